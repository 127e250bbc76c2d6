"""streaming_nll against the NLL computed from llama-cpp-python's own full logits."""

import numpy as np
import pytest



@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama


def test_streaming_nll_equals_nll_from_full_logits(tiny):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness.evaluate import streaming_nll

    model, path = tiny
    tokens = np.random.default_rng(11).integers(3, model.n_vocab, size=200).tolist()
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=256, n_batch=64,
                                  n_ubatch=64, logits_all=True, verbose=False, type_k=0, type_v=0)
    try:
        llm.eval(tokens)
        logits = np.asarray(llm.scores[:200], dtype=np.float64)
        lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        expected = lse[:-1] - logits[np.arange(199), tokens[1:]]
        r = streaming_nll(llm, tokens, n_batch=48, progress=False)
    finally:
        llm.close()
    np.testing.assert_allclose(r.nll, expected, atol=1e-4)
    buckets = r.bucketize(50)
    assert [(b["start"], b["end"]) for b in buckets] == [(1, 50), (51, 100), (101, 150), (151, 199)]
    assert buckets[0]["ppl"] == pytest.approx(np.exp(expected[:50].mean()), rel=1e-4)


@pytest.mark.parametrize("tokens, n_batch, words", [
    ([5], None, "at least 2 tokens"),
    ([5, 9999], None, "token ids must be in [0, 259)"),
    ([5, 6, 7], 0, "n_batch=0 must be in 1..64"),
])
def test_streaming_nll_bad_input(tiny, tokens, n_batch, words):
    import llama_extrapolate
    from llama_extrapolate.harness.evaluate import streaming_nll

    _, path = tiny
    llm = llama_extrapolate.Llama(str(path), n_ctx=256, n_batch=64, verbose=False)
    try:
        with pytest.raises(ValueError) as err:
            streaming_nll(llm, tokens, n_batch=n_batch, progress=False)
        assert words in str(err.value)
    finally:
        llm.close()


def test_log_softmax_at_matches_the_whole_array_formula_and_stays_small():
    import tracemalloc

    from llama_extrapolate.harness.evaluate import log_softmax_at

    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((77, 1000)) * 8 + 300).astype(np.float32)   # large offsets: needs the max shift
    targets = rng.integers(0, 1000, size=77)
    rows = logits.astype(np.float64)
    m = rows.max(1)
    expected = m + np.log(np.exp(rows - m[:, None]).sum(1)) - rows[np.arange(77), targets]
    np.testing.assert_allclose(log_softmax_at(logits, targets, rows_per_step=10), expected, rtol=1e-12)
    np.testing.assert_allclose(log_softmax_at(logits, targets), expected, rtol=1e-12)

    # a 512-token chunk of a 49k vocabulary: the scoring must not hold float64 copies of the whole chunk
    big = rng.standard_normal((512, 49152)).astype(np.float32)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        log_softmax_at(big, rng.integers(0, 49152, size=512))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"scoring a chunk allocated {peak / 2**20:.0f} MiB at its peak"


class _Killed(Exception):
    pass


@pytest.mark.parametrize("name, attention, n_ctx, shift", [
    ("lambda", dict(sinks=4, window=32, ceiling=32, rollback=0), 128, None),  # re-based many times
    ("vanilla", dict(sinks=0, window=0, ceiling=0), 640, None),
    ("context-shift", dict(sinks=0, window=0, ceiling=0), 128, 4),
])
def test_killed_stream_resumes_from_its_checkpoint(tiny, tmp_path, name, attention, n_ctx, shift):
    """A stream killed after a checkpoint is rerun: it restores the state, scores only the rest, and every
    score matches the uninterrupted run (to the order of sums over cells restored in other slots)."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness.checkpoint import StreamCheckpoint
    from llama_extrapolate.harness.evaluate import streaming_nll

    model, path = tiny
    tokens = np.random.default_rng(12).integers(3, model.n_vocab, size=600).tolist()

    def llm():
        return llama_extrapolate.Llama(str(path), attention=AttentionConfig(**attention), n_ctx=n_ctx, n_batch=32,
                                       n_ubatch=32, verbose=False, type_k=0, type_v=0)

    def ckpt(**key):
        return StreamCheckpoint(tmp_path / name, key={"config": name, **key}, every_seconds=1e-9)

    a = llm()
    try:
        full = streaming_nll(a, tokens, n_batch=32, progress=False, context_shift=shift)

        def kill_at_320(nll, done):
            if done == 352:  # the checkpoint of 320 is written, the one of 352 never will be
                raise _Killed

        with pytest.raises(_Killed):
            streaming_nll(a, tokens, n_batch=32, progress=False, context_shift=shift, on_chunk=kill_at_320,
                          checkpoint=ckpt())
        assert (tmp_path / f"{name}.state").is_file() and (tmp_path / f"{name}.npz").is_file()
    finally:
        a.close()
    b = llm()  # a new process would start from a fresh context
    try:
        seen = []
        r = streaming_nll(b, tokens, n_batch=32, progress=False, context_shift=shift, checkpoint=ckpt(),
                          on_chunk=lambda nll, done: seen.append(done))
        assert r.resumed_from == 320 and seen[0] == 352
        np.testing.assert_array_equal(r.nll[:320], full.nll[:320])  # the restored scores themselves
        np.testing.assert_allclose(r.nll, full.nll, rtol=0, atol=1e-4)
        assert np.isfinite(r.nll).all()
        # a checkpoint of other tokens, configuration or batch is not loaded
        other = streaming_nll(b, tokens, n_batch=32, progress=False, context_shift=shift,
                              checkpoint=ckpt(tokens="other"))
        assert other.resumed_from == 0
    finally:
        b.close()
