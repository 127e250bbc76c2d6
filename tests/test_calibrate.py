"""Calibration (attention alignment's Algorithm 1 and its extensions).

The searches are checked twice: on synthetic statistics whose answer is known
in closed form, and end to end on a tiny model against the numpy oracle
(statistics from the softmax written out in full).
"""

import math

import numpy as np
import pytest

from conftest import random_tokens
from reference import RefAttention, RefStats, forward


# --- synthetic statistics with a known answer ---------------------------------------------------
class Synthetic:
    """Pmax of unit u at temperature tau and length L: exp(-a * tau**c_u * log L), so the tau aligning
    L_ex with L_tr at tau = 1 is (log L_tr / log L_ex) ** (1 / c_u) for that unit."""

    def __init__(self, c):
        self.c = np.asarray(c, dtype=np.float64)  # [n_layer, n_head]

    def stats(self, tau, L):
        from llama_extrapolate.harness.stats import AttentionStats

        t = np.asarray(tau, dtype=np.float64)
        t = np.broadcast_to(t[:, None] if t.ndim == 1 else t, self.c.shape)
        pmax = np.exp(-0.3 * t ** self.c * math.log(L))
        z = np.zeros_like(self.c)
        return AttentionStats(count=np.ones_like(self.c), pmax=pmax, entropy=-np.log(pmax), n_keys=z + L,
                              logit_mean=z, logit_var=z + 1.0, mass=np.zeros(self.c.shape + (120,)),
                              bin_lower=np.arange(120))


def synthetic_calibrator(c, lengths=(256, 1024), training_length=64):
    from llama_extrapolate.harness import calibrate

    syn = Synthetic(c)
    cal = calibrate.Calibrator.__new__(calibrate.Calibrator)
    cal.tokens, cal.training_length, cal.lengths = np.zeros(2048, np.int32), training_length, list(lengths)
    cal.queries, cal.tail, cal.cache, cal.on_measure, cal.progress = "all", 16, {}, None, False
    passes = []

    def measure(tau):
        key = calibrate.tau_key(tau)
        if key not in cal.cache:
            passes.append(key)
            cal.cache[key] = calibrate.Measurement(tau=tau, at={L: syn.stats(tau, L) for L in cal.checkpoints},
                                                   seconds=0.0)
        return cal.cache[key]

    cal.measure = measure
    return cal, passes


def test_continuous_search_recovers_the_known_tau():
    cal, passes = synthetic_calibrator(np.ones((2, 3)))
    for L in (256, 1024):
        want = math.log(64) / math.log(L)
        for mode in ("pmax", "entropy"):
            got = cal.continuous(mode, L, tol=1e-4)
            assert abs(got["tau"] - want) < 2e-4, (mode, L, got, want)
    assert len(passes) < 30


def test_grid_search_is_the_papers_grid_argmin():
    from llama_extrapolate.harness import calibrate

    cal, _ = synthetic_calibrator(np.ones((2, 3)))
    out = cal.grid("pmax")
    for L in (256, 1024):
        want = math.log(64) / math.log(L)  # 0.75 and 0.6
        assert out[L]["tau"] == min(calibrate.PAPER_GRID, key=lambda t: abs(t - want))
        assert len(out[L]["curve"]) == 11


def test_per_layer_and_per_head_search_recover_each_units_tau():
    c = np.array([[1.0, 0.5, 2.0], [1.5, 0.8, 1.2]])
    cal, _ = synthetic_calibrator(c)
    for t in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5):
        cal.measure(t)
    want = (math.log(64) / math.log(1024)) ** (1 / c)
    head = cal.per_unit("pmax", 1024, "head", refine=3)
    assert np.abs(head["tau"] - want).max() < 5e-3
    assert head["mean_abs_error"][-1] < head["mean_abs_error"][0] or head["mean_abs_error"][0] < 1e-4
    layer = cal.per_unit("entropy", 1024, "layer", refine=3)
    assert layer["tau"].shape == (2,)


def test_propositions_closed_forms():
    from llama_extrapolate.harness import calibrate

    # Proposition 2 from its formula; Proposition 1's root satisfies the alignment equation of appendix A.2
    assert calibrate.proposition2(512, 2048, 1.0, 1.2) == pytest.approx(1.2 / math.sqrt(1 + 2 * math.log(4)))
    l_tr, l_ex, p_tr, s_tr, s_ex = 512, 4096, 0.3, 1.5, 1.6
    tau = calibrate.proposition1(l_tr, l_ex, p_tr, s_tr, s_ex)
    lmax = math.log(p_tr * l_tr * math.exp(s_tr ** 2 / 2))
    p_ex = math.exp(lmax / tau) / (l_ex * math.exp(s_ex ** 2 / (2 * tau ** 2)))
    assert p_ex == pytest.approx(p_tr, rel=1e-9)
    assert calibrate.log_length_tau(8192, 32768) == pytest.approx(math.log(8192) / math.log(32768))


# --- end to end on a tiny model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_cal(tiny_llama):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    tokens = random_tokens(model, 256, seed=11)
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=320, n_batch=64,
                                  n_ubatch=64, n_threads=2, verbose=False, type_k=0, type_v=0)
    yield model, path, tokens, llm
    llm.close()


def ref_mean(model, tokens, tau, L, mode):
    st = RefStats(model.n_layer, model.n_head)
    forward(model, tokens[:L], RefAttention(tau=tau), stats=st)
    return float(getattr(st, mode).sum() / st.count.sum())


def test_measure_equals_the_oracle_at_every_checkpoint(tiny_cal):
    from llama_extrapolate.harness import calibrate

    model, _, tokens, llm = tiny_cal
    m = calibrate.measure(llm, tokens, [64, 128, 256], 0.8, progress=False)
    for L in (64, 128, 256):
        for mode in ("pmax", "entropy"):
            assert m.at[L].mean(mode) == pytest.approx(ref_mean(model, tokens, 0.8, L, mode), rel=1e-3)


def test_algorithm1_grid_matches_the_oracles_choice(tiny_cal):
    from llama_extrapolate.harness import calibrate

    model, _, tokens, llm = tiny_cal
    cal = calibrate.Calibrator(llm, tokens, 64, [256], progress=False)
    grid = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
    got = cal.grid("pmax", grid)[256]
    target = ref_mean(model, tokens, 1.0, 64, "pmax")
    ref_curve = {t: ref_mean(model, tokens, t, 256, "pmax") for t in grid}
    assert got["tau"] == min(grid, key=lambda t: abs(ref_curve[t] - target))
    assert got["target"] == pytest.approx(target, rel=1e-3)


def test_continuous_search_aligns_the_statistic(tiny_cal):
    from llama_extrapolate.harness import calibrate

    model, _, tokens, llm = tiny_cal
    cal = calibrate.Calibrator(llm, tokens, 64, [256], progress=False)
    r = cal.continuous("entropy", 256, tol=2e-3)
    target = ref_mean(model, tokens, 1.0, 64, "entropy")
    assert r["bracket"][1] - r["bracket"][0] <= 2e-3 + 1e-9
    lo, hi = (ref_mean(model, tokens, t, 256, "entropy") - target for t in r["bracket"])
    assert lo * hi <= 0, "the oracle's statistic does not cross the target inside the reported bracket"


def test_calibrator_rejects_bad_settings(tiny_cal):
    from llama_extrapolate.harness import calibrate

    _, _, tokens, llm = tiny_cal
    cases = [
        (dict(lengths=[64]), "must be > training_length=64"),
        (dict(lengths=[512]), "n_ctx=320 is below"),
        (dict(lengths=[256], queries="some"), "queries='some'"),
        (dict(lengths=[256], tail=0), "tail=0"),
        (dict(lengths=[]), "lengths is empty"),
    ]
    for kw, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
            calibrate.Calibrator(llm, tokens if kw.get("lengths") != [512] else np.tile(tokens, 3), 64, **kw)
    with pytest.raises(ValueError, match="text has 100"):
        calibrate.Calibrator(llm, tokens[:100], 64, [256])


# --- profiles and schedules ----------------------------------------------------------------------
def test_profile_round_trip_and_lookups(tmp_path, tiny_llama):
    from llama_extrapolate.profile import CalibrationProfile, file_sha256

    _, path = tiny_llama
    prof = CalibrationProfile(model_name=path.name, model_sha256=file_sha256(path), training_length=64)
    prof.add("pmax", "global", "grid", 256, 0.75)
    prof.add("pmax", "global", "continuous", 256, 0.7321)
    prof.add("pmax", "global", "continuous", 1024, 0.61)
    prof.add("entropy", "layer", "refined", 256, [0.6, 0.7])
    f = tmp_path / "p.json"
    prof.save(f)
    back = CalibrationProfile.load(f)
    assert back == prof
    assert back.points("pmax") == ((64, 1.0), (256, 0.7321), (1024, 0.61))
    assert back.temperature(64) == 1.0 and back.temperature(32) == 1.0
    assert back.temperature(512) == pytest.approx(0.7321 + 0.5 * (0.61 - 0.7321))
    assert back.temperature(10**6) == 0.61
    assert np.allclose(back.temperature(256, "entropy", "layer"), [0.6, 0.7])
    back.check_model(path)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + b"\0" * 16)
    with pytest.raises(ValueError, match="calibrate this model first"):
        back.check_model(other)
    with pytest.raises(ValueError, match="no entropy/global"):
        back.points("entropy", "global")


@pytest.mark.parametrize("content, words", [
    ("{not json", "not JSON"),
    ('{"format": "something-else"}', "expected 'llama-extrapolate/calibration-profile/1'"),
    ('{"format": "llama-extrapolate/calibration-profile/1", "model_name": "x"}', "malformed"),
])
def test_bad_profiles_are_named(tmp_path, content, words):
    from llama_extrapolate.profile import CalibrationProfile

    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ValueError, match=words):
        CalibrationProfile.load(f)
    with pytest.raises(FileNotFoundError, match="llama-extrapolate calibrate"):
        CalibrationProfile.load(tmp_path / "missing.json")


def interp_points(points, p):
    xs = [math.log(L) for L, _ in points]
    x = math.log(p + 1)
    ts = [np.asarray(t, dtype=np.float64) for _, t in points]
    if x <= xs[0]:
        return ts[0]
    if x >= xs[-1]:
        return ts[-1]
    k = next(i for i in range(1, len(xs)) if xs[i] >= x)
    return ts[k - 1] + (x - xs[k - 1]) / (xs[k] - xs[k - 1]) * (ts[k] - ts[k - 1])


class PointsRef(RefAttention):
    """The oracle with a temperature schedule by points."""

    def __init__(self, points, **kw):
        super().__init__(**kw)
        self.points = points

    def temperature(self, layer, n_head, p):
        f = interp_points(self.points, p)
        f = np.full(n_head, float(f)) if f.ndim == 0 else (np.full(n_head, f[layer]) if f.ndim == 1 else f[layer])
        return super().temperature(layer, n_head, p) * f


@pytest.mark.parametrize("per_head", [False, True])
def test_schedule_by_points_matches_the_oracle(tiny_llama, per_head):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    tokens = random_tokens(model, 300, seed=12)
    if per_head:
        points = ((64, np.ones((2, 4)).tolist()), (128, np.linspace(0.6, 0.9, 8).reshape(2, 4).tolist()),
                  (300, np.full((2, 4), 0.5).tolist()))
    else:
        points = ((64, 1.0), (200, 0.7))
    cfg = AttentionConfig(sinks=4, window=32, ceiling=32, temperature_schedule="points", temperature_points=points)
    llm = llama_extrapolate.Llama(str(path), attention=cfg, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2,
                                  logits_all=True, verbose=False, type_k=0, type_v=0)
    try:
        llm.eval(tokens)
        got = np.asarray(llm.scores[:300], dtype=np.float64)
    finally:
        llm.close()
    ref = forward(model, tokens, PointsRef(points, sinks=4, window=32, ceiling=32))
    plain = forward(model, tokens, RefAttention(sinks=4, window=32, ceiling=32))
    assert np.abs(got - ref).max() < 2e-3
    assert np.abs(plain - ref).max() > 0.05, "the schedule must change the logits for this test to mean anything"


def test_points_at_millions_of_tokens_read_back_as_set(tiny_llama):
    """Lengths past 2^21 (a calibration at 4M tokens): the library holds them as given (their float logarithms
    alone came back as 3000002 for 3000001, and the read-back check refused the schedule)."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    _, path = tiny_llama
    points = ((64, 1.0), (3_000_001, 0.8), (4_194_305, 0.7))
    cfg = AttentionConfig(sinks=4, window=32, ceiling=32, temperature_schedule="points", temperature_points=points)
    llm = llama_extrapolate.Llama(str(path), attention=cfg, n_ctx=512, n_batch=64, verbose=False)
    try:
        lengths, _ = llama_extrapolate.native.get_temperature_points(llama_extrapolate.context_address(llm))
        assert [int(x) for x in lengths] == [64, 3_000_001, 4_194_305]
    finally:
        llm.close()


def test_temperature_points_are_read_only_into_arrays_of_their_size(tiny_llama):
    """llama_ext_get_temperature_points writes n_points lengths and n_points x n_layer x n_head values: asked with
    another count than the schedule holds, it writes nothing and returns LLAMA_EXT_ERR_COUNT (-2), so a caller's
    array too small for the schedule is never written past its end."""
    import ctypes

    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    cfg = AttentionConfig(sinks=4, window=32, ceiling=32, temperature_schedule="points",
                          temperature_points=((64, 1.0), (512, 0.9), (4096, 0.8)))
    llm = llama_extrapolate.Llama(str(path), attention=cfg, n_ctx=512, n_batch=64, verbose=False)
    lib = llama_cpp.llama_cpp._lib
    fn = lib.llama_ext_get_temperature_points
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_float), ctypes.c_size_t]
    fn.restype = ctypes.c_int32
    per_point = model.n_layer * model.n_head
    try:
        ctx = llama_extrapolate.context_address(llm)
        assert lib.llama_ext_get_temperature_n_points(ctypes.c_void_p(ctx)) == 3
        for n in (0, 2, 4):
            lengths = (ctypes.c_uint32 * 8)(*([7] * 8))
            tau = (ctypes.c_float * (8 * per_point))(*([7.0] * (8 * per_point)))
            assert fn(ctx, lengths, tau, n) == -2, n
            assert list(lengths) == [7] * 8 and set(tau) == {7.0}, f"n_points={n}: written although refused"
        lengths = (ctypes.c_uint32 * 3)()
        tau = (ctypes.c_float * (3 * per_point))()
        assert fn(ctx, lengths, tau, 3) == 0
        assert list(lengths) == [64, 512, 4096]
        assert np.allclose(np.ctypeslib.as_array(tau).reshape(3, per_point)[:, 0], [1.0, 0.9, 0.8])
    finally:
        llm.close()


def test_from_profile_gives_a_length_or_a_schedule(tmp_path, tiny_llama):
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.profile import CalibrationProfile, file_sha256

    _, path = tiny_llama
    prof = CalibrationProfile(model_name=path.name, model_sha256=file_sha256(path), training_length=64)
    prof.add("pmax", "global", "continuous", 256, 0.8)
    f = tmp_path / "p.json"
    prof.save(f)
    at = AttentionConfig.from_profile(f, model_path=path, length=128)
    assert at.temperature == pytest.approx(1 + 0.5 * (0.8 - 1))
    assert at.window == 0
    sched = AttentionConfig.from_profile(f, window=None)
    assert sched.temperature_schedule == "points" and sched.temperature_points == ((64, 1.0), (256, 0.8))
    assert sched.window is None


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature_schedule="points"), "go together"),
    (dict(temperature_points=((64, 1.0),)), "go together"),
    (dict(temperature_schedule="points", temperature_points=()), "is empty"),
    (dict(temperature_schedule="points", temperature_points=((64, 1.0), (32, 0.9))), "must increase"),
    (dict(temperature_schedule="points", temperature_points=((64, 0.0),)), "finite number > 0"),
    (dict(temperature_schedule="points", temperature_points=((64,),)), "pair"),
])
def test_bad_points_are_named(kwargs, words):
    from llama_extrapolate import AttentionConfig

    with pytest.raises((ValueError, TypeError), match=words):
        AttentionConfig(**kwargs)


# --- command line --------------------------------------------------------------------------------
def test_cli_calibrate_writes_a_profile(tmp_path, tiny_llama):
    from llama_extrapolate import AttentionConfig, cli
    from llama_extrapolate.profile import CalibrationProfile

    model, path = tiny_llama
    text = tmp_path / "doc.txt"
    rng = np.random.default_rng(3)
    text.write_text(" ".join("".join(rng.choice(list("abcdefghij"), 5)) for _ in range(400)))
    out = tmp_path / "prof.json"
    rc = cli.main(["calibrate", "--model", str(path), "--text", str(text), "--training-length", "64",
                   "--lengths", "128,256", "--granularity", "global,layer", "--quiet", "--output", str(out),
                   "--threads", "2", "--n-batch", "64", "--tol", "0.01"])
    assert rc == 0
    prof = CalibrationProfile.load(out)
    kinds = {(e["mode"], e["granularity"], e["length"]) for e in prof.entries}
    assert kinds == {(m, g, L) for m in ("pmax", "entropy") for g in ("global", "layer") for L in (128, 256)}
    assert set(prof.extra["propositions"]) == {"64", "128", "256"}
    cfg = AttentionConfig.from_profile(out, model_path=path)
    assert cfg.temperature_points[0] == (64, 1.0)


@pytest.mark.parametrize("args, words", [
    (["--text", "/nonexistent.txt"], "no such file"),
    (["--lengths", "12k"], "whole numbers"),
    (["--granularity", "neuron"], "granularity"),
    (["--training-length", "1"], "must be >= 2"),
])
def test_cli_calibrate_bad_input(tmp_path, tiny_llama, capsys, args, words):
    from llama_extrapolate import cli

    _, path = tiny_llama
    rc = cli.main(["calibrate", "--model", str(path), "--quiet", "--output", str(tmp_path / "x.json"), *args])
    assert rc == 2
    assert words in capsys.readouterr().err


def test_cli_calibrate_refuses_non_utf8_and_short_texts(tmp_path, tiny_llama, capsys):
    from llama_extrapolate import cli

    _, path = tiny_llama
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    assert cli.main(["calibrate", "--model", str(path), "--text", str(bad), "--quiet"]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("a few words")
    assert cli.main(["calibrate", "--model", str(path), "--text", str(short), "--training-length", "64",
                     "--quiet", "--output", str(tmp_path / "y.json")]) == 2
    assert "fewer than the longest length 256" in capsys.readouterr().err
