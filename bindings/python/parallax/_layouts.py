"""Layouts and pipeline schedules as data: who holds what, who sends what, in which order."""
from __future__ import annotations

from typing import Any, Dict, List

from parallax._facade import ConfigSource, core, facade, native_config, wrap


@facade(core.layout)
def layout(config: ConfigSource = None, *, explore: bool = False,
           **sections: Dict[str, Any]) -> Dict[str, Any]:
    return core.layout(native_config(config), explore=explore, **sections)


@facade(core.explore_layout)
def explore_layout(config: ConfigSource = None, **sections: Dict[str, Any]) -> Dict[str, Any]:
    return core.explore_layout(native_config(config), **sections)


@facade(core.Schedule)
class Schedule:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    @property
    def kind(self) -> str:
        return self._impl.kind

    @property
    def pp(self) -> int:
        return self._impl.pp

    @property
    def microbatches(self) -> int:
        return self._impl.microbatches

    @property
    def virtual_stages(self) -> int:
        return self._impl.virtual_stages

    @property
    def actions(self) -> List[List[Dict[str, Any]]]:
        return self._impl.actions

    def simulate(self, forward_slots: int = 1, backward_slots: int = 1,
                 rendezvous: bool = False, weight_slots: int = 0) -> Dict[str, Any]:
        return self._impl.simulate(forward_slots, backward_slots, rendezvous, weight_slots)

    def text(self) -> str:
        return self._impl.text()

    def actions_text(self) -> str:
        return self._impl.actions_text()

    def __repr__(self) -> str:
        return repr(self._impl)


@facade(core.schedule)
def schedule(kind: str = "1f1b", pp: int = 2, microbatches: int = 4,
             virtual_stages: int = 1) -> Schedule:
    return wrap(Schedule, core.schedule(kind, pp, microbatches, virtual_stages))
