"""The arithmetic behind bench/performance.py's target ratios (the runs themselves are benchmarks, not tests)."""

import math

import pytest
from conftest import load_bench


@pytest.fixture(scope="module")
def perf():
    return load_bench("performance")


def stream(speeds, block=2048, marks=(), decode=None):
    blocks = [{"end": block * (i + 1), "tokens": block, "tok_s": s} for i, s in enumerate(speeds)]
    ms = [{"tokens": m, "peak_rss_bytes": 1000 + m // 1024, **({"decode_tok_s": decode[m]} if decode else {})}
          for m in marks]
    return {"blocks": blocks, "marks": ms}


def test_prefill_at_is_tokens_over_seconds_of_the_span(perf):
    sec = stream([100.0] * 4 + [50.0, 100.0, 100.0, 50.0])
    # the 8192 tokens before 16384: two blocks at 50 tok/s (41 s each) and two at 100 (20.5 s each)
    assert perf.prefill_at(sec, 16384) == pytest.approx(8192 / (2 * 2048 / 50 + 2 * 2048 / 100))
    assert perf.prefill_at(sec, 16384, span=2048) == pytest.approx(50.0)
    assert math.isnan(perf.prefill_at(sec, 20480))  # the stream did not reach it


def test_summary_ratios(perf):
    marks = (8192, 16384, 32768)
    lam = stream([80.0] * 8 + [60.0] * 8, marks=marks, decode={8192: 30.0, 16384: 28.0, 32768: 27.0})
    van = stream([80.0] * 4 + [40.0] * 4 + [15.0] * 8, marks=marks)
    out = perf.summarize({"stream_lambda": lam, "stream_vanilla": van})
    assert out["lambda_prefill_last_over_16k"] == pytest.approx(60.0 / 80.0)
    assert out["lambda_decode_last_over_8k"] == pytest.approx(27.0 / 30.0)
    assert out["lambda_over_vanilla_prefill_32768"] == pytest.approx(60.0 / 15.0)
    assert out["lambda_over_vanilla_prefill_16384"] == pytest.approx(80.0 / 40.0)
    assert out["lambda_rss_last_over_16k"] == pytest.approx((1000 + 32) / (1000 + 16))


def test_paired_decode_pairs_each_stream_burst_with_its_neighbouring_reference_burst(perf, monkeypatch):
    # the machine alternates between a fast and a slow phase every two bursts; the stream is 10% slower than the
    # reference throughout: every pair must see the same phase on both sides, so every ratio is 0.9
    calls = []

    def fake_decode_speed(llm, n, repeats=3):
        assert repeats == 1 and n == 64
        calls.append(llm)
        phase = 30.0 if (len(calls) - 1) // 2 % 2 == 0 else 20.0
        return phase * (0.9 if llm == "stream" else 1.0)

    monkeypatch.setattr(perf, "decode_speed", fake_decode_speed)
    out = perf.paired_decode("stream", "ref", 64, 4)
    assert calls == ["stream", "ref", "ref", "stream", "stream", "ref", "ref", "stream"]
    assert out["ratios"] == pytest.approx([0.9] * 4)
    assert out["median_ratio"] == pytest.approx(0.9)
    assert out["stream_tok_s"] == pytest.approx([27.0, 18.0, 27.0, 18.0])


def test_summary_reports_paired_decode_medians(perf):
    lam = stream([80.0] * 16, marks=(8192, 16384, 32768), decode={8192: 30.0, 16384: 22.0, 32768: 27.0})
    lam["paired_reference_tokens"] = 8192
    for m, r in zip(lam["marks"], (1.01, 0.97, 0.95)):
        m["paired_decode"] = {"median_ratio": r}
    out = perf.summarize({"stream_lambda": lam})
    assert out["lambda_decode_paired_over_reference"] == {"8192": 1.01, "16384": 0.97, "32768": 0.95}
    assert out["paired_reference_tokens"] == 8192


@pytest.mark.parametrize("argv, named", [
    (["stream", "--paired-decode", "-1"], "--paired-decode -1"),
    (["stream", "--paired-decode", "4", "--decode", "0"], "--decode 0"),
    (["knobs-off", "--decode", "0"], "--decode 0"),
    (["knobs-off", "--repeats", "0"], "--repeats 0"),
])
def test_bad_knobs_are_refused_with_their_value(perf, argv, named):
    with pytest.raises(SystemExit, match=named):
        perf.main(argv)


def soak(n_marks, nll, bucket=4096, done=True):
    marks = [{"tokens": 8192 * 2**i, "rss_bytes": 500 + i, "peak_rss_bytes": 1000 + (i >= 3)}
             for i in range(n_marks)]
    sec = {"tokens": marks[-1]["tokens"], "bucket": bucket, "marks": marks, "sinks": 10, "window": 512,
           "n_ctx": 1280, "buckets": [nll(i) for i in range(marks[-1]["tokens"] // bucket)]}
    if done:
        sec.update(total_s=1.0, nll_nan=0, nll_scored=sec["tokens"] - 1)
    return sec


def test_soak_summary_memory_and_nll_by_range(perf):
    # buckets of the second half of each doubling 1.0 higher: the range means must follow the buckets
    sec = soak(5, lambda i: 3.0 + (i % 2), bucket=4096)          # marks 8k .. 128k
    out = perf.summarize({"soak": sec})["soak"]
    assert out["tokens_read"] == 131072 and out["complete"]
    assert out["peak_rss_last_over_16k"] == pytest.approx(1001 / 1000)
    assert out["rss_last_over_16k"] == pytest.approx(504 / 501)
    assert set(out["nll_by_range"]) == {"8192-16384", "16384-32768", "32768-65536", "65536-131072"}
    assert all(v == pytest.approx(3.5) for v in out["nll_by_range"].values())
    assert out["nll_range_spread"] == pytest.approx(0.0)
    assert out["nll_nan"] == 0 and out["nll_scored"] == 131071


def test_soak_summary_shows_drift_and_an_unfinished_run(perf):
    sec = soak(4, lambda i: 3.0 + i / 8, done=False)              # NLL rising along the stream
    sec["buckets"] = sec["buckets"][:12]                          # interrupted inside 32k-64k
    out = perf.summarize({"soak": sec})["soak"]
    assert not out["complete"]
    assert list(out["nll_by_range"]) == ["8192-16384", "16384-32768"]   # the partial range is left out
    assert out["nll_by_range"]["16384-32768"] > out["nll_by_range"]["8192-16384"]
    assert "nll_nan" not in out


def test_plot_writes_the_soak_figure_beside_the_json(perf, tmp_path):
    out = tmp_path / "performance.json"
    perf.save_section(out, "soak", soak(4, lambda i: 3.0))
    perf.main(["plot", "--out", str(out)])
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert perf.load_results(out)["summary"]["soak"]["tokens_read"] == 65536
