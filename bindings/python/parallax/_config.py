"""Job configs: parallax.Config, the keys the library knows and its embedded default job."""
from __future__ import annotations

from typing import Any, Dict, List

from parallax._facade import ConfigSource, core, facade, native_config, wrap


@facade(core.Config)
class Config:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    def __init__(self, source: ConfigSource = None, **sections: Dict[str, Any]) -> None:
        self._impl = core.Config(native_config(source), **sections)

    @property
    def toml(self) -> str:
        return self._impl.toml

    @property
    def source(self) -> str:
        return self._impl.source

    def to_dict(self) -> Dict[str, Dict[str, Any]]:
        return self._impl.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._impl[key]

    def override(self, **sections: Dict[str, Any]) -> Config:
        return wrap(Config, self._impl.override(**sections))

    def layout(self) -> str:
        return self._impl.layout()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return bool(self._impl == other._impl)

    def __repr__(self) -> str:
        return repr(self._impl)


@facade(core.config_keys)
def config_keys() -> List[str]:
    return core.config_keys()


@facade(core.default_config_toml)
def default_config_toml() -> str:
    return core.default_config_toml()
