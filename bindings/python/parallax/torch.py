"""parallax.torch: record a PyTorch training run as a Parallax golden trace (docs/torch.md).

`with record(model, "run.h5", optimizer=opt):` hooks a Hugging Face GPT-2 or Llama/Qwen3 model
(or the user's own modules, through `name_map`) and its optimizer, and writes, for the recorded
steps, the probes Parallax records (core/model/probe.h) under Parallax's names and logical shapes,
in the golden-trace format of validators/trace.h: activations (`fwd/<op>/out`), the total gradient
of each op's input (`bwd/<op>/dinp`), every parameter's reduced gradient (`grad/<l>/param/<name>`),
and after the update the parameters and AdamW's moments (`optim/<l>/{param,adam.m,adam.v}/<name>`).
It never changes what the run computes: its hooks read and copy, nothing else.

Inside a distributed run (DDP, FSDP2, tensor and sequence parallelism through DTensor, a pipeline
split) each rank keeps the pieces it holds, each a hyperslab of the probe's logical tensor: batch
rows from its dp rank and microbatch; columns and sequence rows from DTensor placements or, for a
local activation, from its module's sharded weight. The pieces are held in memory and, past 512
MiB, written by a writer thread to a per-rank spill file beside the output (a step never waits for
the disk). At the end rank 0 puts every logical tensor together (the lowest rank holding an
element gives it), keeps a rank's piece that disagrees with it bit for bit under /replicas, lists
who held what in /pieces and writes the file. torch is imported by this module only: `import
parallax` never imports it.

Index
  record          the recorder of one run, a context manager (what `with` gives: the Recorder)
  Recorder        grads_ready, scalar, activation, end_step, flush; writes the trace at the end
  LLAMA_MAP, GPT2_MAP    the built-in name maps: transformers module -> Parallax ops
  glob_match      Parallax's probe patterns (core/model/probe.h: * ? **)
  checksum_f32    the per-dataset checksum of core/io/checkpoint.h, vectorised in numpy
  write_trace     probes (and pieces, replicas) to a trace file; rank 0 calls it at the end
  (private)       _ModelMap (modules and parameters to probe keys), _Layout (ranks and axes),
                  _dtensor_slab / _local_slab (where a rank's piece sits), _Spill (a rank's
                  pieces on disk), _assemble (rank 0: logical tensors, replicas, order)
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import threading
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

import torch  # this module is torch's side of Parallax: `import parallax` does not import it

# DTensor (torch >= 2.4): FSDP2's and tensor parallelism's sharded tensors; None in a torch built
# without distributed.
_dtensor: Any = None
try:
    import torch.distributed.tensor as _dtensor
except ImportError:
    pass

__all__ = ["GPT2_MAP", "LLAMA_MAP", "Recorder", "checksum_f32", "glob_match", "record",
           "write_trace"]

# ---- the built-in maps ------------------------------------------------------------------------
#
# A name map takes a module's qualified name (`{l}` stands for the layer index) to the probes
# taken at its boundary. A side names which tensor: "out" the module's output as fwd/<op>/out,
# "in" its (first) input as fwd/<op>/out, "din" the total gradient of its input as
# bwd/<op>/dinp, "dout" the total gradient of its output as bwd/<op>/dinp. A plain string op is
# {"out": op, "din": op}: an op's output and the gradient of what it consumed. Layers come from
# `{l}`; names without it are outside the blocks (layer "-"). See docs/torch.md.

LLAMA_MAP: Dict[str, Union[str, Dict[str, str]]] = {
    "model.embed_tokens": {"out": "embed"},
    "model.layers.{l}.input_layernorm": "ln_1",  # din: the block input
    "model.layers.{l}.self_attn.q_proj": {"din": "attn.qkv"},  # din: ln_1's output
    "model.layers.{l}.self_attn.o_proj": {"in": "attn.core", "out": "attn.proj",
                                          "din": "attn.proj"},
    "model.layers.{l}.post_attention_layernorm": {"in": "residual_1", "out": "ln_2", "din": "ln_2"},
    "model.layers.{l}.mlp.gate_proj": {"out": "mlp.gate", "dout": "mlp.swiglu", "din": "mlp.fc"},
    "model.layers.{l}.mlp.up_proj": {"out": "mlp.up"},
    "model.layers.{l}.mlp.down_proj": {"in": "mlp.swiglu", "out": "mlp.proj", "din": "mlp.proj"},
    "model.layers.{l}": {"out": "residual_2"},
    "model.norm": "ln_f",  # din: the last block's output
    "lm_head": {"out": "head", "din": "head", "dout": "loss"},  # dout: d loss / d logits
}

GPT2_MAP: Dict[str, Union[str, Dict[str, str]]] = {
    "transformer.h.0": {"in": "embed"},  # wte + wpe (dropout off); layer "-"
    "transformer.h.{l}.ln_1": "ln_1",
    "transformer.h.{l}.attn.c_attn": {"out": "attn.qkv", "din": "attn.qkv", "dout": "attn.core"},
    "transformer.h.{l}.attn.c_proj": {"in": "attn.core", "out": "attn.proj", "din": "attn.proj"},
    "transformer.h.{l}.ln_2": {"in": "residual_1", "out": "ln_2", "din": "ln_2"},
    "transformer.h.{l}.mlp.c_fc": {"out": "mlp.fc", "din": "mlp.fc"},
    "transformer.h.{l}.mlp.act": "mlp.gelu",  # din: c_fc's output
    "transformer.h.{l}.mlp.c_proj": {"out": "mlp.proj", "din": "mlp.proj"},
    "transformer.h.{l}": {"out": "residual_2"},
    "transformer.ln_f": "ln_f",
    "lm_head": {"out": "head", "din": "head", "dout": "loss"},
}
# GPT-2's parameters outside the blocks carry Parallax's llm.c names; its Conv1D weights (in, out)
# are transposed to (out, in).
_GPT2_PARAMS = {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe",
                "transformer.ln_f.weight": "ln_f.weight", "transformer.ln_f.bias": "ln_f.bias"}

_SIDES = {"out": ("fwd", "out"), "in": ("fwd", "out"), "din": ("bwd", "dinp"),
          "dout": ("bwd", "dinp")}
_PHASES = ("fwd", "bwd", "grad", "optim")
_OPTIM = (("param", None), ("adam.m", "exp_avg"), ("adam.v", "exp_avg_sq"))
_SCALARS = ("grad/-/clip/norm",)  # the scalar probes Parallax emits (shape (1,))
_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
_AXES = ("dp", "fsdp", "tp", "pp")
_AXIS_ALIASES = {"dp_replicate": "dp", "dp_shard": "fsdp"}  # torchtitan's names
# Wrappers that insert a level into module names (torch.compile, activation checkpointing,
# FSDP1) and are not part of the model's own names.
_WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
_HOLD_BYTES = 512 << 20  # pieces a rank holds in memory before its writer thread writes them


# ---- patterns and checksums ---------------------------------------------------------------------

def _glob_regex(pattern: str) -> "re.Pattern[str]":
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = pattern[i]
        out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
        i += 1
    return re.compile("".join(out))


def glob_match(pattern: str, name: str) -> bool:
    """Whether `name` matches `pattern` in full, as Parallax's probe selections do: `*` any run
    of characters but '/', `**` any run, `?` one character but '/'."""
    return _glob_regex(pattern).fullmatch(name) is not None


def _mix64(x: np.ndarray) -> np.ndarray:  # splitmix64's finaliser, wrapping uint64 arithmetic
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def checksum_f32(data: np.ndarray) -> int:
    """core/io/checkpoint.h's checksum_f32: the sum over elements i (row-major) of
    mix64(mix64(i ^ 0x5058434b50543031) ^ bits_i) mod 2^64, bits_i the float32's bit pattern."""
    bits = np.ascontiguousarray(data, dtype=np.float32).reshape(-1).view(np.uint32)
    key, total, chunk = np.uint64(0x5058434B50543031), 0, 1 << 22
    with np.errstate(over="ignore"):
        for a in range(0, bits.size, chunk):
            i = np.arange(a, min(a + chunk, bits.size), dtype=np.uint64)
            terms = _mix64(_mix64(i ^ key) ^ bits[a:a + chunk].astype(np.uint64))
            total = (total + int(terms.sum(dtype=np.uint64))) % (1 << 64)
    return total


# ---- where a rank's piece sits ------------------------------------------------------------------

def _is_dtensor(t: Any) -> bool:
    return _dtensor is not None and isinstance(t, _dtensor.DTensor)


def _local(t: Any) -> torch.Tensor:  # a DTensor's own piece
    return t.to_local()


def _whole(t: Any) -> torch.Tensor:  # a DTensor made whole: a collective over its mesh
    return t.full_tensor()


def _dtensor_slab(t: Any) -> Optional[Tuple[List[int], List[int]]]:
    """[lo, hi) of a DTensor's local tensor in its global one, or None when it is no hyperslab
    (a Partial sum, a strided shard as FSDP2 over a tp shard of the same dimension makes).
    Shards nest in mesh order, each chunked as torch.chunk cuts (the last chunks short or empty)."""
    shape = list(t.shape)
    lo, hi = [0] * len(shape), list(shape)
    coord = t.device_mesh.get_coordinate()
    if coord is None:
        return None
    for i, p in enumerate(t.placements):
        if type(p) is _dtensor.Replicate:
            continue
        if type(p) is not _dtensor.Shard:  # Partial, _StridedShard
            return None
        d = p.dim % len(shape)
        size, parts = hi[d] - lo[d], t.device_mesh.size(i)
        chunk = -(-size // parts)
        a = min(coord[i] * chunk, size)
        lo[d], hi[d] = lo[d] + a, lo[d] + min(a + chunk, size)
    if [h - l for l, h in zip(lo, hi)] != list(t.to_local().shape):
        return None
    return lo, hi


# The weight dimension holding a module's input / output features, by module class: a tensor
# parallel module's local activation is cut as its weight is along that dimension.
def _feature_dim(module: Any, side: str) -> Optional[int]:
    kind = type(module).__name__
    output = side in ("out", "dout")
    if isinstance(module, torch.nn.Linear) or kind == "Linear":
        return 0 if output else 1  # weight (out, in)
    if kind == "Conv1D":
        return 1 if output else 0  # transformers' GPT-2: weight (in, out)
    if isinstance(module, torch.nn.Embedding) and output:
        return 1  # weight (V, C): output features C
    return None


def _first_tensor(obj: Any, kwargs: Optional[Dict[str, Any]] = None) -> Optional[torch.Tensor]:
    """The first tensor of a module's arguments or output (a tensor, a tuple, a ModelOutput)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)):
        for x in obj:
            if isinstance(x, torch.Tensor):
                return x
    elif isinstance(obj, dict):  # ModelOutput is a dict
        for x in obj.values():
            if isinstance(x, torch.Tensor):
                return x
    for key in ("hidden_states", "input", "x", "input_ids", "inputs_embeds"):
        if kwargs and isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key]
    return None


def _strip_name(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPER_PARTS)


# ---- the layout ---------------------------------------------------------------------------------

def _dist() -> Any:
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


class _Layout:
    """The ranks and their coordinates on the axes dp, fsdp, tp, pp: from a DeviceMesh whose
    dimension names are among them (torchtitan's dp_replicate / dp_shard too), or dp = the world.
    The batch is cut over dp × fsdp (dp major); tp and pp ranks of one batch shard see its rows."""

    def __init__(self, mesh: Any) -> None:
        dist = _dist()
        self.world = dist.get_world_size() if dist else 1
        self.rank = dist.get_rank() if dist else 0
        if mesh is None:
            self.axes = {"dp": self.world, "tp": 1, "pp": 1}
            self.coords = [{"dp": r, "tp": 0, "pp": 0} for r in range(self.world)]
            return
        names = getattr(mesh, "mesh_dim_names", None)
        if not names:
            raise ValueError("record: mesh has no dimension names; name its dimensions among "
                             "dp, fsdp, tp, pp (init_device_mesh(..., mesh_dim_names=...))")
        axes = [_AXIS_ALIASES.get(n, n) for n in names]
        for n, a in zip(names, axes):
            if a not in _AXES:
                raise ValueError(f"record: mesh dimension '{n}' is not one of dp, fsdp, tp, pp "
                                 "(nor dp_replicate, dp_shard); the recorder cannot place its "
                                 "pieces")
        if len(set(axes)) != len(axes):
            raise ValueError(f"record: mesh dimensions {list(names)} name an axis twice")
        ranks = mesh.mesh.cpu().numpy()
        if ranks.size != self.world:
            raise ValueError(f"record: mesh holds {ranks.size} ranks but the world has "
                             f"{self.world}; give the mesh of every rank (the world mesh)")
        self.axes = {a: 1 for a in ("dp", "tp", "pp")}
        self.axes.update({a: int(s) for a, s in zip(axes, ranks.shape)})
        self.axes = {a: self.axes[a] for a in _AXES if a in self.axes}
        self.coords = [dict.fromkeys(self.axes, 0) for _ in range(self.world)]
        for idx in np.ndindex(*ranks.shape):
            for a, c in zip(axes, idx):
                self.coords[int(ranks[idx])][a] = int(c)

    def coord(self, axis: str, rank: Optional[int] = None) -> int:
        return self.coords[self.rank if rank is None else rank].get(axis, 0)

    @property
    def batch_shards(self) -> int:
        return self.axes.get("dp", 1) * self.axes.get("fsdp", 1)

    def batch_shard(self, rank: int) -> int:
        return self.coord("dp", rank) * self.axes.get("fsdp", 1) + self.coord("fsdp", rank)

    def to_json(self) -> str:
        if self.world == 1:
            return ""
        return json.dumps({"world": self.world, "axes": self.axes, "ranks": self.coords})


# ---- the model map ------------------------------------------------------------------------------

class _ModelMap:
    """Which module gives which probe, and each parameter's Parallax layer and name.

    rules: (key, its regex, {side: op}, whether it has {l}) for each name-map key. A parameter
    inside a block (the keys' common `<prefix>.{l}.`) is named by the rest of its name in layer
    l + layer_offset; outside, by its full name (or GPT-2's llm.c name) in layer -1. strict: a
    key no module matches is an error (the user's maps; the built-in ones fit a pipeline stage
    that lacks some modules)."""

    def __init__(self, name_map: Dict[str, Any], params: Dict[str, str], layer_offset: int,
                 strict: bool) -> None:
        self.rules, self.strict, self.params, self.layer_offset = [], strict, params, layer_offset
        prefixes = set()
        for key, value in name_map.items():
            sides = {"out": value, "din": value} if isinstance(value, str) else dict(value)
            for side, op in sides.items():
                if side not in _SIDES:
                    raise ValueError(f"record: name_map['{key}'] has side '{side}'; sides are "
                                     "out, in, dout, din")
                if not isinstance(op, str) or not op or "/" in op:
                    raise ValueError(f"record: name_map['{key}']['{side}'] = {op!r} is not an op "
                                     "name (e.g. 'ln_1')")
            if key.count("{l}") > 1:
                raise ValueError(f"record: name_map key '{key}' has more than one {{l}}")
            rx = re.compile(re.escape(key).replace(r"\{l\}", r"(\d+)"))
            self.rules.append((key, rx, sides, "{l}" in key))
            if "{l}" in key:
                prefixes.add(key[:key.index("{l}") + 3])
        if len(prefixes) > 1:
            raise ValueError(f"record: name_map's layers sit under several prefixes "
                             f"{sorted(prefixes)}; one block list (e.g. 'layers.{{l}}') is needed "
                             "to name the parameters")
        prefix = prefixes.pop() if prefixes else None
        self.block = re.compile(re.escape(prefix).replace(r"\{l\}", r"(\d+)") + r"\.(.+)") \
            if prefix else None
        self.block_module = re.compile(re.escape(prefix).replace(r"\{l\}", r"(\d+)") +
                                       r"(\..+)?") if prefix else None

    def module_probes(self, name: str) -> List[Tuple[str, int, str]]:
        """[(side, layer, op)] of the module with (stripped) qualified name `name`."""
        out = []
        for _, rx, sides, has_layer in self.rules:
            m = rx.fullmatch(name)
            if m:
                layer = int(m.group(1)) + self.layer_offset if has_layer else -1
                out += [(side, layer, op) for side, op in sides.items()]
        return out

    def param(self, name: str) -> Tuple[int, str]:
        """(layer, Parallax name) of a parameter's (stripped) qualified name."""
        m = self.block.fullmatch(name) if self.block else None
        if m:
            return int(m.group(1)) + self.layer_offset, m.group(2)
        return -1, self.params.get(name, name)

    def template(self, module_name: str) -> Tuple[str, bool]:
        """A module's name with its layer index taken out, and whether it sits in a block."""
        m = self.block_module.fullmatch(module_name) if self.block_module else None
        if not m:
            return module_name, False
        return "{l}" + (m.group(2) or ""), True


def _builtin_map(names: Sequence[str], layer_offset: int) -> _ModelMap:
    if any(n.startswith(("model.layers.", "model.embed_tokens")) or n == "model.norm"
           for n in names):
        return _ModelMap(LLAMA_MAP, {}, layer_offset, strict=False)
    if any(n.startswith(("transformer.h.", "transformer.wte")) or n == "transformer.ln_f"
           for n in names):
        gpt2 = dict(GPT2_MAP)
        if layer_offset:  # h.0 of a later stage is not the first block: its input is no embedding
            del gpt2["transformer.h.0"]
        return _ModelMap(gpt2, _GPT2_PARAMS, layer_offset, strict=False)
    raise ValueError("record: the model is neither a transformers GPT-2 (transformer.h.<l>) nor "
                     "a Llama/Qwen3 (model.layers.<l>); pass name_map={module name: op} for your "
                     "own modules (docs/torch.md)")


# ---- a rank's pieces on disk --------------------------------------------------------------------

class _Spill:
    """One rank's pieces: float32 elements appended to one file, beside an index. Pieces are held
    in memory until they pass `hold` bytes, then handed to a writer thread all together (at most
    two batches in flight), so a step waits for neither the disk nor a copy: memory stays under
    about three times `hold`; what is held at the end is written then."""

    def __init__(self, path: str, hold: int) -> None:
        self.path, self.hold = path, hold
        self.file = open(path, "wb")
        self.elements = 0
        self.held: List[Tuple[List[np.ndarray], Optional[Any]]] = []
        self.held_bytes = 0
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parallax-spill")
        self.jobs: deque = deque()

    def put(self, arrays: List[np.ndarray], ready: Optional[Any] = None) -> List[int]:
        """Takes contiguous float32 arrays; returns their element offsets in the file. ready: a
        CUDA event the copies wait on (device-to-host copies made without blocking)."""
        offsets = []
        for a in arrays:
            offsets.append(self.elements)
            self.elements += a.size
        self.held.append((arrays, ready))
        self.held_bytes += sum(a.nbytes for a in arrays)
        if self.held_bytes > self.hold:
            self._hand_over()
        return offsets

    def _hand_over(self) -> None:
        while len(self.jobs) >= 2:
            self.jobs.popleft().result()
        self.jobs.append(self.pool.submit(self._write, self.held))
        self.held, self.held_bytes = [], 0

    def _write(self, batches: List[Tuple[List[np.ndarray], Optional[Any]]]) -> None:
        for arrays, ready in batches:
            if ready is not None:
                ready.synchronize()
            for a in arrays:
                self.file.write(a.data)  # the GIL is released while it writes

    def drain(self) -> None:
        """Everything taken so far on disk."""
        if self.held:
            self._hand_over()
        while self.jobs:
            self.jobs.popleft().result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.pool.shutdown()
            self.file.close()


# ---- the recorder -------------------------------------------------------------------------------

class Recorder:
    """Records one run (see record). Inside `with`: grads_ready() before clipping, scalar() for
    the grad norm, activation() for a tensor no module gives (per-token losses), end_step() in a
    loop without an optimizer. The trace is written when the `with` block ends without an error
    (after a barrier: every rank leaves it with the file written)."""

    def __init__(self, model: Any, path: Union[str, "os.PathLike[str]"], *,
                 optimizer: Any = None, probes: Sequence[str] = ("**",), every: int = 1,
                 name_map: Optional[Dict[str, Any]] = None, layer_offset: int = 0,
                 mesh: Any = None, precision: str = "fp32",
                 shard_map: Optional[Dict[str, Callable[..., Dict[int, Tuple[int, int]]]]] = None,
                 dinp_scale: Optional[float] = None) -> None:
        if isinstance(probes, str):
            probes = [probes]
        self.path = os.fspath(path)
        self.patterns = list(probes)
        if not self.patterns:
            raise ValueError("record: probes is empty; give globs such as '**' or '*/fwd/**'")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"record: every = {every!r}; it must be an int >= 1 (record steps "
                             "1, 1 + every, ...)")
        if precision not in _PRECISIONS:
            raise ValueError(f"record: precision '{precision}' is not one of "
                             f"{', '.join(_PRECISIONS)}")
        self.every, self.precision, self.optimizer = every, precision, optimizer
        self.layout = _Layout(mesh)
        self.dinp_scale = 1.0 / self.layout.batch_shards if dinp_scale is None else dinp_scale
        self.shard_map = [(_glob_regex(k), fn) for k, fn in (shard_map or {}).items()]
        self._regexes = [_glob_regex(p) for p in self.patterns]

        # A torch.distributed.pipelining stage: its module is recorded, and the forward it runs
        # once to infer the shapes it sends (metadata inference) is not.
        self._stage = None
        if hasattr(model, "submod") and hasattr(model, "stage_index"):
            self._stage, model = model, model.submod
        # The model itself beneath DDP / torch.compile wrappers: its module names are the map's.
        while True:
            if type(model).__name__ == "DistributedDataParallel":
                model = model.module
            elif hasattr(model, "_orig_mod"):
                model = model._orig_mod
            else:
                break
        self.model = model
        self._modules = [(_strip_name(n), m) for n, m in model.named_modules()]
        names = [n for n, _ in self._modules]
        self.map = _builtin_map(names, layer_offset) if name_map is None else \
            _ModelMap(name_map, {}, layer_offset, strict=True)
        self._check_arguments(names)

        self._handles: List[Any] = []
        self._step = 1
        self._begin_step()
        self._spill: Optional[_Spill] = None
        self._index: List[Dict[str, Any]] = []
        self._rows_by_step: Dict[int, int] = {}
        self._exec: Dict[str, int] = {}  # module template -> first-execution index (param order)
        self._exec_handles: List[Any] = []
        self._lock = threading.Lock()  # tensor hooks may run on autograd's device threads
        self._warned: set = set()
        self._last_step = 0
        self._paused = False  # a pipeline stage's metadata inference is running
        self._training_forward = False  # the model's forward runs, with gradients

    # -- argument checks (before any hook) --

    def _candidates(self, names: Sequence[str]) -> List[str]:
        """Every probe (without its step) this rank could record."""
        tails = []
        for name in names:
            for side, layer, op in self.map.module_probes(name):
                phase, tensor = _SIDES[side]
                tails.append(f"{phase}/{_layer(layer)}/{op}/{tensor}")
        adam = self.optimizer is not None
        for pname, _ in self.model.named_parameters():
            layer, pn = self.map.param(_strip_name(pname))
            tails.append(f"grad/{_layer(layer)}/param/{pn}")
            if adam:
                tails += [f"optim/{_layer(layer)}/{op}/{pn}" for op, _ in _OPTIM]
        return tails + list(_SCALARS) + ["fwd/-/loss/out"]

    def _check_arguments(self, names: Sequence[str]) -> None:
        tails = self._candidates(names)
        problems = {}
        for pattern, rx in zip(self.patterns, self._regexes):
            m = re.match(r"(\d+)/", pattern)
            steps = ["1", m.group(1)] if m else ["1"]
            if not any(rx.fullmatch(f"{s}/{t}") for s in steps for t in tails):
                problems[f"pattern:{pattern}"] = (
                    f"record: probe pattern '{pattern}' matches no probe this model records "
                    "(names are step/phase/layer/op/tensor, e.g. '*/fwd/*/ln_1/out', "
                    "'*/grad/**'; phases fwd, bwd, grad, optim; optim probes need optimizer=)")
        if self.map.strict:
            for key, rx, _, _ in self.map.rules:
                if not any(rx.fullmatch(n) for n in names):
                    problems[f"module:{key}"] = (
                        f"record: name_map names module '{key}', which the model does not have "
                        "(on any rank); module names are model.named_modules()'s")
        # On a pipeline stage a module or a probe may live on another rank: only what no rank
        # has is an error, and every rank raises the same one.
        dist = _dist()
        if dist and self.layout.world > 1:
            everyone: List[Any] = [None] * self.layout.world
            dist.all_gather_object(everyone, set(problems))
            common = set.intersection(*everyone)
            problems = {k: v for k, v in problems.items() if k in common}
        if problems:
            raise ValueError(problems[sorted(problems)[0]])
        opt = self.optimizer
        if opt is not None:
            wants_optim = any(rx.fullmatch(f"1/{t}") for rx in self._regexes for t in tails
                              if t.startswith("optim/"))
            if wants_optim and not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                raise TypeError(f"record: optimizer is {type(opt).__name__}; optim probes "
                                "(adam.m, adam.v) need torch.optim.Adam or AdamW. Leave optim "
                                "probes out of probes= for another optimizer")
            if not hasattr(opt, "register_step_pre_hook"):
                raise TypeError(f"record: optimizer {type(opt).__name__} has no step hooks "
                                "(torch >= 2.0 optimizers have); call rec.end_step() instead")

    # -- step state --

    def _begin_step(self) -> None:
        self._recording = (self._step - 1) % self.every == 0
        self._wanted: Dict[str, bool] = {}
        self._pending: List[Tuple[Dict[str, Any], torch.Tensor]] = []
        self._seq: Dict[str, int] = {}
        self._rows = 0  # batch rows (sequences) this rank has run this step
        self._mb_lo = 0
        self._seq_len = 0
        self._grads_taken = False
        self._device_copies = False  # some copies are still on their way from the device

    def _want(self, tail: str) -> Optional[str]:
        """The probe's full name when this step records it, else None."""
        if not self._recording:
            return None
        hit = self._wanted.get(tail)
        if hit is None:
            name = f"{self._step}/{tail}"
            hit = self._wanted[tail] = any(rx.fullmatch(name) for rx in self._regexes)
        return f"{self._step}/{tail}" if hit else None

    def _live(self) -> bool:
        """Forward hooks record only a training forward: not under no_grad (an evaluation), not
        while backward recomputes a checkpointed forward (its first forward was recorded)."""
        if not self._recording or self._paused:
            return False
        task = getattr(torch._C, "_current_graph_task_id", None)
        if task is not None and task() != -1:
            return False
        if torch.is_grad_enabled():
            return True
        if self._training_forward:
            self._warn("a module ran under no_grad inside a training forward (reentrant "
                       "activation checkpointing?): its probes are not recorded; checkpoint "
                       "with use_reentrant=False")
        return False

    # -- context manager --

    def __enter__(self) -> "Recorder":
        out_dir = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(out_dir, exist_ok=True)
        self._install_hooks()
        self._spill = _Spill(self._spill_path(self.layout.rank), _HOLD_BYTES)
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        for h in self._handles + self._exec_handles:
            h.remove()
        self._handles, self._exec_handles = [], []
        if self._pending:  # a step the optimizer did not end: its pieces count too
            self._flush()
            self._last_step = self._step
        spill = self._spill
        assert spill is not None, "record: __exit__ without __enter__"
        spill.close()
        if kind is not None:  # the run failed: leave no half trace behind
            _remove(spill.path)
            return
        meta = {"rank": self.layout.rank, "rows": self._rows_by_step, "pieces": self._index,
                "steps": self._last_step}
        with open(self._spill_path(self.layout.rank) + ".json", "w") as f:
            json.dump(meta, f)
        dist = _dist()
        if dist and self.layout.world > 1:
            dist.barrier()
        error = None
        if self.layout.rank == 0:
            try:
                self._write()
            except BaseException as e:  # every rank reaches the barrier below all the same
                error = e
        if dist and self.layout.world > 1:
            dist.barrier()
        if error is not None:
            raise error

    def _spill_path(self, rank: int) -> str:
        head, tail = os.path.split(os.path.abspath(self.path))
        return os.path.join(head, f".{tail}.rank{rank}.spill")

    # -- hooks --

    def _install_hooks(self) -> None:
        if self._stage is not None and hasattr(self._stage, "register_forward_context"):
            try:
                self._handles.append(self._stage.register_forward_context(self._stage_context))
            except RuntimeError as e:
                raise RuntimeError(f"record: the pipeline stage has a forward context already "
                                   f"({e}); the recorder needs its own to leave out the stage's "
                                   "metadata inference") from e
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre,
                                                                  with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._root_post))
        for name, module in self._modules:
            probes = self.map.module_probes(name)
            ins = [(s, l, op) for s, l, op in probes if s in ("in", "din")]
            outs = [(s, l, op) for s, l, op in probes if s in ("out", "dout")]
            # The input as the previous module made it (before tensor parallelism's input
            # functions redistribute it: the gradient of that tensor is the complete one).
            if ins:
                self._handles.append(module.register_forward_pre_hook(
                    self._make_pre(name, module, ins), prepend=True, with_kwargs=True))
            # The output as the next module sees it (after tensor parallelism's output functions).
            if outs:
                self._handles.append(module.register_forward_hook(
                    self._make_post(name, module, outs), with_kwargs=True))
            if any(True for _ in module.parameters(recurse=False)):
                self._exec_handles.append(module.register_forward_pre_hook(
                    self._make_exec(name)))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._opt_pre))
            self._handles.append(self.optimizer.register_step_post_hook(self._opt_post))

    @contextlib.contextmanager
    def _stage_context(self, info: Any) -> Iterator[None]:
        paused, self._paused = self._paused, bool(getattr(info, "is_metadata_inference", False))
        try:
            yield
        finally:
            self._paused = paused

    def _root_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        self._training_forward = self._live()
        if not self._training_forward:
            return
        x = _first_tensor(args, kwargs)
        if x is None or x.dim() < 1 or x.device.type == "meta":
            return
        # A microbatch: its rows follow the step's earlier ones on this rank.
        self._mb_lo = self._rows
        self._rows += int(x.shape[0])
        if x.dim() >= 2:
            self._seq_len = int(x.shape[1])

    def _root_post(self, module: Any, args: Any, output: Any) -> None:
        self._training_forward = False

    def _make_exec(self, name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            self._exec.setdefault(self.map.template(name)[0], len(self._exec))
        return hook

    def _make_pre(self, name: str, module: Any,
                  entries: List[Tuple[str, int, str]]) -> Callable[..., None]:
        def hook(mod: Any, args: Any, kwargs: Any) -> None:
            if not self._live():
                return
            x = _first_tensor(args, kwargs)
            if x is not None:
                self._take_boundary(name, module, x, entries)
        return hook

    def _make_post(self, name: str, module: Any,
                   entries: List[Tuple[str, int, str]]) -> Callable[..., None]:
        def hook(mod: Any, args: Any, kwargs: Any, output: Any) -> None:
            if not self._live():
                return
            y = _first_tensor(output)
            if y is not None:
                self._take_boundary(name, module, y, entries)
        return hook

    def _take_boundary(self, name: str, module: Any, t: torch.Tensor,
                       entries: List[Tuple[str, int, str]]) -> None:
        """A module's input or output: the activation now, its gradient through a tensor hook."""
        if t.device.type == "meta":  # a shape inference
            return
        if t.dim() < 2:
            self._warn(f"{name}: its tensor has shape {tuple(t.shape)}, not (batch, ...); "
                       "not recorded")
            return
        mb_lo = self._mb_lo
        for side, layer, op in entries:
            phase, tensor = _SIDES[side]
            probe = self._want(f"{phase}/{_layer(layer)}/{op}/{tensor}")
            if probe is None:
                continue
            where = None if _is_dtensor(t) else self._local_slab(name, module, side, t)
            if where is None and not _is_dtensor(t):
                continue
            if phase == "fwd":
                self._take_activation(probe, t, where, mb_lo, 1.0, layer, op, phase)
            elif t.requires_grad:
                step = self._step
                t.register_hook(self._make_grad_hook(probe, where, mb_lo, layer, op, step))

    def _make_grad_hook(self, probe: str, where: Any, mb_lo: int, layer: int, op: str,
                        step: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if step == self._step:  # a backward after the step ended records nothing
                self._take_activation(probe, grad, where, mb_lo, self.dinp_scale, layer, op,
                                      "bwd")
        return hook

    def _local_slab(self, name: str, module: Any, side: str,
                    t: torch.Tensor) -> Optional[Tuple[List[int], List[int]]]:
        """(lo, logical shape) of a local (not DTensor) activation, its dim 0 the microbatch's
        rows: sequence rows cut over tp when it holds fewer than the step's T (sequence
        parallelism); features cut as its module's DTensor weight is (column / row parallel);
        shard_map's function for the module first, when the user gave one."""
        shape = list(t.shape)
        lo, logical = [0] * len(shape), list(shape)
        for rx, fn in self.shard_map:
            if rx.fullmatch(name):
                for d, (a, size) in fn(side, t).items():
                    if d % len(shape) == 0:
                        raise ValueError(f"record: shard_map['{name}'] cuts dimension 0, the "
                                         "batch; the recorder places batch rows itself")
                    lo[d % len(shape)], logical[d % len(shape)] = int(a), int(size)
                return lo, logical
        if len(shape) >= 3 and self._seq_len and shape[1] != self._seq_len:
            tp = self.layout.axes.get("tp", 1)
            if shape[1] * tp != self._seq_len:
                self._warn(f"{name}: {shape[1]} sequence rows of the step's {self._seq_len} with "
                           f"tp = {tp}; pass mesh= with a tp dimension or shard_map=; not "
                           "recorded")
                return None
            lo[1], logical[1] = self.layout.coord("tp") * shape[1], self._seq_len
        wd = _feature_dim(module, side)
        weight: Any = getattr(module, "weight", None)
        if wd is not None and _is_dtensor(weight) and shape[-1] != weight.shape[wd]:
            slab = _dtensor_slab(weight)
            if slab is None or slab[1][wd] - slab[0][wd] != shape[-1]:
                self._warn(f"{name}: {shape[-1]} features, its weight's dimension {wd} is "
                           f"{weight.shape[wd]} and is not cut to match; pass shard_map=; not "
                           "recorded")
                return None
            lo[-1], logical[-1] = slab[0][wd], int(weight.shape[wd])
        return lo, logical

    def _take_activation(self, probe: str, t: Any, where: Any, mb_lo: int, scale: float,
                         layer: int, op: str, phase: str) -> None:
        if _is_dtensor(t):
            slab = _dtensor_slab(t)
            if slab is None:  # a Partial sum: made whole (a collective every peer makes too)
                t = _whole(t)
                lo, logical = [0] * t.dim(), list(t.shape)
            else:
                lo, logical, t = slab[0], list(t.shape), _local(t)
        else:
            lo, logical = where
        lo = list(lo)
        lo[0] += mb_lo
        hi = [a + n for a, n in zip(lo, t.shape)]
        cls = (0 if op == "embed" else 2) if layer < 0 else 1
        if phase == "fwd":
            hint = [cls, layer]
        else:  # backward runs the head first, the blocks from the last
            hint = [2 - cls if cls != 1 else 1, -layer]
        self._add(probe, t, lo, hi, [None] + logical[1:], hint, scale)

    def _add(self, probe: str, t: torch.Tensor, lo: List[int], hi: List[int],
             logical: Sequence[Optional[int]], hint: List[int], scale: float = 1.0,
             transpose: bool = False) -> None:
        copy = _to_host(t, scale, transpose)
        with self._lock:
            seq = self._seq.setdefault(probe, len(self._seq))
            entry = {"name": probe, "lo": lo, "hi": hi, "shape": list(logical),
                     "hint": hint + [seq]}
            self._pending.append((entry, copy))
            self._device_copies |= t.device.type != "cpu"

    def _warn(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            warnings.warn("parallax.torch: " + text, stacklevel=3)

    # -- parameters, gradients, optimizer state --

    def _params(self) -> List[Tuple[int, str, Any, bool, List[int]]]:
        """(layer, Parallax name, parameter, transposed, order hint) of every parameter. The hint
        gives Parallax's order: the embedding's, the blocks' (each block's in the order its
        modules first ran), then the rest."""
        out = []
        never = 1 << 30  # a module that never ran
        first_block = min((i for t, i in self._exec.items() if t.startswith("{l}")),
                          default=never)
        owners: Dict[int, Tuple[str, Any, str]] = {}
        for mname, m in self._modules:
            for pname, p in m.named_parameters(recurse=False):
                owners.setdefault(id(p), (mname, m, pname))
        for i, (qual, p) in enumerate(self.model.named_parameters()):
            mname, m, pname = owners.get(id(p), ("", None, qual))
            layer, name = self.map.param(_strip_name(qual))
            template = self.map.template(mname)[0]
            at = self._exec.get(template, never)
            cls = 1 if layer >= 0 else 0 if at < first_block else 2
            transposed = type(m).__name__ == "Conv1D" and pname == "weight" and p.dim() == 2
            out.append((layer, name, p, transposed, [cls, layer, at, i]))
        return out

    def _take_params(self, phase: str) -> None:
        if not self._recording:
            return
        state = getattr(self.optimizer, "state", {})
        for layer, name, p, transposed, hint in self._params():
            if phase == "grad":
                kinds = [("param", p.grad)]
            else:
                kinds = [(op, p if key is None else state.get(p, {}).get(key))
                         for op, key in _OPTIM]
            value: Any
            for k, (op, value) in enumerate(kinds):
                probe = self._want(f"{phase}/{_layer(layer)}/{op}/{name}")
                if probe is None or not isinstance(value, torch.Tensor):
                    continue
                slab = _dtensor_slab(value) if _is_dtensor(value) else None
                if slab is not None:  # FSDP2's and tp's shards
                    (lo, hi), local = slab, _local(value)
                else:  # a plain tensor, or a DTensor made whole (every peer of its mesh too)
                    local = _whole(value) if _is_dtensor(value) else value
                    lo, hi = [0] * local.dim(), list(local.shape)
                logical = list(value.shape)
                if transposed:
                    lo, hi, logical = lo[::-1], hi[::-1], logical[::-1]
                self._add(probe, local.detach(), list(lo), list(hi), logical,
                          ([k] if phase == "optim" else []) + hint, transpose=transposed)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._grads_taken:
            self._take_params("grad")
            self._grads_taken = True

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._take_params("optim")
        self.end_step()

    # -- the user's calls --

    def grads_ready(self) -> None:
        """Take the step's gradients now (call it after the last backward, before clipping);
        otherwise they are taken when optimizer.step() begins."""
        self._take_params("grad")
        self._grads_taken = True

    def scalar(self, name: str, value: Any) -> None:
        """A scalar probe of this step, shape (1,): `name` is phase/layer/op/tensor, e.g.
        "grad/-/clip/norm" (clip_grad_norm_'s result). Every rank calls it (a DTensor norm is
        made whole, a collective)."""
        if name.count("/") != 3:
            raise ValueError(f"record: scalar name '{name}' is not phase/layer/op/tensor "
                             "(e.g. 'grad/-/clip/norm')")
        probe = self._want(name)
        if probe is None:
            return
        if _is_dtensor(value):
            value = _whole(value)
        t = value.detach().reshape(1) if isinstance(value, torch.Tensor) else \
            torch.tensor([float(value)], dtype=torch.float32)
        phase = name.split("/")[0]
        hint = [3, 0, 0] if phase == "grad" else [len(_OPTIM), 3, 0, 0] if phase == "optim" \
            else [3, 0]
        self._add(probe, t, [0], [1], [1], hint)

    def activation(self, name: str, value: torch.Tensor) -> None:
        """A batch-shaped probe of the current microbatch that no module boundary gives, e.g.
        ("fwd/-/loss/out", the per-token losses (B, T)); dim 0 its rows, placed as the model's."""
        if name.count("/") != 3:
            raise ValueError(f"record: activation name '{name}' is not phase/layer/op/tensor "
                             "(e.g. 'fwd/-/loss/out')")
        probe = self._want(name)
        if probe is None:
            return
        phase, layer, op, _ = name.split("/")
        lo = [self._mb_lo] + [0] * (value.dim() - 1)
        hi = [a + n for a, n in zip(lo, value.shape)]
        layer_i = -1 if layer == "-" else int(layer)
        cls = (0 if op == "embed" else 2) if layer_i < 0 else 1
        hint = [cls, layer_i] if phase == "fwd" else [2 - cls if cls != 1 else 1, -layer_i]
        self._add(probe, value, lo, hi, [None] + list(value.shape[1:]), hint)

    def end_step(self) -> None:
        """Ends the step (the optimizer's step ends it by itself): its gradients are taken if
        they were not yet, its pieces go to disk, the next step begins."""
        if not self._grads_taken:
            self._take_params("grad")
        if self._rows:
            self._rows_by_step[self._step] = self._rows
        if self._pending:
            self._flush()
        self._last_step = self._step
        for h in self._exec_handles:  # the order modules run in is known after one step
            h.remove()
        self._exec_handles = []
        self._step += 1
        self._begin_step()

    def flush(self) -> None:
        """Writes the pieces of the steps ended so far and waits until they are on disk (they are
        otherwise held in memory up to 512 MiB, then written behind the run)."""
        if self._spill is not None:
            self._spill.drain()

    @property
    def step(self) -> int:
        """The 1-based step being run."""
        return self._step

    def _flush(self) -> None:
        ready = None
        if self._device_copies:
            ready = torch.cuda.Event()
            ready.record()
        arrays = [c.numpy() for _, c in self._pending]
        assert self._spill is not None, "record: pieces taken outside its with block"
        offsets = self._spill.put(arrays, ready)
        for (entry, _), off in zip(self._pending, offsets):
            entry["offset"] = off
            entry["step"] = int(entry["name"].split("/", 1)[0])
            self._index.append(entry)
        if self._rows:
            self._rows_by_step[self._step] = self._rows
        self._pending, self._device_copies = [], False

    # -- rank 0: the file --

    def _write(self) -> None:
        ranks = []
        for r in range(self.layout.world):
            path = self._spill_path(r)
            if not os.path.exists(path + ".json"):
                raise FileNotFoundError(
                    f"record: rank {r}'s pieces ({path}) are not there; every rank must see the "
                    "output's folder (a shared file system)")
            with open(path + ".json") as f:
                meta = json.load(f)
            size = os.path.getsize(path)
            meta["data"] = np.memmap(path, dtype=np.float32, mode="r") if size else \
                np.zeros(0, np.float32)
            ranks.append(meta)
        try:
            probes, order, pieces, replicas = _assemble(ranks, self.layout)
            steps = max([m["steps"] for m in ranks] + [0])
            attrs = {"config": "", "patterns": "\n".join(self.patterns), "stride": self.every,
                     "steps": steps, "source": "torch", "precision": self.precision,
                     "layout": self.layout.to_json()}
            write_trace(self.path, probes, order, attrs, pieces, replicas)
        finally:
            for m in ranks:
                m["data"] = None
            for r in range(self.layout.world):
                _remove(self._spill_path(r))
                _remove(self._spill_path(r) + ".json")


def record(model: Any, path: Union[str, "os.PathLike[str]"], *, optimizer: Any = None,
           probes: Sequence[str] = ("**",), every: int = 1,
           name_map: Optional[Dict[str, Any]] = None, layer_offset: int = 0, mesh: Any = None,
           precision: str = "fp32",
           shard_map: Optional[Dict[str, Callable[..., Dict[int, Tuple[int, int]]]]] = None,
           dinp_scale: Optional[float] = None) -> Recorder:
    """Records a training run of `model` to the trace `path` (use it in a `with` block).

    optimizer: its step hooks end each step (grads before the step unless grads_ready() took
      them; params and Adam's moments after); torch.optim.Adam/AdamW for optim probes.
    probes: globs over step/phase/layer/op/tensor, as Parallax's; every: record steps 1,
      1 + every, ...
    name_map: {module name: op or {side: op}} for the user's own modules ({l}: the layer
      index; sides out, in, dout, din; see docs/torch.md); default: transformers' GPT-2 or
      Llama/Qwen3 (LLAMA_MAP, GPT2_MAP). layer_offset: added to every layer (a pipeline stage
      whose blocks are numbered from 0).
    mesh: a DeviceMesh over the world, dimensions named among dp, fsdp, tp, pp; without one,
      dp = the world size.
    precision: the run's compute precision, "fp32", "bf16", "fp16" or "fp8" (the trace's).
    shard_map: {module name glob: fn(side, local tensor) -> {dim: (lo, logical size)}} where a
      local activation is cut in a way its module's weight does not tell.
    dinp_scale: multiplies every bwd probe; default 1 / (dp · fsdp), since each batch shard's
      loss is the mean over its own rows and DDP and FSDP average the gradients.
    Raises ValueError / TypeError naming a bad argument before any hook is placed."""
    return Recorder(model, path, optimizer=optimizer, probes=probes, every=every,
                    name_map=name_map, layer_offset=layer_offset, mesh=mesh,
                    precision=precision, shard_map=shard_map, dinp_scale=dinp_scale)


def _layer(layer: int) -> str:
    return "-" if layer < 0 else str(layer)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _to_host(t: torch.Tensor, scale: float = 1.0, transpose: bool = False) -> torch.Tensor:
    """A float32, contiguous, host copy of t (widened exactly from bf16 / fp16; fp64 rounds)
    that later in-place updates cannot touch. A device tensor is copied into pinned memory
    without blocking; the spill writer waits for it."""
    t = t.detach()
    if transpose:
        t = t.t()
    if t.device.type == "cpu":
        out = t.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    else:
        t = t.to(torch.float32).contiguous()
        out = torch.empty(t.shape, dtype=torch.float32, pin_memory=True)
        out.copy_(t, non_blocking=True)
    if scale != 1.0:
        out.mul_(scale)
    return out


# ---- rank 0: assembling the pieces --------------------------------------------------------------

_Replicas = Dict[Tuple[str, int], Tuple[List[int], List[int], np.ndarray]]


def _assemble(ranks: List[Dict[str, Any]], layout: _Layout) -> Tuple[
        Dict[str, np.ndarray], List[str], List[str], _Replicas]:
    """Every probe's logical tensor from every rank's pieces (the lowest rank holding an element
    gives it); the pieces that disagree, per rank; /pieces' lines; the probes' order."""
    # Batch rows: a probe's dim 0 holds batch shard 0's rows of the step, then shard 1's, ...;
    # each shard's count is its lowest rank's (every tp / pp peer of it runs the same rows).
    rows: Dict[int, Dict[int, int]] = {}
    for r, meta in enumerate(ranks):
        shard = layout.batch_shard(r)
        for step, n in meta["rows"].items():
            rows.setdefault(int(step), {}).setdefault(shard, n)
    offsets = {s: {sh: sum(n for k, n in by.items() if k < sh) for sh in by}
               for s, by in rows.items()}
    totals = {s: sum(by.values()) for s, by in rows.items()}

    by_probe: Dict[str, List[Tuple[int, Dict[str, Any]]]] = {}
    first: Dict[str, Tuple] = {}
    for r, meta in enumerate(ranks):
        for k, e in enumerate(meta["pieces"]):
            by_probe.setdefault(e["name"], []).append((r, e))
            first.setdefault(e["name"], (e["hint"], r, k))

    def key(name: str) -> Tuple:
        step, phase = name.split("/")[:2]
        return (int(step), _PHASES.index(phase) if phase in _PHASES else 4, first[name])

    order = sorted(by_probe, key=key)
    probes: Dict[str, np.ndarray] = {}
    replicas: Dict[Tuple[str, int], List[Tuple[List[int], List[int], np.ndarray]]] = {}
    lines: List[str] = []
    for name in order:
        placed = []
        for r, e in by_probe[name]:
            lo, hi, shape = list(e["lo"]), list(e["hi"]), list(e["shape"])
            if shape[0] is None:  # batch rows of this rank's shard
                step, shard = e["step"], layout.batch_shard(r)
                off = offsets.get(step, {}).get(shard, 0)
                lo[0] += off
                hi[0] += off
                shape[0] = totals.get(step, hi[0])
            n = int(np.prod([b - a for a, b in zip(lo, hi)]))
            data = ranks[r]["data"][e["offset"]:e["offset"] + n].reshape(
                [b - a for a, b in zip(lo, hi)])
            placed.append((r, lo, hi, shape, data))
        shape = placed[0][3]
        for r, lo, hi, s, _ in placed:
            if s != shape:
                raise RuntimeError(f"record: probe {name} has logical shape {shape} on rank "
                                   f"{placed[0][0]} but {s} on rank {r}")
        out = np.zeros(shape, np.float32)
        held = np.zeros(shape, bool)
        for r, lo, hi, _, data in sorted(placed, key=lambda x: x[0]):
            where = tuple(slice(a, b) for a, b in zip(lo, hi))
            view, got = out[where], held[where]
            view[~got] = data[~got]
            held[where] = True
            lines.append(f"{name}\t{r}\t{','.join(map(str, lo))}\t{','.join(map(str, hi))}")
        if not held.all():
            warnings.warn(f"parallax.torch: probe {name}: {int((~held).sum())} of {held.size} "
                          "elements are held by no rank; written as NaN")
            out[~held] = np.nan
        for r, lo, hi, _, data in placed:
            where = tuple(slice(a, b) for a, b in zip(lo, hi))
            if not np.array_equal(out[where].view(np.uint32), data.view(np.uint32)):
                replicas.setdefault((name, r), []).append((lo, hi, data))
        probes[name] = out
    # A rank's disagreeing pieces of a probe as one slab: their bounding box, the rank's values
    # where it holds them, the logical tensor's elsewhere.
    merged: _Replicas = {}
    for (name, r), parts in replicas.items():
        lo = [min(p[0][d] for p in parts) for d in range(len(parts[0][0]))]
        hi = [max(p[1][d] for p in parts) for d in range(len(parts[0][1]))]
        box = probes[name][tuple(slice(a, b) for a, b in zip(lo, hi))].copy()
        for plo, phi, data in parts:
            box[tuple(slice(a - b0, c - b0) for a, c, b0 in zip(plo, phi, lo))] = data
        merged[(name, r)] = (lo, hi, box)
    return probes, order, lines, merged


# ---- the file -----------------------------------------------------------------------------------

def _text(value: str) -> np.ndarray:
    """A fixed-length ASCII string attribute, as Parallax writes them (never zero-sized)."""
    raw = value.encode("utf-8")
    return np.array(raw, dtype=f"S{max(len(raw), 1)}")


def write_trace(path: str, probes: Dict[str, np.ndarray], order: Sequence[str],
                attrs: Dict[str, Any], pieces: Sequence[str] = (),
                replicas: Optional[_Replicas] = None) -> None:
    """A golden trace (validators/trace.h) at `path`, atomically (a temporary file beside it,
    renamed): root attributes format, format_version, created and `attrs` (strings as fixed-length
    ASCII, ints as int64), /order, /probes/<name> float32 with their checksums, /pieces and
    /replicas/<name>/<rank> (attributes lo, hi, checksum) when given."""
    import h5py  # type: ignore[import-untyped]  # h5py ships no type stubs
    head, tail = os.path.split(os.path.abspath(path))
    tmp = os.path.join(head, f".{tail}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w", libver=("earliest", "v110")) as f:
            f.attrs.create("format", _text("parallax-trace"))
            f.attrs.create("format_version", np.int64(1))
            created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            f.attrs.create("created", _text(created))
            for k, v in attrs.items():
                f.attrs.create(k, _text(v) if isinstance(v, str) else np.int64(v))
            text = "\n".join(order).encode() or b"\n"
            f.create_dataset("order", data=np.frombuffer(text, np.uint8))
            for name in order:
                d = f.create_dataset("probes/" + name, data=probes[name])
                d.attrs.create("checksum", np.uint64(checksum_f32(probes[name])))
            if pieces:
                f.create_dataset("pieces", data=np.frombuffer("\n".join(pieces).encode(),
                                                              np.uint8))
            for (name, rank), (lo, hi, data) in sorted((replicas or {}).items()):
                d = f.create_dataset(f"replicas/{name}/{rank}", data=data)
                d.attrs.create("lo", np.asarray(lo, np.int64))
                d.attrs.create("hi", np.asarray(hi, np.int64))
                d.attrs.create("checksum", np.uint64(checksum_f32(data)))
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
