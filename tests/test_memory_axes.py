"""The document memory's block summaries along principal axes (patch 0012, memory_axes="principal").

Quest's bound, q.center + |q|.radius over a block's box, holds in any orthonormal coordinates (q.k is the sum of the
coordinates' products along any of them) and is tightest where the keys vary along the axes. With principal axes
each KV head of each stored layer takes the eigenvectors of the covariance of the document's first keys (those of
the decode that completes the first block, at most 4 x head_dim) as its axes, summarizes every block's keys along
them, and the graph takes the queries onto them for the bound. Checked here against numpy: the axes are orthonormal
and diagonalize that covariance, the selection is the top m of numpy's bound in those coordinates (with and
without the rerank), the logits are the oracle's given the selection, a state carries the axes, and a state of
the other axes is refused.
"""

import numpy as np
import pytest

from conftest import memory_state_round_trip
from test_memory import (C, H0, M, N_SELECTABLE, QUESTION, S, W, assert_logits_given, assert_top_m,  # noqa: F401
                         block_bound, f16_summary, make_llm, memory_config, question_queries, read_and_ask,
                         rerank_of, selection, stored_blocks, tiny)

FIRST_DECODE = 64  # tiny_llm's ubatch: the first decode completes the first block


def summary_axes(llm, model):
    """{il: ([n_kv, hd, hd] axes, principal)} of the stored layers."""
    return {il: llm.memory_summary_axes(il) for il in range(H0, model.n_layer)}


def assert_top_m_of(score, chosen, where):
    """test_memory's assert_top_m, where two scores within float32's reach of each other (1e-3 relative) may
    stand in either order: the chosen m score at least what any block left out scores, up to that margin."""
    order = np.argsort(-score, kind="stable")
    if score[order[M - 1]] - score[order[M]] > 1e-3 * abs(score[order[M - 1]]):
        assert_top_m(score, chosen, where)
        return
    assert len(set(np.asarray(chosen).tolist())) == M, (where, chosen)
    rest = np.setdiff1d(np.arange(len(score)), chosen)
    low = score[np.asarray(chosen)].min()
    assert low >= score[rest].max() - 1e-3 * abs(low), (where, score, chosen)


def rotated_bound(qg, keys, axes):
    """Quest's bound of a block along ``axes`` (rows): the keys' coordinates summarized as the library keeps them
    (F16 for the tiny model's heads of 16), the queries' coordinates against them; checked to still bound q.k (up
    to the float32 axes' rounding)."""
    k_rot = keys.astype(np.float32) @ axes.T.astype(np.float32)
    center, radius = f16_summary(k_rot)
    q_rot = qg @ axes.T.astype(np.float64)
    bound = q_rot @ center + np.abs(q_rot) @ radius
    exact = qg @ keys.T.astype(np.float64)
    assert (bound[:, None] >= exact - 1e-4 * (1 + np.abs(exact))).all()
    return bound.max()


@pytest.fixture(scope="module")
def principal(tiny):
    model, path, tokens = tiny
    llm = make_llm(path, memory_config(), memory_axes="principal")
    got, sel, stored = ask_and_close_keep_axes(llm, model, tokens)
    return got, sel, stored


def ask_and_close_keep_axes(llm, model, tokens):
    """test_memory's ask_and_close, with the axes read before the close: (logits, selection, stored blocks and
    "axes")."""
    try:
        got = read_and_ask(llm, tokens)
        stored = stored_blocks(llm, model, N_SELECTABLE)
        stored["axes"] = summary_axes(llm, model)
        return got, selection(llm, model), stored
    finally:
        llm.close()


def test_the_axes_are_the_principal_axes_of_the_first_keys(tiny, principal):
    model, _, _ = tiny
    _, _, stored = principal
    n_first = min(FIRST_DECODE - S, 4 * model.head_dim)
    for il, (axes, is_principal) in stored["axes"].items():
        assert is_principal, f"layer {il}: the first block was complete, its axes must be set"
        for g in range(model.n_head_kv):
            a = axes[g].astype(np.float64)
            np.testing.assert_allclose(a @ a.T, np.eye(model.head_dim), atol=1e-5)
            keys = np.concatenate([stored[(b, il, g)][0] for b in range(2)])[:n_first].astype(np.float64)
            cov = np.cov(keys.T, bias=True)
            diag = a @ cov @ a.T
            off = np.abs(diag - np.diag(np.diag(diag))).max()
            assert off < 1e-4 * np.abs(cov).max(), (il, g, off)
            variances = np.diag(diag)
            assert (np.diff(variances) <= 1e-5 * variances[0]).all(), "the axes come largest variance first"
            # not the channels: the test would not tell the axes from the identity otherwise
            assert np.abs(a - np.eye(model.head_dim)).max() > 0.1


def test_selection_along_the_principal_axes_equals_numpys_bound(tiny, principal):
    model, _, tokens = tiny
    got, sel, stored = principal
    queries = question_queries(model, tokens, sel)
    differ = 0
    for il in range(H0, model.n_layer):
        axes = stored["axes"][il][0]
        for g in range(model.n_head_kv):
            keys = [stored[(b, il, g)][0] for b in range(N_SELECTABLE)]
            bound = np.array([rotated_bound(queries[(il, g)], k, axes[g]) for k in keys])
            assert_top_m_of(bound, sel[il][g], (il, g))
            channels = np.array([block_bound(queries[(il, g)], k) for k in keys])
            differ += set(np.argsort(-channels, kind="stable")[:M].tolist()) != set(sel[il][g].tolist())
    assert differ > 0, "the channels' bound must select otherwise somewhere for the test to tell the axes apart"
    assert_logits_given(model, tokens, got, sel)


def test_the_rerank_takes_the_principal_bounds_candidates(tiny):
    model, path, tokens = tiny
    llm = make_llm(path, memory_config(memory_candidates=4), memory_axes="principal")
    got, sel, stored = ask_and_close_keep_axes(llm, model, tokens)
    queries = question_queries(model, tokens, sel)
    for il in range(H0, model.n_layer):
        axes = stored["axes"][il][0]
        for g in range(model.n_head_kv):
            keys = [stored[(b, il, g)][0] for b in range(N_SELECTABLE)]
            bound = np.array([rotated_bound(queries[(il, g)], k, axes[g]) for k in keys])
            exact = np.array([(queries[(il, g)] @ k.T.astype(np.float64)).max() for k in keys])
            assert_top_m_of(rerank_of(bound, exact, 4, defined=False)[1], sel[il][g], (il, g))


def test_a_state_carries_the_axes(tiny):
    """Saved mid-document (the axes set, a block half filled), restored into a new context with principal axes:
    the same axes, selections and logits as the stream that never stopped."""
    model, path, tokens = tiny
    doc = QUESTION - 7
    made = []

    def make():
        made.append(make_llm(path, memory_config(), memory_axes="principal"))
        return made[-1]

    r = memory_state_round_trip(make, tokens, doc, range(H0, model.n_layer))
    for il, want in r["want_sel"].items():
        np.testing.assert_array_equal(r["got_sel"][il], want)
    np.testing.assert_allclose(r["got"], r["want"], atol=1e-4, rtol=0)


def test_a_state_of_the_other_axes_is_refused(tiny):
    model, path, tokens = tiny
    a = make_llm(path, memory_config(), memory_axes="principal")
    try:
        a.set_top_k_active(False)
        a.eval(tokens[:200])
        assert a.memory_summary_axes(H0)[1]
        state = a.save_state()
    finally:
        a.close()
    b = make_llm(path, memory_config())  # the channels
    try:
        with pytest.raises(Exception) as e:
            b.load_state(state)
        assert "state" in str(e.value).lower()
        assert not b.memory_summary_axes(H0)[1]
    finally:
        b.close()


def test_the_channels_are_the_identity_and_bad_axes_are_named(tiny):
    model, path, _ = tiny
    llm = make_llm(path, memory_config())
    try:
        axes, is_principal = llm.memory_summary_axes(H0)
        assert not is_principal and llm.memory_axes == "channels"
        np.testing.assert_array_equal(axes, np.broadcast_to(np.eye(model.head_dim), axes.shape))
        with pytest.raises(ValueError, match="memory_summary_axes"):
            llm.memory_summary_axes(0)
    finally:
        llm.close()
    with pytest.raises(ValueError, match="memory_axes='pca'.*principal"):
        make_llm(path, memory_config(), memory_axes="pca")
    from llama_extrapolate import AttentionConfig

    with pytest.raises(ValueError, match="memory"):
        make_llm(path, AttentionConfig(sinks=S, window=W, ceiling=C), memory_axes="principal")
