"""The module as people who use PyTorch and h5py expect it (docs/python.md).

- An ended job (run(), finish(), close(), the end of its `with` block, or a failure) lets go of
  its output folder's lock and of its run file at once: h5py opens run.h5 and a new job takes the
  same out= in the same process. A lock left by a process that no longer runs is taken over with
  a warning, never refused.
- mypy sees the package's types (it is typed, PEP 561) in the install set-up made.
- Errors follow one rule: usage errors are ParallaxError, never InternalError; a missing file is
  also a FileNotFoundError, Config()[key] also a KeyError, job.rank(r) also an IndexError; a call
  after a rank died says the job failed and why.
- Under a layout, weights() and the other assembled copies are read-only like the views.

By hand: python3 -m pytest tests/python/test_python_api.py
"""
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

parallax = pytest.importorskip("parallax", reason="the parallax module is not built/installed")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]


def small(**sections):
    """A job of a few steps (the default model: numerics.block 16, 4 layers)."""
    train = {"steps": 6, "batch_size": 4, **sections.pop("train", {})}
    return {"train": train, **sections}


# ---- an ended job lets go of its folder and its run file --------------------------------------


def end_by_run(job):
    job.run()


def end_by_finish(job):
    job.step(2)
    job.finish()


def end_by_close(job):
    job.step(2)
    job.close()


def end_by_with(job):
    with job:
        job.step(2)


def end_by_with_that_raised(job):
    with pytest.raises(ZeroDivisionError):
        with job:
            job.step(2)
            1 / 0


@pytest.mark.parametrize("end", [end_by_run, end_by_finish, end_by_close, end_by_with,
                                 end_by_with_that_raised])
def test_an_ended_job_releases_its_folder_and_run_file(tmp_path, end):
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "out"
    job = parallax.Job(**small(), out=out)
    assert (out / ".parallax-lock").exists()
    end(job)
    assert job.status == "finished"
    assert not (out / ".parallax-lock").exists()
    # The job is still alive (a notebook's variable): h5py opens its run file all the same.
    with h5py.File(out / "run.h5", "r") as f:
        assert list(f["metrics/loss/step"]) == list(range(1, job.steps_done + 1))
    # A re-run of the same cell: the same out=, the old job not yet collected.
    again = parallax.Job(**small(), out=out)
    assert again.step(1)["step"] == 1
    del job


def test_a_failed_job_releases_its_folder_and_run_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "out"
    job = parallax.Job(**small(layout={"dp": 2, "timeout_s": 2}),
                       fault={"kind": "kill", "rank": 1, "step": 2}, out=out)
    with pytest.raises(parallax.CommError):
        job.step(3)
    assert job.status == "failed"
    assert not (out / ".parallax-lock").exists()
    with h5py.File(out / "run.h5", "r") as f:
        assert list(f["metrics/loss/step"]) == [1]
    parallax.Job(**small(), out=out).close()


def test_an_open_job_keeps_its_folder_and_says_how_to_free_it(tmp_path):
    job = parallax.Job(**small(), out=tmp_path)
    job.step(1)
    with pytest.raises(parallax.ConfigError, match=r"another job of this process.*close\(\)"):
        parallax.Job(**small(), out=tmp_path)
    job.close()
    parallax.Job(**small(), out=tmp_path).close()


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lock_file_left_by_a_killed_process_is_taken_over_with_a_warning(tmp_path):
    pid = dead_pid()
    (tmp_path / ".parallax-lock").write_text(f"{pid} {socket.gethostname()}\n")
    with pytest.warns(RuntimeWarning, match=f"left by process {pid}, which no longer runs"):
        job = parallax.Job(**small(), out=tmp_path)
    assert (tmp_path / ".parallax-lock").read_text().split()[0] == str(os.getpid())
    job.close()


def test_a_lock_still_held_for_a_dead_process_is_taken_over_with_a_warning(tmp_path):
    """A process forked by the dead holder (a data loader's worker) still holds the flock it
    inherited, and the file names the dead holder: the folder is free all the same."""
    pid = dead_pid()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, socket, sys, time
        fd = os.open({str(tmp_path / '.parallax-lock')!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"{pid} " + socket.gethostname().encode() + b"\\n")
        print("held", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(RuntimeWarning, match=f"of process {pid}, which no longer runs"):
            job = parallax.Job(**small(), out=tmp_path)
        job.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_held_by_a_live_process_is_refused_naming_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, socket, time
        fd = os.open({str(tmp_path / '.parallax-lock')!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{{os.getpid()}} {{socket.gethostname()}}\\n".encode())
        print("held", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(parallax.ConfigError, match=f"in use by another run \\(process "
                                                       f"{holder.pid}"):
            parallax.Job(**small(), out=tmp_path)
    finally:
        holder.kill()
        holder.wait()


# ---- the package's types reach mypy ---------------------------------------------------------

QUICK_START = """\
import parallax

job = parallax.Job(train={"steps": 20})
row = job.step(5)
reveal_type(job)
reveal_type(row)
reveal_type(job.weights())
"""


def test_mypy_sees_the_types_in_the_installed_package(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed: pip install mypy")
    (tmp_path / "quick.py").write_text(QUICK_START)
    # Outside the repository, with no MYPYPATH: only what the install put on the path.
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir",
                        str(tmp_path / "cache"), "quick.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert 'Revealed type is "parallax._job.Job"' in r.stdout, (
        "mypy does not see parallax's types: an editable install needs the folder "
        "bindings/python (the typed package) on the path, e.g. a .pth file in site-packages "
        "naming it (docs/python.md)\n" + r.stdout + r.stderr)
    assert 'Revealed type is "builtins.dict[builtins.str, builtins.float]"' in r.stdout or \
        'Revealed type is "dict[str, float]"' in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_wheel_installs_the_typed_package_over_its_extension():
    build = Path(parallax._core.__file__).resolve().parents[1]
    plan = build / "meson-info" / "intro-install_plan.json"
    if not plan.exists():
        pytest.skip(f"no meson build tree beside the module ({plan})")
    import json
    dests = {v["destination"] for group in json.loads(plan.read_text()).values()
             for v in group.values()}
    package = Path(parallax.__file__).parent
    for source in package.iterdir():
        if source.suffix == ".py" or source.name == "py.typed":
            assert "{py_platlib}/parallax/" + source.name in dests, (source.name, dests)
    assert any(d.startswith("{py_platlib}/parallax/_core.") for d in dests), dests


def test_the_package_passes_mypy_with_every_def_typed(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed: pip install mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir",
                        str(tmp_path / "cache"), "--disallow-untyped-defs",
                        "--disallow-incomplete-defs", "-p", "parallax"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- one rule for the error classes -----------------------------------------------------------


def test_config_lookups_are_key_errors():
    cfg = parallax.Config()
    for key in ("nope", "train.nope"):
        with pytest.raises(KeyError) as e:
            cfg[key]
        assert isinstance(e.value, parallax.ConfigError)
        assert str(e.value) == f'no config {"section" if "." not in key else "key"} "{key}"'


def test_a_rank_outside_the_layout_is_an_index_error():
    job = parallax.Job(**small(layout={"dp": 2}))
    with pytest.raises(IndexError, match=r"rank\(2\): not a rank of this layout \(0 \.\. 1\)"):
        job.rank(2)
    with pytest.raises(parallax.RankIndexError):
        job.rank(-1)
    assert job.rank(1)["rank"] == 1


def test_missing_files_are_file_not_found_and_keep_their_class(tmp_path):
    nothing = tmp_path / "nothing.h5"
    cases = [
        (lambda: parallax.Config(tmp_path / "nothing.toml"), parallax.ConfigError,
         "nothing.toml"),
        (lambda: parallax.Job(tmp_path / "nothing.toml"), parallax.ConfigError, "nothing.toml"),
        (lambda: parallax.read_checkpoint(nothing), parallax.CheckpointError, "nothing.h5"),
        (lambda: parallax.inspect_checkpoint(nothing), parallax.CheckpointError, "nothing.h5"),
        (lambda: parallax.read_run_file(nothing), parallax.ParallaxError, "nothing.h5"),
        (lambda: parallax.convert(nothing, tmp_path / "m.bin"), parallax.DataError, "nothing.h5"),
        (lambda: parallax.Job(**small(checkpoint={"resume": str(nothing)})),
         parallax.CheckpointError, "nothing.h5"),
    ]
    for call, cls, name in cases:
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert isinstance(e.value, cls) and isinstance(e.value, parallax.ParallaxError)
        assert e.value.errno == 2 and e.value.filename.endswith(name)
        assert name in str(e.value) and not str(e.value).startswith("[Errno")


def test_a_bad_file_that_is_there_is_not_an_os_error(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(parallax.CheckpointError) as e:
        parallax.read_checkpoint(bad)
    assert not isinstance(e.value, OSError)


def test_usage_errors_are_not_internal_errors():
    job = parallax.Job(**small())
    job.run()
    with pytest.raises(parallax.ParallaxError, match="the job has finished") as e:
        job.step()
    assert not isinstance(e.value, parallax.InternalError)

    job = parallax.Job(**small(train={"steps": 60}))
    stepping = threading.Thread(target=job.step, args=(60,))
    stepping.start()
    try:
        deadline = time.time() + 60
        while job.status != "running" and time.time() < deadline:
            time.sleep(0.001)
        assert job.status == "running"
        for call in (job.step, job.weights, job.finish):
            with pytest.raises(parallax.ParallaxError, match="another thread") as e:
                call()
            assert not isinstance(e.value, parallax.InternalError)
    finally:
        stepping.join()
    assert job.steps_done == 60


def test_a_call_after_a_rank_died_says_the_job_failed_and_why():
    job = parallax.Job(**small(layout={"dp": 2, "timeout_s": 2}),
                       fault={"kind": "kill", "rank": 1, "step": 2})
    with pytest.raises(parallax.CommError, match="did not arrive within 2.00 s"):
        job.step(3)
    for call in (job.step, job.weights, lambda: job.rank(0), job.finish):
        with pytest.raises(parallax.CommError) as e:
            call()
        text = str(e.value)
        assert text.startswith("parallax.Job: this job failed after step 1, before this call")
        assert "rank 1 (world rank 1) did not arrive within 2.00 s" in text
        assert "only slow" not in text and "raise the timeout" not in text
    job.close()  # an ended job closes without raising


# ---- read-only state under every layout ------------------------------------------------------


@pytest.mark.parametrize("layout", [{}, {"dp": 2}, {"tp": 2}, {"pp": 2}])
def test_state_arrays_are_read_only_on_every_layout(layout):
    job = parallax.Job(**small(layout=layout))
    job.step(1)
    for what in (job.weights, job.grads, job.adam_m, job.adam_v):
        arrays = what()
        assert arrays and all(not a.flags.writeable for a in arrays.values()), (what, layout)
        a = arrays["h.0.mlp.c_fc.weight"]
        with pytest.raises(ValueError, match="read-only"):
            a[0, 0] = 1.0
        assert a.copy().flags.writeable
