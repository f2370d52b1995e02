"""The layout planner: which layout for N devices of a cluster, its memory, step time and MFU."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from parallax._facade import ConfigSource, core, facade, native_config


@facade(core.plan)
def plan(config: ConfigSource = None, *, gpus: int, cluster: str,
         calibrate: Sequence[str] = (), **sections: Dict[str, Any]) -> List[Dict[str, Any]]:
    return core.plan(native_config(config), gpus=gpus, cluster=str(cluster),
                     calibrate=[str(c) for c in calibrate], **sections)
