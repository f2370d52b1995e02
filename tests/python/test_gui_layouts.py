"""The workbench under layouts beyond dp, tp and pp, driven with real X input events (xdotool)
through test_gui's Window: a cp2 job started with a click shows both ranks, each with its own
measured step, in the Pipeline panel and both ranks' memory in Memory & comm; the layout explorer
follows the job bar's fields as they are typed (no Start), keeps the person's own pick through a
Start, runs its own numerics.block; a weight that both dp ranks hold whole is painted as
replicated (diagonal stripes of both ranks' colours), not as two halves; for a llama job it
shows the attention heads on the tp ranks, the KV heads split under tp2 and whole on every rank
under tp4 (which does not divide 2 KV heads), and the editor unfolds the llama block's keys."""
import numpy as np

from test_gui import (  # noqa: F401  (display: the module's Xvfb fixture, reused)
    TINY, Window, coloured, display, pytestmark, region, screenshots)

import pytest

# TINY with sequences of 64 tokens: cp = 2 cuts each into 4 zig-zag chunks of one 16-token block.
CP2 = TINY.replace("seq_len = 32", "seq_len = 64") + "[layout]\ncp = 2\n"


# examples/llama-tiny.toml's model (4 query heads over 2 KV heads) on TINY's short job, tp2 with
# blocks of 16 channels: a tp rank's one KV head of 16 channels is one block.
LLAMA = TINY.replace("[model]\n", """[model]
arch = "llama"
kv_heads = 2
rope_theta = 10000
""").replace("ffn = 128", "ffn = 192") + "[layout]\ntp = 2\n"
# Where the explorer's screenshot draws the query heads over the KV heads (fractions x0, y0, x1, y1).
HEADS_PICTURE = (0.09, 0.12, 0.36, 0.20)


@pytest.fixture(scope="module")
def cp2_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("gui_layouts") / "cp2.toml"
    path.write_text(CP2)
    return str(path)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("gui_layouts_tiny") / "tiny.toml"
    path.write_text(TINY)
    return str(path)


def test_a_cp2_job_shows_both_ranks_in_pipeline_and_memory(display, cp2_config, tmp_path):
    w = Window(display, cp2_config)
    try:
        s = w.state()
        assert s["pipeline"]["lanes"] == []
        w.click("start", s)
        w.click("tab:pipeline")
        s = w.wait_for(lambda s: s["pipeline"]["problem"] == "" and s["steps_done"] >= 2)
        lanes = s["pipeline"]["lanes"]
        assert [l["name"] for l in lanes] == ["rank 0: pp0 dp0 cp0 tp0",
                                              "rank 1: pp0 dp0 cp1 tp0"], lanes
        assert all(l["compute_bars"] >= 2 for l in lanes), lanes  # a forward and a backward each
        assert "measured_timeline" in s["rects"]
        w.click("tab:memory", s)
        s = w.wait_for(lambda s: len(s["memory_per_rank"]) == 2)
        assert all(m["params"] > 0 and m["grads"] > 0 for m in s["memory_per_rank"]), s
        assert "memory_plot" in s["rects"]
        w.click("stop", s)
    finally:
        w.close()
    # The same panels as pictures: two lanes of measured bars, two rank bars beside the estimate.
    img = screenshots(display, cp2_config, tmp_path / "cp2", 4, ["pipeline", "memory"])
    lanes = region(img["pipeline"], (0.11, 0.11, 0.99, 0.23))
    h = lanes.shape[0]
    for top, bottom in ((0.0, 0.45), (0.55, 1.0)):  # rank 0's lane, rank 1's lane
        n = coloured(lanes[int(top * h):int(bottom * h)])
        assert n > 5000, f"a cp2 lane of the pipeline has {n} coloured pixels"
    bars = region(img["memory"], (0.05, 0.05, 0.88, 0.47))
    cols = (bars.max(axis=2) - bars.min(axis=2) > 60).any(axis=0)
    runs = int(np.count_nonzero(np.diff(cols.astype(int)) == 1)) + int(cols[0])
    assert runs >= 3, f"memory: {runs} bars (the estimate and two ranks wanted)"


def test_the_explorer_follows_the_job_bar_and_keeps_its_own_picks(display, tiny_config,
                                                                  tmp_path):
    w = Window(display, tiny_config)
    try:
        w.click("tab:layout_explorer")
        # Typed into the job bar, no Start: the explorer follows and explores it.
        w.type_into("layout.dp", "2")
        s = w.wait_for(lambda s: s["explorer_picks"]["dp"] == 2 and not s["explorer_busy"]
                       and s["explorer_ranks"] == 2)
        assert s["status"] == "no job" and s["explorer_picks"]["follow"], s["explorer_picks"]
        # dp2 without ZeRO: every block of the matrix shown is held whole by both ranks.
        held = s["explorer_held"]
        assert held and all(b["replicated"] and b["ranks"] == [0, 1] for b in held), held
        # Its own numerics.block, then its own tp: picked here, no longer the job bar's.
        w.type_text("explorer_block", "explorer_block", "8")
        w.type_text("explorer_tp", "explorer_tp", "2")
        s = w.wait_for(lambda s: not s["explorer_picks"]["follow"])
        w.click("explore", s)
        s = w.wait_for(lambda s: not s["explorer_busy"] and s["explorer_ranks"] == 4
                       and s["explorer_block"] == 8)
        # Start the job (dp2, tp1): the explorer keeps its tp2 and block 8.
        w.click("start", s)
        s = w.wait_for(lambda s: s["steps_done"] >= 2 and not s["explorer_busy"])
        p = s["explorer_picks"]
        assert p["tp"] == 2 and p["dp"] == 2 and p["block"] == 8 and not p["follow"], p
        assert s["explorer_ranks"] == 4 and s["explorer_block"] == 8, s
        # A job bar edit no longer moves it; "follow the job bar" takes the bar's values again.
        w.type_into("layout.dp", "1")
        s = w.state()
        assert s["explorer_picks"]["dp"] == 2
        w.click("explorer_follow", s)
        s = w.wait_for(lambda s: s["explorer_picks"]["follow"] and s["explorer_picks"]["dp"] == 1
                       and s["explorer_picks"]["tp"] == 1 and s["explorer_picks"]["block"] == 16)
        w.wait_for(lambda s: not s["explorer_busy"] and s["explorer_ranks"] == 1)
    finally:
        w.close()


def test_replicated_weights_are_painted_as_replicated(display, tmp_path):
    """dp2: the attention matrix in diagonal stripes of rank 0's and rank 1's colours. Halves
    would be two flat blocks: every pixel row inside one block would be a single colour."""
    path = tmp_path / "dp2.toml"
    path.write_text(TINY + "[layout]\ndp = 2\n")
    img = screenshots(display, str(path), tmp_path / "dp2", 3, ["layout_explorer"])
    inner = region(img["layout_explorer"], (0.02, 0.20, 0.38, 0.50))
    blue = (inner[..., 2] > 200) & (inner[..., 0] < 120)  # rank 0
    orange = (inner[..., 0] > 200) & (inner[..., 2] < 100)  # rank 1
    assert blue.sum() > 5000 and orange.sum() > 5000, (blue.sum(), orange.sum())
    both = int((blue.any(axis=1) & orange.any(axis=1)).sum())  # rows with both colours
    assert both > 0.9 * inner.shape[0], f"{both} of {inner.shape[0]} rows hold both colours"


def test_the_explorer_shows_the_kv_heads_of_a_llama_job(display, tmp_path):
    path = tmp_path / "llama.toml"
    path.write_text(LLAMA)
    w = Window(display, str(path))
    try:
        s = w.state()
        # The editor: arch and the llama block's keys, unfolded for a llama job.
        assert s["fields"]["model.arch"] == "llama" and s["fields"]["model.kv_heads"] == "2"
        assert "editor_llama" in s["rects"] and "field:model.kv_heads" in s["rects"], s["rects"]
        w.click("tab:layout_explorer", s)
        s = w.wait_for(lambda s: not s["explorer_busy"] and s["explorer_ranks"] == 2
                       and s["explorer_heads"])
        h = s["explorer_heads"]
        assert h["split"] and h["kind"] == "grouped-query", h
        assert [r["q"] for r in h["ranks"]] == [[0, 2], [2, 4]], h
        assert [r["kv"] for r in h["ranks"]] == [[0, 1], [1, 2]], h
        assert h["ranks"][0]["text"] == "tp rank 0: q heads 0-1, kv head 0 (split)", h
        assert "explorer_heads" in s["rects"]
        # The matrix shown first is k_proj: one shard per tp rank.
        assert s["explorer_tensor"] == "model.layers.0.self_attn.k_proj.weight", s
        held = s["explorer_held"]
        assert [b["ranks"] for b in held] == [[0], [1]], held
        assert not any(b["replicated"] for b in held), held
        # tp4 does not divide the 2 KV heads: every rank holds k_proj whole.
        w.type_text("explorer_tp", "explorer_tp", "4")
        s = w.wait_for(lambda s: not s["explorer_picks"]["follow"])
        w.click("explore", s)
        s = w.wait_for(lambda s: not s["explorer_busy"] and s["explorer_ranks"] == 4)
        h = s["explorer_heads"]
        assert not h["split"], h
        assert [r["q"] for r in h["ranks"]] == [[0, 1], [1, 2], [2, 3], [3, 4]], h
        assert all(r["kv"] == [0, 2] for r in h["ranks"]), h
        assert h["ranks"][3]["text"] == ("tp rank 3: q head 3, kv heads 0-1 (whole on every rank: "
                                         "tp=4 does not divide kv_heads=2), reads kv head 1"), h
        held = s["explorer_held"]
        assert len(held) == 1 and held[0]["replicated"] and held[0]["ranks"] == [0, 1, 2, 3], held
    finally:
        w.close()
    # The picture: under tp2 the query heads in rank 0's and rank 1's colours, each KV head in
    # one rank's colour (split), above the k_proj matrix cut between the two.
    img = screenshots(display, str(path), tmp_path / "llama", 2, ["layout_explorer"])
    top = region(img["layout_explorer"], HEADS_PICTURE)
    blue = (top[..., 2] > 200) & (top[..., 0] < 120)  # tp rank 0
    orange = (top[..., 0] > 200) & (top[..., 2] < 100)  # tp rank 1
    assert blue.sum() > 3000 and orange.sum() > 3000, (blue.sum(), orange.sum())
