"""The document memory's landmarks (patch 0012, memory_landmark=n): the blocks ranked by the mean of runs of keys.

Quest's box over 64 scattered keys ranks the block that holds a needle among hundreds at 32k tokens
(studies/memory/first_stage.py), so the rerank must read half the document's keys to find it. With landmarks each
block keeps the mean of each run of n of its keys instead of its box (ShadowKV's landmarks, in the key channels, rounded as the
summaries are: F16 for the tiny model's heads of 16), and a selecting ubatch ranks the blocks by their largest
landmark q.k over its queries instead of the bound; the rerank, when asked for, reranks the landmarks' best
candidates. Checked against numpy: the selection is numpy's top m of that score over the stored keys (and not the
bound's somewhere), the rerank takes the landmarks' candidates, the logits are the oracle's given the selection, a
state carries the landmarks, a state without them is refused, and bad values are named.
"""

import numpy as np
import pytest

from conftest import kept_state_reopened, memory_state_round_trip, random_tokens, save_mid_document
from test_memory import (B, H0, M, N_SELECTABLE, N_TOKENS, QUESTION, S, assert_logits_given, block_bound,  # noqa: F401
                         make_llm, memory_config, q4_0_rounded, q8_0_rounded, question_queries, read_and_ask, rerank_of,
                         selection, stored_blocks, tiny, tiny_hd32)
from test_memory_axes import assert_top_m_of

LANDMARK = 8  # tokens a landmark averages: 4 landmarks a block of 32


def landmark_score(qg, keys, n=LANDMARK, rounded=q8_0_rounded):
    """A block's largest q.k over its landmarks (the means of its runs of n stored keys, as the library keeps them:
    F16 for heads of 16; for heads of a multiple of 32 Q8_0, or Q4_0 beside a q4_0 store (``rounded``), whose
    product rounds the queries to q8_0 too) and the queries qg."""
    # summed in order and divided in float32, as the library does: at 4 bits a mean a rounding apart from the
    # library's would round to another of 16 levels
    runs = keys.astype(np.float32).reshape(-1, n, keys.shape[-1])
    means = np.cumsum(runs, axis=1, dtype=np.float32)[:, -1] / np.float32(n)
    if keys.shape[-1] % 32 == 0:
        return (q8_0_rounded(qg) @ rounded(means).T).max()
    return (qg @ means.astype(np.float16).astype(np.float64).T).max()


def ask(path, model, tokens, **config):
    llm = make_llm(path, memory_config(**config), memory_landmark=LANDMARK)
    try:
        got = read_and_ask(llm, tokens)
        return got, selection(llm, model), stored_blocks(llm, model, N_SELECTABLE), llm.memory_info()
    finally:
        llm.close()


@pytest.fixture(scope="module")
def by_landmarks(tiny):
    model, path, tokens = tiny
    return ask(path, model, tokens)


def test_the_blocks_are_ranked_by_their_best_landmark(tiny, by_landmarks):
    model, _, tokens = tiny
    got, sel, stored, info = by_landmarks
    assert info["n_landmark"] == LANDMARK
    queries = question_queries(model, tokens, sel)
    differ = 0
    for il in range(H0, model.n_layer):
        for g in range(model.n_head_kv):
            keys = [stored[(b, il, g)][0] for b in range(N_SELECTABLE)]
            score = np.array([landmark_score(queries[(il, g)], k) for k in keys])
            assert_top_m_of(score, sel[il][g], (il, g))
            bound = np.array([block_bound(queries[(il, g)], k) for k in keys])
            differ += set(np.argsort(-bound, kind="stable")[:M].tolist()) != set(sel[il][g].tolist())
    assert differ > 0, "the bound must select otherwise somewhere for the test to tell the landmarks apart"
    assert_logits_given(model, tokens, got, sel)


def test_the_rerank_takes_the_landmarks_candidates(tiny):
    model, path, tokens = tiny
    got, sel, stored, _ = ask(path, model, tokens, memory_candidates=4)
    queries = question_queries(model, tokens, sel)
    for il in range(H0, model.n_layer):
        for g in range(model.n_head_kv):
            keys = [stored[(b, il, g)][0] for b in range(N_SELECTABLE)]
            score = np.array([landmark_score(queries[(il, g)], k) for k in keys])
            exact = np.array([(queries[(il, g)] @ k.T.astype(np.float64)).max() for k in keys])
            assert_top_m_of(rerank_of(score, exact, 4, defined=False)[1], sel[il][g], (il, g))
    assert_logits_given(model, tokens, got, sel)


def test_the_landmarks_take_the_place_of_the_summaries_in_ram(tiny, by_landmarks):
    """A block keeps its B / L landmarks instead of its center and radius: the RAM of a memory with landmarks is that
    of one without, less two summary rows and plus B / L landmark rows (F16, heads of 16) per block, KV head and
    stored layer of the capacity."""
    model, path, _ = tiny
    _, _, _, info = by_landmarks
    llm = make_llm(path, memory_config())
    try:
        without = llm.memory_info()["bytes_in_ram"]
    finally:
        llm.close()
    llm = make_llm(path, memory_config(), memory_landmark=LANDMARK)
    try:
        with_landmarks = llm.memory_info()["bytes_in_ram"]
    finally:
        llm.close()
    rows = (model.n_layer - H0) * model.n_head_kv * info["n_blocks_cap"]
    assert with_landmarks - without == (B // LANDMARK - 2) * rows * model.head_dim * 2


def test_a_state_carries_the_landmarks_and_one_without_is_refused(tiny, capfd):
    model, path, tokens = tiny
    made = []

    def make():
        made.append(make_llm(path, memory_config(), memory_landmark=LANDMARK))
        return made[-1]

    r = memory_state_round_trip(make, tokens, QUESTION - 7, range(H0, model.n_layer))
    for il, want in r["want_sel"].items():
        np.testing.assert_array_equal(r["got_sel"][il], want)
    np.testing.assert_allclose(r["got"], r["want"], atol=1e-4, rtol=0)

    other = make_llm(path, memory_config())  # no landmarks
    try:
        capfd.readouterr()
        with pytest.raises(Exception, match="state"):
            other.load_state(r["state"])
        # llama-cpp-python raises a bare "Failed to set llama state data": the reason is in llama.cpp's log
        assert "has landmarks of 8 keys, this one no landmarks" in capfd.readouterr().err
    finally:
        other.close()


def ask_hd32(path, model, tokens, **kw):
    """The heads-of-32 model's memory with landmarks (``kw``: more of the Llama's arguments), read and asked: its RAM
    before the reading, the logits, the selection and the stored blocks."""
    llm = make_llm(path, memory_config(), memory_landmark=LANDMARK, **kw)
    try:
        ram = llm.memory_info()["bytes_in_ram"]
        got = read_and_ask(llm, tokens)
        return ram, got, selection(llm, model), stored_blocks(llm, model, N_SELECTABLE)
    finally:
        llm.close()


def landmark_ram(model, bytes_per_32):
    """The RAM of the heads-of-32 model's memory with landmarks of ``bytes_per_32`` bytes a block of 32 values (34
    Q8_0, 18 Q4_0) for the capacity's blocks, and the block being filled, in F32."""
    n_stored, cap, row = model.n_layer - H0, 512 // B, model.n_head_kv * model.head_dim
    return (B // LANDMARK) * n_stored * cap * row * bytes_per_32 // 32 + 2 * n_stored * B * row * 4


def test_heads_of_32_channels_rank_by_q8_0_landmarks(tiny_hd32):
    """Heads of 32 channels keep their landmarks in Q8_0, as their summaries (34 bytes a landmark), and the product
    takes them as kept: the selection is numpy's top m of the Q8_0 landmarks' scores against q8_0-rounded queries."""
    model, path, tokens = tiny_hd32
    ram, got, sel, stored = ask_hd32(path, model, tokens)
    assert ram == landmark_ram(model, 34)  # no min/max summaries
    queries = question_queries(model, tokens, sel)
    for il in range(H0, model.n_layer):
        for g in range(model.n_head_kv):
            score = np.array([landmark_score(queries[(il, g)], stored[(b, il, g)][0]) for b in range(N_SELECTABLE)])
            assert_top_m_of(score, sel[il][g], (il, g))
    assert_logits_given(model, tokens, got, sel)


def test_a_q4_0_store_ranks_by_q4_0_landmarks(tiny_hd32):
    """Beside a q4_0 store (a wide model's, for its disk) the landmarks are Q4_0 (18 bytes a landmark of 32: at
    Llama-2-7B's shapes and 128k tokens 0.54 GB where Q8_0 took 1.02), and the product takes them as kept: the
    selection is numpy's top m of the Q4_0 landmarks of the stored keys (as the q4_0 store returns them) against
    q8_0-rounded queries, and not that of Q8_0 landmarks everywhere. Checked in the first stored layer, over four
    streams: the queries of the layers after it come through the region's q4_0 values, which the oracle's
    forward does not round."""
    model, path, _ = tiny_hd32
    differ = 0
    for seed in range(2, 6):
        tokens = random_tokens(model, N_TOKENS, seed=seed)
        ram, _, sel, stored = ask_hd32(path, model, tokens, memory_type="q4_0")
        assert ram == landmark_ram(model, 18)
        queries = question_queries(model, tokens, sel)
        for g in range(model.n_head_kv):
            keys = [stored[(b, H0, g)][0] for b in range(N_SELECTABLE)]
            score = np.array([landmark_score(queries[(H0, g)], k, rounded=q4_0_rounded) for k in keys])
            assert_top_m_of(score, sel[H0][g], (seed, H0, g))
            q8 = np.array([landmark_score(queries[(H0, g)], k) for k in keys])
            differ += set(np.argsort(-q8, kind="stable")[:M].tolist()) != set(sel[H0][g].tolist())
    assert differ > 0, "Q8_0 landmarks must select otherwise somewhere for the test to tell Q4_0 ones apart"


def test_a_kept_q4_0_stores_state_carries_its_q4_0_landmarks(tiny_hd32, tmp_path):
    """A kept store's state references its blocks and carries their landmarks as kept (Q4_0 beside a q4_0 store,
    18 bytes a landmark where the summaries' rows are 34): a context that reopens the file and loads the state goes
    on with the selections and logits of the stream that never stopped, every KV head's landmarks where they were."""
    model, path, tokens = tiny_hd32
    kept = dict(memory_path=str(tmp_path / "doc.memory"), memory_keep=True, memory_landmark=LANDMARK,
                memory_type="q4_0")
    r = kept_state_reopened(lambda: make_llm(path, memory_config(), **kept),
                            lambda: make_llm(path, memory_config(), **kept, memory_reopen=True),
                            tokens, QUESTION - 7, range(H0, model.n_layer))
    assert r["saved"]["n_blocks"] >= 2 and model.n_head_kv > 1
    for il, sel in r["want_sel"].items():
        np.testing.assert_array_equal(r["got_sel"][il], sel)
    np.testing.assert_array_equal(r["got"], r["want"])


def test_an_earlier_builds_state_is_read_where_its_landmarks_are_this_builds(tiny_hd32, tmp_path, capfd):
    """A kept store's state of an earlier build ("LXMEMRF4") has its landmarks in the summaries' type: it is read
    where that is still theirs (an f32 store's Q8_0 landmarks) and refused, with the reason, beside a q4_0 store
    (whose landmarks were Q8_0 and are now Q4_0), not misread."""
    import copy

    model, path, tokens = tiny_hd32
    doc = QUESTION - 7
    for store, read in [("f32", True), ("q4_0", False)]:
        kept = dict(memory_path=str(tmp_path / f"doc-{store}.memory"), memory_keep=True, memory_landmark=LANDMARK,
                    memory_type=store)
        a = make_llm(path, memory_config(), **kept)
        try:
            state, _ = save_mid_document(a, tokens, doc)
        finally:
            a.close()
        blob = bytes(state.llama_state)
        assert blob.count(b"LXMEMRF5") == 1
        earlier = copy.copy(state)
        earlier.llama_state = blob.replace(b"LXMEMRF5", b"LXMEMRF4")
        b = make_llm(path, memory_config(), **kept, memory_reopen=True)
        try:
            capfd.readouterr()
            if read:
                b.load_state(earlier)
                assert b.memory_info()["n_blocks"] > 0
            else:
                with pytest.raises(Exception, match="state"):
                    b.load_state(earlier)
                assert "whose landmarks beside a q4_0 store were q8_0 (this build's are q4_0)" in capfd.readouterr().err
        finally:
            b.close()


@pytest.mark.parametrize("landmark", [5, 64, -1, True])
def test_bad_landmarks_are_named(tiny, landmark):
    _, path, _ = tiny
    with pytest.raises(ValueError, match=f"memory_landmark={landmark!r}.*divisor of the memory's block size {B}"):
        make_llm(path, memory_config(), memory_landmark=landmark)


def test_landmarks_with_the_principal_axes_are_refused(tiny):
    _, path, _ = tiny
    with pytest.raises(ValueError, match="memory_landmark=8 with memory_axes='principal'.*drop one"):
        make_llm(path, memory_config(), memory_landmark=LANDMARK, memory_axes="principal")


def test_run_ranks_by_landmarks(tiny, tmp_path, capsys):
    """`run --memory-landmark 8 --memory-candidates 4` opens the memory with landmarks and says so."""
    from llama_extrapolate import cli

    _, path, _ = tiny
    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    rc = cli.main(["run", "--model", str(path), "--file", str(doc), "--prompt", "What jumps?", "--window", "32",
                   "--sinks", "4", "--max-tokens", "4", "--n-batch", "32", "--no-chat", "--memory-blocks", "2",
                   "--memory-block-size", "32", "--memory-landmark", str(LANDMARK), "--memory-candidates", "4"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"2 selected per head ranked by landmarks of {LANDMARK} keys" in err


def test_landmarks_need_the_memory(tiny):
    _, path, _ = tiny
    from llama_extrapolate import AttentionConfig

    with pytest.raises(ValueError, match="memory_landmark"):
        make_llm(path, AttentionConfig(sinks=S, window=32, ceiling=32), memory_landmark=LANDMARK)
