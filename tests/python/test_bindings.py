"""The Python module `parallax` (bindings/): configs built as --set builds them, jobs stepped from
Python on every layout, state as numpy views of the library's memory, bit-for-bit agreement with
the CLI's --dump, errors as Python exceptions, interruption by Ctrl-C, validation, schedules,
checkpoints and run files."""
import _thread
import ast
import inspect
import os
import pydoc
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import parallax

ROOT = Path(__file__).resolve().parents[2]
EXE = os.environ.get("PARALLAX_EXE", str(ROOT / "build" / "app" / "parallax"))

# A small job: the default model with 2 layers on 64-token sequences, one OpenMP thread per rank.
SMALL = dict(model={"seq_len": 64, "layers": 2}, train={"steps": 10, "threads": 1, "eval_every": 5},
             numerics={"block": 32})


def small(**over):
    sections = {k: dict(v) for k, v in SMALL.items()}
    for k, v in over.items():
        sections.setdefault(k, {}).update(v)
    return sections


def same_bits(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


# ---- configs and errors -------------------------------------------------------------------


def test_module_is_this_tree_and_version_matches_the_cli():
    assert Path(parallax.__file__).resolve().parent == (ROOT / "bindings" / "python" / "parallax")
    assert Path(parallax._core.__file__).resolve().parent == (ROOT / "build" / "bindings").resolve()
    out = subprocess.run([EXE, "--version"], capture_output=True, text=True, check=True).stdout
    assert parallax.__version__ in out


def test_a_config_from_a_dict_keywords_dotted_keys_and_toml_is_the_same(tmp_path):
    a = parallax.Config({"train": {"lr": 1e-3, "steps": 7}, "layout": {"dp": 2}})
    b = parallax.Config(train={"lr": 1e-3, "steps": 7}, layout={"dp": 2})
    c = parallax.Config({"train.lr": 1e-3, "train.steps": 7, "layout.dp": 2})
    path = tmp_path / "job.toml"
    path.write_text(a.toml)
    d = parallax.Config(path)
    assert a.toml == b.toml == c.toml == d.toml
    assert d["train.lr"] == 1e-3 and d["layout"]["dp"] == 2
    assert parallax.Config("examples/tiny.toml" if Path("examples/tiny.toml").exists()
                           else ROOT / "examples" / "tiny.toml")["model.hidden"] == 64
    assert a.override(layout={"tp": 2})["layout.tp"] == 2 and a["layout.tp"] == 1
    assert set(parallax.config_keys()) >= {"train.lr", "layout.zero", "numerics.block"}


@pytest.mark.parametrize("sections, words", [
    ({"train": {"lr": -1}}, ["train.lr", "out of range"]),
    ({"train": {"lrr": 1}}, ["train.lrr"]),
    ({"train": {"steps": "many"}}, ["train.steps"]),
    ({"nosuch": {"x": 1}}, ["nosuch"]),
    ({"train": {"lr": [1, 2]}}, ["train.lr", "list"]),
    ({"train": 5}, ["train", "dict"]),
])
def test_bad_values_raise_config_error_naming_the_key(sections, words):
    with pytest.raises(parallax.ConfigError) as e:
        parallax.Config(**sections)
    assert isinstance(e.value, ValueError) and isinstance(e.value, parallax.ParallaxError)
    for w in words:
        assert w in str(e.value)


def test_a_layout_the_job_cannot_take_is_refused_before_any_rank_starts():
    with pytest.raises(parallax.ConfigError, match="layout.tp=3"):
        parallax.Job(layout={"tp": 3})
    with pytest.raises(parallax.ConfigError, match="train.batch_size"):
        parallax.layout(layout={"dp": 3})
    with pytest.raises(parallax.ConfigError):
        parallax.Job(ROOT / "examples" / "no-such-job.toml")
    with pytest.raises(parallax.ConfigError):
        parallax.Job(42)
    job = parallax.Job(**small())  # the interpreter and the module are fine afterwards
    assert job.step()["step"] == 1


# ---- stepping and metrics -----------------------------------------------------------------


def test_step_run_and_metrics():
    job = parallax.Job(**small())
    assert (job.status, job.steps_done, job.steps_total, job.world_size) == ("paused", 0, 10, 1)
    row = job.step(3)
    assert row["step"] == 3 and np.isfinite(row["loss"]) and row["val_loss"] == -1
    m = job.metrics()
    assert list(m["step"]) == [1, 2, 3] and m["loss"].dtype == np.float64
    assert m["loss"][-1] == row["loss"]
    with pytest.raises(parallax.ConfigError, match="at least 1"):
        job.step(0)
    final = job.run()
    assert job.status == "finished" and job.steps_done == 10
    assert list(final["step"]) == list(range(1, 11))
    assert np.all(final["val_loss"][[4, 9]] > 0) and np.all(np.delete(final["val_loss"], [4, 9]) == -1)
    with pytest.raises(parallax.ParallaxError, match="finished"):
        job.step()
    assert job.weights()["wte"].shape == (32, 64)  # the state stays readable


def test_router_stats_of_a_moe_job():
    # examples/moe-small.toml: 2 MoE layers of 4 experts, top-2, capacity 1.25; 16 x 64 tokens.
    job = parallax.Job(ROOT / "examples" / "moe-small.toml", train={"eval_every": 0},
                       output={"run_file": False, "progress": False})
    job.step(3)
    stats = job.router_stats()
    assert sorted(stats) == [0, 1]
    slots = 16 * 64 * 2
    for layer in stats.values():
        assert list(layer["steps"]) == [1, 2, 3]
        assert layer["tokens"].shape == (3, 4) and layer["tokens"].dtype == np.int64
        kept = layer["tokens"].sum(axis=1)
        assert np.all(kept + np.round(layer["drop_fraction"] * slots) == slots)
        assert np.all(layer["router_entropy"] <= np.log(4) + 1e-12)
        assert np.all(layer["aux_loss"] == 0.01 * layer["balance"])
        assert set(layer) >= {"z_loss", "balance"}
    assert parallax.Job(**small()).router_stats() == {}  # a dense model has none


def test_batch_is_what_the_step_trained_on():
    # The embedding's output of step 2 is wte[tokens] + wpe[positions], one fp32 add per element.
    job = parallax.Job(**small(), probes=["2/fwd/-/embed/out"])
    job.step(1)
    w = {k: v.copy() for k, v in job.weights().items()}  # the weights step 2 runs with
    job.step(1)
    batch = job.batch(2)
    assert batch.dtype == np.int32 and batch.shape == (8, 65)
    T = 64
    want = w["wte"][batch[:, :T]] + w["wpe"][:T][None, :, :]
    assert job.probe("2/fwd/-/embed/out").tobytes() == want.astype(np.float32).tobytes()
    assert not np.array_equal(job.batch(1), batch)  # another step, another batch
    assert job.batch(2, "val").shape == (8, 65)
    with pytest.raises(parallax.ConfigError, match="split"):
        job.batch(2, "test")
    assert job.loss_floor >= job.entropy_rate > 0  # a Markov source: the floor is at least the rate


def test_observers_see_every_step_with_the_job_paused():
    job = parallax.Job(**small())
    seen = []

    def watch(m):
        # The job is paused right after step m["step"]: its metrics end with this step.
        assert job.steps_done == m["step"] == job.metrics()["step"][-1]
        seen.append((m["step"], m["loss"], job.weights()["ln_f.bias"].copy()))

    job.add_observer(watch)
    job.step(4)
    assert [s for s, _, _ in seen] == [1, 2, 3, 4]
    assert [l for _, l, _ in seen] == list(job.metrics()["loss"])
    assert not np.array_equal(seen[0][2], seen[-1][2])
    job.remove_observer(watch)
    job.step(1)
    assert len(seen) == 4


# ---- state: views without a copy ----------------------------------------------------------


def test_single_device_state_views_the_library_memory_and_sees_the_next_update():
    job = parallax.Job(**small())
    job.step()
    w, g, m, v = job.weights(), job.grads(), job.adam_m(), job.adam_v()
    fc = w["h.0.mlp.c_fc.weight"]
    assert fc.shape == (256, 64) and fc.dtype == np.float32
    for d in (w, g, m, v):
        for a in d.values():
            # The job's extension object owns the memory; the array keeps it alive.
            assert a.base is job._impl
            assert not a.flags.writeable and not a.flags.owndata
    assert np.shares_memory(fc, job.weights()["h.0.mlp.c_fc.weight"])  # the same memory again
    before = {k: d["h.1.attn.c_attn.weight"].copy() for k, d in zip("wgmv", (w, g, m, v))}
    job.step()
    for k, d in zip("wgmv", (w, g, m, v)):
        assert not np.array_equal(d["h.1.attn.c_attn.weight"], before[k]), k  # the next update
    same_bits(w, {k: a.copy() for k, a in job.weights().items()})


def test_arrays_keep_the_job_alive():
    w = parallax.Job(**small()).weights()["wpe"]  # the job's only reference is the array's base
    assert w.base.steps_done == 0 and w.shape == (64, 64) and np.isfinite(w).all()


LAYOUTS = [{"dp": 2}, {"dp": 2, "zero": 3, "microbatches": 2}, {"dp": 4, "zero": 2},
           {"tp": 2}, {"tp": 2, "sequence_parallel": True}, {"pp": 2, "microbatches": 4},
           {"dp": 2, "tp": 2, "pp": 2, "zero": 1, "microbatches": 2}]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "x".join(f"{k}{v}" for k, v in l.items()))
def test_logical_state_under_a_layout_equals_the_single_device(layout):
    ref = parallax.Job(**small())
    job = parallax.Job(**small(layout=layout))
    assert job.world_size == layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
    ref.step(2)
    job.step(2)
    for what in ("weights", "grads", "adam_m", "adam_v"):
        same_bits(getattr(ref, what)(), getattr(job, what)())
    same_bits({k: v for k, v in ref.metrics().items() if k in ("loss", "grad_norm")},
              {k: v for k, v in job.metrics().items() if k in ("loss", "grad_norm")})


def test_expert_parallel_ranks_hold_their_experts_and_the_logical_state_is_the_single_device_s():
    moe = dict(model={"moe_experts": 4, "moe_top_k": 2, "moe_ffn": 32, "moe_every": 2},
               numerics={"block": 16})
    ref = parallax.Job(**small(**moe))
    job = parallax.Job(**small(layout={"dp": 4, "ep": 2}, **moe))
    ref.step(2)
    job.step(2)
    for what in ("weights", "grads", "adam_m", "adam_v"):
        same_bits(getattr(ref, what)(), getattr(job, what)())
    r1, r2 = job.rank(1), job.rank(2)
    assert r1["experts"] == (2, 4) and r2["experts"] == (0, 2) and job.rank(0)["cp"] == 0
    name = "h.1.moe.experts.c_fc.weight"  # (E·moe_ffn, C): rank 1 holds experts 2 and 3
    assert r1["weights"][name].shape == (64, 64)
    assert np.array_equal(r1["weights"][name], job.weights()[name][64:128])
    by = {r["tensor"]: r for r in job.shard_map() if r["rank"] == 1}
    assert by[name]["slice"] == name + "[64:128, :]"
    assert [r["slice"] for r in job.shard_map() if r["rank"] == 2 and r["tensor"] == name] == \
        [name + "[0:64, :]"]


def test_each_rank_s_pieces_are_views_and_the_shard_map_says_what_they_are():
    job = parallax.Job(**small(layout={"dp": 2, "tp": 2, "zero": 1}))
    job.step()
    r3 = job.rank(3)
    assert (r3["dp"], r3["tp"], r3["pp"], r3["layers"]) == (1, 1, 0, [(0, 2)])
    fc = r3["weights"]["h.0.mlp.c_fc.weight"]
    assert fc.shape == (128, 64) and fc.base is job._impl  # its tp shard: half the ffn rows
    lo, hi = r3["adam_m_range"]
    assert r3["adam_m_flat"].shape == (hi - lo,) and r3["adam_m_flat"].base is job._impl
    # ZeRO-1: the two replicas hold the two halves of the moments of their tp shard.
    assert job.rank(1)["adam_m_range"] == (0, lo) and r3["weights_range"][0] == 0
    logical = job.weights()["h.0.mlp.c_fc.weight"]
    assert np.array_equal(fc, logical[128:256])
    rows = [r for r in job.shard_map() if r["rank"] == 3]
    by = {r["tensor"]: r for r in rows}
    assert by["h.0.mlp.c_fc.weight"]["slice"] == "h.0.mlp.c_fc.weight[128:256, :]"
    assert by["h.0.mlp.c_proj.weight"]["slice"] == "h.0.mlp.c_proj.weight[:, 128:256]"
    assert by["h.0.ln_1.weight"]["slice"] == "h.0.ln_1.weight[:]"
    assert by["h.0.mlp.c_fc.weight"]["local_shape"] == (128, 64)
    # Every logical element of every tensor is written by exactly one rank.
    written = {}
    for r in job.shard_map():
        written[r["tensor"]] = written.get(r["tensor"], 0) + r["writes"]
    assert written == {k: a.size for k, a in job.weights().items()}
    mem = job.memory()
    assert len(mem) == 4 and all(m["optimizer"] > 0 for m in mem)


def test_probes_of_a_layout_put_together_equal_the_single_device_s():
    pats = ["*/fwd/*/attn.*/*", "*/grad/0/param/mlp.c_fc.weight"]
    ref = parallax.Job(**small(), probes=pats)
    job = parallax.Job(**small(layout={"tp": 2, "sequence_parallel": True}), probes=pats)
    ref.step(2)
    job.step(2)
    names = ref.probe_names()
    assert names and set(names) == set(job.probe_names())
    assert "2/grad/0/param/mlp.c_fc.weight" in names
    for n in names:
        a, b = ref.probe(n), job.probe(n)
        assert a.dtype == np.float32 and a.shape == b.shape and a.tobytes() == b.tobytes(), n
        assert not a.flags.owndata and a.base is not None  # the array owns what unshard made
    assert ref.probe("2/grad/0/param/mlp.c_fc.weight").tobytes() == \
        ref.grads()["h.0.mlp.c_fc.weight"].tobytes()
    ref.clear_probes()
    assert ref.probe_names() == []
    with pytest.raises(parallax.ParallaxError, match="no such|never"):
        ref.probe("1/fwd/0/nothing/out")
    with pytest.raises(parallax.ConfigError, match="probes"):
        parallax.Job(**small()).probe("1/fwd/0/attn.qkv/out")


# ---- the same bits as the CLI -------------------------------------------------------------


@pytest.mark.parametrize("layout", [{}, {"dp": 2, "tp": 2, "zero": 2}], ids=["single", "dp2xtp2xz2"])
def test_a_ten_step_job_from_python_gives_the_cli_dump_s_bits(tmp_path, layout):
    sets = ["model.seq_len=64", "model.layers=2", "train.steps=10", "train.threads=1", "train.eval_every=5",
            "numerics.block=32"] + [f"layout.{k}={v}" for k, v in layout.items()]
    dump = tmp_path / "cli.h5"
    subprocess.run([EXE, "train", "--quiet", "--out", str(tmp_path / "cli"), "--dump", str(dump),
                    *[a for s in sets for a in ("--set", s)]], check=True, capture_output=True)
    job = parallax.Job(**small(layout=layout))
    while job.steps_done < 10:
        job.step(3)
    m = job.metrics()
    with h5py.File(dump, "r") as f:
        same_bits({k: f["weights"][k][()] for k in f["weights"]}, job.weights())
        same_bits({k: f["adam/m"][k][()] for k in f["adam/m"]}, job.adam_m())
        same_bits({k: f["adam/v"][k][()] for k in f["adam/v"]}, job.adam_v())
        for key in ("loss", "grad_norm", "val_loss"):
            assert f["steps"][key][()].tobytes() == m[key].tobytes(), key
        assert list(f["steps/step"][()]) == list(m["step"])


# ---- interruption and failures ------------------------------------------------------------


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """Ctrl-C reaches Python as KeyboardInterrupt here however pytest was started: a shell that
    runs a command in the background (`cmd &`) starts it with SIGINT ignored, and Python then
    keeps it ignored, so a simulated Ctrl-C would do nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def interrupt_main_later(how, after_s=None, when=None):
    """Ctrl-C from another thread: after `after_s` seconds, or as soon as the event `when` is set
    (by an observer at a chosen step, so that the interrupt lands mid-run however fast steps are)."""
    def fire():
        if when is not None:
            when.wait()
        if how == "interrupt_main":
            _thread.interrupt_main()
        else:
            os.kill(os.getpid(), signal.SIGINT)
    t = threading.Timer(after_s or 0.0, fire)
    t.start()
    return t


@pytest.mark.parametrize("how", ["interrupt_main", "sigint"])
def test_ctrl_c_stops_after_the_step_in_progress_and_the_job_goes_on_bit_for_bit(how):
    steps = 40
    job = parallax.Job(**small(train={"steps": steps}))
    at_step_3 = threading.Event()
    job.add_observer(lambda m: at_step_3.set() if m["step"] == 3 else None)
    t = interrupt_main_later(how, when=at_step_3)
    with pytest.raises(KeyboardInterrupt):
        job.step(steps)
    t.join()
    stopped = job.steps_done
    assert 3 <= stopped < steps and job.status == "paused"
    assert list(job.metrics()["step"]) == list(range(1, stopped + 1))
    job.step(steps)  # runs to the end
    ref = parallax.Job(**small(train={"steps": steps}))
    ref.step(steps)
    same_bits(ref.weights(), job.weights())
    same_bits(ref.adam_v(), job.adam_v())


def interrupted_within(how, after_s, fn):
    """fn() interrupted after after_s seconds: it must raise KeyboardInterrupt; returns the
    seconds it took."""
    t0 = time.monotonic()
    t = interrupt_main_later(how, after_s)
    try:
        with pytest.raises(KeyboardInterrupt):
            fn()
    finally:
        t.join()
    return time.monotonic() - t0


@pytest.mark.parametrize("how", ["interrupt_main", "sigint"])
def test_ctrl_c_stops_validate_between_the_layouts_steps_and_the_interpreter_goes_on(how):
    # 30 layouts of 200 steps beside the reference, in lockstep: a minute or more of work on any
    # machine, so Ctrl-C after a second always lands mid-run, and it stops every run after its
    # step in progress (the bound leaves room for a loaded host; uninterrupted is far above it).
    cfg = small(train={"steps": 200})
    took = interrupted_within(how, 1.0, lambda: parallax.validate(**cfg, layouts=["dp2"] * 30,
                                                                   steps=200))
    assert took < 1.0 + 10.0
    rep = parallax.validate(**cfg, layouts=["dp2", "tp2"], steps=2)
    assert rep.all_ok and [r.verdict for r in rep.layouts] == ["match", "match"]


def test_ctrl_c_stops_validates_reference_run():
    cfg = small(train={"steps": 3000})  # 3000 steps of the reference and of dp2: half a minute
    took = interrupted_within("sigint", 1.0, lambda: parallax.validate(**cfg, layouts=["dp2"],
                                                                        steps=3000))
    assert took < 1.0 + 10.0
    assert parallax.validate(**small(), layouts="dp2", steps=2).all_ok


def test_ctrl_c_stops_record_trace_before_it_writes(tmp_path):
    path = tmp_path / "trace.h5"
    cfg = small(train={"steps": 5000})  # 5000 steps: half a minute or more
    took = interrupted_within("sigint", 1.0, lambda: parallax.record_trace(
        path, **cfg, steps=5000, probes=["*/fwd/-/loss/*"]))
    assert took < 1.0 + 10.0
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert parallax.record_trace(path, **cfg, steps=2, probes=["*/fwd/-/loss/*"]) > 0
    assert parallax.Trace(path).names() == ["1/fwd/-/loss/out", "2/fwd/-/loss/out"]


def test_an_exception_in_an_observer_leaves_the_job_usable():
    job = parallax.Job(**small())

    def boom(m):
        if m["step"] == 3:
            raise RuntimeError("observer says stop")

    job.add_observer(boom)
    with pytest.raises(RuntimeError, match="observer says stop"):
        job.step(8)
    assert job.steps_done == 3
    job.remove_observer(boom)
    job.step(7)
    ref = parallax.Job(**small())
    ref.step(10)
    same_bits(ref.weights(), job.weights())


def test_a_rank_that_dies_raises_comm_error_and_the_interpreter_lives_on():
    job = parallax.Job(**small(layout={"dp": 2, "timeout_s": 1.0},
                               fault={"kind": "kill", "rank": 1, "step": 3}))
    job.step()
    w = job.weights()["wte"]  # a copy under dp2; rank views stay valid after a failure too
    r1 = job.rank(1)["weights"]["wte"]
    with pytest.raises(parallax.CommError, match="rank 1"):
        job.step(5)
    assert job.status == "failed"
    with pytest.raises(parallax.CommError):
        job.step()
    assert np.isfinite(w).all() and np.isfinite(r1).all() and r1.shape == (32, 64)


# ---- checkpoints, run files, llm.c --------------------------------------------------------


def test_save_checkpoint_inspect_read_and_resume_under_another_layout(tmp_path):
    job = parallax.Job(**small(layout={"dp": 2, "zero": 3}))
    job.step(4)
    path = job.save_checkpoint(tmp_path / "ck")
    assert Path(path).name == "ckpt-00000004.h5"
    info = parallax.inspect_checkpoint(path)
    assert info["ok"] and info["step"] == 4 and all(d["ok"] for d in info["datasets"])
    assert list(info["history"]["step"]) == [1, 2, 3, 4]
    state = parallax.read_checkpoint(path)
    same_bits(state["weights"], job.weights())
    same_bits(state["adam_v"], job.adam_v())
    resumed = parallax.Job(**small(layout={"tp": 2}, checkpoint={"resume": str(path)}))
    assert resumed.steps_done == 4
    resumed.step(6)
    ref = parallax.Job(**small())
    ref.step(10)
    same_bits(ref.weights(), resumed.weights())
    with pytest.raises(parallax.CheckpointError, match="nothing.h5"):
        parallax.inspect_checkpoint(tmp_path / "nothing.h5")
    # A resume that fails while the ranks build their jobs raises from the constructor.
    with pytest.raises(parallax.CheckpointError, match="nothing.h5"):
        parallax.Job(**small(layout={"dp": 2}, checkpoint={"resume": str(tmp_path / "nothing.h5")}))


def test_convert_to_llmc_and_back_gives_the_same_weights(tmp_path):
    job = parallax.Job(**small())
    job.step(2)
    ck = job.save_checkpoint(tmp_path)
    text = parallax.convert(ck, tmp_path / "model.bin")
    assert "llm.c checkpoint" in text and (tmp_path / "model.bin").stat().st_size > 0
    parallax.convert(tmp_path / "model.bin", tmp_path / "back.h5")
    same_bits(job.weights(), parallax.read_checkpoint(tmp_path / "back.h5")["weights"])
    started = parallax.Job(**small(model={"init_from": str(tmp_path / "back.h5")}))
    same_bits(job.weights(), started.weights())
    with pytest.raises(parallax.DataError, match="extension"):
        parallax.convert(ck, tmp_path / "model.txt")


def test_a_run_file_is_written_with_out_and_read_back(tmp_path):
    job = parallax.Job(**small(), out=tmp_path / "run")
    job.step(5)
    rec = parallax.read_run_file(tmp_path / "run" / "run.h5")
    steps, loss = rec["metrics"]["loss"]
    assert list(steps) == [1, 2, 3, 4, 5] and loss.tobytes() == job.metrics()["loss"].tobytes()
    assert "[model]" in rec["config"]
    with pytest.raises(parallax.ConfigError, match="output.dir"):
        parallax.Job(**small(), out=tmp_path / "run")  # the folder is the first job's
    with pytest.raises(parallax.ParallaxError, match="nothing.h5"):
        parallax.read_run_file(tmp_path / "nothing.h5")


# ---- validation, layouts and schedules ----------------------------------------------------


def test_validate_matches_and_names_a_planted_divergence():
    rep = parallax.validate(layouts=["dp2", "tp2"], steps=3, **small())
    assert rep.all_ok and [r["verdict"] for r in rep.rows()] == ["match", "match"]
    assert "dp2" in rep.table()
    per = rep.layouts[0].per_tensor()
    assert np.all(per["differing"] == 0) and len(per["name"]) == len(per["max_ulp"])
    bad = parallax.validate(layouts="dp2", steps=3,
                            **small(fault={"kind": "flip_weight", "rank": 1, "step": 2,
                                           "tensor": "wpe", "element": 5}))
    r = bad.layouts[0]
    assert not bad.all_ok and r.verdict == "diverged" and r.first_step == 2
    assert r.first.name == "params/wpe" and r.first.first == 5
    assert r.first_op_rank == 1 and "wpe" in r.first_op.name
    with pytest.raises(parallax.ConfigError, match="layout tp3"):
        parallax.validate(layouts=["tp3"], steps=2, **small())


def test_golden_trace_recorded_read_and_checked(tmp_path):
    trace = tmp_path / "ref.h5"
    assert parallax.record_trace(trace, steps=2, probes=["*/fwd/*/attn.*/*", "*/optim/**"],
                                 **small()) > 0
    t = parallax.Trace(trace)
    names = t.names()
    assert t.info["steps"] == 2 and any("/optim/" in n for n in names)
    a = t.read(names[0])
    assert a.dtype == np.float32 and a.flags.owndata is False and a.base is not None
    rep = parallax.validate(layouts=["dp2"], golden=trace, **small())
    assert rep.all_ok


def test_layouts_and_schedules_as_data():
    lay = parallax.layout(layout={"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
                          numerics={"block": 32})
    assert lay["world_size"] == 8 and len(lay["ranks"]) == 8
    r5 = lay["ranks"][5]
    assert (r5["pp"], r5["dp"], r5["tp"]) == (1, 0, 1) and r5["tp_group"] == [4, 5]
    assert "rank 5: pp 1, dp 0, tp 1" in lay["text"]
    # expert parallelism: ep consecutive dp ranks share out the experts
    moe = parallax.layout(layout={"dp": 4, "ep": 2},
                          model={"moe_experts": 4, "moe_top_k": 2, "moe_ffn": 64})
    assert moe["ep"] == 2 and moe["world_size"] == 4
    assert [r["ep_group"] for r in moe["ranks"]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [tuple(r["experts"]) for r in moe["ranks"]] == [(0, 2), (2, 4), (0, 2), (2, 4)]
    assert "rank 3: pp 0, dp 3, tp 0, experts [2,4)" in moe["text"]
    # the attention heads on the tp ranks: GPT-2's multi-head split with the query heads; a
    # llama job's 2 KV heads split under tp2, whole on every rank under tp4
    h = lay["attention_heads"]
    assert h["kind"] == "multi-head" and h["split"] and h["ranks"][1]["q"] == h["ranks"][1]["kv"]
    for tp, split in ((2, True), (4, False)):
        h = parallax.layout(model={"arch": "llama", "kv_heads": 2}, layout={"tp": tp},
                            numerics={"block": 16})["attention_heads"]
        assert (h["kind"], h["group"], h["split"]) == ("grouped-query", 2, split), h
        assert [r["q"] for r in h["ranks"]] == [(t * 4 // tp, (t + 1) * 4 // tp) for t in range(tp)]
        assert [r["kv"] for r in h["ranks"]] == ([(0, 1), (1, 2)] if split else [(0, 2)] * 4)
        assert [r["kv_read"] for r in h["ranks"]] == ([(0, 1), (1, 2)] if split else
                                                      [(0, 1), (0, 1), (1, 2), (1, 2)])
    assert h["ranks"][3]["text"] == ("tp rank 3: q head 3, kv heads 0-1 (whole on every rank: "
                                     "tp=4 does not divide kv_heads=2), reads kv head 1")
    for pp, m in ((2, 4), (4, 8), (4, 4)):
        for kind in ("gpipe", "1f1b"):
            s = parallax.schedule(kind, pp=pp, microbatches=m)
            sim = s.simulate()
            assert sim["ok"] and abs(sim["bubble"] - (pp - 1) / (m + pp - 1)) < 1e-12
            assert len(s.actions) == pp
            assert all(sum(a["kind"] == "forward" for a in acts) == m for acts in s.actions)
    inter = parallax.schedule("interleaved", pp=4, microbatches=8, virtual_stages=2).simulate()
    assert inter["ok"] and inter["bubble"] < parallax.schedule("1f1b", pp=4, microbatches=8).simulate()["bubble"]
    with pytest.raises(parallax.ConfigError):
        parallax.schedule("interleaved", pp=4, microbatches=6, virtual_stages=2)


def test_the_canonical_sum_is_the_documented_tree_and_shares_of_its_nodes_agree():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(768).astype(np.float32) * np.float32(1e3)

    def blocks_then_tree(v, block):  # docs/numerics.md, "The canonical reduction order"
        sums = []
        for b in range(0, len(v), block):
            acc = np.float32(0)
            for e in v[b:b + block]:
                acc = np.float32(acc + e)
            sums.append(acc)

        def node(lo, hi):
            if hi - lo == 1:
                return sums[lo]
            mid = parallax.tree_split(lo, hi)
            return np.float32(node(lo, mid) + node(mid, hi))
        return node(0, len(sums))

    total = parallax.canonical_sum(x, 64)
    assert np.float32(total) == blocks_then_tree(x, 64)
    assert parallax.tree_split(0, 12) == 6 and parallax.tree_split(0, 3) == 2
    # tp=3 over 12 blocks (K = 768 in blocks of 64): rank 1 owns [4,8) = nodes [4,5) [5,6) [6,8).
    assert parallax.tree_nodes(12, 4, 8) == [(4, 5), (5, 6), (6, 8)]
    assert parallax.tree_nodes(12, 0, 12) == [(0, 12)]
    partial = {(a, b): parallax.canonical_sum(x[a * 64:b * 64], 64)
               for r in ((0, 4), (4, 8), (8, 12)) for a, b in parallax.tree_nodes(12, *r)}

    def combine(lo, hi):  # the ranks' node partials, combined in the tree above them
        if (lo, hi) in partial:
            return np.float32(partial[(lo, hi)])
        mid = parallax.tree_split(lo, hi)
        return np.float32(combine(lo, mid) + combine(mid, hi))
    root = combine(0, 12)
    f = np.float32
    assert root == f(total)
    shuffled_sums = {np.float32(np.sum(rng.permutation(x), dtype=np.float32)) for _ in range(20)}
    assert len(shuffled_sums) > 1  # without a fixed order, the bits depend on the order
    assert parallax.canonical_dot(x, np.ones_like(x), 64) == total
    with pytest.raises(parallax.ConfigError):
        parallax.canonical_sum(x, 0)


# ---- the stub -----------------------------------------------------------------------------


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_the_package_faces_exactly_what_the_extension_has():
    """Every public class and function of the extension has its typed Python face, member for
    member, with a docstring; nothing else is public beside the error classes."""
    core = parallax._core
    errors = {n for n in parallax.errors.__all__}
    assert set(parallax.__all__) == public(core) | errors
    assert errors <= public(parallax) and public(core) <= public(parallax)
    for name in public(core):
        face, native = getattr(parallax, name), getattr(core, name)
        assert face is not native and face.__module__ == "parallax", name
        assert face.__doc__, name
        if not isinstance(native, type):
            continue
        assert public(face) == public(native), name
        for member in public(face):
            attr = inspect.getattr_static(face, member)
            has_doc = parallax._facade.native_doc(getattr(native, member)) is not None
            assert attr.__doc__ or not has_doc, f"{name}.{member}"


def test_help_shows_parallax_names_only():
    """help() of the package and of every class and function: no pybind11 base, metaclass or
    signature types (`self: parallax._core.Job`), and each signature is Python's own."""
    def text(obj):
        return pydoc.render_doc(obj, renderer=pydoc.plaintext)

    texts = {"parallax": text(parallax)} | {n: text(getattr(parallax, n)) for n in parallax.__all__}
    for name, text in texts.items():
        assert "pybind11" not in text, name
        assert "_core." not in text, name
        assert "self: " not in text, name
    assert "class Job(builtins.object)" in texts["Job"]
    assert "step(self, n: 'int' = 1) -> 'Dict[str, float]'" in texts["Job"]
    assert "class ConfigKeyError(ConfigError, builtins.KeyError)" in texts["ConfigKeyError"]


def test_explore_layout_says_who_holds_what_and_who_sends_what():
    e = parallax.explore_layout(layout={"tp": 2, "dp": 2}, model={"seq_len": 32}, numerics={"block": 16})
    assert "rank 1 = dp0 \u00b7 pp0 \u00b7 tp1 holds h.0.mlp.c_fc.weight[128:256, :]" in e["text"]
    ranks = {p["rank"]: p["rows"] for p in e["holds"]["h.0.mlp.c_fc.weight"]}
    assert ranks == {0: (0, 128), 2: (0, 128), 1: (128, 256), 3: (128, 256)}
    fwd_tp = [c for c in e["collectives"] if c["phase"] == "fwd" and c["group"] == "tp"]
    assert any(c["op"] == "attn.proj" and c["collective"] == "all_reduce" and c["bytes"] > 0 for c in fwd_tp)
    assert any(c["group"] == "dp" for c in e["collectives"])  # the gradients' all-reduce
    assert len(e["memory"]) == 4 and all(m["total"] > 0 for m in e["memory"])
    with pytest.raises(parallax.ConfigError, match="layout.tp"):
        parallax.explore_layout(layout={"tp": 3}, model={"seq_len": 32})
