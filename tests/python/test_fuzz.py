"""The fuzz suite: seeded, bounded in time. It mutates job configs (keys, values, types, TOML text,
--set), llm.c token files, llm.c GPT-2 checkpoints, HDF5 checkpoints and Hugging Face folders
(GPT-2, Llama and Qwen3-MoE ones: config.json's keys, RoPE's parameters and text,
model.safetensors' bytes), and runs `parallax train`, `validate`,
`inspect`, `convert` and resumes on them with tiny models. Every run must end
within a per-case time limit, by exit 0 or a code of the documented exit-code table
(docs/faults.md) other than the internal error (1, "a bug in Parallax"), never by a signal or a
sanitizer report; and a bad-input exit (2) must name a config key or a file.

Environment: PARALLAX_EXE (the executable), PARALLAX_FUZZ_SEED (default below, printed),
PARALLAX_FUZZ_BUDGET_S (wall-clock budget of the whole suite, default 75 s),
PARALLAX_FUZZ_CASES (at most this many cases), PARALLAX_FUZZ_CASE_TIMEOUT_S (default 30 s),
PARALLAX_FUZZ_ONLY (run only these case numbers, comma-separated: a failure prints its number).
Case i draws everything from Random(f"{seed}:{i}"), so it is the same case in any run."""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import time
import tomllib
from pathlib import Path
import random

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

SEED = int(os.environ.get("PARALLAX_FUZZ_SEED", "20240612"))
BUDGET_S = float(os.environ.get("PARALLAX_FUZZ_BUDGET_S", "75"))
MAX_CASES = int(os.environ.get("PARALLAX_FUZZ_CASES", "1000000"))
CASE_TIMEOUT_S = float(os.environ.get("PARALLAX_FUZZ_CASE_TIMEOUT_S", "30"))
ONLY = [int(x) for x in os.environ.get("PARALLAX_FUZZ_ONLY", "").split(",") if x.strip()]

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PAGE = ROOT / "docs" / "config.md"  # the key tables (made from the key registry)
TOKEN_MAGIC, CKPT_MAGIC = 20240520, 20240326


# ---- what the docs promise ---------------------------------------------------------------------

def readme_keys():
    """{"model.vocab": "int ≥ 2", ...} from docs/config.md's key tables."""
    body = CONFIG_PAGE.read_text()
    keys, section = {}, None
    for line in body.splitlines():
        m = re.match(r"### `\[(\w+)\]`", line)
        if m:
            section = m.group(1)
            continue
        cells = [c.strip() for c in line.split("|")]
        if section and len(cells) > 3 and cells[1].startswith("`"):
            for name in re.findall(r"`(\w+)`", cells[1]):
                keys[f"{section}.{name}"] = cells[2]
    return keys


def readme_exit_codes():
    """The documented exit codes, and those that mean a bug (the internal error): the table of
    the docs page that holds it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = next(p.read_text() for p in pages if "| code | meaning |" in p.read_text())
    table = text[text.index("| code | meaning |"):]
    codes, bugs = set(), set()
    for line in table.splitlines()[2:]:
        m = re.match(r"\| `(\d+)` \| ([^|]*)\|", line)
        if not m:
            break
        code = int(m.group(1))
        codes.add(code)
        if "internal error" in m.group(2):
            bugs.add(code)
    return codes, bugs


KEYS = readme_keys()
CODES, BUG_CODES = readme_exit_codes()


# ---- TOML ----------------------------------------------------------------------------------------

class Raw(str):
    """TOML text written as it is (a date, an integer out of range, garbage)."""


def toml_value(v):
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        out = '"'
        for ch in v:
            if ch in '"\\':
                out += "\\" + ch
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out += "\\u%04X" % ord(ch)
            else:
                out += ch
        return out + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def toml_text(cfg):
    out = []
    for section, table in cfg.items():
        if not isinstance(table, dict):
            out.append(f"{section} = {toml_value(table)}")
            continue
        out.append(f"[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(out) + "\n"


# ---- the base inputs -----------------------------------------------------------------------------

def base_config(d):
    """A tiny job (runs in well under a second) whose inputs live in d."""
    return {
        "model": {"vocab": 16, "seq_len": 8, "layers": 2, "heads": 2, "hidden": 8, "ffn": 32},
        "layout": {"timeout_s": 5.0},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 1, "val_batches": 1, "threads": 1,
                  "warmup_steps": 1, "max_memory_gib": 2.0},
        "numerics": {"block": 8},
        "output": {"dir": "out", "run_file": False, "progress": False},
    }


def token_file(path, tokens):
    header = [0] * 256
    header[:3] = [TOKEN_MAGIC, 1, len(tokens)]
    Path(path).write_bytes(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-base")
    rng = random.Random(SEED)
    token_file(d / "train.bin", [rng.randrange(16) for _ in range(600)])
    token_file(d / "val.bin", [rng.randrange(16) for _ in range(300)])
    cfg = base_config(d)
    (d / "job.toml").write_text(toml_text(cfg))
    r = subprocess.run([EXE, "train", str(d / "job.toml"), "--quiet", "--set",
                        f"output.export_llmc={d / 'gpt.bin'}", "--set", f"checkpoint.dir={d / 'ck'}",
                        "--set", "output.run_file=true", "--set", f"output.dir={d / 'out'}"],
                       capture_output=True, text=True, timeout=120, cwd=d)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([EXE, "record", str(d / "job.toml"), "--out", str(d / "trace.h5"), "--steps",
                        "2"], capture_output=True, text=True, timeout=120, cwd=d)
    assert r.returncode == 0, r.stderr
    ckpts = sorted((d / "ck").glob("ckpt-*.h5"))
    assert ckpts, "the base run wrote no checkpoint"
    shutil.copy(ckpts[-1], d / "ckpt.h5")
    r = subprocess.run([EXE, "convert", str(d / "ckpt.h5"), "--to", str(d / "hf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # The llama family's folders: one training step of each model, its checkpoint converted.
    for name, model in HF_LLAMA_MODELS.items():
        cfg = base_config(d)
        cfg["model"] = dict(model)
        (d / f"{name}.toml").write_text(toml_text(cfg))
        r = subprocess.run([EXE, "train", str(d / f"{name}.toml"), "--quiet", "--set",
                            "train.steps=1", "--set", f"checkpoint.dir={d / name}-ck"],
                           capture_output=True, text=True, timeout=120, cwd=d)
        assert r.returncode == 0, r.stderr
        ckpt = sorted((d / f"{name}-ck").glob("ckpt-*.h5"))[-1]
        r = subprocess.run([EXE, "convert", str(ckpt), "--to", str(d / name)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    os.mkfifo(d / "fifo")
    (d / "folder").mkdir()
    return d


# The llama family's tiny models whose Hugging Face folders the hf cases mutate too: a
# LlamaForCausalLM (grouped-query attention, Llama 3.1's RoPE scaling, a tied head) and a
# Qwen3MoeForCausalLM (per-head q and k norms, a dense layer and a MoE layer of stacked experts).
HF_LLAMA_MODELS = {
    "hf_llama": {"arch": "llama", "vocab": 16, "seq_len": 8, "layers": 2, "heads": 2,
                 "hidden": 8, "ffn": 12, "kv_heads": 1, "norm_eps": 1e-6, "rope_theta": 10000.0,
                 "rope_factor": 8.0, "rope_original_max_positions": 4, "tie_embeddings": True},
    "hf_qwen3_moe": {"arch": "llama", "vocab": 16, "seq_len": 8, "layers": 2, "heads": 2,
                     "hidden": 8, "ffn": 12, "kv_heads": 1, "head_dim": 4, "qk_norm": True,
                     "moe_experts": 2, "moe_top_k": 1, "moe_ffn": 6, "moe_every": 2,
                     "moe_capacity_factor": 0.0, "moe_z_loss": 0.0},
}


# ---- value pools ---------------------------------------------------------------------------------

INTS = [-(2 ** 63), -1, 0, 1, 2, 3, 4, 7, 8, 16, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 32 + 1,
        10 ** 8, 10 ** 9, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1]
FLOATS = [-1.0, 0.0, 1e-300, 1e-9, 0.5, 0.999999, 1.0, 3.0, 1e300, math.inf, -math.inf, math.nan]
STRINGS = ["", "x", "auto", "bitwise", "fast", "none", "full", "gpipe", "1f1b", "interleaved",
           "canonical", "ring", "markov", "bin", "fp32", "bf16", "avx512", "scalar", "kill",
           "stall", "flip_grad", "flip_weight", "wte", "h.0.attn.c_attn.weight", "é" * 3, "a" * 300,
           "../..", "line\nbreak"]
WRONG_TYPES = [Raw("1979-05-27"), Raw("07:32:00"), [1, 2], {"a": 1}, "12", True, 1.5, 3,
               Raw("99999999999999999999"), Raw("0x7fffffffffffffff"), Raw("1e99999")]

# Keys whose in-range values could make a legitimate run long: only small values or ones the
# limits refuse (a run of 2^31 steps is no bug).
SPECIAL = {
    "train.steps": [-1, 0, 1, 2, 3, 2 ** 32 + 1, 2 ** 62, 2 ** 63 - 1],
    "train.val_batches": [-1, 0, 1, 2, 3, 10 ** 9, 2 ** 32 + 1, 2 ** 62],
    "train.eval_every": [-1, 0, 1, 2, 10 ** 9, 2 ** 63 - 1],
    "train.threads": [-1, 0, 1, 2, 3, 64, 1025, 100000, 2 ** 63 - 1],
    "train.max_memory_gib": [-1.0, math.nan, math.inf, 1e-6, 0.01, 1.0],
    "layout.timeout_s": [-1.0, 0.0, math.nan, math.inf, 1e-9, 0.5, 3.0],
    "fault.stall_s": [-1.0, 0.0, 0.2, math.nan, math.inf],
    "fault.step": [-1, 0, 1, 2, 3, 2 ** 63 - 1],
    "checkpoint.every": [-1, 0, 1, 2, 2 ** 62],
    "checkpoint.keep": [-1, 0, 1, 2, 2 ** 62],
    # Orders up to the table's limit of 2^24 entries are legitimate but take seconds to draw.
    "data.markov_order": [-1, 0, 1, 2, 3, 100, 2 ** 62],
}
INPUT_KEYS = {"data.train_path", "data.val_path", "model.init_from", "checkpoint.resume"}
OUTPUT_KEYS = {"output.export_llmc", "output.dir", "checkpoint.dir"}


def key_type(key):
    t = KEYS[key]
    if t.startswith("int"):
        return "int"
    if t.startswith("float"):
        return "float"
    if t.startswith("bool"):
        return "bool"
    return "string"


def input_pool(base, case):
    return ["", str(base / "train.bin"), str(base / "val.bin"), str(base / "gpt.bin"),
            str(base / "ckpt.h5"), str(base / "fifo"), str(base / "folder"), "/dev/zero",
            "/dev/null", str(base / "missing.bin"), str(case / "new"), "/proc/self/nothing/x",
            "auto"]


def output_pool(base, case):
    """Paths a run may write: never the base inputs (other cases read them) nor a device (a
    regression could replace /dev/null), but copies of them, a FIFO and folders of the case."""
    copy = case / rng_name(case)
    if not copy.exists():
        src = base / copy.name
        if src.is_file():
            shutil.copy(src, copy)
    fifo = case / "out-fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    return ["", str(copy), str(fifo), str(case), str(case / "new"), str(case / "a" / "b" / "w.bin"),
            "/proc/self/nothing/x", "out"]


def rng_name(case):
    return random.Random(str(case)).choice(["gpt.bin", "ckpt.h5", "train.bin"])


def random_value(rng, key, base, case):
    if rng.random() < 0.15:
        return rng.choice(WRONG_TYPES)
    if key in SPECIAL:
        return rng.choice(SPECIAL[key])
    if key in INPUT_KEYS:
        return rng.choice(input_pool(base, case))
    if key in OUTPUT_KEYS:
        return rng.choice(output_pool(base, case))
    kind = key_type(key)
    if kind == "int":  # half the time small values, which pass the range checks and run
        return rng.choice(INTS) if rng.random() < 0.5 else rng.randint(0, 9)
    if kind == "float":
        return rng.choice(FLOATS + [rng.uniform(-2, 2)])
    if kind == "bool":
        return rng.choice([True, False])
    quoted = re.findall(r'"(\w+)"', KEYS[key])  # the documented allowed values, and others
    return rng.choice(quoted + STRINGS if quoted else STRINGS)


# ---- mutations -----------------------------------------------------------------------------------

def mutate_config(rng, cfg, base, case):
    """Applies 1-3 mutations to the config dict; returns (what, sets, text_mutation)."""
    what, sets = [], []
    for _ in range(rng.choice([1, 1, 2, 3])):
        op = rng.random()
        key = rng.choice(sorted(KEYS))
        section, name = key.split(".")
        if not isinstance(cfg.get(section, {}), dict):
            cfg[section] = {}  # an earlier mutation made it a value
        if op < 0.55:
            v = random_value(rng, key, base, case)
            cfg.setdefault(section, {})[name] = v
            what.append(f"{key} = {toml_value(v)}")
        elif op < 0.65:
            v = random_value(rng, key, base, case)
            if isinstance(v, (dict, list)) or (isinstance(v, str) and "\n" in v):
                v = 1
            sets.append(f"{key}={toml_value(v) if not isinstance(v, str) or rng.random() < 0.5 else v}")
            what.append(f"--set {sets[-1]}")
        elif op < 0.72:
            cfg.get(section, {}).pop(name, None)
            what.append(f"removed {key}")
        elif op < 0.78:
            bogus = rng.choice([f"{name}x", f"{name[:-1]}", "nonsense"])
            cfg.setdefault(section, {})[bogus] = 1
            what.append(f"unknown key {section}.{bogus}")
        elif op < 0.82:
            cfg[rng.choice(["modle", "extra", "Model"])] = {"vocab": 3}
            what.append("unknown section")
        elif op < 0.86:
            cfg[section] = rng.choice([1, "x", [1]])
            what.append(f"[{section}] as a value")
        elif op < 0.90:
            sets.append(rng.choice(["train", "=", "train.=1", ".x=1", "model.vocab", "a.b.c=1",
                                    "model.vocab==3", "train.lr=", "model.layers=[1,"]))
            what.append(f"malformed --set {sets[-1]}")
        else:
            what.append("text")
    return what, sets


def mutate_text(rng, text):
    op = rng.randrange(4)
    if op == 0 and text:
        return text[:rng.randrange(len(text))], "truncated"
    if op == 1 and text:
        b = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return b.decode("utf-8", "replace"), "bytes flipped"
    if op == 2:
        return text + rng.choice(["[model]\nvocab = 3\n", "x = \n", "[[train]]\n", "\x00\x01",
                                  '"unterminated\n', "[train]\nsteps = 1\n"]), "appended"
    lines = text.splitlines()
    if lines:
        lines.insert(rng.randrange(len(lines) + 1), lines[rng.randrange(len(lines))])
    return "\n".join(lines) + "\n", "a line duplicated"


def interesting_i32(rng):
    return rng.choice([-(2 ** 31), -1, 0, 1, 2, 3, 5, 7, 8, 15, 16, 17, 127, 128, 1024, 50257,
                       2 ** 20, 2 ** 30, 2 ** 31 - 1])


def mutate_bytes(rng, data, header_ints=256):
    """Header fields, truncation, appended bytes, flipped bytes, NaNs: (new bytes, what)."""
    b = bytearray(data)
    op = rng.randrange(6)
    if op <= 1:
        i = rng.randrange(8)
        v = interesting_i32(rng)
        b[4 * i:4 * i + 4] = struct.pack("<i", v)
        return bytes(b), f"header[{i}] = {v}"
    if op == 2:
        n = rng.randrange(len(b))
        return bytes(b[:n]), f"truncated to {n} bytes"
    if op == 3:
        n = rng.choice([1, 2, 4, 1024])
        return bytes(b) + bytes(rng.randrange(256) for _ in range(n)), f"{n} bytes appended"
    if op == 4 and len(b) > 4 * header_ints + 4:
        at = 4 * header_ints + 4 * rng.randrange((len(b) - 4 * header_ints) // 4)
        b[at:at + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -math.inf, 1e38]))
        return bytes(b), f"float at byte {at} non-finite or huge"
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b), "bytes flipped"


def mix64(x):
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def checksum(arr):
    """The checkpoint's per-dataset checksum (core/io/checkpoint.h), over 4- or 8-byte elements."""
    import numpy as np
    a = np.ascontiguousarray(arr)
    bits = a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64).ravel()
    s = 0
    for i, b in enumerate(bits.tolist()):
        s = (s + mix64(mix64(i ^ 0x5058434B50543031) ^ b)) & 0xFFFFFFFFFFFFFFFF
    return s


def mutate_h5(rng, path):
    """Bytes (flips, truncation, appended) or, with h5py, the structure: a dataset's shape, extent,
    dtype, presence, attributes. Returns what was done."""
    try:
        import h5py
        import numpy as np
    except ImportError:
        h5py = None
    if h5py is None or rng.random() < 0.45:
        data, what = mutate_bytes(rng, path.read_bytes(), header_ints=2)
        path.write_bytes(data)
        return what
    with h5py.File(path, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        name = rng.choice(sorted(names))
        op = rng.randrange(6)
        old = f[name]
        attrs = dict(old.attrs)
        if op == 0:  # another shape, with a checksum that matches the new data
            shape = tuple(rng.choice([0, 1, 2, 3, 7, 9, 64]) for _ in range(rng.choice([1, 2, 2, 3])))
            data = np.asarray(np.random.default_rng(rng.randrange(2 ** 32)).standard_normal(shape),
                              dtype=old.dtype)
            del f[name]
            f.create_dataset(name, data=data)
            f[name].attrs["checksum"] = np.uint64(checksum(data))
            return f"/{name} reshaped to {shape}"
        if op == 1:  # an extent no file holds (never written: chunked, no storage)
            dtype = old.dtype
            del f[name]
            f.create_dataset(name, shape=(2 ** rng.choice([31, 40, 50]),), dtype=dtype, chunks=(1024,))
            for k, v in attrs.items():
                f[name].attrs[k] = v
            return f"/{name} given a huge extent"
        if op == 2:
            del f[name]
            return f"/{name} deleted"
        if op == 3:  # another dtype, same values and checksum attribute
            data = old[()]
            del f[name]
            f.create_dataset(name, data=np.asarray(data, dtype=rng.choice(["f8", "i4", "u1", "f2"])))
            for k, v in attrs.items():
                f[name].attrs[k] = v
            return f"/{name} given another dtype"
        if op == 4:
            key = rng.choice(["step", "format_version", "seed", "config", "format"])
            f.attrs[key] = rng.choice([np.int64(-1), np.int64(2 ** 62), b"x", np.float64(1.5)])
            return f"root attribute {key} changed"
        old.attrs["checksum"] = np.uint64(rng.randrange(2 ** 64))
        return f"/{name} checksum attribute changed"


# ---- one case ------------------------------------------------------------------------------------

class Case:
    def __init__(self, n, root, base):
        self.n = n
        self.rng = random.Random(f"{SEED}:{n}")
        self.dir = root / f"case-{n}"
        self.dir.mkdir()
        self.base = base
        self.files = []  # inputs a bad-input message may name
        self.what = []
        self.args = []
        self.text_mutated = False

    def config_file(self, cfg, text=None):
        p = self.dir / "job.toml"
        p.write_text(text if text is not None else toml_text(cfg))
        self.files.append(p)
        return p


def kind_of(rng):
    return rng.choices(["config", "tokens", "llmc", "h5", "hf"], weights=[50, 12, 13, 13, 12])[0]


HF_VALUES = [None, True, False, 0, -1, 1, 2, 3, 8, 16, 32, 2 ** 31, 2 ** 40, 2 ** 63 - 1, 10 ** 30,
             -(2 ** 63), 0.5, 1e-05, 1e-06, 8.0, 0.0, -4.0, 1e300, "", "gelu_new", "gelu", "silu",
             "gpt2", "llama", "qwen3", "qwen3_moe", "default", "llama3", "yarn", "GPT2LMHeadModel",
             [], [0], ["full_attention"], ["GPT2LMHeadModel"], ["LlamaForCausalLM"],
             ["Qwen3ForCausalLM"], ["Qwen3MoeForCausalLM"], {}, {"rope_type": "llama3"},
             {"type": "linear", "factor": 2.0}, [[[]]]]


def mutate_hf(rng, folder):
    """config.json's keys (values of other types and sizes, keys removed, unknown keys) or text,
    or model.safetensors' bytes (its header above all, truncation, non-finite floats). Returns
    what was done."""
    cfg, st = folder / "config.json", folder / "model.safetensors"
    op = rng.randrange(6)
    if op <= 1:
        doc = json.loads(cfg.read_text())
        obj, at = doc, ""
        if isinstance(doc.get("rope_parameters"), dict) and rng.random() < 0.3:
            obj, at = doc["rope_parameters"], "rope_parameters."  # RoPE's keys inside it
        key = rng.choice(sorted(obj))
        if op == 0:
            obj[key] = rng.choice(HF_VALUES)
            what = f"config.json {at}{key} = {json.dumps(obj[key])}"
        else:
            del obj[key]
            what = f"config.json without {at}{key}"
        cfg.write_text(json.dumps(doc, indent=2))
        return what
    if op == 2:
        text, how = mutate_text(rng, cfg.read_text())
        cfg.write_text(text)
        return f"config.json {how}"
    b = bytearray(st.read_bytes())
    header = 8 + struct.unpack("<Q", bytes(b[:8]))[0]
    if op == 3:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(min(header, len(b)))] = rng.randrange(256)
        st.write_bytes(bytes(b))
        return "model.safetensors header bytes flipped"
    if op == 4:
        n = rng.randrange(len(b))
        st.write_bytes(bytes(b[:n]))
        return f"model.safetensors truncated to {n} bytes"
    at = header + 4 * rng.randrange((len(b) - header) // 4)
    b[at:at + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -math.inf]))
    st.write_bytes(bytes(b))
    return f"model.safetensors float at byte {at} non-finite"


def layouts(rng):
    parts = ["dp2", "tp2", "pp2", "dp2xz3", "dp2xtp2", "mb2", "sp", "z1", "dp3", "tp3", "dp0",
             "xx", "", "dp2xdp2", "pp2xmb4", "dp4096", "tp2xsp"]
    return ",".join(rng.choice(parts) for _ in range(rng.randint(1, 2)))


def build_case(case):
    rng, base, d = case.rng, case.base, case.dir
    cfg = base_config(base)
    cfg["output"]["dir"] = str(d / "out")
    kind = kind_of(rng)
    case.kind = kind
    if kind == "config":
        what, sets = mutate_config(rng, cfg, base, d)
        case.what += what
        text = toml_text(cfg)
        if "text" in what:
            text, how = mutate_text(rng, text)
            case.what.append(f"config text {how}")
            case.text_mutated = True
        cfg_path = case.config_file(cfg, text)
        # A run stays short: when the text lost train.steps (the default is 600 steps) or
        # layout.timeout_s (a stall would wait 60 s), they are set on the command line.
        try:
            doc = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, ValueError):
            doc = None
        if doc is not None:
            for section, key, value in (("train", "steps", 2), ("layout", "timeout_s", 5.0)):
                table = doc.get(section)
                if table is None or (isinstance(table, dict) and key not in table):
                    sets.insert(0, f"{section}.{key}={value}")
        for table in cfg.values():  # every path the config names
            for v in table.values() if isinstance(table, dict) else []:
                if isinstance(v, str) and "/" in v:
                    case.files.append(Path(v))
        if rng.random() < 0.8:
            case.args = ["train", str(cfg_path), "--quiet"]
        else:
            case.args = ["validate", str(cfg_path), "--steps", "2", "--layouts", layouts(rng)]
        for s in sets:
            case.args += ["--set", s]
            if "/" in s:
                case.files.append(Path(s.split("=", 1)[-1].strip('"')))
        return
    if kind == "tokens":
        which = rng.choice(["train", "val"])
        src = base / f"{which}.bin"
        dst = d / f"{which}.bin"
        data, how = mutate_bytes(rng, src.read_bytes())
        if rng.random() < 0.15:  # a token past the vocabulary
            b = bytearray(src.read_bytes())
            at = 1024 + 2 * rng.randrange((len(b) - 1024) // 2)
            b[at:at + 2] = struct.pack("<H", rng.choice([16, 255, 65535]))
            data, how = bytes(b), "a token >= model.vocab"
        dst.write_bytes(data)
        case.what.append(f"{which} token file: {how}")
        other = base / ("val.bin" if which == "train" else "train.bin")
        cfg["data"] = {"source": "bin", "train_path": str(dst if which == "train" else other),
                       "val_path": str(dst if which == "val" else other)}
        case.files += [dst, other]
        case.args = ["train", str(case.config_file(cfg)), "--quiet"]
        return
    if kind == "llmc":
        dst = d / "gpt.bin"
        data, how = mutate_bytes(rng, (base / "gpt.bin").read_bytes())
        dst.write_bytes(data)
        case.files.append(dst)
        case.what.append(f"llm.c checkpoint: {how}")
        if rng.random() < 0.6:
            case.args = ["convert", str(dst), "--to", str(d / "out.h5")]
        else:
            cfg["model"]["init_from"] = str(dst)
            case.args = ["train", str(case.config_file(cfg)), "--quiet"]
        return
    if kind == "hf":
        which = rng.choice(["hf", *HF_LLAMA_MODELS])
        if which in HF_LLAMA_MODELS:
            cfg["model"] = dict(HF_LLAMA_MODELS[which])
        dst = d / "hf"
        shutil.copytree(base / which, dst)
        case.what.append(f"{which} folder")
        case.what.append(mutate_hf(rng, dst))
        case.files += [dst, dst / "config.json", dst / "model.safetensors"]
        op = rng.randrange(5)
        if op <= 2:
            case.args = ["convert", str(dst if op else dst / "model.safetensors"), "--to",
                         str(d / "out.h5")]
        elif op == 3:
            case.args = ["convert", str(dst), "--to", str(d / "out.bin")]
        else:
            cfg["model"]["init_from"] = str(dst)
            case.args = ["train", str(case.config_file(cfg)), "--quiet"]
        return
    # an HDF5 file: a checkpoint mostly, else a golden trace or the run file a resume continues
    op = rng.randrange(6)
    if op >= 4:
        cfg["train"]["steps"] = 3
        if op == 4:
            dst = d / "trace.h5"
            shutil.copy(base / "trace.h5", dst)
            case.args = ["validate", str(case.config_file(cfg)), "--golden", str(dst), "--layouts",
                         rng.choice(["dp2", "tp2", "pp2", "dp2xz3"])]
        else:
            dst = d / "out" / "run.h5"
            dst.parent.mkdir()
            shutil.copy(base / "out" / "run.h5", dst)
            cfg["output"].update({"run_file": True, "dir": str(dst.parent)})
            cfg["checkpoint"] = {"dir": str(d / "ck"), "resume": str(base / "ckpt.h5")}
            case.args = ["train", str(case.config_file(cfg)), "--quiet"]
        case.what.append(f"{dst.name}: " + mutate_h5(rng, dst))
        case.files.append(dst)
        return
    dst = d / "ckpt-00000002.h5"
    shutil.copy(base / "ckpt.h5", dst)
    case.what.append("checkpoint: " + mutate_h5(rng, dst))
    case.files.append(dst)
    if op == 0:
        case.args = ["inspect", str(dst if rng.random() < 0.7 else d)]
    elif op == 1:
        case.args = ["convert", str(dst), "--to", str(d / "out.bin")]
    elif op == 2:  # resume, with the config the checkpoint was written with
        cfg["train"]["steps"] = 3
        cfg["checkpoint"] = {"dir": str(d / "ck"), "resume": str(dst)}
        case.args = ["train", str(case.config_file(cfg)), "--quiet"]
    else:
        cfg["model"]["init_from"] = str(dst)
        case.args = ["train", str(case.config_file(cfg)), "--quiet"]


def names_something(case, err):
    """A bad-input message names a config key, an input file, or the option at fault."""
    if any(k in err for k in KEYS):
        return True
    # A structural error of the config file (TOML syntax, an unknown section or key, a section
    # that is not a table) names the file and the line.
    if str(case.dir / "job.toml") in err and re.search(r"\bline \d+", err):
        return True
    for f in case.files:
        if f == case.dir / "job.toml" and not case.text_mutated:
            continue  # every config error names the config file: not enough by itself
        if str(f) in err or (f.name and f.name in err):
            return True
    return any(o in err for o in ["--set", "--layouts", "--to", "--steps", "layout dp", "layout tp",
                                  "layout pp", "layout "])


def run_case(case):
    """None when the case behaves, else a description of the failure."""
    t0 = time.monotonic()
    try:
        r = subprocess.run([EXE, *case.args], capture_output=True, text=True, errors="replace",
                           timeout=CASE_TIMEOUT_S, cwd=case.dir)
    except subprocess.TimeoutExpired:
        return f"did not end within {CASE_TIMEOUT_S:.0f} s", time.monotonic() - t0
    dt = time.monotonic() - t0
    err = r.stderr
    rc = r.returncode
    if rc < 0:
        return f"died of signal {-rc}\n{err[-3000:]}", dt
    if "Sanitizer" in err or "runtime error:" in err:
        return f"a sanitizer reported (exit {rc})\n{err[-6000:]}", dt
    if rc in BUG_CODES or rc not in CODES:
        return f"exit {rc} (not a documented code, or the internal error)\n{err[-3000:]}", dt
    if rc == 2 and not names_something(case, err):
        return f"exit 2 without naming a key or file:\n{err[-3000:]}", dt
    if rc not in (0, 6) and not err.strip():
        return f"exit {rc} without a message", dt
    return None, dt


def test_fuzz(base, tmp_path, capsys):
    assert KEYS and CODES, "the config keys (docs/config.md) or exit codes were not found"
    t0 = time.monotonic()
    failures, counts, slowest, slowest_case = [], {}, 0.0, -1
    numbers = ONLY or range(MAX_CASES)
    done = 0
    for n in numbers:
        if not ONLY and time.monotonic() - t0 > BUDGET_S:
            break
        case = Case(n, tmp_path, base)
        build_case(case)
        problem, dt = run_case(case)
        if dt > slowest:
            slowest, slowest_case = dt, n
        done += 1
        counts[case.kind] = counts.get(case.kind, 0) + 1
        if problem:
            failures.append(f"case {n} ({case.kind}: {'; '.join(case.what)})\n  parallax "
                            + " ".join(case.args) + f"\n  {problem}")
        else:
            shutil.rmtree(case.dir, ignore_errors=True)
    elapsed = time.monotonic() - t0
    with capsys.disabled():
        print(f"\nfuzz: seed {SEED}, {done} cases ("
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
              + f") in {elapsed:.1f} s, the slowest {slowest:.2f} s (case {slowest_case}), "
              + f"{len(failures)} failed"
              + f" (reproduce one: PARALLAX_FUZZ_SEED={SEED} PARALLAX_FUZZ_ONLY=<case>)")
    assert not failures, f"{len(failures)} of {done} fuzz cases failed:\n\n" + "\n\n".join(failures[:20])
