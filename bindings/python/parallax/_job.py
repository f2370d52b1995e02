"""parallax.Job: a training job on its layout's in-process ranks, driven a few steps at a time."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from parallax._config import Config
from parallax._facade import (ConfigSource, Metrics, PathArg, Tensors, core, facade, native_config,
                              wrap)


@facade(core.Job)
class Job:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    def __init__(self, config: ConfigSource = None, *, out: Optional[PathArg] = None,
                 probes: Union[None, str, Sequence[str]] = None, probe_stride: int = 1,
                 **sections: Dict[str, Any]) -> None:
        self._impl = core.Job(native_config(config), out=out, probes=probes,
                              probe_stride=probe_stride, **sections)

    @property
    def config(self) -> Config:
        return wrap(Config, self._impl.config)

    @property
    def layout(self) -> Dict[str, Any]:
        return self._impl.layout

    @property
    def world_size(self) -> int:
        return self._impl.world_size

    @property
    def steps_done(self) -> int:
        return self._impl.steps_done

    @property
    def steps_total(self) -> int:
        return self._impl.steps_total

    @property
    def status(self) -> str:
        return self._impl.status

    @property
    def num_params(self) -> int:
        return self._impl.num_params

    @property
    def loss_floor(self) -> float:
        return self._impl.loss_floor

    @property
    def entropy_rate(self) -> float:
        return self._impl.entropy_rate

    def step(self, n: int = 1) -> Dict[str, float]:
        return self._impl.step(n)

    def run(self) -> Metrics:
        return self._impl.run()

    def finish(self) -> None:
        self._impl.finish()

    def close(self) -> None:
        self._impl.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._impl.__exit__(*exc)

    def add_observer(self, fn: Callable[[Dict[str, float]], Any]) -> None:
        self._impl.add_observer(fn)

    def remove_observer(self, fn: Callable[[Dict[str, float]], Any]) -> None:
        self._impl.remove_observer(fn)

    def metrics(self) -> Metrics:
        return self._impl.metrics()

    def events(self) -> List[Dict[str, Any]]:
        return self._impl.events()

    def values(self) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
        return self._impl.values()

    def batch(self, step: int, split: str = "train") -> npt.NDArray[np.int32]:
        return self._impl.batch(step, split)

    def router_stats(self) -> Dict[int, Dict[str, np.ndarray]]:
        return self._impl.router_stats()

    def fp8(self) -> Dict[str, npt.NDArray[Any]]:
        return self._impl.fp8()

    def memory(self) -> List[Dict[str, int]]:
        return self._impl.memory()

    def comm_stats(self, reset: bool = False) -> List[Dict[str, Any]]:
        return self._impl.comm_stats(reset)

    def describe(self, collectives: bool = False) -> str:
        return self._impl.describe(collectives)

    def explore(self) -> Dict[str, Any]:
        return self._impl.explore()

    def fp8_state(self) -> Optional[Dict[str, Any]]:
        return self._impl.fp8_state()

    def fp8_cast(self, name: str) -> Dict[str, Any]:
        return self._impl.fp8_cast(name)

    def weights(self) -> Tensors:
        return self._impl.weights()

    def grads(self) -> Tensors:
        return self._impl.grads()

    def adam_m(self) -> Tensors:
        return self._impl.adam_m()

    def adam_v(self) -> Tensors:
        return self._impl.adam_v()

    def rank(self, rank: int) -> Dict[str, Any]:
        return self._impl.rank(rank)

    def shard_map(self) -> List[Dict[str, Any]]:
        return self._impl.shard_map()

    def probe_names(self) -> List[str]:
        return self._impl.probe_names()

    def probe(self, name: str) -> np.ndarray:  # float32, or bfloat16 / float16 activations
        return self._impl.probe(name)

    def clear_probes(self) -> None:
        self._impl.clear_probes()

    def save_checkpoint(self, dir: PathArg) -> str:
        return self._impl.save_checkpoint(dir)

    def __repr__(self) -> str:
        return repr(self._impl)
