"""How the package sits over its extension module, parallax._core (bindings/*.cpp).

Every public class is a plain Python class holding the extension's object (`_impl`), and every
public function calls the extension's: the annotations here are the types editors and type
checkers read, the docstrings are the extension's own (adopted at import, so that each sentence
is written once, beside the code it describes), and help() shows Parallax's names only.
"""
from __future__ import annotations

import importlib
from os import PathLike
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Type, TypeVar, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from parallax._config import Config

# Typed Any: the extension has no stub of its own; the classes and functions below are its types.
core: Any = importlib.import_module("parallax._core")

PathArg = Union[str, "PathLike[str]"]
ConfigSource = Union[None, PathArg, Dict[str, Any], "Config"]
# step (int64), loss, val_loss, grad_norm, lr, tokens_per_s, step_ms, comm_bytes
Metrics = Dict[str, np.ndarray]
Tensors = Dict[str, npt.NDArray[np.float32]]

T = TypeVar("T")

# Dunder methods whose extension docstring is worth adopting; the rest keep Python's own.
_DOCUMENTED_DUNDERS = {"__init__", "__getitem__", "__enter__", "__exit__", "__eq__"}


def native_doc(native: Any) -> Optional[str]:
    """The extension object's docstring without the signature line pybind11 puts first (its
    types are the extension's; the Python signature beside it is the one to read)."""
    doc = getattr(native, "__doc__", None)
    if not doc:
        return None
    name = getattr(native, "__name__", None)
    lines = doc.splitlines()
    if name and lines and lines[0].startswith(name + "("):
        lines = lines[1:]
    text = "\n".join(lines).strip("\n")
    return text or None


def facade(native: Any) -> Callable[[T], T]:
    """Marks a class or function as the public face of `native`: it takes native's docstrings
    (the class's and each member's that has none of its own) and belongs to module `parallax`."""

    def adopt(obj: T) -> T:
        if isinstance(obj, type):
            if obj.__doc__ is None:
                obj.__doc__ = native.__doc__
            for name, member in vars(obj).items():
                if name.startswith("_") and name not in _DOCUMENTED_DUNDERS:
                    continue
                doc = native_doc(getattr(native, name, None))
                if doc is None:
                    continue
                if isinstance(member, property):
                    if member.__doc__ is None:
                        member.__doc__ = doc
                elif callable(member) and getattr(member, "__doc__", None) is None:
                    member.__doc__ = doc
        elif getattr(obj, "__doc__", None) is None:
            obj.__doc__ = native_doc(native)
        obj.__module__ = "parallax"
        return obj

    return adopt


def wrap(cls: Type[T], impl: Any) -> T:
    """The public object of class `cls` holding the extension's object `impl`."""
    obj = object.__new__(cls)
    obj._impl = impl  # type: ignore[attr-defined]
    return obj


def native_config(source: Any) -> Any:
    """What the extension takes for a config source: a parallax.Config's own object, else the
    source as given (None, a path, a dict)."""
    from parallax._config import Config  # the config module imports this one

    return source._impl if isinstance(source, Config) else source
