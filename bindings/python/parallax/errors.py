"""The exceptions Parallax raises, each carrying the library's own sentence: what was wrong,
where, and what to do (docs/python.md, "Errors").

  ParallaxError(RuntimeError)               every error below; also a call the job cannot take
                                            in its state
  ConfigError(ParallaxError, ValueError)    a config key unknown, mistyped or out of range
  ConfigKeyError(ConfigError, KeyError)     Config()[key] of a key or section not there
  RankIndexError(ConfigError, IndexError)   job.rank(r) of a rank not in the layout
  DataError(ParallaxError, ValueError)      a malformed data, checkpoint or llm.c file
  CheckpointError(DataError)                a checkpoint that cannot be used
  CorruptionError(ParallaxError)            silent data corruption a re-run reproduced
  CommError(ParallaxError)                  a rank died, stalled or could not communicate
  StorageError(ParallaxError, OSError)      an output that could not be written
  InternalError(ParallaxError)              a bug in Parallax

A file that is missing or unreadable raises its error's class made also an OSError of its errno
(FileNotFoundError, PermissionError): a class of both, named as the first (file_error_class).
"""
from __future__ import annotations

from typing import Dict, Tuple, Type

__all__ = ["ParallaxError", "ConfigError", "ConfigKeyError", "RankIndexError", "DataError",
           "CheckpointError", "CorruptionError", "CommError", "StorageError", "InternalError"]


class ParallaxError(RuntimeError):
    """Base of every error Parallax raises; the message is the library's sentence: what was
    wrong, where, and what to do."""

    # The message as given: KeyError's own str() would quote it.
    __str__ = BaseException.__str__


class ConfigError(ParallaxError, ValueError):
    """A job config key is unknown, mistyped or out of range, or a layout the job cannot take;
    the message names the key."""


class ConfigKeyError(ConfigError, KeyError):
    """Config()[key] of a section or key the config does not have; also a KeyError."""

    __str__ = BaseException.__str__


class RankIndexError(ConfigError, IndexError):
    """A rank the job's layout does not have (job.rank(r)); also an IndexError."""


class DataError(ParallaxError, ValueError):
    """A data, checkpoint or llm.c file is malformed; the message names the file."""


class CheckpointError(DataError):
    """A checkpoint that cannot be used (corrupt, truncated, another model or data stream); the
    message names the file."""


class CorruptionError(ParallaxError):
    """Silent data corruption: the replicas disagree and a re-run reproduced it; the message
    names the ranks and the step."""


class CommError(ParallaxError):
    """A rank died, stalled past layout.timeout_s or could not communicate; the message names
    it."""


class StorageError(ParallaxError, OSError):
    """An output could not be written (a full or failing file system)."""

    __str__ = BaseException.__str__


class InternalError(ParallaxError):
    """A bug in Parallax: report it with the message."""


for _cls in (ParallaxError, ConfigError, ConfigKeyError, RankIndexError, DataError,
             CheckpointError, CorruptionError, CommError, StorageError, InternalError):
    _cls.__module__ = "parallax"

_file_classes: Dict[Tuple[type, type], type] = {}


def file_error_class(base: Type[ParallaxError], os_class: Type[OSError]) -> type:
    """`base` made also `os_class` (FileNotFoundError, PermissionError or OSError): one class
    per pair, named as `base`, made when first raised (the extension raises it)."""
    cls = _file_classes.get((base, os_class))
    if cls is None:
        doc = f"{base.__name__}, about a file, that is also a {os_class.__name__}."
        cls = type(base.__name__, (base, os_class), {"__doc__": doc, "__module__": "parallax",
                                                     "__str__": BaseException.__str__})
        _file_classes[(base, os_class)] = cls
    return cls
