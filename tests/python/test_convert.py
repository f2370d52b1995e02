"""`parallax convert` between llm.c GPT-2 checkpoints (.bin) and Parallax checkpoints (.h5), and
`model.init_from` taking either: round trips are byte-identical, the tensors are llm.c's floats,
runs started from either file are bit-identical, and bad input is exit code 2 naming the file."""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

STEPS = 3
COMMON = ["--quiet", "--set", f"train.steps={STEPS}", "--set", "train.eval_every=0",
          "--set", "train.batch_size=8", "--set", "model.seq_len=64", "--set", "model.layers=2",
          "--set", "train.threads=1"]

# llm.c's parameter tensors in file order: (name, shape in units of (L, C)), see checkpoint_llmc.h.
LAYER_TENSORS = [("ln_1.weight", lambda C: (C,)), ("ln_1.bias", lambda C: (C,)),
                 ("attn.c_attn.weight", lambda C: (3 * C, C)), ("attn.c_attn.bias", lambda C: (3 * C,)),
                 ("attn.c_proj.weight", lambda C: (C, C)), ("attn.c_proj.bias", lambda C: (C,)),
                 ("ln_2.weight", lambda C: (C,)), ("ln_2.bias", lambda C: (C,)),
                 ("mlp.c_fc.weight", lambda C: (4 * C, C)), ("mlp.c_fc.bias", lambda C: (4 * C,)),
                 ("mlp.c_proj.weight", lambda C: (C, 4 * C)), ("mlp.c_proj.bias", lambda C: (C,))]


def run(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True)


def parse_llmc(path):
    """An llm.c GPT-2 checkpoint: (header ints, {Parallax name: float32 array}, padding rows of wte)."""
    raw = np.fromfile(path, dtype="<i4", count=256)
    assert raw[0] == 20240326 and raw[1] == 3
    maxT, V, L, NH, C, Vp = (int(x) for x in raw[2:8])
    floats = np.fromfile(path, dtype="<f4", offset=256 * 4)
    out, pos = {}, 0

    def take(shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = floats[pos:pos + n].reshape(shape)
        pos += n
        return a

    wte = take((Vp, C))
    out["wte"], pad = wte[:V], wte[V:]
    out["wpe"] = take((maxT, C))
    for suffix, shape in LAYER_TENSORS:
        for i in range(L):
            out[f"h.{i}.{suffix}"] = take(shape(C))
    out["ln_f.weight"] = take((C,))
    out["ln_f.bias"] = take((C,))
    assert pos == floats.size, "the file has more floats than its header says"
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp), out, pad


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A few steps of the tiny default GPT: its llm.c export, its final checkpoint and its dump."""
    d = tmp_path_factory.mktemp("convert")
    r = run("train", *COMMON, "--set", f"output.export_llmc={d / 'trained.bin'}",
            "--set", f"checkpoint.dir={d / 'ck'}", "--out", str(d / "o"), "--dump", str(d / "dump.h5"))
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def converted(trained):
    """trained.bin -> trained.h5."""
    h5 = trained / "trained.h5"
    r = run("convert", str(trained / "trained.bin"), "--to", str(h5))
    assert r.returncode == 0, r.stderr
    return h5


def test_bin_h5_bin_round_trip_is_byte_identical(trained, converted, tmp_path):
    back = tmp_path / "back.bin"
    r = run("convert", str(converted), "--to", str(back))
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == (trained / "trained.bin").read_bytes()
    assert not [p for p in os.listdir(tmp_path) if "tmp" in p], "a temporary file was left behind"


def test_converted_checkpoint_holds_llmc_floats_and_a_fresh_state(trained, converted):
    r = run("inspect", str(converted))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step:     0" in r.stdout and "history:  empty" in r.stdout

    hdr, ref, pad = parse_llmc(trained / "trained.bin")
    assert (hdr["V"], hdr["L"], hdr["NH"], hdr["C"], hdr["maxT"]) == (32, 2, 4, 64, 64)
    assert hdr["Vp"] == 128 and not pad.any(), "export_llmc pads the vocabulary with zero rows"
    got = datasets(converted)
    model = {k[len("model/"):]: v for k, v in got.items() if k.startswith("model/")}
    assert model.keys() == ref.keys()
    for name, a in ref.items():
        b = model[name]
        assert b.dtype == np.float32 and b.shape == a.shape, name
        assert a.tobytes() == b.tobytes(), f"/model/{name} differs from the .bin's floats"
    # The same weights the training run ended with (its dump), bit for bit.
    dump = datasets(trained / "dump.h5")
    for name, a in model.items():
        assert a.tobytes() == dump[f"weights/{name}"].tobytes(), name
    for k, v in got.items():
        if k.startswith("optim/"):
            assert not v.any(), f"/{k} is not zero"
    with h5py.File(converted, "r") as f:
        assert f.attrs["step"] == 0 and f["optim"].attrs["adam_step"] == 0
        assert f["history/step"].shape == (0,)
        assert f["data"].attrs["source"].decode().startswith("converted from llm.c trained.bin")
        config = f.attrs["config"].decode()
        for line in ["vocab = 32", "seq_len = 64", "layers = 2", "heads = 4", "hidden = 64", "ffn = 256"]:
            assert line in config, line


def test_training_checkpoint_converts_to_the_runs_own_llmc_export(trained, tmp_path):
    ckpt = trained / "ck" / f"ckpt-{STEPS:08d}.h5"
    out = tmp_path / "from_ckpt.bin"
    r = run("convert", str(ckpt), "--to", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (trained / "trained.bin").read_bytes()


@pytest.mark.parametrize("layout", [[], ["layout.pp=2", "layout.microbatches=2"], ["layout.tp=2", "numerics.block=32"]])
def test_init_from_h5_and_bin_give_identical_runs(trained, converted, tmp_path, layout):
    # Both files go under the same name (init_from goes by the content, not the extension), so
    # even the config stored in the dumps is the same: every dataset and attribute is equal, all
    # but the dump's `created` time stamp.
    weights = tmp_path / "weights"
    extra = [a for kv in layout for a in ("--set", kv)]
    args = ["train", *COMMON, *extra, "--set", "train.seed=5", "--set", f"model.init_from={weights}",
            "--out", str(tmp_path / "o")]
    dumps = []
    for source in [converted, trained / "trained.bin"]:
        shutil.copyfile(source, weights)
        dumps.append(tmp_path / f"dump-{source.suffix[1:]}.h5")
        r = run(*args, "--dump", str(dumps[-1]))
        assert r.returncode == 0, r.stderr
    a, b = datasets(dumps[0]), datasets(dumps[1])
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
    with h5py.File(dumps[0], "r") as fa, h5py.File(dumps[1], "r") as fb:
        attrs = lambda f: {k: v for k, v in f.attrs.items() if k != "created"}
        assert attrs(fa) == attrs(fb) and f"init_from = \"{weights}\"" in fa.attrs["config"]
    # ... and they did start from the file: a random start ends elsewhere.
    r = run("train", *COMMON, *extra, "--set", "train.seed=5", "--out", str(tmp_path / "o"),
            "--dump", str(tmp_path / "fresh.h5"))
    assert r.returncode == 0, r.stderr
    a, b = datasets(dumps[0]), datasets(tmp_path / "fresh.h5")
    assert a["weights/wte"].tobytes() != b["weights/wte"].tobytes()


def test_init_from_takes_the_first_rows_of_a_longer_wpe(trained, converted, tmp_path):
    # The checkpoint's seq_len is 64; a model of 32 positions takes its first 32 rows, as from llm.c.
    dumps = []
    for source in [converted, trained / "trained.bin"]:
        d = tmp_path / f"{source.suffix[1:]}.h5"
        r = run("train", *COMMON, "--set", "model.seq_len=32", "--set", f"model.init_from={source}",
                "--out", str(tmp_path / "o"), "--dump", str(d))
        assert r.returncode == 0, r.stderr
        dumps.append(datasets(d))
    assert dumps[0].keys() == dumps[1].keys()
    for k in dumps[0]:
        assert dumps[0][k].tobytes() == dumps[1][k].tobytes(), k


def expect_bad_input(r, *names):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    for n in names:
        assert str(n) in r.stderr, (n, r.stderr)


def test_truncated_bin_is_refused_and_out_untouched(trained, tmp_path):
    data = (trained / "trained.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:len(data) // 2])
    out = tmp_path / "out.h5"
    out.write_bytes(b"previous contents")
    expect_bad_input(run("convert", str(cut), "--to", str(out)), cut, "truncated")
    assert out.read_bytes() == b"previous contents"
    assert sorted(os.listdir(tmp_path)) == ["cut.bin", "out.h5"]


def test_corrupt_h5_is_refused_by_convert_and_init_from(converted, tmp_path):
    bad = tmp_path / "bad.h5"
    shutil.copyfile(converted, bad)
    with h5py.File(bad, "r") as f:
        offset = f["model/h.1.mlp.c_fc.weight"].id.get_offset()
    with open(bad, "r+b") as f:
        f.seek(offset + 101)
        byte = f.read(1)
        f.seek(offset + 101)
        f.write(bytes([byte[0] ^ 0x10]))
    out = tmp_path / "out.bin"
    expect_bad_input(run("convert", str(bad), "--to", str(out)), bad, "h.1.mlp.c_fc.weight", "checksum")
    assert not out.exists()
    expect_bad_input(run("train", *COMMON, "--set", f"model.init_from={bad}", "--out", str(tmp_path / "o")),
                     bad, "checksum")


def test_wrong_extension_and_wrong_input_kind(trained, converted, tmp_path):
    expect_bad_input(run("convert", str(trained / "trained.bin"), "--to", str(tmp_path / "out.txt")),
                     tmp_path / "out.txt", ".h5", ".bin")
    expect_bad_input(run("convert", str(trained / "trained.bin"), "--to", str(tmp_path / "x.bin")),
                     trained / "trained.bin", "already an llm.c checkpoint")
    expect_bad_input(run("convert", str(converted), "--to", str(tmp_path / "x.h5")),
                     converted, "already a Parallax checkpoint")
    expect_bad_input(run("convert", str(tmp_path / "missing.bin"), "--to", str(tmp_path / "x.h5")),
                     tmp_path / "missing.bin")
    bf16 = tmp_path / "bf16.bin"  # llm.c's bf16 checkpoints are version 5: not read, and said so
    data = bytearray((trained / "trained.bin").read_bytes())
    data[4:8] = (5).to_bytes(4, "little")
    bf16.write_bytes(bytes(data))
    expect_bad_input(run("convert", str(bf16), "--to", str(tmp_path / "x.h5")), bf16, "version 5", "fp32")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a checkpoint at all")
    expect_bad_input(run("train", *COMMON, "--set", f"model.init_from={junk}", "--out", str(tmp_path / "o")),
                     junk, "model.init_from")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("x.")]


def test_init_from_shape_mismatch_names_file_key_and_both_values(trained, converted, tmp_path):
    for source in [converted, trained / "trained.bin"]:
        r = run("train", *COMMON, "--set", "model.layers=3", "--set", f"model.init_from={source}",
                "--out", str(tmp_path / "o"))
        expect_bad_input(r, source, "model.layers", "2", "3")
    r = run("train", *COMMON, "--set", "model.hidden=32", "--set", "model.ffn=128",
            "--set", f"model.init_from={converted}", "--out", str(tmp_path / "o"))
    expect_bad_input(r, converted, "model.hidden = 64", "model.ffn = 256")


def test_resume_of_a_converted_checkpoint_points_to_init_from(converted, tmp_path):
    r = run("train", *COMMON, "--set", f"checkpoint.resume={converted}", "--out", str(tmp_path / "o"))
    expect_bad_input(r, converted, "converted from llm.c", "model.init_from")


def test_non_gpt2_checkpoint_cannot_become_llmc(tmp_path):
    r = run("train", *COMMON, "--set", "train.steps=1", "--set", "model.ffn=128",
            "--set", f"checkpoint.dir={tmp_path / 'ck'}", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    ckpt = tmp_path / "ck" / "ckpt-00000001.h5"
    expect_bad_input(run("convert", str(ckpt), "--to", str(tmp_path / "x.bin")), ckpt, "model.ffn = 128")
    assert not (tmp_path / "x.bin").exists()


def test_help_describes_both_directions():
    r = run("convert", "--help")
    assert r.returncode == 0
    assert "--to" in r.stdout and ".h5" in r.stdout and ".bin" in r.stdout and "init_from" in r.stdout
