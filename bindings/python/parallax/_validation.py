"""Validation: the single-device reference against parallel layouts, and golden traces."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from parallax._facade import ConfigSource, PathArg, core, facade, native_config, wrap


@facade(core.Comparison)
class Comparison:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    @property
    def name(self) -> str:
        return self._impl.name

    @property
    def shape(self) -> List[int]:
        return self._impl.shape

    @property
    def count(self) -> int:
        return self._impl.count

    @property
    def differing(self) -> int:
        return self._impl.differing

    @property
    def max_ulp(self) -> int:
        return self._impl.max_ulp

    @property
    def ulp_histogram(self) -> npt.NDArray[np.int64]:
        return self._impl.ulp_histogram

    @property
    def max_abs(self) -> float:
        return self._impl.max_abs

    @property
    def max_rel(self) -> float:
        return self._impl.max_rel

    @property
    def first(self) -> int:
        return self._impl.first

    @property
    def first_index(self) -> List[int]:
        return self._impl.first_index

    @property
    def first_reference(self) -> float:
        return self._impl.first_reference

    @property
    def first_candidate(self) -> float:
        return self._impl.first_candidate

    @property
    def equal(self) -> bool:
        return self._impl.equal

    def text(self) -> str:
        return self._impl.text()

    def __repr__(self) -> str:
        return repr(self._impl)


@facade(core.AxisResult)
class AxisResult:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    @property
    def layout(self) -> str:
        return self._impl.layout

    @property
    def verdict(self) -> str:
        return self._impl.verdict

    @property
    def first_step(self) -> int:
        return self._impl.first_step

    @property
    def error(self) -> str:
        return self._impl.error


@facade(core.LayoutResult)
class LayoutResult:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    @property
    def layout(self) -> str:
        return self._impl.layout

    @property
    def verdict(self) -> str:
        return self._impl.verdict

    @property
    def steps(self) -> int:
        return self._impl.steps

    @property
    def max_ulp(self) -> int:
        return self._impl.max_ulp

    @property
    def first_step(self) -> int:
        return self._impl.first_step

    @property
    def first_rank(self) -> int:
        return self._impl.first_rank

    @property
    def first(self) -> Comparison:
        return wrap(Comparison, self._impl.first)

    @property
    def first_ranks(self) -> List[int]:
        return self._impl.first_ranks

    @property
    def replica_step(self) -> int:
        return self._impl.replica_step

    @property
    def replica_tensor(self) -> str:
        return self._impl.replica_tensor

    @property
    def replica_ranks(self) -> List[int]:
        return self._impl.replica_ranks

    @property
    def replica_twin(self) -> int:
        return self._impl.replica_twin

    @property
    def differing(self) -> List[Comparison]:
        return [wrap(Comparison, x) for x in self._impl.differing]

    @property
    def final_step(self) -> List[Comparison]:
        return [wrap(Comparison, x) for x in self._impl.final_step]

    @property
    def first_op_rank(self) -> int:
        return self._impl.first_op_rank

    @property
    def first_op_ranks(self) -> List[int]:
        return self._impl.first_op_ranks

    @property
    def first_op_where(self) -> str:
        return self._impl.first_op_where

    @property
    def first_op(self) -> Comparison:
        return wrap(Comparison, self._impl.first_op)

    @property
    def first_op_note(self) -> str:
        return self._impl.first_op_note

    @property
    def axes(self) -> List[AxisResult]:
        return [wrap(AxisResult, x) for x in self._impl.axes]

    @property
    def budget_ratio(self) -> float:
        return self._impl.budget_ratio

    @property
    def budget_worst(self) -> str:
        return self._impl.budget_worst

    @property
    def error(self) -> str:
        return self._impl.error

    @property
    def seconds(self) -> float:
        return self._impl.seconds

    @property
    def ok(self) -> bool:
        return self._impl.ok

    def per_tensor(self) -> Dict[str, Any]:
        return self._impl.per_tensor()

    def __repr__(self) -> str:
        return repr(self._impl)


@facade(core.ValidationReport)
class ValidationReport:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    @property
    def job(self) -> str:
        return self._impl.job

    @property
    def mode(self) -> str:
        return self._impl.mode

    @property
    def steps(self) -> int:
        return self._impl.steps

    @property
    def reference_seconds(self) -> float:
        return self._impl.reference_seconds

    @property
    def layouts(self) -> List[LayoutResult]:
        return [wrap(LayoutResult, x) for x in self._impl.layouts]

    @property
    def all_ok(self) -> bool:
        return self._impl.all_ok

    @property
    def any_error(self) -> bool:
        return self._impl.any_error

    def table(self) -> str:
        return self._impl.table()

    def to_json(self) -> str:
        return self._impl.to_json()

    def to_markdown(self) -> str:
        return self._impl.to_markdown()

    def rows(self) -> List[Dict[str, Any]]:
        return self._impl.rows()

    def __repr__(self) -> str:
        return repr(self._impl)


@facade(core.validate)
def validate(config: ConfigSource = None, *,
             layouts: Union[str, Sequence[str]] = "dp2,tp2,pp2,dp2xtp2xpp2", steps: int = 20,
             mode: Optional[str] = None, golden: Optional[PathArg] = None,
             **sections: Dict[str, Any]) -> ValidationReport:
    report = core.validate(native_config(config), layouts=layouts, steps=steps, mode=mode,
                           golden=golden, **sections)
    return wrap(ValidationReport, report)


@facade(core.record_trace)
def record_trace(path: PathArg, config: ConfigSource = None, *, steps: int = 20,
                 probes: Sequence[str] = ("**",), stride: int = 1,
                 **sections: Dict[str, Any]) -> int:
    return core.record_trace(path, native_config(config), steps=steps, probes=probes,
                             stride=stride, **sections)


@facade(core.compare)
def compare(reference: PathArg, run: PathArg) -> Dict[str, Any]:
    return core.compare(reference, run)


@facade(core.Trace)
class Trace:
    __slots__ = ("_impl",)
    _impl: Any  # the extension's object

    def __init__(self, path: PathArg) -> None:
        self._impl = core.Trace(path)

    @property
    def path(self) -> str:
        return self._impl.path

    @property
    def info(self) -> Dict[str, Any]:
        return self._impl.info

    def names(self) -> List[str]:
        return self._impl.names()

    def read(self, name: str) -> npt.NDArray[np.float32]:
        return self._impl.read(name)
