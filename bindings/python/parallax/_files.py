"""Checkpoints and run files read from Python; llm.c checkpoints converted."""
from __future__ import annotations

from typing import Any, Dict

from parallax._facade import PathArg, core, facade


@facade(core.inspect_checkpoint)
def inspect_checkpoint(path: PathArg) -> Dict[str, Any]:
    return core.inspect_checkpoint(path)


@facade(core.read_checkpoint)
def read_checkpoint(path: PathArg) -> Dict[str, Any]:
    return core.read_checkpoint(path)


@facade(core.convert)
def convert(input: PathArg, output: PathArg) -> str:
    return core.convert(input, output)


@facade(core.read_run_file)
def read_run_file(path: PathArg) -> Dict[str, Any]:
    return core.read_run_file(path)
