"""Attention statistics summed inside llama.cpp (patch 0010) against the numpy oracle.

The oracle writes every softmax row out in full and takes its maximum,
entropy, logit mean and variance and mass by distance bin; llama.cpp never
copies a row out of the graph. Tiny random models (RoPE llama GQA 4/2 and
ALiBi MPT), f32 KV cache. Both reductions (patch 0010): "host", the CPU op,
and "graph", the ggml ops a GPU backend runs (here on the CPU backend; on
Vulkan in test_backends.py), each against the oracle.
"""

from functools import partial

import numpy as np
import pytest

from conftest import random_tokens, tiny_llm
from reference import STAT_BIN_LOWER, RefAttention, RefStats, forward, forward_mpt

N_TOKENS = 200
RTOL = 1e-3


make_llm = partial(tiny_llm, logits_all=False)


REDUCE = ["host", "graph"]


def collect(llm, tokens, reduce="auto"):
    from llama_extrapolate.harness import stats

    llm.reset()
    with stats.collecting(llm, reduce=reduce):
        llm.eval(tokens)
    assert set(stats.reduced_on_graph(llm).tolist()) == {reduce == "graph"}
    return stats.AttentionStats.read(llm)


def compare(got, ref: RefStats, what):
    assert np.array_equal(got.count, ref.count), f"{what}: row counts differ"
    assert np.array_equal(got.n_keys, ref.n_keys), f"{what}: visible key counts differ"
    for name in ("pmax", "entropy", "logit_mean", "logit_var"):
        g, r = getattr(got, name), getattr(ref, name)
        err = np.abs(g - r).max() / max(np.abs(r).max(), 1e-9)
        assert err < RTOL, f"{what}: {name} relative error {err:.2e}"
    err = np.abs(got.mass - ref.mass).max()
    assert err < 1e-3 * got.count.max(), f"{what}: mass by distance differs by {err}"


def test_bins_match_the_reference_definition():
    from llama_extrapolate.harness import stats

    assert np.array_equal(stats.bin_lower(), STAT_BIN_LOWER)
    # every distance an int32 position difference takes has its bin, with no clamp: the last bin, [7·2^28, 8·2^28),
    # ends at 2^31
    assert stats.bin_lower()[-1] == 7 << 28 and (8 << 28) == 2**31


CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "temperature-per-head": (dict(sinks=0, window=0, ceiling=0, temperature=np.linspace(0.6, 1.3, 8).reshape(2, 4)),
                             RefAttention(tau=np.linspace(0.6, 1.3, 8).reshape(2, 4))),
    "lambda+ceiling": (dict(sinks=4, window=32, ceiling=32), RefAttention(sinks=4, window=32, ceiling=32)),
}


@pytest.mark.parametrize("reduce", REDUCE)
@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_statistics_match_reference(tiny_llama, case, ubatch, reduce):
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=5)
    kwargs, ref_cfg = CASES[case]
    ref = RefStats(model.n_layer, model.n_head)
    forward(model, tokens, ref_cfg, stats=ref)
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=ubatch)
    try:
        compare(collect(llm, tokens, reduce), ref, f"{case}, ubatch {ubatch}, {reduce}")
    finally:
        llm.close()


@pytest.mark.parametrize("reduce", REDUCE)
def test_statistics_on_alibi_with_temperature(tiny_mpt_model, reduce):
    from llama_extrapolate import AttentionConfig

    model, path = tiny_mpt_model
    tokens = random_tokens(model, 150, seed=6)
    for kwargs, ref_cfg in [(dict(sinks=0, window=0, ceiling=0), RefAttention()),
                            (dict(sinks=2, window=24, ceiling=24, temperature=0.8),
                             RefAttention(sinks=2, window=24, ceiling=24, tau=0.8))]:
        ref = RefStats(model.n_layer, model.n_head)
        forward_mpt(model, tokens, ref_cfg, stats=ref)
        llm = make_llm(path, AttentionConfig(**kwargs), ubatch=32)
        try:
            compare(collect(llm, tokens, reduce), ref, f"ALiBi {kwargs}, {reduce}")
        finally:
            llm.close()


@pytest.mark.parametrize("reduce", REDUCE)
def test_bounded_stream_and_snapshots_subtract(tiny_llama, reduce):
    """A 600-token stream through a bounded cache (its positions re-based, its cells reused out of order): the rows
    of a stretch are the difference of two readings."""
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats

    model, path = tiny_llama
    tokens = random_tokens(model, 600, seed=7)
    ref_all, ref_head = RefStats(model.n_layer, model.n_head), RefStats(model.n_layer, model.n_head)
    cfg = RefAttention(sinks=4, window=32, ceiling=32)
    forward(model, tokens, cfg, stats=ref_all)
    forward(model, tokens[:400], cfg, stats=ref_head)
    llm = make_llm(path, AttentionConfig(sinks=4, window=32, ceiling=32, rollback=0), ubatch=50, n_ctx=128)
    try:
        llm.reset()
        with stats.collecting(llm, reduce=reduce):
            llm.eval(tokens[:400])
            head = stats.AttentionStats.read(llm)
            llm.eval(tokens[400:])
        full = stats.AttentionStats.read(llm)
    finally:
        llm.close()
    compare(head, ref_head, "first 400 tokens")
    compare(full, ref_all, "600 tokens")
    tail = full - head
    assert tail.rows == 200
    assert np.allclose(tail.pmax, ref_all.pmax - ref_head.pmax, rtol=1e-3, atol=1e-3)


def test_off_collects_nothing_and_leaves_logits_unchanged(tiny_llama):
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats

    model, path = tiny_llama
    tokens = random_tokens(model, 100, seed=8)
    llm = make_llm(path, AttentionConfig.vanilla(), logits_all=True)
    try:
        llm.reset()
        llm.eval(tokens)
        plain = np.array(llm.scores[:100])
        assert stats.AttentionStats.read(llm).rows == 0
        assert not stats.enabled(llm)
        llm.reset()
        with stats.collecting(llm):
            assert stats.enabled(llm)
            llm.eval(tokens)
        with_stats = np.array(llm.scores[:100])
        rows = stats.AttentionStats.read(llm).rows
        llm.reset()
        llm.eval(tokens)
        assert stats.AttentionStats.read(llm).rows == rows  # off again: the sums stay
    finally:
        llm.close()
    assert rows == 100
    assert np.array_equal(plain, with_stats)


def test_flash_attention_is_refused_with_a_named_reason(tiny_llama):
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats

    _, path = tiny_llama
    llm = make_llm(path, AttentionConfig.vanilla(), flash_attn=True)
    try:
        with pytest.raises(ValueError, match="flash_attn=False"):
            stats.enable(llm)
    finally:
        llm.close()


def test_bad_reduce_choices_are_named(tiny_llama):
    """An unknown place to reduce is named with the choices; the graph's ops on a context of several sequences
    (they sort the cells of one) are refused with the fix, and the context keeps its choice."""
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats

    _, path = tiny_llama
    llm = make_llm(path, AttentionConfig.vanilla(), embedding=True)  # (llama_cpp opens n_batch sequences)
    try:
        with pytest.raises(ValueError, match=r"reduce='gpu'.*auto, host, graph"):
            stats.set_reduce(llm, "gpu")
        with pytest.raises(ValueError, match=r"embedding=True.*reduce='host'"):
            stats.set_reduce(llm, "graph")
        stats.set_reduce(llm, "host")
        assert not stats.reduced_on_graph(llm).any()
    finally:
        llm.close()
