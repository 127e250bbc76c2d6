"""The bookkeeping of bench/long_eval.py: NLL by position range, the tables, what is still to run."""

from pathlib import Path

import numpy as np
import pytest
from conftest import load_bench

from llama_extrapolate.harness.evaluate import NLLResult


@pytest.fixture(scope="module")
def bench():
    return load_bench("long_eval")


def buckets(nll: np.ndarray, size: int = 1024) -> list:
    return NLLResult(nll=nll, seconds=1.0).bucketize(size)


def test_range_mean_weights_the_buckets_inside_the_range(bench):
    # a 16k-token stream has targets 1..16383; NLL = 1 on targets up to 8192, 3 after
    nll = np.where(np.arange(1, 16384) <= 8192, 1.0, 3.0)
    b = buckets(nll)
    assert bench.range_mean(b, 4096, 8192) == pytest.approx(1.0)
    assert bench.range_mean(b, 8192, 16384) == pytest.approx(3.0)  # the last range lacks its final target
    # a range the stream does not reach, or reaches only in part, has no mean
    assert bench.range_mean(b, 16384, 32768) is None
    assert bench.range_mean(buckets(nll[:10000]), 8192, 16384) is None
    # uneven buckets count by their size: 4k-8k from 512-token buckets with a ramp
    ramp = np.arange(1, 16384, dtype=float) / 4096
    assert bench.range_mean(buckets(ramp, 512), 4096, 8192) == pytest.approx(ramp[4096:8192].mean())


def test_tables_and_missing_runs(bench):
    nll = np.full(65535, 2.0)
    entry = {"config": {"n_ctx": 8714}, "buckets": buckets(nll), "complete": True, "tokens_per_second": 75.0,
             "peak_rss_bytes": 900 * 2**20}
    partial = {"config": {"n_ctx": 65536}, "buckets": buckets(nll[:20000]), "complete": False,
               "tokens_done": 20001}
    results = {"tokens": 65536, "configs": {"lambda": entry, "vanilla": partial}}
    table = bench.nll_table(results).splitlines()
    assert table[2] == "| lambda | 2.000 | 2.000 | 2.000 | 2.000 | 75.0 | 900 | 8714 |"
    assert table[3] == "| vanilla | 2.000 | 2.000 | – | – | (stopped at 20001) | – | 65536 |"

    trials = [{"config": "vanilla", "length": 4096, "depth": d, "trial": 0, "correct": d < 0.5}
              for d in bench.DEPTHS]
    from llama_extrapolate.harness.tasks import accuracy_table

    pk = {"trials": trials, "accuracy": accuracy_table(trials)}
    assert bench.passkey_table(pk).splitlines()[2] == "| vanilla | 0.40 (5 depths) |"

    todo = bench.missing(results, pk, 65536, Path("no/such/profile.json"))
    assert "nll lambda" not in todo and "nll vanilla" in todo and "nll context-shift" in todo
    assert any(t.startswith("nll profile") for t in todo)
    assert "passkey vanilla 4096: 5/5 depths" not in " ".join(todo)
    assert "passkey vanilla 8192: 0/5 depths" in todo
    assert "passkey context-shift 32768: 0/5 depths" in todo
    # a shorter run than asked for is not done
    assert "nll lambda" in bench.missing({**results, "tokens": 32768}, pk, 65536, Path("no/such/profile.json"))


def test_config_lists(bench, tmp_path):
    assert bench.nll_configs("lambda, vanilla", tmp_path / "p.json") == ["lambda", "vanilla"]
    assert bench.nll_configs(None, tmp_path / "p.json") == list(bench.NLL_CONFIGS)
    (tmp_path / "p.json").write_text("{}")
    assert bench.nll_configs(None, tmp_path / "p.json")[-1] == f"profile={tmp_path / 'p.json'}"


def test_pytorch_route_blocks_and_ratios():
    """bench/pytorch_route.py: block rates and NLL from chunk time stamps, the ratio before each mark."""
    route = load_bench("pytorch_route")
    # 8 chunks of 1024 tokens at 1 s each, NLL = chunk index
    raw = {"load_s": 1.0, "stamps": [(1024 * (i + 1), float(i + 1)) for i in range(8)],
           "nll": np.repeat(np.arange(8.0), 1024)[:-1], "peak_rss_bytes": 0}
    s = route.summarize_route(raw)
    assert [b["end"] for b in s["blocks"]] == [2048, 4096, 6144, 8192]
    assert all(b["tok_s"] == pytest.approx(1024.0) for b in s["blocks"])
    assert [b["nll"] for b in s["blocks"]] == pytest.approx([0.5, 2.5, 4.5, (6 * 1024 + 7 * 1023) / 2047])
    assert route.rate_before(s["blocks"], 8192, span=4096) == pytest.approx(1024.0)
    assert route.rate_before(s["blocks"], 16384) is None
    slow = {**s, "blocks": [{**b, "tok_s": b["tok_s"] / 4} for b in s["blocks"]]}
    out = route.summary({"routes": {"llama-extrapolate": s, "torch": slow}})
    assert out["max_abs_block_nll_diff"] == 0.0
    assert "tok_s_ratio_16384" not in out  # neither route reached 16k
    long_ = {"blocks": [{"end": 2048 * (i + 1), "tokens": 2048, "tok_s": 100.0, "nll": 1.0} for i in range(8)]}
    out = route.summary({"routes": {"llama-extrapolate": long_,
                                    "torch": {"blocks": [{**b, "tok_s": 25.0} for b in long_["blocks"]]}}})
    assert out["tok_s_ratio_16384"] == pytest.approx(4.0)
