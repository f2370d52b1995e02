"""Checkpoints and run files read from Python; llm.c, Parallax and Hugging Face weights
converted."""
from __future__ import annotations

from typing import Any, Dict, Optional

from parallax._facade import PathArg, core, facade


@facade(core.inspect_checkpoint)
def inspect_checkpoint(path: PathArg) -> Dict[str, Any]:
    return core.inspect_checkpoint(path)


@facade(core.read_checkpoint)
def read_checkpoint(path: PathArg) -> Dict[str, Any]:
    return core.read_checkpoint(path)


@facade(core.convert)
def convert(input: PathArg, output: PathArg, dtype: Optional[str] = None) -> str:
    return core.convert(input, output, dtype)


@facade(core.read_run_file)
def read_run_file(path: PathArg) -> Dict[str, Any]:
    return core.read_run_file(path)
