"""The canonical reduction order itself, and the library's casts to bf16, fp16 and fp8."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple, Union

import numpy as np
import numpy.typing as npt

from parallax._facade import core, facade

# "f32", "bf16", "f16", "e4m3", "e5m2" or a numpy dtype
DTypeArg = Union[str, np.dtype, type]


@facade(core.canonical_sum)
def canonical_sum(x: npt.ArrayLike, block: int = 64) -> float:
    return core.canonical_sum(x, block)


@facade(core.canonical_dot)
def canonical_dot(x: npt.ArrayLike, y: npt.ArrayLike, block: int = 64) -> float:
    return core.canonical_dot(x, y, block)


@facade(core.tree_sum)
def tree_sum(partials: npt.ArrayLike) -> float:
    return core.tree_sum(partials)


@facade(core.tree_nodes)
def tree_nodes(blocks: int, lo: int, hi: int) -> List[Tuple[int, int]]:
    return core.tree_nodes(blocks, lo, hi)


@facade(core.tree_split)
def tree_split(lo: int, hi: int) -> int:
    return core.tree_split(lo, hi)


@facade(core.numpy_dtype)
def numpy_dtype(name: str) -> np.dtype:
    return core.numpy_dtype(name)


@facade(core.cast)
def cast(x: npt.ArrayLike, dtype: DTypeArg) -> np.ndarray:
    return core.cast(x, dtype)


@facade(core.fp8_cast)
def fp8_cast(x: npt.ArrayLike, *, recipe: str = "delayed", role: str = "x", scale: float = 1.0,
             block_size: int = 128) -> Dict[str, Any]:
    return core.fp8_cast(x, recipe=recipe, role=role, scale=scale, block_size=block_size)
