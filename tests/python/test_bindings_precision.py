"""Low precision from Python: the library's bf16, fp16 and fp8 data as numpy dtypes (ml_dtypes),
its casts bit for bit against ml_dtypes' where both round to nearest even and its own saturation
where they differ, the fp8 casts of both recipes with their codes and scales, the fp8 scaling
state of a job and of a checkpoint; and a layout described with its collectives per layer."""
import ml_dtypes
import numpy as np
import pytest

import parallax

SMALL = dict(model={"seq_len": 64, "layers": 2}, train={"steps": 10, "threads": 1, "eval_every": 5},
             numerics={"block": 32})
# Every block's linears in fp8 (the default model's two blocks would otherwise both stay bf16),
# a short amax history.
FP8 = {"activations": "bf16", "fp8": "delayed", "fp8_layers": "all", "fp8_amax_history_len": 4}


def small(**over):
    sections = {k: dict(v) for k, v in SMALL.items()}
    for k, v in over.items():
        sections.setdefault(k, {}).update(v)
    return sections


def bits(a):
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def awkward_floats(n=20000, seed=0):
    """fp32 values over the whole range: normal and subnormal, exact ties of bf16 and fp16,
    zeros of both signs, and the largest finite values."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    ties = (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    ties16 = (np.float32(1.5) + np.arange(200, dtype=np.float32) * np.float32(2**-10)
              + np.float32(2**-11))
    small_ = rng.standard_normal(5000).astype(np.float32) * np.float32(2.0) ** rng.integers(
        -30, 20, 5000).astype(np.float32)
    edges = np.array([0.0, -0.0, 448.0, 464.0, -465.0, 57344.0, 61440.0, 65504.0, 65520.0,
                      3.3895314e38, 1e-45, -1e-40], dtype=np.float32)
    return np.concatenate([x, ties[np.isfinite(ties)], ties16, small_, edges]).astype(np.float32)


# ---- casts -----------------------------------------------------------------------------------


def test_the_library_dtypes_are_ml_dtypes_and_numpy_dtypes():
    assert parallax.numpy_dtype("bf16") == np.dtype(ml_dtypes.bfloat16)
    assert parallax.numpy_dtype("f16") == np.dtype(np.float16)
    assert parallax.numpy_dtype("e4m3") == np.dtype(ml_dtypes.float8_e4m3fn)
    assert parallax.numpy_dtype("e5m2") == np.dtype(ml_dtypes.float8_e5m2)
    assert parallax.numpy_dtype("f32") == np.dtype(np.float32)
    with pytest.raises(parallax.ConfigError, match="e4m3"):
        parallax.numpy_dtype("fp4")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16_bit_casts_are_ml_dtypes_bits_overflow_included(dtype):
    x = awkward_floats()
    x = np.concatenate([x, np.array([np.inf, -np.inf], np.float32)])
    got = parallax.cast(x, dtype)
    assert got.dtype == parallax.numpy_dtype(dtype) and got.shape == x.shape
    with np.errstate(over="ignore"):
        want = x.astype(parallax.numpy_dtype(dtype))
    assert np.array_equal(bits(got), bits(want))
    # Widening is exact, and narrowing again gives the same bits.
    back = parallax.cast(got, "f32")
    assert back.dtype == np.float32
    assert np.array_equal(bits(back), bits(want.astype(np.float32)))
    assert np.array_equal(bits(parallax.cast(back, dtype)), bits(got))
    # NaN stays NaN (quiet).
    assert np.isnan(parallax.cast(np.array([np.nan], np.float32), dtype).astype(np.float32)).all()


@pytest.mark.parametrize("dtype,top", [("e4m3", 448.0), ("e5m2", 57344.0)])
def test_fp8_casts_are_ml_dtypes_bits_in_range_and_saturate_beyond(dtype, top):
    x = awkward_floats()
    got = parallax.cast(x, dtype)
    want = x.astype(parallax.numpy_dtype(dtype))
    assert got.dtype == want.dtype
    # Where ml_dtypes' result is finite, the library's bits are the same (nearest even, with
    # gradual underflow).
    finite = np.isfinite(want.astype(np.float32))
    assert finite.sum() > 10000
    assert np.array_equal(bits(got)[finite], bits(want)[finite])
    # Beyond the largest finite value ml_dtypes gives NaN (e4m3fn) or inf (e5m2); the library
    # saturates to ±top, infinities included (OCP saturating mode, core/base/dtype.h).
    over = ~finite
    assert over.sum() > 100
    g = got.astype(np.float32)
    assert np.array_equal(g[over], np.where(x[over] > 0, top, -top).astype(np.float32))
    inf = parallax.cast(np.array([np.inf, -np.inf], np.float32), dtype).astype(np.float32)
    assert list(inf) == [top, -top]
    nan = parallax.cast(np.array([np.nan], np.float32), dtype).astype(np.float32)
    assert np.isnan(nan).all()


# ---- fp8 casts with their scales ---------------------------------------------------------------


@pytest.mark.parametrize("role,dtype,top", [("x", "e4m3", 448.0), ("w", "e4m3", 448.0),
                                            ("dy", "e5m2", 57344.0)])
def test_a_delayed_cast_gives_its_codes_and_scale_and_the_library_reads_them_back(role, dtype, top):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((48, 80)) * 30).astype(np.float32)
    x[0, :4] = [1e6, -1e6, np.inf, 0.0]  # saturate, and an inf (whose amax the scale ignores)
    scale = np.float32(0.37)
    c = parallax.fp8_cast(x, recipe="delayed", role=role, scale=float(scale))
    q = c["q"]
    assert q.dtype == parallax.numpy_dtype(dtype) and q.shape == x.shape
    assert c["scale"].dtype == np.float32 and c["scale"] == scale
    assert c["scale_inv"] == np.float32(1) / scale
    # The codes are x·scale cast to nearest even (ml_dtypes' bits where it stays finite), ...
    prod = x * scale
    want = prod.astype(q.dtype)
    finite = np.isfinite(want.astype(np.float32))
    assert np.array_equal(bits(q)[finite], bits(want)[finite])
    # ... saturating where ml_dtypes overflows, ...
    assert np.array_equal(q.astype(np.float32)[~finite],
                          np.where(prod[~finite] > 0, top, -top).astype(np.float32))
    # ... and the library's own cast (its vector path) reads exactly them back.
    assert c["values"].dtype == np.float32
    assert np.array_equal(bits(c["values"]), bits(q.astype(np.float32) * c["scale_inv"]))
    assert c["amax"] == np.abs(x).max() and not c["nan"]


def test_a_block_cast_scales_each_tile_by_448_over_its_amax():
    rng = np.random.default_rng(2)
    b = 16
    x = (rng.standard_normal((40, 70)) * rng.uniform(0.01, 100, (40, 70))).astype(np.float32)
    x[16:32, 16:32] = 0.0       # a weight block of zeros: scale 1
    x[0, 35] = np.inf           # a tile holding an inf: scale 1
    for role, band in [("x", 1), ("w", b), ("dy", 1)]:
        c = parallax.fp8_cast(x, recipe="block", role=role, block_size=b)
        q, s = c["q"], c["scale"]
        assert q.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
        assert s.shape == (-(-40 // band), -(-70 // b)) and c["tile"] == (band, b)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                tile = x[i * band:(i + 1) * band, j * b:(j + 1) * b]
                amax = np.abs(tile).max()
                want = np.float32(448) / amax if (amax > 0 and np.isfinite(amax)) else 1.0
                assert s[i, j] == np.float32(want), (role, i, j)
                qt = q[i * band:(i + 1) * band, j * b:(j + 1) * b]
                p = tile * s[i, j]
                m = np.isfinite(p)
                assert np.array_equal(bits(qt)[m], bits(p[m].astype(qt.dtype)))
                vt = c["values"][i * band:(i + 1) * band, j * b:(j + 1) * b]
                assert np.array_equal(bits(vt), bits(qt.astype(np.float32) * c["scale_inv"][i, j]))


def test_bad_fp8_casts_raise_config_errors():
    with pytest.raises(parallax.ConfigError, match="recipe"):
        parallax.fp8_cast(np.ones(4, np.float32), recipe="mxfp8")
    with pytest.raises(parallax.ConfigError, match="role"):
        parallax.fp8_cast(np.ones(4, np.float32), role="z")
    with pytest.raises(parallax.ConfigError, match="scale"):
        parallax.fp8_cast(np.ones(4, np.float32), scale=0.0)


# ---- what a job holds narrow, and its fp8 state ------------------------------------------------


@pytest.mark.parametrize("act,dtype", [("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)])
def test_probes_of_narrow_activations_come_back_in_their_dtype(act, dtype):
    job = parallax.Job(**small(precision={"activations": act}),
                       probes=["1/fwd/*/attn.qkv/out", "1/bwd/*/mlp.fc/dinp", "1/grad/**"])
    job.step()
    out = job.probe("1/fwd/0/attn.qkv/out")
    assert out.dtype == np.dtype(dtype) and out.shape == (8, 64, 192)
    assert job.probe("1/bwd/1/mlp.fc/dinp").dtype == np.dtype(dtype)
    # Gradients of the weights are fp32 master gradients.
    assert job.probe("1/grad/0/param/mlp.c_fc.weight").dtype == np.float32
    # The same probe under tp2 is the same bits, put together from both ranks.
    tp = parallax.Job(**small(precision={"activations": act}, layout={"tp": 2}),
                      probes=["1/fwd/*/attn.qkv/out"])
    tp.step()
    got = tp.probe("1/fwd/0/attn.qkv/out")
    assert got.dtype == out.dtype and np.array_equal(bits(got), bits(out))


def test_the_fp8_state_is_a_view_of_the_job_and_follows_the_library_rule():
    job = parallax.Job(**small(precision=FP8))
    st = job.fp8_state()
    assert st["recipe"] == "delayed" and st["roles"] == ("x", "w", "dy")
    assert st["gemms"][:4] == ["h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc",
                               "h.0.mlp.c_proj"] and len(st["gemms"]) == 8
    assert st["dtypes"] == (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fn),
                            np.dtype(ml_dtypes.float8_e5m2))
    scale, hist = st["scale"], st["amax_history"]
    assert scale.dtype == np.float32 and scale.shape == (8, 3) and hist.shape == (8, 3, 4)
    assert not scale.flags.writeable and (scale == 1).all() and (hist == 0).all()
    job.step(3)
    # The views see the steps: scale = fp8_max / max(history), newest amax first.
    assert (hist[:, :, :3] > 0).all() and (hist[:, :, 3] == 0).all()
    want = st["fp8_max"][None, :] / hist.max(axis=2)
    assert np.array_equal(bits(scale), bits(want.astype(np.float32)))
    assert job.fp8_state()["scale"].tobytes() == scale.tobytes()
    # The same bits under a layout.
    tp = parallax.Job(**small(precision=FP8, layout={"tp": 2, "dp": 2}))
    tp.step(3)
    assert tp.fp8_state()["scale"].tobytes() == scale.tobytes()
    assert tp.fp8_state()["amax_history"].tobytes() == hist.tobytes()
    assert parallax.Job(**small()).fp8_state() is None


def test_a_jobs_weight_cast_is_the_cast_its_next_step_makes():
    job = parallax.Job(**small(precision=FP8))
    job.step(2)
    st = job.fp8_state()
    g = st["gemms"].index("h.1.mlp.c_fc")
    c = job.fp8_cast("h.1.mlp.c_fc.weight")
    assert c["gemm"] == "h.1.mlp.c_fc" and c["weight"] == "h.1.mlp.c_fc.weight"
    assert c["q"].dtype == np.dtype(ml_dtypes.float8_e4m3fn) and c["q"].shape == (256, 64)
    assert c["scale"] == st["scale"][g, 1]
    again = parallax.fp8_cast(job.weights()["h.1.mlp.c_fc.weight"], scale=float(st["scale"][g, 1]),
                              role="w")
    assert c["q"].tobytes() == again["q"].tobytes()
    assert c["values"].tobytes() == again["values"].tobytes()
    assert np.array_equal(bits(c["values"]), bits(c["q"].astype(np.float32) * c["scale_inv"]))
    with pytest.raises(parallax.ConfigError, match="not an fp8 matmul"):
        job.fp8_cast("wpe")
    block = parallax.Job(**small(precision={"activations": "bf16", "fp8": "block",
                                            "fp8_layers": "all", "fp8_block_size": 32}))
    block.step()
    assert block.fp8_state()["scale"] is None
    b = block.fp8_cast("h.0.attn.c_attn")
    assert b["scale"].shape == (192 // 32, 64 // 32) and b["tile"] == (32, 32)
    with pytest.raises(parallax.ConfigError, match="no fp8"):
        parallax.Job(**small()).fp8_cast("h.0.mlp.c_fc")


def test_a_checkpoint_holds_the_fp8_state_the_job_had(tmp_path):
    job = parallax.Job(**small(precision=FP8))
    job.step(3)
    path = job.save_checkpoint(tmp_path / "ck")
    st = job.fp8_state()
    ck = parallax.read_checkpoint(path)["fp8"]
    assert ck["gemms"] == st["gemms"] and ck["history_len"] == 4
    assert ck["scale"].dtype == np.float32 and ck["scale"].tobytes() == st["scale"].tobytes()
    assert ck["amax_history"].tobytes() == st["amax_history"].tobytes()
    info = parallax.inspect_checkpoint(path)["fp8"]
    assert info["scale"].tobytes() == st["scale"].tobytes()
    plain = parallax.Job(**small())
    plain.step()
    assert parallax.read_checkpoint(plain.save_checkpoint(tmp_path / "plain"))["fp8"] is None


# ---- a layout in words, with its collectives per layer -----------------------------------------


def test_a_layout_describes_its_collectives_per_layer_with_their_bytes():
    cfg = small(layout={"dp": 2, "tp": 2})
    d = parallax.layout(**cfg, explore=True)
    e = parallax.explore_layout(**cfg)
    # (Rows of different groups at the same point come in the order their ranks reached it.)
    key = lambda r: (r["phase"], r["layer"], r["op"], r["group"], r["collective"], r["ranks"])
    assert sorted(d["collectives"], key=key) == sorted(e["collectives"], key=key)
    assert sorted(d["holds_text"]) == sorted(e["text"])
    assert sorted(d["collectives_text"]) == sorted(e["collectives_text"])
    # One line per collective, with its layer, group, calls and bytes.
    for row, line in zip(e["collectives"], e["collectives_text"]):
        where = "model" if row["layer"] < 0 else f"layer {row['layer']}"
        assert line.startswith(f"{where} {row['phase']} {row['op']}: {row['group']} "
                               f"{row['collective']}, {row['calls']} call")
    assert any(line.startswith("layer 1 fwd attn.proj: tp all_reduce") for line in e["collectives_text"])
    # Bytes per layer and rank: the rows' bytes × calls, summed.
    per = d["bytes_per_layer"]
    assert set(per) == {-1, 0, 1}
    for layer, arr in per.items():
        want = np.zeros(4, np.int64)
        for row in e["collectives"]:
            if row["layer"] == layer:
                for r in row["ranks"]:
                    want[r] += row["bytes"] * row["calls"]
        assert arr.dtype == np.int64 and np.array_equal(arr, want)
    assert per[0][0] > 0
    # In words: the mesh, who holds what, the collectives, memory per rank.
    text = d["text"]
    assert text.startswith(parallax.layout(**cfg)["text"])
    assert "rank 1 = dp0 · pp0 · tp1 holds h.0.attn.c_proj.weight[:, 32:64]" in text
    assert e["collectives_text"][1] in text and "memory per rank" in text
    assert len(d["memory"]) == 4


def test_a_jobs_description_reaches_the_collectives_per_layer():
    job = parallax.Job(**small(layout={"tp": 2}))
    plain = job.describe()
    full = job.describe(collectives=True)
    assert full.startswith(plain) and len(full) > len(plain)
    e = job.explore()
    assert len(e["collectives"]) == len(parallax.explore_layout(**small(layout={"tp": 2}))["collectives"])
    for line in e["collectives_text"]:
        assert line in full
    assert job.steps_done == 0  # the job's own ranks did not step
