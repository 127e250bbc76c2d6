"""streaming_nll against the NLL computed from llama-cpp-python's own full logits."""

import numpy as np
import pytest



@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama


def test_streaming_nll_equals_nll_from_full_logits(tiny):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.evaluate import streaming_nll

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
    from llama_extrapolate.evaluate import streaming_nll

    _, path = tiny
    llm = llama_extrapolate.Llama(str(path), n_ctx=256, n_batch=64, verbose=False)
    try:
        with pytest.raises(ValueError) as err:
            streaming_nll(llm, tokens, n_batch=n_batch, progress=False)
        assert words in str(err.value)
    finally:
        llm.close()
