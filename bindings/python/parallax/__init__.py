"""Parallax from Python: a GPT training runtime whose every parallel layout computes the single
device's bits.

  Config          a job config (TOML file, dict or keyword sections)
  Job             a training job driven a few steps at a time; metrics and state as numpy arrays
  validate        the single-device reference against parallel layouts, step by step
  compare         two traces (Parallax's or a PyTorch run's, parallax.torch) op by op under the
                  error budget
  layout, explore_layout   a layout resolved, and who holds and sends what in one traced step
  schedule        a pipeline schedule as data (actions per rank) and its simulation
  canonical_sum, tree_nodes   the canonical reduction order itself
  checkpoints     save (Job.save_checkpoint), read_checkpoint, inspect_checkpoint, convert (llm.c,
                  Hugging Face)
  read_run_file   the metrics, events and FP8 drift monitor rows of a run file
  plan            layouts for N devices of a cluster file, ranked by predicted step time
  predicted_vs_measured   a run file's own layout predicted beside what it measured
  cast, fp8_cast  the library's casts: bf16 and fp8 arrays as ml_dtypes dtypes, fp8 codes and
                  scales
Errors are parallax.ParallaxError subclasses (ConfigError is also a ValueError) carrying the
library's own messages (parallax.errors lists them).

The classes and functions here are Python's, over the extension module parallax._core; their
annotations are the types editors and type checkers read (the package is typed, PEP 561).
"""
from parallax.errors import (CheckpointError, CommError, ConfigError, ConfigKeyError,
                             CorruptionError, DataError, InternalError, ParallaxError,
                             RankIndexError, StorageError)
from parallax._facade import core as _core
from parallax._config import Config, config_keys, default_config_toml
from parallax._files import convert, inspect_checkpoint, read_checkpoint, read_run_file
from parallax._job import Job
from parallax._layouts import Schedule, explore_layout, layout, schedule
from parallax._plan import plan, predicted_vs_measured
from parallax._numerics import (canonical_dot, canonical_sum, cast, fp8_cast, numpy_dtype,
                                tree_nodes, tree_split, tree_sum)
from parallax._validation import (AxisResult, Comparison, LayoutResult, Trace, ValidationReport,
                                  compare, record_trace, validate)

__version__: str = _core.__version__

__all__ = [
    "AxisResult", "CheckpointError", "CommError", "Comparison", "Config", "ConfigError",
    "ConfigKeyError", "CorruptionError", "DataError", "InternalError", "Job", "LayoutResult",
    "ParallaxError", "RankIndexError", "Schedule", "StorageError", "Trace", "ValidationReport",
    "canonical_dot", "canonical_sum", "cast", "compare", "config_keys", "convert",
    "default_config_toml", "explore_layout", "fp8_cast", "inspect_checkpoint", "layout",
    "numpy_dtype", "plan", "predicted_vs_measured", "read_checkpoint", "read_run_file", "record_trace", "schedule",
    "tree_nodes", "tree_split", "tree_sum", "validate",
]
