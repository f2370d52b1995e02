"""The layout planner: which layout for N devices of a cluster, its memory, step time and MFU; and
a run's own layout predicted beside what it measured."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from parallax._facade import ConfigSource, PathArg, core, facade, native_config


@facade(core.plan)
def plan(config: ConfigSource = None, *, gpus: int, cluster: PathArg,
         calibrate: Sequence[PathArg] = (), only_tp: Sequence[int] = (),
         only_pp: Sequence[int] = (), only_cp: Sequence[int] = (),
         **sections: Dict[str, Any]) -> List[Dict[str, Any]]:
    return core.plan(native_config(config), gpus=gpus, cluster=str(cluster),
                     calibrate=[str(c) for c in calibrate], only_tp=list(only_tp),
                     only_pp=list(only_pp), only_cp=list(only_cp), **sections)


@facade(core.predicted_vs_measured)
def predicted_vs_measured(run: PathArg, *, cluster: PathArg,
                          calibrate: Sequence[PathArg] = ()) -> Dict[str, Any]:
    return core.predicted_vs_measured(str(run), cluster=str(cluster),
                                      calibrate=[str(c) for c in calibrate])
