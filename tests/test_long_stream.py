"""With a Lambda window, llama-cpp-python's completion and chat accept prompts far longer than n_ctx."""

import numpy as np
import pytest

from reference import RefAttention, forward


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama


def tiny_llm(path, **attention):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    return llama_extrapolate.Llama(str(path), attention=AttentionConfig(**attention), n_ctx=128, n_batch=32,
                                   n_ubatch=32, n_threads=2, verbose=False, type_k=0, type_v=0)


def test_completion_of_a_prompt_far_longer_than_the_context(tiny):
    model, path = tiny
    prompt = np.random.default_rng(6).integers(3, model.n_vocab, size=1000).tolist()
    llm = tiny_llm(path, sinks=4, window=32, ceiling=32, rollback=16)
    try:
        assert llm.n_ctx() == 256 < len(prompt)
        out = llm.create_completion(prompt, max_tokens=3, temperature=0.0)
        assert out["usage"]["prompt_tokens"] == 1000
        # greedy continuation = the oracle's argmax, token after token
        stream = list(prompt)
        for _ in range(3):
            stream.append(int(np.argmax(forward(model, stream, RefAttention(sinks=4, window=32, ceiling=32))[-1])))
        # generated tokens are decoded in turn (more than max_tokens when byte tokens leave an
        # incomplete UTF-8 character): the first two are the oracle's
        assert llm.n_tokens >= 1002
        assert list(llm.input_ids[1000:1002]) == stream[1000:1002]
        # the per-token arrays stay bounded: ids in a capped history, logits for one batch only
        from llama_extrapolate.history import DEFAULT_CAPACITY, TokenHistory

        assert isinstance(llm.input_ids, TokenHistory) and llm.input_ids.capacity == DEFAULT_CAPACITY
        assert llm.scores.shape[0] <= 128
    finally:
        llm.close()


def test_vanilla_still_refuses_prompts_beyond_the_context(tiny):
    model, path = tiny
    llm = tiny_llm(path, sinks=0, window=0, ceiling=0)
    try:
        with pytest.raises(ValueError, match="exceed context window"):
            llm.create_completion(list(range(3, 60)) * 10, max_tokens=1)
    finally:
        llm.close()


def test_prefix_reuse_within_rollback_and_reread_beyond(tiny):
    """Prompt-prefix reuse works inside the rollback margin; beyond it the prompt is re-read: same result."""
    model, path = tiny
    rng = np.random.default_rng(7)
    doc = rng.integers(3, model.n_vocab, size=400).tolist()
    llm = tiny_llm(path, sinks=4, window=32, ceiling=32, rollback=16)
    cfg = RefAttention(sinks=4, window=32, ceiling=32)
    try:
        for prompt in (doc + [5, 6, 7], doc + [5, 6, 9], doc[:300] + [11]):
            llm.create_completion(prompt, max_tokens=2, temperature=0.0)
            expected = int(np.argmax(forward(model, prompt, cfg)[-1]))
            assert llm.n_tokens >= len(prompt) + 1
            assert int(llm.input_ids[len(prompt)]) == expected
    finally:
        llm.close()


def test_chat_completion_beyond_n_ctx_on_the_default_model(default_model):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    doc = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(150))
    llm = llama_extrapolate.Llama(str(default_model), attention=AttentionConfig(sinks=4, window=256, ceiling=256,
                                                                                 rollback=64),
                                  n_ctx=512, n_batch=128, n_ubatch=128, n_threads=2, verbose=False)
    try:
        n_doc = len(llm.tokenize(doc.encode()))
        assert n_doc > 2 * llm.n_ctx()
        out = llm.create_chat_completion(
            messages=[{"role": "user", "content": doc + "\nWhat animal jumps? One word."}],
            max_tokens=4, temperature=0.0)
        assert out["usage"]["prompt_tokens"] > n_doc
        assert isinstance(out["choices"][0]["message"]["content"], str)
        assert llm.scores.shape[0] <= 512
    finally:
        llm.close()


def test_a_continued_conversation_reuses_the_cache(tiny):
    """Prompt = previous stream + a new turn: the cache is reused (a few tokens decoded), result exact."""
    import llama_cpp

    model, path = tiny
    rng = np.random.default_rng(8)
    first = rng.integers(3, model.n_vocab, size=500).tolist()
    llm = tiny_llm(path, sinks=4, window=32, ceiling=32, rollback=16)
    cfg = RefAttention(sinks=4, window=32, ceiling=32)
    try:
        llm.create_completion(first, max_tokens=2, temperature=0.0)
        stream = [int(t) for t in llm.input_ids[: llm.n_tokens]]
        assert stream[:500] == first
        second = stream + [7, 8, 9]
        llama_cpp.llama_perf_context_reset(llm.ctx)
        llm.create_completion(second, max_tokens=2, temperature=0.0)
        decoded = llama_cpp.llama_perf_context(llm.ctx).n_p_eval
        assert decoded < 20, f"{decoded} prompt tokens decoded: the cached stream was not reused"
        assert int(llm.input_ids[len(second)]) == int(np.argmax(forward(model, second, cfg)[-1]))
    finally:
        llm.close()
