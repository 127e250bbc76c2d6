"""Receptive fields: the paper's known facts, the numerical test, Theorem 0.5, and the ERF against the oracle."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import random_tokens
from reference import RefAttention, RefStats, forward

from llama_extrapolate.harness import trf


@pytest.mark.parametrize("m", [0.5, 2.0 ** -8, 2.0 ** -0.5])
def test_alibi_converges_to_the_geometric_sum(m):
    r = trf.alibi(m)
    v = r.verdict()
    assert v.converges and v.method == "analytic"
    assert v.B == pytest.approx(1.0 / (1.0 - math.exp(-m)), rel=1e-12)
    direct = float(np.exp(-m * np.arange(200_000, dtype=np.float64)).sum())
    assert v.B == pytest.approx(direct, rel=1e-12)
    # the numerical test, given only ln b_t, agrees
    nv = trf.numerical_verdict(trf.custom("alibi", lambda t: -m * t))
    assert nv.converges and nv.B_bounds[0] <= direct * (1 + 1e-12) and direct <= nv.B_bounds[1] * (1 + 1e-12)
    # sum_{t>=j} e^{-mt} < B eps  <=>  e^{-mj} < eps  <=>  j > ln(1/eps)/m
    for row in trf.trf(r, [0.1, 0.01, 1e-3]):
        assert row["trf"] == math.floor(math.log(1.0 / row["eps"]) / m) + 1


def test_alibi_slopes_follow_the_head_count():
    assert np.allclose(trf.alibi_slopes(8), 2.0 ** (-np.arange(1, 9)))
    s12 = trf.alibi_slopes(12)  # 8 from the power of two, 4 interleaved from 16 heads
    assert np.allclose(s12[:8], 2.0 ** (-np.arange(1, 9)))
    assert np.allclose(s12[8:], 2.0 ** (-0.5 - np.arange(4)))


def test_type1_trf_grows_like_one_over_eps():
    r = trf.type1()
    rows = trf.trf(r, [1e-2, 1e-3, 1e-4])
    # the tail of 1/n^2 beyond n = j is about 1/j, so TRF(eps) ~ 1 / (B eps) with B = pi^2 / 6
    assert rows[2]["trf"] * 1e-4 == pytest.approx(6 / math.pi ** 2, rel=2e-3)
    assert rows[1]["trf"] / rows[0]["trf"] == pytest.approx(10, rel=0.02)
    assert rows[2]["trf"] / rows[1]["trf"] == pytest.approx(10, rel=0.01)


def test_divergent_series_are_reported_divergent():
    for r in (trf.harmonic(), trf.n_log_n(), trf.sandwich(), trf.t5(-0.25 * np.arange(32))):
        assert r.verdict().converges is False, r.name
        with pytest.raises(ValueError, match="does not converge"):
            trf.trf(r, [0.1])
    # the numerical test alone: 1/n is caught by its exponent; 1/(n ln n) drifts toward 1 and is not called
    # convergent (its exponent 1 + 1/ln n falls along the grid)
    assert trf.numerical_verdict(trf.custom("1/n", lambda t: -np.log1p(t))).converges is False
    assert trf.numerical_verdict(trf.custom("1/(n ln n)", lambda t: -np.log(t + 2) - np.log(np.log(t + 2)))).converges is not True
    assert trf.numerical_verdict(trf.custom("constant", lambda t: np.zeros_like(t))).converges is False


def test_type2_has_the_smaller_receptive_field():
    eps = [0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 1e-4]
    t1 = [row["trf"] for row in trf.trf(trf.type1(), eps)]
    t2 = [row["trf"] for row in trf.trf(trf.type2(), eps)]
    assert all(a <= b for a, b in zip(t2, t1)) and t2[-1] < t1[-1] / 100
    c = trf.compare(trf.type2(), trf.type1())
    assert c["holds"] and c["eps0"] is not None and c["eps0"] > 0
    # Theorem 0.5's conclusion below eps0
    small = [e for e in eps if e <= c["eps0"]]
    assert small
    assert trf.compare(trf.type1(), trf.type2())["holds"] is False


def test_type2_numerical_sum_brackets_the_direct_sum():
    nv = trf.numerical_verdict(trf.custom("type 2", lambda t: -np.log1p(t) ** 2))
    direct = float(np.exp(-np.log1p(np.arange(1_000_000, dtype=np.float64)) ** 2).sum())
    assert nv.converges and nv.B_bounds[0] <= direct + 1e-12 <= nv.B_bounds[1] + 2e-12


@pytest.mark.parametrize("sinks,window", [(4, 8192), (0, 16), (4, 0), (10, 100)])
def test_lambda_trf_is_at_most_s_plus_w(sinks, window):
    r = trf.lambda_mask(sinks, window)
    for row in trf.trf(r, [0.5, 0.1, 0.01, 1e-4]):
        assert row["trf"] <= sinks + window
        assert row["trf"] == math.floor((sinks + window) * (1 - row["eps"])) + 1


def test_t5_with_a_masked_last_bucket_converges():
    bias = np.concatenate([-0.1 * np.arange(31), [-np.inf]])
    r = trf.t5(bias, max_distance=128)
    assert r.verdict().converges
    assert trf.t5_bucket(np.array([0, 15, 16, 127, 128, 10 ** 6]), 32, 128).tolist() == [0, 15, 16, 31, 31, 31]
    rows = trf.trf(r, [0.01])
    assert rows[0]["trf"] < 128


def test_kerple_log_converges_only_above_one():
    assert trf.kerple_log(1.5, 1.0).verdict().converges
    assert trf.kerple_log(1.0, 1.0).verdict().converges is False
    assert trf.kerple_power(1.0, 0.5).verdict().converges


def test_erf_from_mass_matches_a_per_distance_count():
    rng = np.random.default_rng(0)
    per_distance = rng.random(5000) * np.exp(-np.arange(5000) / 700.0)
    bins = np.array([b for b in trf_bins() if b < 5000])
    mass = np.add.reduceat(per_distance, bins)
    for row in trf.erf_from_mass(bins, mass, [0.5, 0.1, 0.01]):
        exact = int(np.searchsorted(np.cumsum(per_distance) / per_distance.sum(), 1 - row["eps"], side="right")) + 1
        assert row["lo"] <= exact <= row["hi"]


def trf_bins():
    from reference import STAT_BIN_LOWER

    return STAT_BIN_LOWER


class ExactMass(RefStats):
    """The oracle's attention mass at every distance, per layer (summed over heads)."""

    def __init__(self, n_layer, n_head, n_dist):
        super().__init__(n_layer, n_head)
        self.exact = np.zeros((n_layer, n_dist))

    def add(self, layer, logits, w, distances):
        super().add(layer, logits, w, distances)
        np.add.at(self.exact[layer], distances, w.sum(axis=0))


@pytest.mark.parametrize("sinks,window", [(0, 0), (2, 24)])
def test_measured_erf_brackets_the_oracle(tiny_llama, sinks, window):
    from llama_extrapolate import AttentionConfig, Llama

    model, path = tiny_llama
    tokens = random_tokens(model, 300, seed=3)
    cfg = AttentionConfig.vanilla() if window == 0 else AttentionConfig(sinks=sinks, window=window, ceiling=window,
                                                                         rollback=0)
    ref = ExactMass(model.n_layer, model.n_head, len(tokens))
    forward(model, tokens, RefAttention(sinks=sinks, window=window, ceiling=window), stats=ref)
    llm = Llama(str(path), attention=cfg, n_ctx=len(tokens) + 64 if window == 0 else 128, n_batch=50, n_ubatch=50,
                n_threads=2, verbose=False)
    try:
        got = trf.measure_erf(llm, tokens, [0.5, 0.2, 0.05], n_batch=50)
    finally:
        llm.close()
    for layer, rows in enumerate(got["by_layer"]):
        cum = np.cumsum(ref.exact[layer]) / ref.exact[layer].sum()
        for row in rows:
            exact = int(np.searchsorted(cum, 1 - row["eps"], side="right")) + 1
            assert row["lo"] <= exact <= row["hi"], (layer, row, exact)
    if window:
        # only the window and the sinks are attended: everything past W is sink mass
        far = np.asarray(got["mass_by_layer"])[:, np.asarray(got["bin_lower"]) >= window].sum(axis=1)
        ref_far = ref.exact[:, window:].sum(axis=1) / ref.exact.sum(axis=1)
        assert np.allclose(far / np.asarray(got["mass_by_layer"]).sum(axis=1), ref_far, atol=2e-3)


@pytest.mark.parametrize("call,match", [
    (lambda: trf.alibi(-1.0), "slope=-1.0"),
    (lambda: trf.alibi_slopes(0), "n_head=0"),
    (lambda: trf.kerple_power(1.0, 3.0), "r2=3.0"),
    (lambda: trf.sandwich(7), "dim=7"),
    (lambda: trf.t5([0.0, -1.0, -2.0]), "bias has shape"),
    (lambda: trf.lambda_mask(-1, 10), "sinks=-1"),
    (lambda: trf.trf(trf.type1(), [1.5]), "eps=1.5"),
    (lambda: trf.erf_from_mass([0, 1], [0.0, 0.0], [0.1]), "mass sums to 0"),
    (lambda: trf.custom("x", 3), "log_weight=3"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_cli_writes_json_and_png(tmp_path, tiny_llama):
    from llama_extrapolate import cli

    _, path = tiny_llama
    out = tmp_path / "trf.json"
    text = tmp_path / "doc.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    argv = ["trf", "--eps", "0.1,0.01", "--rpe-window", "64", "--erf", "--model", str(path), "--file", str(text),
            "--tokens", "200", "--window", "32", "--sinks", "4", "--n-batch", "50", "--threads", "2",
            "-o", str(out)]
    assert cli.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["rpes"]["Type 1 (1/n^2)"]["trf"][1]["trf"] == trf.trf(trf.type1(), [0.01])[0]["trf"]
    assert res["rpes"]["1/n"]["verdict"]["converges"] is False
    assert res["rpes"]["Lambda S=4 W=64"]["trf"][0]["trf"] <= 68
    assert res["theorem_0_5"]["Type 2 vs Type 1"]["holds"]
    assert set(res["erf"]) >= {"vanilla", "lambda", "model"}
    assert len(res["erf"]["lambda"]["by_layer"]) == 2
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert (tmp_path / "trf_erf.png").stat().st_size > 10_000
    assert cli.main(["trf", "--eps", "0,0.1", "-o", str(out)]) == 2
    assert cli.main(["trf", "--erf", "--configs", "full", "--model", str(path), "--file", str(text),
                     "--tokens", "100", "-o", str(out)]) == 2


def test_cli_adds_the_alibi_model_heads(tmp_path, tiny_mpt_model):
    from llama_extrapolate import cli

    model, path = tiny_mpt_model
    out = tmp_path / "trf.json"
    assert cli.main(["trf", "--eps", "0.1", "--model", str(path), "-o", str(out)]) == 0
    res = json.loads(out.read_text())["rpes"]
    heads = [k for k in res if " head " in k]
    assert len(heads) == model.n_head
    slopes = trf.alibi_slopes(model.n_head, model.max_alibi_bias)
    for h, k in enumerate(heads):
        assert res[k]["verdict"]["B"] == pytest.approx(1 / (1 - math.exp(-slopes[h])))


@pytest.mark.parametrize("n_head", [1, 4, 6, 12])
def test_alibi_slopes_match_the_oracle_model(n_head):
    from tinymodel import TinyMPT

    m = TinyMPT()
    m.n_head = n_head
    assert np.allclose(trf.alibi_slopes(n_head, m.max_alibi_bias), m.alibi_slopes())
