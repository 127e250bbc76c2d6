"""The document memory (patch 0012) against the numpy oracle, on the tiny llama model.

While the document is read with the bounded Lambda cache, every token after the sinks goes to the block store;
for the question each KV head of the layers >= h0 selects m blocks by Quest's bound, and the top-k middle keys
are chosen among their keys, scored at distance D. Two things are checked separately:

- given the blocks the library selected (``Llama.memory_selection``), its logits equal the oracle's;
- the selection itself equals an exhaustive scorer's: the bound q.center + |q|.radius of every block computed
  in numpy from the stored keys (``native.memory_read_block``; the summaries in F16 as the library keeps them)
  and the oracle's queries, the top m of the max over the ubatch's queries and the group's heads, among the
  blocks hidden from its first query.

The caches and the store are F32 here, so the comparison is exact up to float32 arithmetic.
"""

from functools import partial

import numpy as np
import pytest

from conftest import kept_state_reopened, memory_state_round_trip, random_tokens, tiny_llm
from reference import RefAttention, TopKMargin, forward, forward_mpt, rope_angles, rotate

N_TOKENS = 300
QUESTION = 250
TOL = 2e-3
S, W, C = 4, 32, 32
K, H0, D = 3, 1, 16
M, B = 2, 32


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    model, path = tiny_llama
    return model, path, random_tokens(model, N_TOKENS, seed=2)


def memory_config(**kw):
    from llama_extrapolate import AttentionConfig

    args = dict(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D, top_k_scope="question",
                memory_blocks=M, memory_block_size=B, memory_candidates=0)
    args.update(kw)
    return AttentionConfig(**args)


make_llm = partial(tiny_llm, memory_type="f32", memory_capacity=512)


def read_and_ask(llm, tokens, question=QUESTION):
    llm.reset()
    llm.eval(tokens[:question])
    llm.set_top_k_active(True)
    llm.eval(tokens[question:])
    return np.asarray(llm.scores[:len(tokens)], dtype=np.float64)


@pytest.fixture(scope="module")
def asked(tiny):
    model, path, tokens = tiny
    llm = make_llm(path, memory_config())
    try:
        got = read_and_ask(llm, tokens)
        sel = selection(llm, model)
        info = llm.memory_info()
        stored = stored_blocks(llm, model, info["n_blocks"])
    finally:
        llm.close()
    return got, sel, info, stored


def selection(llm, model):
    """The blocks each layer >= h0 selected in the last ubatch: {il: [n_kv, m]}."""
    return {il: llm.memory_selection(il) for il in range(H0, model.n_layer)}


def ask_and_close(llm, model, tokens, n_blocks):
    """Read and ask on llm, then close it: (its logits, its selection, the first n_blocks stored blocks)."""
    try:
        got = read_and_ask(llm, tokens)
        return got, selection(llm, model), stored_blocks(llm, model, n_blocks)
    finally:
        llm.close()


def stored_blocks(llm, model, n_blocks, n_kv=None):
    """The keys and values of blocks 0 .. n_blocks - 1 as the store holds them, by (block, layer >= h0, KV head)."""
    from llama_extrapolate import native

    ctx = native.context_address(llm)
    return {(b, il, g): native.memory_read_block(ctx, b, il, g) for b in range(n_blocks)
            for il in range(H0, model.n_layer) for g in range(model.n_head_kv if n_kv is None else n_kv)}


def test_logits_equal_the_oracle_given_the_selected_blocks(tiny, asked):
    model, _, tokens = tiny
    got, sel, _, _ = asked
    assert all(s.shape == (model.n_head_kv, M) and (s >= 0).all() for s in sel.values())
    margin = TopKMargin()
    ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                              top_k_distance=D, top_k_from=QUESTION, memory_blocks=sel,
                                              memory_block=B), margin=margin)
    plain = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C))
    assert margin.rows > 0 and margin.gap > 1e-4, f"top-k choice ill-defined (gap {margin.gap}): pick another seed"
    assert np.abs(ref[QUESTION:] - plain[QUESTION:]).max() > 0.5, "the memory must change the answer's logits"
    np.testing.assert_array_equal(got[:QUESTION].argmax(1), plain[:QUESTION].argmax(1))
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


def test_whole_blocks_are_read_in_the_order_of_the_text(tiny):
    """top_k >= m*B: every key of the selected blocks is a middle key, and the blocks are read as passages (patch
    0012): selected with their predecessor's bound, and scored in the order of the text behind D, exact against
    the oracle given the selection; scoring them all at D instead (the rule for a smaller top_k) is measurably
    different."""
    model, path, tokens = tiny
    llm = make_llm(path, memory_config(top_k=M * B))
    try:
        got = read_and_ask(llm, tokens)
        sel = selection(llm, model)
        stored = stored_blocks(llm, model, llm.memory_info()["n_blocks"])
    finally:
        llm.close()
    # the blocks: the top m of the bound with the predecessor's (a block and its successor come together)
    check_selection(model, tokens, sel, stored, neighbour=True)
    cfg = dict(sinks=S, window=W, ceiling=C, top_k=M * B, top_k_layer=H0, top_k_distance=D, top_k_from=QUESTION,
               memory_blocks=sel, memory_block=B)
    ref = forward(model, tokens, RefAttention(**cfg))
    at_d = forward(model, tokens, RefAttention(**cfg, memory_order=False))
    assert np.abs(ref[QUESTION:] - at_d[QUESTION:]).max() > 0.1, "the order must change the answer's logits"
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


def test_the_keys_at_the_windows_edge_are_middle_keys(tiny, asked):
    """The question's first query has keys behind its window whose block is not wholly behind it (not selectable);
    they stay in the cache as middle keys, so no key is out of reach (the blind spot the first memory had)."""
    model, _, tokens = tiny
    got, sel, _, _ = asked
    n_sel = (QUESTION - S - W + 1) // B
    assert QUESTION - W >= S + n_sel * B, "this question must have keys at the window's edge"
    cfg = dict(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D, top_k_from=QUESTION,
               memory_blocks=sel, memory_block=B)
    with_edge = forward(model, tokens, RefAttention(**cfg))
    without = forward(model, tokens, RefAttention(**cfg, memory_edge=False))
    assert np.abs(with_edge - without)[QUESTION:].max() > 10 * TOL, "the edge keys must change the answer here"
    assert np.abs(got - without).max() > 10 * TOL
    assert np.abs(got - with_edge).max() < TOL


def test_the_smallest_cache_holds_the_keys_at_the_windows_edge(tiny, asked):
    """A cache of required_n_ctx cells (one block more than the window needs) keeps every key of the block at the
    window's edge while it reads far past its size: the same logits as the roomy cache of `asked`."""
    from llama_extrapolate import read_model_info

    _, path, tokens = tiny
    got, _, _, _ = asked
    cfg = memory_config(rollback=0)
    n_ctx = cfg.resolve(read_model_info(str(path))).required_n_ctx(64, stream=0)
    assert n_ctx == S + W + 64 + B < N_TOKENS  # the region of m*B keys is in the graph, not in the cache
    llm = make_llm(path, cfg, n_ctx=n_ctx, logits_all=False)  # the stream outgrows n_ctx: the last logits only

    def last():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)

    try:
        llm.eval(tokens[:QUESTION])
        read = last()
        llm.set_top_k_active(True)
        llm.eval(tokens[QUESTION:])
        answer = last()
    finally:
        llm.close()
    np.testing.assert_allclose(read, got[QUESTION - 1], atol=1e-4, rtol=0)
    np.testing.assert_allclose(answer, got[N_TOKENS - 1], atol=1e-4, rtol=0)


def test_the_selected_blocks_take_no_cells_of_the_cache(tiny):
    """Patch 0012: the m*B keys and values of the selected blocks are appended to each layer's view in the graph,
    so a region larger than the whole cache works (it was refused: the cache had to hold it), exact against the
    oracle given the selection."""
    from llama_extrapolate import native, read_model_info

    model, path, tokens = tiny
    m = 9  # blocks of 32: 288 keys per KV head, every block of the document (fewer are behind the window)
    cfg = memory_config(memory_blocks=m, rollback=0)
    n_ctx = cfg.resolve(read_model_info(str(path))).required_n_ctx(64, stream=0)
    llm = make_llm(path, cfg, n_ctx=n_ctx, logits_all=False)  # the stream outgrows n_ctx: the last logits only
    try:
        cells = native.n_cells(native.context_address(llm))
        llm.eval(tokens[:QUESTION])
        llm.set_top_k_active(True)
        llm.eval(tokens[QUESTION:])
        got = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
        sel = selection(llm, model)
    finally:
        llm.close()
    assert cells < m * B, f"the cache has {cells} cells: the region of {m * B} must not be among them"
    assert all(s.shape == (model.n_head_kv, m) for s in sel.values())
    ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                              top_k_distance=D, top_k_from=QUESTION, memory_blocks=sel,
                                              memory_block=B))[-1]
    plain = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C))[-1]
    assert np.abs(ref - plain).max() > 0.5, "the memory must change the answer's logits"
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


def test_the_store_holds_every_token_after_the_sinks_unrotated(tiny, asked):
    """Block b of layer il, KV head g: the keys of positions S + b*B.. before RoPE, and their values, as the oracle
    computes them for those tokens (the store is F32: float32 arithmetic apart, 2e-4 where they are of order 1)."""
    model, _, tokens = tiny
    _, sel, info, stored = asked
    assert info["n_tokens"] == N_TOKENS - S and info["n_blocks"] == (N_TOKENS - S) // B
    assert info["bytes_on_disk"] == 4096 + info["n_blocks"] * (model.n_layer - H0) * model.n_head_kv * 2 * B * \
        model.head_dim * 4
    # the question's tokens (from QUESTION on, in the last blocks) were read with the memory's middle keys, which
    # change their layers' inputs past H0: the oracle reads them the same way, given the library's selection
    cap = {}
    forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D,
                                        top_k_from=QUESTION, memory_blocks=sel, memory_block=B), capture=cap)
    for (b, il, g), (k, v) in stored.items():
        _, k_all, v_all = cap[il]
        rows = slice(S + b * B, S + (b + 1) * B)
        where = f"block {b}, layer {il}, head {g}"
        np.testing.assert_allclose(k, k_all[rows, g], atol=2e-4, rtol=0, err_msg=f"keys of {where}")
        np.testing.assert_allclose(v, v_all[rows, g], atol=2e-4, rtol=0, err_msg=f"values of {where}")
    # one token off is far beyond that rounding: the comparison tells the tokens apart
    _, k_all, v_all = cap[H0]
    assert np.abs(v_all[S + 1:S + 1 + B, 0] - v_all[S:S + B, 0]).max() > 100 * 2e-4


def f16_summary(keys):
    """Quest's summary of a block as the library keeps it: per channel center and radius of the keys in F16,
    the radius widened by the center's rounding and rounded up (float64 for the products)."""
    lo, hi = keys.min(0).astype(np.float32), keys.max(0).astype(np.float32)
    center = np.float32(0.5) * (hi + lo)
    c16 = center.astype(np.float16)
    radius = np.float32(0.5) * (hi - lo) + np.abs(center - c16.astype(np.float32))
    r16 = radius.astype(np.float16)
    up = r16.astype(np.float32) < radius
    r16[up] = np.nextafter(r16[up], np.float16(np.inf))
    return c16.astype(np.float64), r16.astype(np.float64)


def q8_0_summary(keys):
    """The same in Q8_0 (heads of a multiple of 32 channels): the center rounded to q8_0, the radius widened by that
    rounding, raised by one q8_0 step of its block (its largest value / 127) and rounded to q8_0, which keeps it at or
    above the widened radius (float64 for the products)."""
    lo, hi = keys.min(0).astype(np.float32), keys.max(0).astype(np.float32)
    center = np.float32(0.5) * (hi + lo)
    c8 = q8_0_rounded(center[None, :])[0].astype(np.float32)
    radius = np.float32(0.5) * (hi - lo) + np.abs(center - c8)
    step = np.repeat(radius.reshape(-1, 32).max(1) / np.float32(127), 32)
    r8 = q8_0_rounded((radius + step)[None, :])[0]
    assert (r8 >= radius).all()
    return c8.astype(np.float64), r8


def neighbour_bound(bound):
    """Reading whole blocks (top_k >= m*B), a block's score is the max of its own bound and its predecessor's
    (patch 0012): the block after a relevant one comes with it."""
    return np.maximum(bound, np.concatenate([bound[:1], bound[:-1]]))


def assert_top_m(bound, chosen, where, neighbour=False):
    """The library's m blocks are the top m of the scores, by a margin float32 cannot cross; with the neighbour
    rule a block and its successor may share a score, so there a tie decides between equals and the check is
    that no block left out scores more than one chosen (1e-3: float32 against float64)."""
    chosen = np.asarray(chosen)
    assert len(set(chosen.tolist())) == M, (where, chosen)
    if not neighbour:
        order = np.argsort(-bound, kind="stable")
        assert bound[order[M - 1]] - bound[order[M]] > 1e-3 * abs(bound[order[M - 1]])
        assert set(chosen.tolist()) == set(order[:M].tolist()), (where, bound, chosen)
        return
    score = neighbour_bound(bound)
    rest = np.setdiff1d(np.arange(len(score)), chosen)
    low = score[chosen].min()
    assert low >= score[rest].max() - 1e-3 * abs(low), (where, score, chosen)


N_SELECTABLE = (QUESTION - S - W + 1) // B  # blocks hidden from the question's first query


def question_queries(model, tokens, sel=None):
    """Per layer >= h0 and KV head: the oracle's queries of the question at distance D from a key at 0, those of
    the group's heads together [n_question*group, head_dim] (float64). Past layer h0 the queries depend on what the
    layers before read from the memory: the blocks sel those selected (without sel, layer h0's are exact only)."""
    cap = {}
    ref = RefAttention(sinks=S, window=W, ceiling=C)
    if sel is not None:
        ref = RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D,
                           top_k_from=QUESTION, memory_blocks=sel, memory_block=B)
    forward(model, tokens, ref, capture=cap)
    group = model.n_head // model.n_head_kv
    out = {}
    for il in range(H0, model.n_layer):
        q, _, _ = cap[il]
        qd = rotate(q[QUESTION:], rope_angles(np.full(N_TOKENS - QUESTION, D), model.head_dim, model.rope_base)[:, None, :],
                    model.neox)
        for g in range(model.n_head_kv):
            out[(il, g)] = qd[:, g * group:(g + 1) * group].reshape(-1, model.head_dim)
    return out


def check_selection(model, tokens, sel, stored, neighbour=False, given=False):
    """The library's blocks against the bound of every block computed in numpy (the oracle's queries at D, the
    stored keys' summaries as the library keeps them: Q8_0 for heads of a multiple of 32, else F16), among the
    blocks hidden from the question's first query. given: the queries past layer h0 are the oracle's given the
    blocks the library selected (the layers before read them), not those of the window alone."""
    queries = question_queries(model, tokens, sel if given else None)
    n_sel = N_SELECTABLE
    summary = q8_0_summary if model.head_dim % 32 == 0 else f16_summary
    for il in range(H0, model.n_layer):
        for g in range(model.n_head_kv):
            bound = [block_bound(queries[(il, g)], stored[(b, il, g)][0], summary) for b in range(n_sel)]
            assert_top_m(np.asarray(bound), sel[il][g], (il, g), neighbour)


def block_bound(qg, k, summary=None):
    """Quest's bound of a block with keys k for the queries qg: the max over them of q.center + |q|.radius with the
    summaries the library keeps (checked to still bound q.k after the rounding)."""
    center, radius = (summary or f16_summary)(k)
    bound = qg @ center + np.abs(qg) @ radius
    assert (bound[:, None] >= qg @ k.T.astype(np.float64) - 1e-9).all()
    return bound.max()


def test_selection_equals_an_exhaustive_bound(tiny, asked):
    model, _, tokens = tiny
    _, sel, info, stored = asked
    check_selection(model, tokens, sel, stored)


def test_the_bound_is_taken_a_slice_of_queries_at_a_time(tiny):
    """A memory opened for 680,000 tokens has 21,250 blocks per KV head, so the graph takes the bound of the
    question's 100 queries (50 tokens, 2 heads a group) 98 at a time (patch 0012: at most 2^22 products a slice)
    and merges the slices' maxima: the selection is still the exhaustive bound's. (F16 blocks: an 87 MB file.)"""
    model, path, tokens = tiny
    group = model.n_head // model.n_head_kv
    n_blocks = 680_000 // B
    assert (2**22 // (n_blocks * model.n_head_kv)) < group * (N_TOKENS - QUESTION), "the bound must take >1 slice"
    llm = make_llm(path, memory_config(), memory_capacity=680_000, memory_type="f16")
    _, sel, stored = ask_and_close(llm, model, tokens, N_SELECTABLE)
    check_selection(model, tokens, sel, stored)


def reranked(qg, keys, candidates, rounded=lambda q: q):
    """numpy's rerank of one KV head's selectable blocks (their stored keys): the bound of each, the c largest
    proposed (by a margin float32 cannot cross, when c < all) and scored by their exact max q.k with the queries
    rounded as the product rounds them, the others -INF. Returns (the blocks in the bound's order, the scores)."""
    bound = np.array([block_bound(qg, k) for k in keys])
    exact = np.array([(rounded(qg) @ k.T.astype(np.float64)).max() for k in keys])
    return rerank_of(bound, exact, candidates)


def rerank_of(bound, exact, candidates, defined=True):
    """The c blocks with the largest bounds take their exact scores, the others -INF: (the bound's order, scores);
    with ``defined`` the c-th bound must stand clear of the next (else float32 could propose other candidates)."""
    order = np.argsort(-bound, kind="stable")
    if defined and candidates < len(bound):
        assert bound[order[candidates - 1]] - bound[order[candidates]] > 1e-3 * abs(bound[order[candidates - 1]])
    score = np.full(len(bound), -np.inf)
    score[order[:candidates]] = exact[order[:candidates]]
    return order, score


@pytest.mark.parametrize("candidates", [4, 8])
def test_candidates_are_reranked_by_their_exact_scores(tiny, candidates):
    """With c candidates (patch 0012) the bound proposes the c selectable blocks with the largest bounds and the m of
    them with the largest exact q.k (max over the question's queries and the group's heads) are selected: checked
    against numpy's bound and exact products for every block (stored keys, the oracle's queries at D). c = 8 is more
    than the 6 selectable blocks: all are reranked and no block the question may not see comes in. The rerank
    changes some selection here, and the logits equal the oracle's given the selection."""
    model, path, tokens = tiny
    llm = make_llm(path, memory_config(memory_candidates=candidates))
    got, sel, stored = ask_and_close(llm, model, tokens, N_SELECTABLE)
    queries = question_queries(model, tokens)
    changed = 0
    for (il, g), qg in queries.items():
        order, score = reranked(qg, [stored[(b, il, g)][0] for b in range(N_SELECTABLE)], candidates)
        assert_top_m(score, sel[il][g], (il, g))
        changed += set(sel[il][g].tolist()) != set(order[:M].tolist())
    assert changed > 0, "the exact scores must change some selection for the test to tell reranking from none"
    assert_logits_given(model, tokens, got, sel)


@pytest.mark.parametrize("candidates", [0, 4])
def test_layer_selection_equals_the_layers_exhaustive_scores(tiny, candidates):
    """memory_selection="layer" (patch 0012): the KV heads of a layer select the same m blocks, by each block's
    largest score over the layer's heads: the bound (c = 0), or the exact q.k of the c blocks with the largest
    such bounds (c = 4 of the 6 selectable). Checked against numpy's bound and products for every block and KV
    head (the oracle's queries at D, given the blocks the layers before selected); the heads' own top m differ
    somewhere, so the test tells the layer's rule from the heads'; the logits equal the oracle's given the
    selection."""
    model, path, tokens = tiny
    llm = make_llm(path, memory_config(memory_candidates=candidates, memory_selection="layer"))
    got, sel, stored = ask_and_close(llm, model, tokens, N_SELECTABLE)
    queries = question_queries(model, tokens, sel)
    heads_differ = 0
    for il in range(H0, model.n_layer):
        keys = [[stored[(b, il, g)][0] for b in range(N_SELECTABLE)] for g in range(model.n_head_kv)]
        bound = np.array([[block_bound(queries[(il, g)], k) for k in keys[g]] for g in range(model.n_head_kv)])
        exact = np.array([[(queries[(il, g)] @ k.T.astype(np.float64)).max() for k in keys[g]]
                          for g in range(model.n_head_kv)])
        score = bound.max(0) if candidates == 0 else rerank_of(bound.max(0), exact.max(0), candidates)[1]
        for g in range(model.n_head_kv):
            assert set(sel[il][g].tolist()) == set(sel[il][0].tolist()), (il, sel[il])
        assert_top_m(score, sel[il][0], il)
        own = bound if candidates == 0 else np.array([rerank_of(bound[g], exact[g], candidates, defined=False)[1]
                                                      for g in range(model.n_head_kv)])
        heads_differ += any(set(np.argsort(-own[g], kind="stable")[:M].tolist()) != set(sel[il][0].tolist())
                            for g in range(model.n_head_kv))
    assert heads_differ > 0, "some KV head must select other blocks on its own for the test to tell the rules apart"
    assert_logits_given(model, tokens, got, sel)


def assert_logits_given(model, tokens, got, sel):
    """The library's logits are the oracle's given the blocks it selected (sel: {layer: [n_kv, m]})."""
    ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                              top_k_distance=D, top_k_from=QUESTION, memory_blocks=sel,
                                              memory_block=B))
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


def q8_0_rounded(x):
    """Rows of x rounded as ggml rounds a product's F32 operand to q8_0: blocks of 32 values, each an F16 scale
    max|x|/127 and the values to integers in [-127, 127] (float64 for the products)."""
    blocks = np.asarray(x, dtype=np.float32).reshape(len(x), -1, 32)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.round(blocks * inv)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(np.shape(x)).astype(np.float64)


def q4_0_rounded(x):
    """Rows of x rounded as ggml's quantize_row_q4_0_ref rounds them: blocks of 32 values, each an F16 scale d =
    (its value of largest magnitude, sign kept) / -8 and the values to the integers floor(x/d + 8.5) in [0, 15] less 8
    (float64 for the products)."""
    blocks = np.asarray(x, dtype=np.float32).reshape(len(x), -1, 32)
    first = np.abs(blocks).argmax(-1)[..., None]  # the first of equal magnitudes, as the loop's strict <
    d = np.take_along_axis(blocks, first, -1) / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.float32(15), np.floor(blocks * inv + np.float32(8.5))) - 8
    return (q * d.astype(np.float16).astype(np.float32)).reshape(np.shape(x)).astype(np.float64)


@pytest.fixture(scope="module")
def tiny_hd32(tmp_path_factory):
    """(model, its GGUF, a stream) of the tiny model with heads of 32 channels: one q8_0 block a head."""
    from tinymodel import TinyLlama

    model = TinyLlama(n_embd=128, n_layer=4)
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp("hd32") / "tiny-hd32.gguf")
    return model, path, random_tokens(model, N_TOKENS, seed=2)


def test_heads_of_32_channels_select_by_q8_0_summaries(tiny_hd32):
    """A head of 32 channels keeps its blocks' summaries in Q8_0 (half the RAM of F16: 0.51 GB at Llama-2-7B's
    shapes and 128k tokens against 0.96): the bound selects the top m of the bounds numpy computes from Q8_0 summaries
    of the stored keys, and they still bound every q.k of their blocks (block_bound checks it); the summaries take
    the RAM of Q8_0 rows."""
    model, path, tokens = tiny_hd32
    llm = make_llm(path, memory_config())
    try:
        ram = llm.memory_info()["bytes_in_ram"]
        read_and_ask(llm, tokens)
        sel = selection(llm, model)
        stored = stored_blocks(llm, model, llm.memory_info()["n_blocks"])
    finally:
        llm.close()
    n_stored, cap, row = model.n_layer - H0, 512 // B, model.n_head_kv * model.head_dim
    pending = 2 * n_stored * B * row * 4  # the block being filled, in F32
    assert ram == 2 * n_stored * cap * row * 34 // 32 + pending
    check_selection(model, tokens, sel, stored, given=True)


@pytest.mark.parametrize("memory_type", ["f16", "q8_0"])
def test_candidates_are_reranked_in_the_stores_type(tiny_hd32, memory_type):
    """Patch 0012: the candidates' keys enter the rerank's product as stored, and the queries are rounded to the
    product's type once (F16 for an F16 store; q8_0 for a q8_0 store, head size 32 here: one q8_0 block). The
    selection is numpy's top m of the same rounded products over the same candidates, in every layer >= h0 (the
    oracle's queries past h0 read the blocks the library selected before, from F32 keys where the library's are
    rounded). Where a query lies on a q8_0 rounding boundary numpy and ggml may round it a step apart, so a KV head
    is compared where its m-th and (m+1)-th scores are further apart than such a step (all six are here; one may
    be left out)."""
    model, path, tokens = tiny_hd32
    candidates = 4
    llm = make_llm(path, memory_config(memory_candidates=candidates), memory_type=memory_type)
    _, sel, stored = ask_and_close(llm, model, tokens, N_SELECTABLE)
    rounded = q8_0_rounded if memory_type == "q8_0" else (lambda q: q.astype(np.float16).astype(np.float64))
    queries = question_queries(model, tokens, sel)
    checked = 0
    for (il, g), qg in queries.items():
        _, score = reranked(qg, [stored[(b, il, g)][0] for b in range(N_SELECTABLE)], candidates, rounded)
        top = np.sort(score)[::-1]
        if top[M - 1] - top[M] > 1e-2 * abs(top[M - 1]):
            assert_top_m(score, sel[il][g], (il, g))
            checked += 1
    assert checked >= len(queries) - 1, f"{checked} of {len(queries)} KV heads had a clear m-th block"


@pytest.fixture(scope="module")
def alibi_asked(tiny_mpt_model):
    """The same reading and question on the tiny MPT model (ALiBi): keys are never rotated, so the store takes them
    as they are, the blocks are scored with the queries as they are, and the middle keys take the bias at D."""
    model, path = tiny_mpt_model
    tokens = random_tokens(model, N_TOKENS, seed=ALIBI_SEED)
    llm = make_llm(path, memory_config())
    try:
        got = read_and_ask(llm, tokens)
        sel = selection(llm, model)
        n_blocks = llm.memory_info()["n_blocks"]
        stored = stored_blocks(llm, model, n_blocks, n_kv=model.n_head)
    finally:
        llm.close()
    return model, tokens, got, sel, stored


ALIBI_SEED = 5
ALIBI_TOL = 1e-2  # as in test_attention_alibi: ggml's CPU GELU goes through a half-precision table


def test_alibi_logits_equal_the_oracle_given_the_selected_blocks(alibi_asked):
    model, tokens, got, sel, _ = alibi_asked
    assert all(s.shape == (model.n_head, M) and (s >= 0).all() for s in sel.values())
    margin = TopKMargin()
    cfg = dict(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D, top_k_from=QUESTION,
               memory_blocks=sel, memory_block=B)
    ref = forward_mpt(model, tokens, RefAttention(**cfg), margin=margin)
    plain = forward_mpt(model, tokens, RefAttention(sinks=S, window=W, ceiling=C))
    without_edge = forward_mpt(model, tokens, RefAttention(**cfg, memory_edge=False))
    assert margin.rows > 0 and margin.gap > 1e-4, f"top-k choice ill-defined (gap {margin.gap}): pick another seed"
    assert np.abs(ref[QUESTION:] - plain[QUESTION:]).max() > 0.5, "the memory must change the answer's logits"
    assert np.abs(ref - without_edge)[QUESTION:].max() > 10 * ALIBI_TOL, "the edge keys must change the answer here"
    err = np.abs(got - ref).max()
    assert err < ALIBI_TOL, f"max |llama.cpp - oracle| = {err}"


def test_alibi_selection_equals_an_exhaustive_bound(alibi_asked):
    model, tokens, _, sel, stored = alibi_asked
    cap = {}
    forward_mpt(model, tokens, RefAttention(sinks=S, window=W, ceiling=C), capture=cap)
    n_sel = (QUESTION - S - W + 1) // B
    for il in range(H0, model.n_layer):
        q, k_all, _ = cap[il]
        for g in range(model.n_head):
            qg = q[QUESTION:, g]  # MPT: one query head per KV head
            bound = []
            for b in range(n_sel):
                k, _ = stored[(b, il, g)]
                # the store holds the keys as the model made them (no rotation to undo)
                np.testing.assert_allclose(k, k_all[S + b * B:S + (b + 1) * B, g], atol=ALIBI_TOL, rtol=0)
                center, radius = f16_summary(k)
                bound.append((qg @ center + np.abs(qg) @ radius).max())
            assert_top_m(np.asarray(bound), sel[il][g], (il, g))


def test_quantized_k_cache(tmp_path):
    """q8_0 keys (head size 64): the store takes the new keys as the cache rounds them and the edge block's keys are
    rotated back from the quantized cache; the error against the oracle (given the blocks selected) is q8_0's own,
    as large as on the upstream path (Lambda mask only), and far below what the memory changes."""
    from llama_extrapolate import AttentionConfig
    from tinymodel import TinyLlama

    model = TinyLlama(n_embd=256)
    model.make_weights()
    path = model.write(tmp_path / "tiny-hd64.gguf")
    tokens = random_tokens(model, N_TOKENS, seed=2)
    plain = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C))
    errors = {}
    for type_k in (0, 8):  # f32, q8_0
        llm = make_llm(path, AttentionConfig(sinks=S, window=W, ceiling=C), type_k=type_k, type_v=0,
                       memory_capacity=None)
        try:
            llm.reset()
            llm.eval(tokens)
            errors["lambda", type_k] = np.abs(np.asarray(llm.scores[:N_TOKENS]) - plain).max()
        finally:
            llm.close()
        llm = make_llm(path, memory_config(), type_k=type_k, type_v=0)
        try:
            got = read_and_ask(llm, tokens)
            sel = selection(llm, model)
        finally:
            llm.close()
        ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                                  top_k_distance=D, top_k_from=QUESTION, memory_blocks=sel,
                                                  memory_block=B))
        errors["memory", type_k] = np.abs(got - ref).max()
        if type_k == 8:
            assert np.abs(ref - plain)[QUESTION:].max() > 3 * errors["memory", 8], errors
    assert errors["memory", 0] < TOL, errors
    assert errors["memory", 8] < 1.5 * errors["lambda", 8], errors


def test_fewer_blocks_than_m_are_all_selected(tiny):
    """The question's first query has one block behind its window and m = 2: every KV head selects that block (the
    other slot reports -1) and the logits equal the oracle's given it. An earlier version of the memory added nothing
    until m blocks were there, so a document shorter than W + m*B was answered as if the memory were off (the
    passkey at 4k with m = 64). With no block behind the window yet, the memory adds nothing."""
    model, path, tokens = tiny
    cfg = RefAttention(sinks=S, window=W, ceiling=C)
    llm = make_llm(path, memory_config())
    try:
        got = read_and_ask(llm, tokens[:100], question=90)  # (90 - 4 - 32 + 1) // 32 = 1 block < m = 2
        sel = selection(llm, model)
    finally:
        llm.close()
    assert all(((s >= 0).sum(axis=1) == 1).all() and (s[s >= 0] == 0).all() for s in sel.values()), sel
    ref = forward(model, tokens[:100], RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                                    top_k_distance=D, top_k_from=90, memory_blocks=sel,
                                                    memory_block=B))
    plain = forward(model, tokens[:100], cfg)
    assert np.abs(ref - plain)[90:].max() > 0.1, "the one block must change the answer's logits"
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"

    llm = make_llm(path, memory_config())
    try:
        early = read_and_ask(llm, tokens[:60], question=50)  # (50 - 4 - 32 + 1) // 32 = 0 blocks
    finally:
        llm.close()
    assert np.abs(early - forward(model, tokens[:60], cfg)).max() < TOL


@pytest.mark.parametrize("kw, words", [
    (dict(memory_blocks=2, top_k=0), "top_k=0"),
    (dict(memory_block_size=48), "multiple of 32"),
    (dict(memory_candidates=M), f"memory_candidates={M} <= memory_blocks={M}"),
    (dict(memory_blocks=0, memory_candidates=8), "memory_candidates=8 with memory_blocks=0"),
    (dict(memory_selection="kv"), "memory_selection='kv': use 'head'"),
    (dict(memory_blocks=0, memory_candidates=None, memory_selection="layer"),
     "memory_selection='layer' with memory_blocks=0"),
])
def test_bad_memory_settings_are_named(kw, words):
    with pytest.raises(ValueError, match=words):
        memory_config(**kw)


@pytest.mark.parametrize("overrides", [
    {"llama.attention.lambda.memory_candidates": 2},  # no memory
    {"llama.attention.lambda.memory_blocks": 2, "llama.attention.lambda.memory_candidates": 2},  # not more than m
    {"llama.attention.lambda.memory_per_layer": True},  # no memory
])
def test_library_refuses_bad_memory_metadata_without_crashing(tiny, overrides):
    """Through plain llama_cpp (no Python checks) the model loader refuses: an exception, not a crash."""
    import llama_cpp

    _, path, _ = tiny
    base = {"llama.attention.lambda.window": W, "llama.attention.lambda.top_k": K}
    with pytest.raises(ValueError, match="Failed to load model"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False, kv_overrides={**base, **overrides})


def ask_twice(llm, model, tokens, first: dict, second: dict):
    """Read and ask with the question settings ``first``, then read and ask again with ``second`` on the same
    context (a graph built for the first question is reusable for the second unless the settings are compared):
    (the second's logits, its selection)."""
    out = None
    for settings in (first, second):
        llm.reset()
        llm.set_top_k_active(False)
        llm.set_memory_question(**settings)
        out = read_and_ask(llm, tokens)
    return out, selection(llm, model)


def test_a_questions_candidates_and_selecting_tokens_are_set_between_decodes(tiny):
    """Llama.set_memory_question (patch 0012): a model loaded with c = 8 and asked with c = 4, after a question with
    8 on the same context, selects and answers exactly as one loaded with 4 (the graph is sized for 8, and the
    first question's graph is not reused); with select_tokens = T the bound and the rerank take the queries of the
    question's last T tokens only: numpy's rerank over those queries picks the library's blocks, and at least one
    KV head selects otherwise than with every query."""
    model, path, tokens = tiny
    want, want_sel, _ = ask_and_close(make_llm(path, memory_config(memory_candidates=4)), model, tokens, 0)
    llm = make_llm(path, memory_config(memory_candidates=8))
    try:
        assert (llm.memory_info()["n_candidates"], llm.memory_info()["n_select_tokens"]) == (8, 0)
        got, sel = ask_twice(llm, model, tokens, {"candidates": 8}, {"candidates": 4})
        assert llm.memory_info()["n_candidates"] == 4
        np.testing.assert_array_equal(got, want)
        assert all((sel[il] == want_sel[il]).all() for il in sel)

        last = 8
        _, all_sel = ask_twice(llm, model, tokens, {"candidates": 8, "select_tokens": last},
                               {"candidates": 8, "select_tokens": 0})
        _, last_sel = ask_twice(llm, model, tokens, {"select_tokens": 0}, {"select_tokens": last})
        assert llm.memory_info()["n_select_tokens"] == last
        stored = stored_blocks(llm, model, N_SELECTABLE)
    finally:
        llm.close()
    group = model.n_head // model.n_head_kv
    queries = question_queries(model, tokens, last_sel)
    for (il, g), qg in queries.items():
        _, score = reranked(qg[-last * group:], [stored[(b, il, g)][0] for b in range(N_SELECTABLE)], 8)
        assert_top_m(score, last_sel[il][g], (il, g))
    assert any(set(last_sel[il][g]) != set(all_sel[il][g]) for il in last_sel for g in range(model.n_head_kv)), \
        "the question's last tokens select as all of them do here: pick another T"


def test_bad_question_settings_are_named(tiny):
    _, path, _ = tiny
    llm = make_llm(path, memory_config(memory_candidates=8))
    try:
        with pytest.raises(ValueError, match="candidates 16: the model was loaded with 8 .* at least 16"):
            llm.set_memory_question(candidates=16)
        with pytest.raises(ValueError, match=f"candidates {M} must exceed the blocks selected, m = {M}"):
            llm.set_memory_question(candidates=M)
        for bad in (-1, 2.5, True):
            with pytest.raises(ValueError, match="select_tokens="):
                llm.set_memory_question(select_tokens=bad)
        assert (llm.memory_info()["n_candidates"], llm.memory_info()["n_select_tokens"]) == (8, 0)
        llm.set_memory_question(candidates=0)  # the bound alone
        assert llm.memory_info()["n_candidates"] == 0
    finally:
        llm.close()
    from llama_extrapolate import AttentionConfig

    plain = tiny_llm(path, AttentionConfig(sinks=S, window=W, ceiling=C))
    try:
        with pytest.raises(ValueError, match="without the document memory"):
            plain.set_memory_question(candidates=4)
    finally:
        plain.close()


def test_a_models_question_selecting_tokens_are_set_at_load(tiny):
    """Llama(memory_select_tokens=T), what run's and serve's --memory-select-tokens pass: set once the memory is
    open and read back from the library; a bad value or one without the memory is named."""
    from llama_extrapolate import AttentionConfig

    _, path, _ = tiny
    llm = make_llm(path, memory_config(memory_candidates=8), memory_select_tokens=8)
    try:
        assert (llm.memory_info()["n_candidates"], llm.memory_info()["n_select_tokens"]) == (8, 8)
    finally:
        llm.close()
    with pytest.raises(ValueError, match="select_tokens=-1: give a whole number >= 0"):
        make_llm(path, memory_config(memory_candidates=8), memory_select_tokens=-1)
    with pytest.raises(ValueError, match="memory_select_tokens without the document memory"):
        tiny_llm(path, AttentionConfig(sinks=S, window=W, ceiling=C), memory_select_tokens=8)


def test_bad_store_settings_are_named(tiny, tmp_path):
    _, path, _ = tiny
    with pytest.raises(ValueError, match="q4_1"):
        make_llm(path, memory_config(), memory_type="q4_1")
    with pytest.raises(ValueError, match="memory_capacity=10"):
        make_llm(path, memory_config(), memory_capacity=10)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=str(blocker)):
        make_llm(path, memory_config(), memory_dir=str(blocker))
    with pytest.raises(ValueError, match="cannot create the memory file .*nope"):
        make_llm(path, memory_config(), memory_path=str(tmp_path / "no-such-dir" / "nope"))
    with pytest.raises(ValueError, match="q8_0"):  # a head of 16 values is no whole q8_0 block
        make_llm(path, memory_config(), memory_type="q8_0")


def test_a_disk_too_small_is_an_error_before_reading(tiny, tmp_path):
    _, path, _ = tiny
    with pytest.raises(ValueError, match="cannot reserve"):
        make_llm(path, memory_config(), memory_capacity=2**40, memory_dir=str(tmp_path))


def test_named_file_is_removed_unless_kept(tiny, tmp_path):
    model, path, tokens = tiny
    for keep in (False, True):
        f = tmp_path / f"memory-{keep}.bin"
        llm = make_llm(path, memory_config(), memory_path=str(f), memory_keep=keep)
        try:
            llm.eval(tokens[:120])
            n_blocks = llm.memory_info()["n_blocks"]
            assert f.exists() and n_blocks == (120 - S) // B
            stored = stored_blocks(llm, model, n_blocks)
        finally:
            llm.close()
        assert f.exists() == keep
    # the kept file: a header whose block count is written after the blocks (a crash leaves a valid prefix)
    head = np.frombuffer(f.read_bytes()[8:8 + 9 * 8], dtype=np.uint64)
    assert f.read_bytes()[:8] == b"LXMEM001"
    version, n_layer, h0, n_kv, hd, block, type_id, n_blocks, record = (int(x) for x in head)
    assert (version, n_layer, h0, n_kv, hd, block, type_id) == (3, 2, H0, 2, 16, B, 0)
    assert n_blocks == (120 - S) // B and f.stat().st_size >= 4096 + n_blocks * record
    # record layout 3: per stored layer the K rows of every KV head ([B][hd]: a layer's keys are one run of the file,
    # which the rerank reads without the values), then their V rows transposed ([hd][B]: the layout the attention
    # multiplies its weights by, read as they are), as the library reads them back
    n_stored = n_layer - h0
    assert record == n_stored * 2 * n_kv * block * hd * 4
    rows = np.frombuffer(f.read_bytes()[4096:4096 + n_blocks * record], dtype=np.float32)
    rows = rows.reshape(n_blocks, n_stored, 2, n_kv, block * hd)
    for (ib, il, g), (k, v) in stored.items():
        np.testing.assert_array_equal(rows[ib, il - h0, 0, g], np.asarray(k).reshape(-1))
        np.testing.assert_array_equal(rows[ib, il - h0, 1, g], np.asarray(v).T.reshape(-1))


def test_run_answers_about_the_beginning_of_a_long_document(default_model, tmp_path, capsys):
    """`llama-extrapolate run` uses the memory by default: a pass key near the start of a document ~3k tokens
    long, read with a window of 1,024, is found (the plain Lambda window no longer sees it)."""
    from llama_extrapolate import cli
    from llama_extrapolate.harness.tasks import PASSKEY_FILLER, PASSKEY_INTRO, PASSKEY_LINE

    doc = tmp_path / "doc.txt"
    doc.write_text(PASSKEY_INTRO + PASSKEY_FILLER * 2 + PASSKEY_LINE.format(key="68512") + PASSKEY_FILLER * 110)
    question = "What is the pass key? The pass key is"
    rc = cli.main(["run", "--file", str(doc), "--prompt", question, "--window", "1024", "--no-chat",
                   "--max-tokens", "16", "--threads", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "68512" in out.out, out.out
    assert "memory" in out.err and "selected per head" in out.err and "MiB on disk" in out.err
    assert "ranked by landmarks of 16 keys" in out.err, out.err  # the default first stage,
    assert "candidates" not in out.err, out.err  # which selects the blocks itself (no rerank)
    # said before the reading: the store's reservation, and that the answer holds the question's blocks (default)
    assert "GiB reserved on disk for" in out.err and "KiB a token, q8_0" in out.err, out.err  # SmolLM2: the small q8_0 store
    assert "the answer holds the blocks its question selected" in out.err, out.err
    rc = cli.main(["run", "--file", str(doc), "--prompt", question, "--window", "1024", "--no-chat",
                   "--max-tokens", "16", "--threads", "2", "--memory-answer", "select", "--memory-select-tokens", "4"])
    out = capsys.readouterr()
    assert rc == 0 and "68512" in out.out, out.out
    assert "the question's last 4 tokens select its blocks; the answer selects blocks at every token" in out.err, \
        out.err
    # 64 blocks per head where the document has 26 behind the window: all of them (an earlier version of the memory
    # stayed shut below m blocks and this answer was the plain window's)
    rc = cli.main(["run", "--file", str(doc), "--prompt", question, "--window", "1024", "--no-chat",
                   "--max-tokens", "16", "--threads", "2", "--memory-blocks", "64", "--quiet"])
    out = capsys.readouterr()
    assert rc == 0 and "68512" in out.out, out.out
    rc = cli.main(["run", "--file", str(doc), "--prompt", question, "--window", "1024", "--no-chat",
                   "--max-tokens", "16", "--threads", "2", "--memory-blocks", "0", "--quiet"])
    off = capsys.readouterr()
    assert rc == 0 and "68512" not in off.out, off.out


def test_every_query_scope_selects_per_ubatch(tiny):
    """top_k_scope='all': every ubatch (the reading included) selects its own blocks once some lie behind its first
    query's window, all of them while there are fewer than m (the other slots report -1); the oracle is given each
    ubatch's selection. An earlier version of the memory stayed shut until m blocks were selectable."""
    model, path, tokens = tiny
    ubatch = 32  # the ubatch at 96 has one block behind its window, fewer than m
    llm = make_llm(path, memory_config(top_k_scope="all"), ubatch=ubatch)
    sel = {il: {} for il in range(H0, model.n_layer)}
    try:
        llm.reset()
        for start in range(0, N_TOKENS, ubatch):
            llm.eval(tokens[start:start + ubatch])
            n_sel = max(0, (start - S - W + 1) // B)  # blocks wholly behind the window of the ubatch's first query
            for il in sel:
                sel[il][start] = llm.memory_selection(il)
                assert ((sel[il][start] >= 0).sum(axis=1) == min(n_sel, M)).all(), (start, sel[il][start])
        got = np.asarray(llm.scores[:N_TOKENS], dtype=np.float64)
    finally:
        llm.close()
    assert sum(int((s >= 0).all()) for s in sel[H0].values()) >= 3, "most ubatches must have used the memory"
    assert any((s >= 0).any() and (s < 0).any() for s in sel[H0].values()), "a ubatch with fewer than m blocks"
    margin = TopKMargin()
    ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0,
                                              top_k_distance=D, memory_blocks=sel, memory_block=B), margin=margin)
    plain = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C))
    assert margin.gap > 1e-4
    assert np.abs(ref - plain).max() > 0.5
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


def test_run_with_the_memory_on_a_short_document(tiny, tmp_path, capsys):
    """A document shorter than the memory's blocks: run still opens it (sized for its blocks) and answers."""
    from llama_extrapolate import cli
    from llama_extrapolate.config import DEFAULT_MEMORY_BLOCKS

    _, path, _ = tiny
    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 5)
    rc = cli.main(["run", "--model", str(path), "--file", str(doc), "--prompt", "What jumps?", "--window", "32",
                   "--sinks", "4", "--max-tokens", "4", "--n-batch", "32", "--no-chat"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "blocks of 64" in err and f"{DEFAULT_MEMORY_BLOCKS} selected per head" in err
    assert "read whole" not in err
    rc = cli.main(["run", "--model", str(path), "--file", str(doc), "--prompt", "What jumps?", "--window", "32",
                   "--sinks", "4", "--max-tokens", "4", "--n-batch", "32", "--no-chat", "--passages"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"top-k {DEFAULT_MEMORY_BLOCKS * 64} " in err, err
    assert "selected per head ranked by landmarks of 16 keys, read whole" in err, err


def test_a_state_holds_the_memory_and_the_stream_goes_on_the_same(tiny):
    """Saved after the document (blocks on disk, a block half filled), restored into a new context whose memory
    is empty: the question selects the same blocks and gives the same logits as the stream that never stopped."""
    model, path, tokens = tiny
    doc = QUESTION - 7  # the store's last block is not complete: its pending tokens go with the state
    assert (doc - S) % B != 0
    r = memory_state_round_trip(lambda: make_llm(path, memory_config()), tokens, doc, range(H0, model.n_layer))
    assert r["loaded"]["n_tokens"] == r["saved"]["n_tokens"] == doc - S
    for il, sel in r["want_sel"].items():
        np.testing.assert_array_equal(r["got_sel"][il], sel)
    assert (r["want_sel"][H0] >= 0).all()  # the memory was selecting, not plain Lambda
    np.testing.assert_allclose(r["got"], r["want"], atol=1e-4, rtol=0)


def test_a_memory_state_into_another_memory_is_refused_with_the_reason(tiny):
    model, path, tokens = tiny
    a = make_llm(path, memory_config())
    try:
        a.set_top_k_active(False)
        a.eval(tokens[:200])
        state = a.save_state()
    finally:
        a.close()
    for kw, words in [({"memory_type": "f16"}, "another layout"), ({"memory_capacity": 128}, "capacity of at least")]:
        b = make_llm(path, memory_config(), **kw)
        try:
            with pytest.raises(Exception) as e:
                b.load_state(state)
            # llama-cpp-python raises a bare "Failed to set llama state data": the reason is in llama.cpp's log
            assert "state" in str(e.value).lower()
        finally:
            b.close()


def test_a_kept_stores_state_references_its_blocks_and_a_reopened_store_goes_on_from_them(tiny, tmp_path):
    """With the store in a kept file the state carries its path, the hash of its last block and the summaries, not
    the records: a new context that reopens the file (after the first went on writing past the state) and loads
    the state gives the logits and selections of the stream that never stopped; a copied state is larger by the
    records."""
    model, path, tokens = tiny
    store = tmp_path / "doc.memory"
    kept = dict(memory_path=str(store), memory_keep=True)
    doc = QUESTION - 7
    r = memory_state_round_trip(lambda: make_llm(path, memory_config()), tokens, doc, range(H0, model.n_layer))
    copied = r["state"].llama_state_size

    r = kept_state_reopened(lambda: make_llm(path, memory_config(), **kept),
                            lambda: make_llm(path, memory_config(), **kept, memory_reopen=True),
                            tokens, doc, range(H0, model.n_layer))
    state, saved = r["state"], r["saved"]
    assert store.is_file()
    # a copy carries each block's record (F32 K and V rows); a reference its summaries (F16 center and radius per
    # channel), the path (u32 length + bytes) and the last block's hash
    heads = (model.n_layer - H0) * model.n_head_kv
    record, summary = heads * 2 * B * model.head_dim * 4, heads * 2 * model.head_dim * 2
    reference = 4 + len(str(store).encode()) + 8
    assert saved["n_blocks"] >= 2
    assert copied - state.llama_state_size == saved["n_blocks"] * (record - summary) - reference
    assert r["loaded"]["n_tokens"] == saved["n_tokens"]
    for il, sel in r["want_sel"].items():
        np.testing.assert_array_equal(r["got_sel"][il], sel)
    assert (r["want_sel"][H0] >= 0).all()
    np.testing.assert_array_equal(r["got"], r["want"])

    # another reading wrote the file since (opened without reopen: emptied): the state is refused, not misread
    c = make_llm(path, memory_config(), **kept)
    try:
        c.eval(tokens[50:50 + doc])
    finally:
        c.close()
    d = make_llm(path, memory_config(), **kept, memory_reopen=True)
    try:
        with pytest.raises(Exception, match="state"):
            d.load_state(state)
    finally:
        d.close()


def test_reopening_a_store_is_checked(tiny, tmp_path):
    _, path, _ = tiny
    store = tmp_path / "doc.memory"
    with pytest.raises(ValueError, match="memory_reopen=True needs memory_keep=True"):
        make_llm(path, memory_config(), memory_path=str(store), memory_reopen=True)
    make_llm(path, memory_config(), memory_path=str(store), memory_keep=True).close()
    with pytest.raises(ValueError, match="another layout.*open it with the same settings, or delete it"):
        make_llm(path, memory_config(), memory_path=str(store), memory_keep=True, memory_reopen=True,
                 memory_type="f16")
    # a file an earlier build wrote (record layout 2: the values stored as the keys are) is not misread
    head = bytearray(store.read_bytes())
    assert int.from_bytes(head[8:16], "little") == 3
    head[8:16] = (2).to_bytes(8, "little")
    store.write_bytes(bytes(head))
    with pytest.raises(ValueError, match="record layout 2, which this build does not read.*read the document again"):
        make_llm(path, memory_config(), memory_path=str(store), memory_keep=True, memory_reopen=True)
    other = tmp_path / "notes.txt"
    other.write_text("not a memory " * 400)
    with pytest.raises(ValueError, match="is not a memory file"):
        make_llm(path, memory_config(), memory_path=str(other), memory_keep=True, memory_reopen=True)
    assert other.read_text() == "not a memory " * 400  # left as it was


def answer_steps(llm, tokens, question_end, mode):
    """The question tokens[QUESTION:question_end] in one ubatch with the selection kept, then each answer token its
    own decode with the memory in ``mode`` ("hold": the kept blocks; "select": each step its own)."""
    llm.reset()
    llm.eval(tokens[:QUESTION])
    llm.set_top_k_active(True)
    llm.memory_hold("keep")
    llm.eval(tokens[QUESTION:question_end])
    llm.memory_hold(mode)
    steps = []
    for i in range(question_end, N_TOKENS):
        llm.eval(tokens[i:i + 1])
        steps.append({il: llm.memory_selection(il) for il in range(H0, llm.model_info.block_count)})
    return np.asarray(llm.scores[:N_TOKENS], dtype=np.float64), steps


def test_an_answer_holds_the_blocks_its_question_selected(tiny):
    """The question selects with "keep", the answer decodes with "hold": each answer token attends to the blocks the
    question read (kept in RAM, no selection, no read of the store), exactly the oracle given the question's
    selection at every answer step; selecting anew at each step chooses other blocks and other logits."""
    model, path, tokens = tiny
    q_end = QUESTION + 20
    held = make_llm(path, memory_config())
    try:
        got, steps = answer_steps(held, tokens, q_end, "hold")
        kept = {il: steps[0][il] for il in range(H0, model.n_layer)}
        info = held.memory_info()
    finally:
        held.close()
    for step in steps:  # a hold selects nothing: the selection stays the question's
        for il in kept:
            np.testing.assert_array_equal(step[il], kept[il])
    assert all((s >= 0).all() for s in kept.values())
    # the kept region is in RAM beside the summaries: K and V of m*B cells per KV head and stored layer, F32 here
    n_stored = model.n_layer - H0
    assert info["bytes_in_ram"] >= 2 * n_stored * model.n_head_kv * M * B * model.head_dim * 4

    selecting = make_llm(path, memory_config())
    try:
        reselected, sel_steps = answer_steps(selecting, tokens, q_end, "select")
    finally:
        selecting.close()
    moved = [i for i, s in enumerate(sel_steps) if any((s[il] != kept[il]).any() for il in kept)]
    assert moved, "the answer's own selections must differ from the question's somewhere, or a hold is not tested"
    assert np.abs(got[q_end:] - reselected[q_end:]).max() > 1e-3

    starts = [QUESTION] + list(range(q_end, N_TOKENS))
    margin = TopKMargin()
    ref = forward(model, tokens, RefAttention(sinks=S, window=W, ceiling=C, top_k=K, top_k_layer=H0, top_k_distance=D,
                                              top_k_from=QUESTION, memory_block=B,
                                              memory_blocks={il: {p: kept[il] for p in starts} for il in kept}),
                  margin=margin)
    assert margin.gap > 1e-4
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp (hold) - oracle given the question's blocks| = {err}"


def test_memory_answer_hold_holds_the_questions_blocks_by_itself(tiny):
    """Llama(memory_answer="hold") keeps what a decode of two or more tokens selects and holds it for one-token
    decodes: the same logits as the hand-held answer (answer_steps), and a one-token decode before any selection
    (the middle keys off while the document is read) selects instead of failing."""
    model, path, tokens = tiny
    q_end = QUESTION + 20
    by_hand = make_llm(path, memory_config())
    try:
        want, _ = answer_steps(by_hand, tokens, q_end, "hold")
    finally:
        by_hand.close()
    auto = make_llm(path, memory_config(), memory_answer="hold")
    try:
        auto.eval(tokens[:QUESTION])
        auto.set_top_k_active(True)
        auto.eval(tokens[QUESTION:q_end])
        kept = {il: auto.memory_selection(il) for il in range(H0, model.n_layer)}
        for i in range(q_end, N_TOKENS):
            auto.eval(tokens[i:i + 1])
            for il in kept:
                np.testing.assert_array_equal(auto.memory_selection(il), kept[il])
        got = np.asarray(auto.scores[:N_TOKENS], dtype=np.float64)
        info = auto.memory_info()
        assert auto.memory_disk_bytes(info["n_blocks"] * B) == info["bytes_on_disk"], info
        assert auto.memory_disk_bytes() == 4096 + auto.memory_capacity // B * (info["bytes_on_disk"] - 4096) // \
            info["n_blocks"]
        auto.reset()  # a new stream holds nothing: its one-token decodes select, the middle keys off or on
        auto.set_top_k_active(False)
        auto.eval(tokens[:1])
        auto.set_top_k_active(True)
        auto.eval(tokens[1:2])
    finally:
        auto.close()
    np.testing.assert_array_equal(got, want)


def test_memory_answer_is_checked(tiny):
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    with pytest.raises(ValueError, match="memory_answer='freeze': use 'select'"):
        make_llm(path, memory_config(), memory_answer="freeze")
    with pytest.raises(ValueError, match="memory_answer='hold' needs the document memory"):
        tiny_llm(path, AttentionConfig(sinks=S, window=W), memory_answer="hold")


def test_hold_modes_are_checked(tiny):
    """A hold before any kept selection, an unknown mode and a model without the memory are refused, named."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    llm = make_llm(path, memory_config())
    try:
        llm.eval(tokens[:QUESTION])
        with pytest.raises(ValueError, match="no region to hold: decode with KEEP first"):
            llm.memory_hold("hold")
        with pytest.raises(ValueError, match="memory hold mode 'freeze': use one of select, keep, hold"):
            llm.memory_hold("freeze")
        llm.memory_hold("keep")
        llm.memory_hold("select")
    finally:
        llm.close()
    plain = tiny_llm(path, AttentionConfig(sinks=S, window=W))
    try:
        with pytest.raises(ValueError, match="no document memory is open"):
            plain.memory_hold("keep")
    finally:
        plain.close()


def test_a_quantized_store_keeps_its_region_in_q8_0(tiny_hd32):
    """With a q8_0 store the kept region is q8_0 too (34 bytes per 32 values: a Llama-2-7B region of 64 blocks of 64
    in 27 layers takes 0.96 GB where F16 took 1.8) and enters the products as it is (no F32 copy at every answer
    step; the queries round to q8_0, as llama.cpp's attention rounds them over a q8_0 K cache); a ubatch that
    selects attends to the blocks it reads in the same types (the keys as stored, not widened). With m above the
    selectable blocks every ubatch selects all of them, so until one more block becomes selectable an answer step
    that selects reads the same blocks a hold keeps. Against F32 everywhere, the held q8_0 region's logits move by
    rounding, not by a misread: this random model magnifies rounding (a q8_0 K cache alone moves its logits by 10%;
    over five token streams the held region's relative error was 0.02-0.17, an F16 store's 0.006-0.025, whichever
    way the store rounded the values), and a region read wrong is off by the logits themselves."""
    model, path, tokens = tiny_hd32
    m = 8  # six blocks are selectable for the question at 250, seven from position 259 on
    q_end = QUESTION + 2
    runs = {}
    for name, mode, store, cache in [("hold", "hold", "q8_0", 1), ("select", "select", "q8_0", 1),
                                     ("f16", "select", "f16", 1), ("f32", "select", "f32", 0)]:
        llm = make_llm(path, memory_config(memory_blocks=m), memory_type=store, type_k=cache, type_v=cache)
        try:
            before = llm.memory_info()["bytes_in_ram"]
            runs[name] = answer_steps(llm, tokens, q_end, mode)
            runs[name + "_ram"] = llm.memory_info()["bytes_in_ram"] - before
            info = llm.memory_info()  # what run reports before reading is what the store takes
            assert llm.memory_disk_bytes(info["n_blocks"] * B) == info["bytes_on_disk"], info
        finally:
            llm.close()
    n_stored = model.n_layer - H0
    assert runs["hold_ram"] == 2 * n_stored * model.n_head_kv * m * B * model.head_dim * 34 // 32
    assert runs["select_ram"] == runs["hold_ram"]  # (its question kept the region too)
    (held, held_sel), (selecting, sel_steps) = runs["hold"], runs["select"]
    blocks = lambda sel: {il: [sorted(row[row >= 0]) for row in s] for il, s in sel.items()}
    kept = blocks(held_sel[0])
    same = 0
    while same < len(sel_steps) and blocks(sel_steps[same]) == kept:
        same += 1
    assert same >= 5 and same < len(sel_steps), "steps before 259 select the kept blocks, steps after one more"
    assert all(blocks(s) == kept for s in runs["f32"][1][:same]), "the F32 run selects the same blocks there"
    span = slice(q_end, q_end + same)
    exact = runs["f32"][0][span]
    err = lambda got: np.abs(got[span] - exact).max() / np.abs(exact).max()
    e_held, e_f16 = err(held), err(runs["f16"][0])
    assert 0 < e_f16 < e_held < 0.25, f"held q8_0 region: relative logit error {e_held}, F16 store and cache {e_f16}"
    # a step that selects the kept blocks attends to them in the types the hold keeps (the q8_0 keys and values as
    # stored): the same logits but for the order of the sums (the selection's
    # order is the scores', the kept region's the question's). Before, the selecting steps cast the region to the
    # F16 cache's type and scored it with F16 queries: a difference of q8_0's rounding of the queries
    e_same = np.abs(held[span] - selecting[span]).max() / np.abs(exact).max()
    assert e_same < 1e-5, f"a selecting step and a held one differ by {e_same} (relative) over the same blocks"


@pytest.mark.parametrize("store, levels", [("q8_0", 127), ("q4_0", 8)])
def test_a_quantized_store_rounds_keys_a_token_and_values_a_channel_at_a_time(tiny_hd32, store, levels):
    """The store rounds a block's keys along each token's channels (the rows the products read) and its values
    along each channel's tokens (the rows the attention multiplies its weights by, which the kept region holds as
    they are): every run of 32 is a whole number of steps of its largest magnitude / levels (q8_0: 127 a sign; q4_0:
    8). Before, the values were rounded as the keys and rounded again across the cells as they were read."""
    model, path, tokens = tiny_hd32
    llm = make_llm(path, memory_config(), memory_type=store)
    try:
        llm.eval(tokens[:120])
        n_blocks = llm.memory_info()["n_blocks"]
        stored = stored_blocks(llm, model, n_blocks)
    finally:
        llm.close()
    assert n_blocks == (120 - S) // B and B % 32 == 0 and model.head_dim == 32

    def off_grid(runs: np.ndarray) -> float:  # runs [n, 32]: the largest distance from a whole step
        amax = np.abs(runs).max(axis=1, keepdims=True)
        steps = runs * levels / np.where(amax > 0, amax, 1)
        return float(np.abs(steps - np.round(steps)).max())

    for (ib, il, g), (k, v) in stored.items():
        k, v = np.asarray(k).reshape(B, -1), np.asarray(v).reshape(B, -1)  # [B][hd]
        assert off_grid(k.reshape(-1, 32)) < 1e-3, (ib, il, g)  # a token's 32 channels
        assert off_grid(v.T.reshape(-1, 32)) < 1e-3, (ib, il, g)  # a channel's 32 tokens
        assert off_grid(v.reshape(-1, 32)) > 0.05, (ib, il, g)  # not a token's channels


def test_a_q4_0_store_keeps_its_region_in_q4_0(tiny_hd32):
    """A q4_0 store (the wide models' default, for the disk) keeps its region in q4_0 too, for the RAM: the keys as
    stored and the values as stored, rounded to q4_0 across a block's cells (18 bytes per 32 values: a Llama-2-7B
    region of 64 blocks of 64 in 27 layers takes 0.51 GB where Q8_0 values put it at 0.74). A selecting step attends
    to the blocks it reads in those types, so over the kept blocks it gives the held step's logits; Q4_0's coarser
    step keeps the held logits within 16 times the q8_0 store's error (8 levels a sign against 127; a region read
    wrong would be off by the logits themselves)."""
    model, path, tokens = tiny_hd32
    m, q_end = 8, QUESTION + 2  # as in the q8_0 test: steps before 259 select the six selectable blocks
    runs = {}
    for name, mode, store in [("hold", "hold", "q4_0"), ("select", "select", "q4_0"), ("q8_0", "hold", "q8_0"),
                              ("f32", "select", "f32")]:
        llm = make_llm(path, memory_config(memory_blocks=m), memory_type=store, type_k=int(store != "f32"),
                       type_v=int(store != "f32"))
        try:
            before = llm.memory_info()["bytes_in_ram"]
            runs[name] = answer_steps(llm, tokens, q_end, mode)
            runs[name + "_ram"] = llm.memory_info()["bytes_in_ram"] - before
        finally:
            llm.close()
    n_stored = model.n_layer - H0
    assert runs["hold_ram"] == 2 * n_stored * model.n_head_kv * m * B * model.head_dim * 18 // 32
    assert runs["q8_0_ram"] == runs["hold_ram"] * 34 // 18
    (held, held_sel), (selecting, sel_steps) = runs["hold"], runs["select"]
    blocks = lambda sel: {il: [sorted(row[row >= 0]) for row in s] for il, s in sel.items()}
    same = 0
    while same < len(sel_steps) and blocks(sel_steps[same]) == blocks(held_sel[0]):
        same += 1
    assert same >= 5, "the selecting steps before 259 select the kept blocks"
    span = slice(q_end, q_end + same)
    exact = runs["f32"][0][span]
    err = lambda got: np.abs(got[span] - exact).max() / np.abs(exact).max()
    e_q4, e_q8 = err(held), err(runs["q8_0"][0])
    assert 0 < e_q8 < e_q4 < 16 * e_q8, f"held q4_0 region: relative logit error {e_q4}, q8_0 store {e_q8}"
    e_same = np.abs(held[span] - selecting[span]).max() / np.abs(exact).max()
    assert e_same < 1e-5, f"a selecting step and a held one differ by {e_same} (relative) over the same blocks"
