"""The desktop workbench (`parallax gui`) under Xvfb: every panel rendered headless to a PNG and
checked for its content, and the real window driven with real X input events (xdotool): press
Start and the loss moves; set tp to 2 and restart and the layout explorer shows two ranks; type a
bad value and the editor shows the library's error beside the key, without crashing. The window
is observed through the state line it prints on F12 (a real key event too). Then Stop, Step, Step
and Resume: one step at a time, paused between. The default job runs with tp = 2 typed in and
says "stopped" after Stop; four bad values show four messages at once, and a fixed one loses
its message as it is typed."""
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
from PIL import Image

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = [
    pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)"),
    pytest.mark.skipif(not shutil.which("Xvfb") or not shutil.which("xdotool"),
                       reason="Xvfb and xdotool are needed (scripts/setup.sh installs them)"),
]

# A tiny job whose tp2 shards are whole blocks (hidden 64, ffn 128, blocks of 16): a step takes
# milliseconds, and validation every 5 steps puts points on the validation curve. Its 5000
# steps outlast the interactive test, so the loss is still moving whenever it looks.
TINY = """
[model]
vocab = 32
seq_len = 32
layers = 2
heads = 4
hidden = 64
ffn = 128
[train]
steps = 5000
batch_size = 8
warmup_steps = 5
eval_every = 5
val_batches = 2
threads = 1
[numerics]
block = 16
[output]
run_file = false
"""

PANELS = ["loss", "layout_check", "pipeline", "memory", "plan", "fp8", "router", "events",
          "layout_explorer", "schedule", "numerics"]
# Panels that draw a plot: (its region as fractions of the image: x0, y0, x1, y1), the least
# number of strongly coloured pixels in it, and the least number of distinct colours overall.
PLOTS = {
    "loss": ((0.05, 0.08, 0.98, 0.60), 800, 40),
    "layout_check": ((0.15, 0.12, 0.90, 0.90), 20000, 10),
    "pipeline": ((0.03, 0.10, 0.98, 0.95), 2000, 10),
    "memory": ((0.03, 0.05, 0.98, 0.55), 2000, 10),
    "layout_explorer": ((0.0, 0.10, 0.98, 0.60), 5000, 10),
    "schedule": ((0.03, 0.10, 0.98, 0.95), 5000, 10),
    "numerics": ((0.0, 0.30, 0.98, 0.98), 5000, 10),
}


@pytest.fixture(scope="module")
def display():
    """Xvfb on a free display number, for this module's tests."""
    for n in range(90, 140):
        if not os.path.exists(f"/tmp/.X{n}-lock") and not os.path.exists(f"/tmp/.X11-unix/X{n}"):
            break
    proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(f"/tmp/.X11-unix/X{n}"):
            break
        time.sleep(0.05)
    env = dict(os.environ, DISPLAY=f":{n}")
    yield env
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("gui") / "tiny.toml"
    path.write_text(TINY)
    return str(path)


def screenshots(env, config, folder, steps, panels=PANELS):
    r = subprocess.run([EXE, "gui", "--screenshot", str(folder), "--steps", str(steps), config,
                        "--out", str(folder / "run")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return {p: np.asarray(Image.open(folder / f"{p}.png").convert("RGB")).astype(np.int32)
            for p in panels}


def region(img, frac):
    h, w, _ = img.shape
    x0, y0, x1, y1 = frac
    return img[int(y0 * h):int(y1 * h), int(x0 * w):int(x1 * w)]


def coloured(pixels):
    """Pixels of a strong colour (not the greys of text, frames and backgrounds)."""
    return int(((pixels.max(axis=2) - pixels.min(axis=2)) > 60).sum())


def distinct(img):
    return len(np.unique(img.reshape(-1, 3), axis=0))


def test_every_panel_renders_its_content(display, config, tmp_path):
    at5 = screenshots(display, config, tmp_path / "s5", 5)
    at20 = screenshots(display, config, tmp_path / "s20", 20)
    for name, img in at20.items():
        assert img.shape[0] >= 600 and img.shape[1] >= 800, name
        assert img.std() > 5, f"{name}.png is blank"
        light = int((img.min(axis=2) > 150).sum())
        assert light > 400, f"{name}.png has no text ({light} light pixels)"
        if name in PLOTS:
            frac, least, colours = PLOTS[name]
            n = coloured(region(img, frac))
            assert n >= least, f"{name}.png: {n} coloured pixels in its plot area, want >= {least}"
            assert distinct(img) >= colours, f"{name}.png: {distinct(img)} colours"
    # The router panel of a dense job: its empty state, no made-up heatmap or lines.
    n = coloured(region(at20["router"], (0.0, 0.05, 1.0, 1.0)))
    assert n < 50, f"router.png of a dense job draws {n} coloured pixels"
    # The loss panel moved on between step 5 and step 20.
    a, b = region(at5["loss"], PLOTS["loss"][0]), region(at20["loss"], PLOTS["loss"][0])
    changed = int((np.abs(a - b).sum(axis=2) > 30).sum())
    assert changed > 2000, f"the loss panel barely changed between step 5 and 20 ({changed} pixels)"


class Window:
    """The workbench as a person uses it: real X events in (xdotool), the F12 state line out."""

    def __init__(self, env, config):
        self.env = env
        # None: the embedded default job. Its run file (if the job writes one) goes to a folder
        # of its own, so that windows of other tests never share one.
        self.out = tempfile.mkdtemp(prefix="parallax-gui-")
        args = [EXE, "gui", "--out", self.out] + ([config] if config else [])
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        r = self.xdo("search", "--sync", "--onlyvisible", "--name", "Parallax workbench", timeout=60)
        self.wid = r.stdout.split()[0]
        self.xdo("windowfocus", "--sync", self.wid)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def xdo(self, *args, timeout=20):
        r = subprocess.run(["xdotool", *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0, f"xdotool {args}: {r.stderr}"
        return r

    def state(self):
        assert self.proc.poll() is None, f"the workbench exited: {self.proc.stderr.read()}"
        self.xdo("key", "F12")
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line.startswith("STATE "):
                return json.loads(line[6:])
        raise AssertionError("no state line after F12")

    def click(self, name, state=None):
        x, y, w, h = (state or self.state())["rects"][name]
        self.xdo("mousemove", "--window", self.wid, str(int(x + w / 2)), str(int(y + h / 2)))
        time.sleep(0.1)  # a frame sees the pointer over the widget before the press
        self.xdo("mousedown", "1")
        time.sleep(0.1)  # and one the button held (Dear ImGui 1.86 reads held states per frame)
        self.xdo("mouseup", "1")
        time.sleep(0.15)

    def press(self, *keys, hold=0.3):
        """Keys held down together for `hold` seconds: Dear ImGui 1.86 reads keys as held states
        once per frame, so a press and release within one frame (a loaded machine's slow frame)
        would be missed."""
        for k in keys:
            self.xdo("keydown", k)
        time.sleep(hold)
        for k in reversed(keys):
            self.xdo("keyup", k)

    def replace_text(self, rect, text, attempt):
        """Click, select all, type (or delete the selection); each retry holds keys longer."""
        hold = 0.3 * (attempt + 1)
        self.click(rect)
        time.sleep(0.1 * attempt)  # a slow frame activates the field before the keys come
        self.press("ctrl", "a", hold=hold)
        if text:
            self.xdo("type", "--delay", str(30 * (attempt + 1)), "--", text)
        else:
            self.press("BackSpace", hold=hold / 2)  # the selection deleted: an empty field
        time.sleep(0.2 * (attempt + 1))

    def type_into(self, key, text):
        """Replaces the field's text, as a person does: click, ctrl+a, type. Checked through the
        state line, and done again, slower, when a loaded machine let a key slip between two
        frames."""
        for attempt in range(5):
            self.replace_text("field:" + key, text, attempt)
            if self.state()["fields"][key] == text:
                return
        raise AssertionError(f"could not type {text!r} into {key}")

    def type_text(self, rect, field, text):
        """Like type_into, for a field outside the config editor (state()["fields"][field])."""
        for attempt in range(5):
            self.replace_text(rect, text, attempt)
            self.press("Tab", hold=0.2)  # an integer field takes its value when it loses focus
            time.sleep(0.2)
            if self.state()["fields"][field] == text:
                return
        raise AssertionError(f"could not type {text!r} into {field}")

    def wait_for(self, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.state()
            if what(s):
                return s
            time.sleep(0.2)
        raise AssertionError(f"timed out; last state: {s}")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.out, ignore_errors=True)


def test_the_window_driven_by_real_input(display, config):
    w = Window(display, config)
    try:
        s = w.state()
        assert s["status"] == "no job" and s["loss_points"] == 0
        # Press Start: the job runs and the loss panel moves.
        w.click("start", s)
        first = w.wait_for(lambda s: s["loss_points"] >= 3)
        time.sleep(1.0)
        later = w.state()
        assert later["loss_points"] > first["loss_points"], (first, later)
        assert later["status"] in ("running", "finished")

        # tp = 2 in the editor, Restart: the layout explorer shows two ranks.
        w.type_into("layout.tp", "2")
        w.click("restart")
        w.click("tab:layout_explorer")
        s = w.wait_for(lambda s: s["job_tp"] == 2 and not s["explorer_busy"] and s["explorer_ranks"] == 2)
        assert "explorer_ranks" in s["rects"]
        assert s["editor_errors"] == {}

        # A bad value: the library's message beside the key, and the window lives on.
        w.type_into("model.hidden", "abc")
        w.click("restart")
        s = w.wait_for(lambda s: "model.hidden" in s["editor_errors"])
        msg = s["editor_errors"]["model.hidden"]
        assert "model.hidden" in msg and "abc" in msg, msg
        fx, fy, fw, fh = s["rects"]["field:model.hidden"]
        ex, ey, ew, eh = s["rects"]["error:model.hidden"]
        assert ex >= fx + fw and ey < fy + fh and ey + eh > fy, "the error is not beside its key"
        assert s["job_tp"] == 2  # the running job was left alone
        time.sleep(0.5)
        assert w.state()["status"] in ("running", "finished")

        # Fixed, then Stop and Step: a new run that does one step at a time and pauses.
        w.type_into("model.hidden", "64")
        w.click("stop")
        w.click("step")
        s = w.wait_for(lambda s: s["status"] == "paused" and s["steps_done"] == 1)
        assert s["editor_errors"] == {} and s["loss_points"] == 1
        w.click("step", s)
        s = w.wait_for(lambda s: s["status"] == "paused" and s["steps_done"] == 2)
        w.click("resume", s)
        w.wait_for(lambda s: s["steps_done"] > 2)
    finally:
        w.close()


def beside(s, key):
    """The error's rectangle is right of its field and on the same line."""
    fx, fy, fw, fh = s["rects"]["field:" + key]
    ex, ey, ew, eh = s["rects"]["error:" + key]
    return ex >= fx + fw and ey < fy + fh and ey + eh > fy


def test_the_default_job_runs_with_tp2(display):
    """The embedded default job (4 layers, reduction blocks of 16) with tp = 2 typed into the
    editor: Start runs it on two ranks, the loss moves, and after Stop the header says so."""
    w = Window(display, None)
    try:
        s = w.state()
        assert s["status"] == "no job" and s["fields"]["layout.tp"] == "1", s["fields"]
        w.type_into("layout.tp", "2")
        s = w.state()
        assert s["editor_errors"] == {} and s["general_error"] == "", s
        w.click("start", s)
        s = w.wait_for(lambda s: s["job_tp"] == 2 and s["loss_points"] >= 3, timeout=120)
        assert s["status"] in ("running", "finished") and s["message"] == "", s
        first = s["loss_points"]
        s = w.wait_for(lambda s: s["loss_points"] > first)
        w.click("stop", s)
        s = w.wait_for(lambda s: s["status"] == "stopped")
        time.sleep(1.0)  # and it stays stopped: no later frame takes it back to running
        assert w.state()["status"] == "stopped"
    finally:
        w.close()


def test_every_bad_key_shows_its_message(display, config):
    """Four bad values typed in: four messages at once, each beside its key in one form (the
    problem, naming the key), and Start refuses; a value fixed loses its message as it is typed,
    the others stay."""
    bad = {"model.hidden": "abc", "train.lr": "-1", "layout.schedule": "foo",
           "spikes.action": "zz"}
    w = Window(display, config)
    try:
        for key, text in bad.items():
            w.type_into(key, text)
        s = w.wait_for(lambda s: len(s["editor_errors"]) == 4)
        assert set(s["editor_errors"]) == set(bad), s["editor_errors"]
        for key, text in bad.items():
            msg = s["editor_errors"][key]
            assert msg.startswith(key) and text in msg and "--set" not in msg, (key, msg)
            assert beside(s, key), key
        assert "editor_problems" in s["rects"]
        w.click("start", s)
        s = w.wait_for(lambda s: s["message"].startswith("not started"))
        assert s["status"] == "no job"

        w.type_into("model.hidden", "64")  # fixed: its message goes without pressing anything
        s = w.wait_for(lambda s: "model.hidden" not in s["editor_errors"])
        assert set(s["editor_errors"]) == set(bad) - {"model.hidden"}, s["editor_errors"]
        for key, text in {"train.lr": "0.003", "layout.schedule": "1f1b",
                          "spikes.action": "off"}.items():
            w.type_into(key, text)
        s = w.wait_for(lambda s: s["editor_errors"] == {})
        w.click("start", s)
        w.wait_for(lambda s: s["loss_points"] >= 2)
    finally:
        w.close()


def test_the_layout_check_runs_in_lockstep(display, config):
    """Two layouts checked in the window: their columns fill in together (step s of every run
    before step s + 1 of any), never one layout to its end before the other begins."""
    w = Window(display, config)
    try:
        w.click("tab:layout_check")
        w.type_text("field:check_layouts", "check_layouts", "dp2,tp2")
        w.type_text("field:check_steps", "check_steps", "150")
        w.click("run_check")
        seen = []
        deadline = time.time() + 300
        while time.time() < deadline:
            s = w.state()["check"]
            done = [g["steps_done"] for g in s["layouts"]]
            if len(done) == 2:
                seen.append(done)
                assert max(done) - min(done) <= 1, f"the layouts are not in lockstep: {seen}"
            if len(done) == 2 and not s["running"]:
                break
            time.sleep(0.1)
        assert [g["verdict"] for g in s["layouts"]] == ["match", "match"], s
        assert all(g["cells_done"] == g["cells"] > 0 for g in s["layouts"]), s
        midway = [d for d in seen if 0 < min(d) and max(d) < 150]
        assert len(midway) >= 2, f"too few looks while the check ran: {seen}"
    finally:
        w.close()


def test_finished_files_open_in_every_panel(display, config, tmp_path):
    """A run.h5 with FP8 rows, spike evidence and memory, and a validate.json with its whole
    grid, opened in the window."""
    run_dir = tmp_path / "run"
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fp8_drift.toml")
    r = subprocess.run([EXE, "train", example, "--out", str(run_dir), "--set", "train.steps=34",
                        "--set", "train.eval_every=0", "--set", "fp8_monitor.every=2",
                        "--set", "data.corrupt_step=22", "--set", "spikes.action=log"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = tmp_path / "validate.json"
    r = subprocess.run([EXE, "validate", config, "--layouts", "dp2,tp2", "--steps", "6",
                        "--json", str(report), "--md", str(tmp_path / "validate.md")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    grid = json.loads(report.read_text())["layouts"][0]["grid"]
    assert len(grid["max_ulp"]) == len(grid["tensors"]) and all(
        row == [0] * 6 for row in grid["max_ulp"])
    w = Window(display, config)
    try:
        w.type_text("field:open", "open", str(run_dir / "run.h5"))
        w.click("open")
        s = w.wait_for(lambda s: s["source"].endswith("run.h5"))
        assert s["loss_points"] == 34
        assert s["fp8_rows"] > 0 and s["spike_steps"] == 34 and s["spike_events"] >= 1, s
        assert s["memory_ranks"] == 1
        w.type_text("field:open", "open", str(report))
        w.click("open")
        s = w.wait_for(lambda s: len(s["check"]["layouts"]) == 2)
        for g in s["check"]["layouts"]:
            assert g["verdict"] == "match" and g["cells"] == g["rows"] * 6 > 0, g
            assert g["cells_done"] == g["cells"], g
    finally:
        w.close()


@pytest.fixture(scope="module")
def traces(config, tmp_path_factory):
    """Three traces of the tiny job, 3 steps each: the reference, another canonical tree
    (numerics.block 8: every sum in another order, within budget) and a learning rate 10% high
    (over budget from step 1's update on); and the compare report of the last against the
    first."""
    folder = tmp_path_factory.mktemp("gui_traces")
    paths = {}
    for name, sets in {"ref": [], "tree": ["numerics.block=8"], "lr": ["train.lr=0.0033"]}.items():
        paths[name] = str(folder / f"{name}.h5")
        args = [EXE, "record", config, "--out", paths[name], "--steps", "3"]
        r = subprocess.run(args + [a for k in sets for a in ("--set", k)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    paths["report"] = str(folder / "compare.json")
    r = subprocess.run([EXE, "compare", paths["ref"], paths["lr"], "--json", paths["report"]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr  # over budget
    return paths


def compare_shot(env, config, folder, *args):
    r = subprocess.run([EXE, "gui", "--screenshot", str(folder), "--steps", "2", config,
                        "--out", str(folder / "run"), *args],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.asarray(Image.open(folder / "layout_check.png").convert("RGB")).astype(np.int32)


def test_two_traces_compared_in_the_layout_check(display, config, traces, tmp_path):
    """`parallax gui --screenshot DIR --compare REF RUN`: the layout check panel shows the two
    traces' grid of ops × steps coloured by error / budget. A learning rate 10% high: red and
    orange cells (over budget) and the first divergence outlined in yellow. Another summation
    order: green cells, none red, nothing outlined. The compare report opened with --open draws
    the panel that --compare of its two traces drew."""
    over = compare_shot(display, config, tmp_path / "over", "--compare", traces["ref"], traces["lr"])
    within = compare_shot(display, config, tmp_path / "within", "--compare", traces["ref"],
                          traces["tree"])
    report = compare_shot(display, config, tmp_path / "report", "--open", traces["report"])
    for name, img in {"over": over, "within": within, "report": report}.items():
        assert img.shape[0] >= 600 and img.shape[1] >= 800, name
        assert img.std() > 5, f"{name}: blank"
        light = int((img.min(axis=2) > 150).sum())
        assert light > 400, f"{name}: no text ({light} light pixels)"
        frac, least, colours = PLOTS["layout_check"]
        n = coloured(region(img, frac))
        assert n >= least, f"{name}: {n} coloured pixels in the grid, want >= {least}"
        assert distinct(img) >= colours, f"{name}: {distinct(img)} colours"
    grid = (0.15, 0.18, 0.90, 0.90)

    def red(img):  # over budget: orange to red (budget_colour), red channel full, blue low
        g = region(img, grid)
        return int(((g[..., 0] >= 250) & (g[..., 1] <= 115) & (g[..., 2] <= 45)).sum())

    def green(img):  # within budget: green to yellow-green, green the strongest channel
        g = region(img, grid)
        return int(((g[..., 1] > g[..., 0] + 15) & (g[..., 1] > g[..., 2] + 60)).sum())

    def yellow(img):  # the first divergence's outline and label (plot::kYellow)
        return int((np.abs(img - np.array([240, 210, 80])).sum(axis=2) < 12).sum())

    assert red(over) > 20000, red(over)
    assert yellow(over) > 100, yellow(over)
    assert red(within) == 0 and green(within) > 20000, (red(within), green(within))
    assert yellow(within) < 20, yellow(within)
    # The report draws what its comparison drew (the report's file name is the only difference).
    same = int((np.abs(report - over).sum(axis=2) > 30).sum())
    assert same < 0.02 * over.shape[0] * over.shape[1], f"{same} pixels differ"


def test_traces_compared_in_the_window(display, config, traces):
    """The two paths typed into the layout check panel and Compare pressed: the grid, its verdict
    and its first divergence; one path alone and the button shows that trace's probes."""
    w = Window(display, config)
    try:
        w.click("tab:layout_check")
        w.type_text("field:reference_trace", "reference_trace", traces["ref"])
        w.type_text("field:run_trace", "run_trace", traces["lr"])
        w.click("compare")
        s = w.wait_for(lambda s: s["check"]["mode"] == "compare" and not s["check"]["running"]
                       and s["check"]["layouts"])
        g = s["check"]["layouts"][0]
        assert g["verdict"] == "over budget", s["check"]
        assert g["summary"].startswith("over budget: step 1, optim/-/param/wte"), g
        assert g["first_cell"][1] == 0 and g["first_cell"][0] >= 0, g
        assert g["cells"] == g["rows"] * 3 == g["cells_done"] and g["over_budget"] > 0, g
        assert "compare_verdict" in s["rects"]
        w.type_text("field:run_trace", "run_trace", "")
        w.click("compare")
        s = w.wait_for(lambda s: s["check"]["mode"] == "trace")
        g = s["check"]["layouts"][0]
        assert g["cells_done"] == g["cells"] == g["rows"] * 3, g
        assert "source parallax" in s["check"]["header"], s["check"]
    finally:
        w.close()


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(scope="module")
def moe_config(tmp_path_factory):
    """examples/moe-small.toml (2 MoE layers of 4 experts, top-2, capacity 1.25), no run file."""
    text = open(os.path.join(EXAMPLES, "moe-small.toml")).read()
    assert 'dir = "runs/moe-small"' in text
    path = tmp_path_factory.mktemp("gui_moe") / "moe-small.toml"
    path.write_text(text.replace('dir = "runs/moe-small"', "run_file = false"))
    return str(path)


def test_the_router_panel_of_a_moe_job(display, moe_config, tmp_path):
    """The router panel's screenshot of a MoE job: the load heatmaps (experts × steps of a layer,
    experts × layers at the last step) and the per-layer lines are drawn, in colours on both sides
    of the even share."""
    img = screenshots(display, moe_config, tmp_path / "moe", 12, ["router"])["router"]
    h, w, _ = img.shape
    # The experts × steps heatmap (left 60%, below the controls): 4 rows × 12 columns of cells.
    heat = region(img, (0.04, 0.12, 0.55, 0.40))
    assert coloured(heat) < heat.shape[0] * heat.shape[1]  # not one block of colour
    colours = np.unique(heat.reshape(-1, 3), axis=0)
    assert len(colours) >= 12, f"the load heatmap has {len(colours)} colours"
    # Blue cells (below the even share) and, as the loads sum to E(1 - dropped), warm ones
    # (above it) whenever any expert took less than its share.
    blue = int(((heat[..., 2] > heat[..., 0] + 40)).sum())
    warm = int(((heat[..., 0] > heat[..., 2] + 25)).sum())
    assert blue > 500 and warm > 200, (blue, warm)
    # The four line plots below: a line for each of the two layers in each.
    lines = region(img, (0.03, 0.50, 0.99, 0.95))
    assert coloured(lines) > 3000, coloured(lines)


def test_the_router_panel_driven_by_real_input(display, moe_config, tmp_path):
    """A MoE job started with a click, the Router tab opened: its layers and experts fill in step
    by step; a click on a heatmap cell chooses a step (no longer following the latest), the
    button follows the latest again, a click on the right heatmap's second column chooses layer
    h.1. Then a finished MoE run.h5 opened in the window shows its steps."""
    w = Window(display, moe_config)
    try:
        s = w.state()
        assert s["router"]["steps"] == 0
        w.click("start", s)
        w.click("tab:router")
        s = w.wait_for(lambda s: s["router"]["steps"] >= 4)
        r = s["router"]
        assert r["layers"] == [0, 1] and r["experts"] == 4, r
        assert r["following"] and r["layer"] == 0 and r["expert"] == -1, r
        # Steps 1, 2, ...; a step's router values come just before its metrics row.
        assert r["step"] == r["steps"] <= s["steps_done"] + 1, (r, s["steps_done"])
        assert r["load_max"] > 1.0, r  # some expert over its even share
        x, y, rw, rh = s["rects"]["router_tokens"]
        # A cell a third of the way along the steps, in the heatmap's second row (expert 1).
        lw = 80  # row labels ("expert 1") to the left of the cells, the colour bar (130) right
        ax, bx = x + lw, x + rw - 130
        top, bottom = y + rh * 0.08, y + rh * 0.80
        w.xdo("mousemove", "--window", w.wid, str(int(ax + (bx - ax) / 3)),
              str(int(top + (bottom - top) * 0.375)))
        time.sleep(0.1)
        w.xdo("mousedown", "1")
        time.sleep(0.1)
        w.xdo("mouseup", "1")
        time.sleep(0.2)
        s = w.wait_for(lambda s: not s["router"]["following"])
        r = s["router"]
        assert r["expert"] == 1, r
        assert 1 <= r["step"] < s["router"]["steps"], r
        chosen, seen = r["step"], s["router"]["steps"]
        s = w.wait_for(lambda s: s["router"]["steps"] > seen)  # the job went on; the step stays
        assert s["router"]["step"] == chosen and not s["router"]["following"], s["router"]
        w.click("router_latest", s)
        s = w.wait_for(lambda s: s["router"]["following"])
        assert s["router"]["step"] >= chosen
        x, y, rw, rh = s["rects"]["router_layers"]
        w.xdo("mousemove", "--window", w.wid, str(int(x + 20 + (rw - 150) * 0.8)),
              str(int(y + rh * 0.45)))
        time.sleep(0.1)
        w.xdo("mousedown", "1")
        time.sleep(0.1)
        w.xdo("mouseup", "1")
        s = w.wait_for(lambda s: s["router"]["layer"] == 1)
        w.click("stop", s)

        # A finished MoE run file, opened: its router statistics of every step.
        run_dir = tmp_path / "run"
        r = subprocess.run([EXE, "train", moe_config, "--out", str(run_dir),
                            "--set", "train.steps=5", "--set", "train.eval_every=0",
                            "--set", "output.run_file=true"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        w.type_text("field:open", "open", str(run_dir / "run.h5"))
        w.click("open")
        s = w.wait_for(lambda s: s["source"].endswith("run.h5") and s["router"]["steps"] == 5)
        assert s["router"]["layers"] == [0, 1] and s["router"]["experts"] == 4, s["router"]
    finally:
        w.close()


def test_a_dense_job_until_experts_are_set(display, config):
    """The router panel of a dense job holds nothing (its empty state); model.moe_experts typed
    into the editor and Restart: the same model with 4 experts per layer, its router filling in.
    Then dp 2 and ep 2 typed in and Restart: the layout explorer follows the job, each of its two
    ranks holding two of the experts."""
    w = Window(display, config)
    try:
        s = w.state()
        assert s["fields"]["model.moe_experts"] == "0", s["fields"]
        w.click("start", s)
        w.click("tab:router")
        s = w.wait_for(lambda s: s["loss_points"] >= 3)
        assert s["router"]["steps"] == 0 and s["router"]["layers"] == [], s["router"]
        w.type_into("model.moe_experts", "4")
        w.click("restart")
        s = w.wait_for(lambda s: s["router"]["steps"] >= 2)
        assert s["router"]["layers"] == [0, 1] and s["router"]["experts"] == 4, s["router"]
        assert s["editor_errors"] == {}

        w.type_into("layout.dp", "2")
        w.type_into("layout.ep", "2")
        w.click("restart")
        w.click("tab:layout_explorer")
        s = w.wait_for(lambda s: not s["explorer_busy"] and s["explorer_ep"] == 2)
        assert s["explorer_ranks"] == 2 and s["explorer_experts"] == [[0, 2], [2, 4]], s
        assert "explorer_ep" in s["rects"] and s["editor_errors"] == {}
    finally:
        w.close()


# The tiny job on two data-parallel ranks, no evaluation: its last step's collectives are the
# step's own, which the planner predicts byte for byte.
DP2 = TINY.replace("eval_every = 5", "eval_every = 0") + "[layout]\ndp = 2\n"
CPU_CLUSTER = os.path.join(EXAMPLES, "clusters", "cpu-inprocess.toml")


@pytest.fixture(scope="module")
def dp2_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("gui_plan") / "tiny-dp2.toml"
    path.write_text(DP2)
    return str(path)


def test_the_plan_panel_ranks_layouts_and_meets_the_run(display, dp2_config):
    """The Plan tab of a dp2 job: the devices field holds the job's world size, the cluster the
    in-process CPU ranks' file found beside the tree; Plan ranks the layouts, the fittest first.
    Then the job runs, and its own layout's prediction stands beside its measurements: memory per
    rank, step time, rank 0's bytes sent and the dp group's bytes per step, the last two equal."""
    w = Window(display, dp2_config)
    try:
        w.click("tab:plan")
        s = w.state()
        assert s["fields"]["plan_gpus"] == "2", s["fields"]
        assert s["fields"]["plan_cluster"].endswith("cpu-inprocess.toml"), s["fields"]
        assert any(c.endswith("a100-ib200.toml") for c in s["plan"]["clusters"]), s["plan"]
        assert not s["plan"]["ready"]
        w.click("plan_button", s)
        s = w.wait_for(lambda s: s["plan"]["ready"] and not s["plan"]["busy"])
        p = s["plan"]
        assert p["error"] == "" and p["gpus"] == 2 and p["candidates"] >= 10, p
        rows = p["rows"]
        assert rows[0]["fits"] and rows[0]["memory_bytes"] < p["usable_bytes"], rows[0]
        steps = [r["step_s"] for r in rows if r["fits"]]
        # fastest first (ties within 1e-6 go to the one that computes less)
        assert all(a <= b * (1 + 1e-6) for a, b in zip(steps, steps[1:])) and steps[0] > 0, steps
        assert "plan_table" in s["rects"] and "plan_comparison" not in s["rects"]

        w.click("start", s)
        s = w.wait_for(lambda s: s["steps_done"] >= 6 and s["plan"]["comparison"]["steps"] >= 6,
                       timeout=120)
        c = s["plan"]["comparison"]
        assert c["error"] == "" and c["layout"] == "dp2 m1", c
        rows = {r["what"]: r for r in c["rows"]}
        mem = rows["memory per rank (largest)"]
        assert 0.5 < mem["measured"] / mem["predicted"] < 2, mem
        step = next(r for k, r in rows.items() if k.startswith("step time"))
        assert step["measured"] > 0 and step["predicted"] > 0, step
        sent = rows["comm sent per step, rank 0"]
        assert sent["measured"] == sent["predicted"] > 0, sent
        dp = next(r for k, r in rows.items() if k.startswith("comm dp "))
        assert dp["measured"] == dp["predicted"] > 0, dp
        assert "plan_comparison" in s["rects"]
    finally:
        w.close()


def test_the_plan_panel_screenshot(display, dp2_config, tmp_path):
    """`parallax gui --screenshot DIR --steps 6 --cluster cpu-inprocess.toml`: the plan panel
    shows its ranked table (rows of text down the panel) and, under it, the job's layout beside
    its measurements (text in the lower half too), with the job's row highlighted in blue."""
    folder = tmp_path / "shots"
    r = subprocess.run([EXE, "gui", "--screenshot", str(folder), "--steps", "6", dp2_config,
                        "--out", str(folder / "run"), "--cluster", CPU_CLUSTER],
                       env=display, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    img = np.asarray(Image.open(folder / "plan.png").convert("RGB")).astype(np.int32)
    assert img.shape[0] >= 600 and img.shape[1] >= 800

    def text_rows(frac):  # pixel rows of a region that hold light text
        g = region(img, frac)
        return int(((g.min(axis=2) > 150).sum(axis=1) > 3).sum())

    table = (0.0, 0.10, 1.0, 0.55)
    assert text_rows(table) > 150, text_rows(table)  # a table: many lines of text, not one
    light = int((region(img, table).min(axis=2) > 150).sum())
    assert light > 5000, light
    assert text_rows((0.0, 0.60, 1.0, 0.95)) > 40  # the comparison under it
    blue = region(img, table)
    job_row = int(((np.abs(blue - np.array([40, 80, 130])).sum(axis=2) < 10)).sum())
    assert job_row > 2000, f"the job's row is not highlighted ({job_row} pixels)"
