"""Inputs that once reached a hang, an allocation failure or a crash instead of a sentence: a FIFO
(or a device, or a folder) given as a file, sizes that are in range but absurd, an llm.c header or
an HDF5 dataset that claims more than its file holds, more threads than a process can start. Each
must end at once with exit 2 and a message that names the key or the file."""
import os
import struct
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

TINY = ["--quiet", "--set", "train.steps=2", "--set", "train.threads=1", "--set", "model.seq_len=8",
        "--set", "model.vocab=16", "--set", "model.hidden=8", "--set", "model.heads=2",
        "--set", "model.ffn=32", "--set", "model.layers=1", "--set", "numerics.block=8",
        "--set", "train.batch_size=2", "--set", "train.eval_every=0"]


def run(tmp_path, *args, timeout=60):
    try:
        return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"parallax {' '.join(args)} did not end within {timeout} s")


def refused(r, *words):
    assert r.returncode == 2, f"exit {r.returncode}: {r.stdout}{r.stderr}"
    for w in words:
        assert w in r.stderr, r.stderr


def train(tmp_path, *sets, extra=()):
    args = ["train", *TINY, "--out", str(tmp_path / "out")]
    for s in sets:
        args += ["--set", s]
    return run(tmp_path, *args, *extra)


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def token_file(path, n=100):
    path.write_bytes(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + bytes(2 * n))


# ---- what is not a regular file -------------------------------------------------------------------

def test_fifo_as_token_file(tmp_path, fifo):
    refused(train(tmp_path, "data.source=bin", f"data.train_path={fifo}"),
            str(fifo), "data.train_path", "FIFO")


def test_fifo_as_validation_token_file(tmp_path, fifo):
    token_file(tmp_path / "t.bin")
    refused(train(tmp_path, "data.source=bin", f"data.train_path={tmp_path / 't.bin'}",
                  f"data.val_path={fifo}", "train.eval_every=1"),
            str(fifo), "data.val_path", "FIFO")


@pytest.mark.parametrize("path", ["/dev/zero", "{tmp}"])
def test_device_or_folder_as_token_file(tmp_path, path):
    path = path.format(tmp=tmp_path)
    refused(train(tmp_path, "data.source=bin", f"data.train_path={path}"), path,
            "data.train_path", "not a regular file")


def test_fifo_as_config_file(tmp_path, fifo):
    refused(run(tmp_path, "train", str(fifo)), str(fifo), "FIFO")


def test_fifo_as_checkpoint_to_resume(tmp_path, fifo):
    refused(train(tmp_path, f"checkpoint.dir={tmp_path / 'ck'}", f"checkpoint.resume={fifo}"),
            str(fifo), "FIFO")


def test_fifo_as_weights_to_start_from(tmp_path, fifo):
    refused(train(tmp_path, f"model.init_from={fifo}"), str(fifo), "model.init_from", "FIFO")


def test_fifo_to_inspect_and_convert(tmp_path, fifo):
    refused(run(tmp_path, "inspect", str(fifo)), str(fifo), "FIFO")
    refused(run(tmp_path, "convert", str(fifo), "--to", str(tmp_path / "x.h5")), str(fifo), "FIFO")


def test_fifo_as_golden_trace(tmp_path, fifo):
    refused(run(tmp_path, "validate", *TINY[1:], "--layouts", "dp2", "--golden", str(fifo),
                "--set", f"output.dir={tmp_path / 'v'}"),
            str(fifo), "FIFO")


@pytest.mark.parametrize("how", ["--dump", "output.export_llmc"])
def test_fifo_or_device_as_an_output_is_not_replaced(tmp_path, fifo, how):
    """A rename over a FIFO or a device would replace it (as root, /dev/null itself)."""
    extra = ["--dump", str(fifo)] if how == "--dump" else []
    sets = [f"output.export_llmc={fifo}"] if how != "--dump" else []
    refused(train(tmp_path, *sets, extra=extra), str(fifo), how, "FIFO")
    assert fifo.is_fifo()


# ---- sizes in range but absurd --------------------------------------------------------------------

@pytest.mark.parametrize("key,value,words", [
    ("train.batch_size", 100000000, ["train.batch_size = 100000000 makes it too big",
                                     "activations"]),
    ("train.val_batches", 1000000000, ["train.val_batches = 1000000000 makes it too big",
                                       "validation losses"]),
    ("model.layers", 100000000, ["model.layers = 100000000 makes it too big"]),
])
def test_a_job_too_big_for_memory_is_refused_before_allocating(tmp_path, key, value, words):
    r = train(tmp_path, f"{key}={value}", "train.eval_every=1")
    refused(r, *words, "it would fit")
    assert "summary" not in r.stdout


def test_sizes_whose_products_overflow_name_the_key(tmp_path):
    r = train(tmp_path, "model.seq_len=9223372036854775000")
    refused(r, "model.seq_len = 9223372036854775000 is out of range")
    assert "[0,-" not in r.stderr and "of -" not in r.stderr  # no overflowed sizes in the sentence


def test_more_threads_than_a_process_can_start(tmp_path):
    refused(train(tmp_path, "train.threads=100000"), "train.threads = 100000", "1024")
    # In range per rank, but 64 in-process ranks of 1024 threads each.
    refused(train(tmp_path, "layout.dp=64", "train.batch_size=64", "train.threads=1024"),
            "train.threads = 1024", "64 ranks", "65536 threads")


def test_validate_refuses_a_layout_too_big_before_listing_its_token_ranges(tmp_path):
    """2^30 microbatches of one token each: the layout's tables (a token range per microbatch,
    the schedule) would need hundreds of GiB; the memory estimate refuses it first."""
    refused(run(tmp_path, "validate", *TINY[1:], "--layouts", "dp2", "--set",
                "train.batch_size=2147483646", "--set", "train.microbatches=1073741823",
                "--set", "model.seq_len=1", "--set", "numerics.block=1", "--set",
                f"output.dir={tmp_path / 'v'}", timeout=30),
            "layout dp2", "bookkeeping", "makes it too big")


# ---- files that claim more than they hold ---------------------------------------------------------

@pytest.fixture(scope="module")
def llmc(tmp_path_factory):
    d = tmp_path_factory.mktemp("llmc")
    r = subprocess.run([EXE, "train", *TINY, "--set", "output.run_file=false", "--set",
                        f"output.export_llmc={d / 'gpt.bin'}"], capture_output=True, text=True,
                       timeout=120, cwd=d)
    assert r.returncode == 0, r.stderr
    return (d / "gpt.bin").read_bytes()


@pytest.mark.parametrize("fields", [{4: 2 ** 31 - 1}, {3: 2 ** 31 - 1, 7: 2 ** 31 - 1},
                                    {6: 2 ** 30}, {2: 2 ** 31 - 1}, {7: 2 ** 31 - 1},
                                    {1: 1, 3: 2 ** 31 - 1}])
def test_llmc_header_claiming_huge_sizes(tmp_path, llmc, fields):
    """Layers, vocabulary, channels, positions (header ints 4, 3 with 7, 6, 2, 7; version 1
    without a padded vocabulary): the header is checked against the file's size before anything
    is sized by it."""
    b = bytearray(llmc)
    for field, value in fields.items():
        b[4 * field:4 * field + 4] = struct.pack("<i", value)
    bad = tmp_path / "gpt.bin"
    bad.write_bytes(bytes(b))
    refused(run(tmp_path, "convert", str(bad), "--to", str(tmp_path / "out.h5"), timeout=20),
            str(bad), "its header", "truncated")
    assert not (tmp_path / "out.h5").exists()
    refused(train(tmp_path, f"model.init_from={bad}"), str(bad))


def test_checkpoint_dataset_larger_than_its_file(tmp_path):
    """An HDF5 dataset whose extent was never written (a chunked one) may claim terabytes: the
    reader compares each dataset with the file before sizing anything by it."""
    h5py = pytest.importorskip("h5py")
    ck = tmp_path / "ck"
    r = train(tmp_path, f"checkpoint.dir={ck}")
    assert r.returncode == 0, r.stderr
    path = sorted(ck.glob("ckpt-*.h5"))[-1]
    with h5py.File(path, "r+") as f:
        attrs = dict(f["history/step"].attrs)
        del f["history/step"]
        f.create_dataset("history/step", shape=(2 ** 40,), dtype="i8", chunks=(1024,))
        for k, v in attrs.items():
            f["history/step"].attrs[k] = v
    for args in (["inspect", str(path)], ["convert", str(path), "--to", str(tmp_path / "o.bin")]):
        refused(run(tmp_path, *args, timeout=30), str(path), "/history/step",
                "more than the whole file")
    refused(train(tmp_path, f"checkpoint.dir={ck}", f"checkpoint.resume={path}",
                  "train.steps=3"), str(path), "/history/step")


# ---- sizes that reach the kernels -----------------------------------------------------------------

def test_a_block_longer_than_any_reduction_is_one_chain(tmp_path):
    """numerics.block = 1e9: every reduction is one block. The vector kernels' gathers index a
    group of 16 blocks with 32-bit offsets, which overflowed (UBSan: signed overflow in
    block_reduce_n); such blocks are summed one at a time, the same chain, so the weights equal
    those of a block that is merely longer than every reduction (2^20) bit for bit."""
    out = {}
    for block in (1000000000, 1 << 20):
        w = tmp_path / f"w{block}.bin"
        r = train(tmp_path, f"numerics.block={block}", f"output.export_llmc={w}",
                  "output.run_file=false")
        assert r.returncode == 0, r.stderr
        out[block] = w.read_bytes()
    assert out[1000000000] == out[1 << 20]


def huge_extent(f, name):
    """Replaces dataset `name` by one of the same dtype and attributes whose extent (2^40
    elements) was never written: it takes no room in the file."""
    attrs, dtype = dict(f[name].attrs), f[name].dtype
    del f[name]
    f.create_dataset(name, shape=(2 ** 40,), maxshape=(None,), dtype=dtype, chunks=(1024,))
    for k, v in attrs.items():
        f[name].attrs[k] = v


def test_run_file_with_a_huge_extent_is_moved_aside_on_resume(tmp_path):
    """A resume reopens the run file to continue it; a metric claiming 2^40 rows was read into
    memory (std::bad_alloc). It is damage: the file is moved aside, as any damaged run file."""
    h5py = pytest.importorskip("h5py")
    out, ck = tmp_path / "out", tmp_path / "ck"
    r = train(tmp_path, "output.run_file=true", f"checkpoint.dir={ck}")
    assert r.returncode == 0, r.stderr
    with h5py.File(out / "run.h5", "r+") as f:
        huge_extent(f, "metrics/loss/step")
        huge_extent(f, "metrics/loss/value")
    r = train(tmp_path, "output.run_file=true", f"checkpoint.dir={ck}", "checkpoint.resume=auto",
              "train.steps=3")
    assert r.returncode == 0, r.stderr
    assert "more than the whole file" in r.stderr and (out / "run.h5.damaged").exists()
    with h5py.File(out / "run.h5", "r") as f:
        assert list(f["metrics/loss/step"][()]) == [1, 2, 3]


def test_trace_with_a_huge_extent(tmp_path):
    h5py = pytest.importorskip("h5py")
    trace = tmp_path / "ref.h5"
    r = run(tmp_path, "record", *TINY[1:], "--out", str(trace), "--steps", "2")
    assert r.returncode == 0, r.stderr
    with h5py.File(trace, "r+") as f:
        probes = []
        f["probes"].visititems(lambda n, o: probes.append(n) if isinstance(o, h5py.Dataset) else None)
        huge_extent(f, "probes/" + probes[0])
    refused(run(tmp_path, "validate", *TINY[1:], "--layouts", "dp2", "--golden", str(trace),
                "--set", f"output.dir={tmp_path / 'v'}"),
            str(trace), "more than the whole file")


# ---- outputs of validate and record --------------------------------------------------------------

def test_validate_and_record_check_their_outputs_before_they_run(tmp_path, fifo):
    """validate wrote its reports only after every layout had run, and a folder that could not
    be made ended in a filesystem_error (exit 1); record wrote its trace after the run."""
    r = run(tmp_path, "validate", *TINY[1:], "--steps", "2", "--layouts", "dp2", "--out", str(fifo))
    refused(r, 'output.dir = "' + str(fifo), "not a folder")
    assert "dp2:" not in r.stderr  # refused before the first layout ran
    (tmp_path / "f").write_text("x")
    refused(run(tmp_path, "validate", *TINY[1:], "--steps", "2", "--layouts", "dp2", "--json",
                str(tmp_path / "f" / "v.json"), "--out", str(tmp_path / "v")),
            '--json = "' + str(tmp_path / "f" / "v.json"))
    r = run(tmp_path, "record", *TINY[1:], "--steps", "2", "--out", str(tmp_path / "f" / "t.h5"))
    refused(r, '--out = "' + str(tmp_path / "f" / "t.h5"))
    assert "trace " not in r.stdout


@pytest.mark.parametrize("damage", ["superblock", "contiguous", "dtype"])
def test_damaged_run_file_is_moved_aside_on_resume(tmp_path, damage):
    """Found by the fuzz suite: a run file HDF5 opens read-only but not for writing (a superblock
    field changed), or a series that cannot be extended (contiguous) or holds another type, was
    an internal error (exit 1) on resume. Damage: moved aside, and the run goes on."""
    h5py = pytest.importorskip("h5py")
    import numpy as np
    out, ck = tmp_path / "out", tmp_path / "ck"
    r = train(tmp_path, "output.run_file=true", f"checkpoint.dir={ck}")
    assert r.returncode == 0, r.stderr
    path = out / "run.h5"
    if damage == "superblock":
        b = bytearray(path.read_bytes())
        b[8:12] = struct.pack("<i", 15)
        path.write_bytes(bytes(b))
    else:
        with h5py.File(path, "r+") as f:
            rows = f["metrics/loss/step"][()]
            del f["metrics/loss/step"]
            f.create_dataset("metrics/loss/step",
                             data=rows if damage == "contiguous" else rows.astype(np.float64))
    r = train(tmp_path, "output.run_file=true", f"checkpoint.dir={ck}", "checkpoint.resume=auto",
              "train.steps=3")
    assert r.returncode == 0, r.stderr
    assert (out / "run.h5.damaged").exists(), r.stderr
    with h5py.File(path, "r") as f:
        assert list(f["metrics/loss/step"][()]) == [1, 2, 3]


def test_a_checkpoint_to_resume_that_is_missing_names_the_key(tmp_path):
    """Found by the fuzz suite: checkpoint.resume = 3 said only "checkpoint 3: does not exist"."""
    refused(train(tmp_path, "checkpoint.resume=3"), 'checkpoint.resume = "3"', "does not exist")
