"""Top-k middle keys (LM-Infinite section 4) in llama.cpp against the numpy oracle, on tiny models.

Each head of a layer >= h0 adds the k keys the window hides (S <= j, p - j >= W) with the largest
logits scored at distance D. The oracle selects them in float64 by sorting (ties: the earlier key);
llama.cpp selects with ggml_top_k in float32. The two agree when the k-th and (k+1)-th logits are
further apart than float rounding, which `TopKMargin` records and the tests assert, so a pass is not
luck. (Layer 0 has exact ties: a repeated token has the same unrotated key and the same value there,
so whichever copy is picked the output is the same; its margin is not asserted.)
"""

import numpy as np
import pytest

from conftest import random_tokens, read_behind_another_sequence, tiny_llm
from reference import RefAttention, TopKMargin, forward, forward_mpt

N_TOKENS = 300
TOL = 2e-3
LAMBDA = dict(sinks=4, window=32, ceiling=32)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    model, path = tiny_llama
    return model, path, random_tokens(model, N_TOKENS, seed=2)


make_llm = tiny_llm


def scores(llm, n):
    return np.asarray(llm.scores[:n], dtype=np.float64)


def run(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return scores(llm, len(tokens))


def reference(model, tokens, forward_fn=forward, **cfg):
    margin = TopKMargin()
    ref = forward_fn(model, tokens, RefAttention(**cfg), margin=margin)
    return ref, margin


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("k, layer, distance", [(3, 1, 16), (3, 0, 16), (1, 1, 8), (6, 1, 30)])
def test_every_query_selects_its_middle_keys(tiny, k, layer, distance, ubatch):
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    cfg = dict(LAMBDA, top_k=k, top_k_layer=layer, top_k_distance=distance)
    llm = make_llm(path, AttentionConfig(**cfg), ubatch=ubatch)
    try:
        got = run(llm, tokens)
    finally:
        llm.close()
    ref, margin = reference(model, tokens, **cfg)
    plain = forward(model, tokens, RefAttention(**LAMBDA))
    assert margin.rows > 0
    if layer > 0:
        assert margin.gap > 1e-4, f"selection ill-defined for this text (gap {margin.gap}): pick another seed"
    assert np.abs(ref - plain).max() > 0.5, "the middle keys must change the output for this test to mean anything"
    err = np.abs(got - ref).max()
    assert err < TOL, f"k={k}, h0={layer}, D={distance}, ubatch {ubatch}: max |llama.cpp - oracle| = {err}"


def test_default_distance_is_half_the_ceiling_or_window(tiny):
    from llama_extrapolate import AttentionConfig

    _, path, _ = tiny
    for attention, want in ((AttentionConfig(sinks=4, window=32, ceiling=24, top_k=2, top_k_layer=1), 12),
                            (AttentionConfig(sinks=4, window=32, ceiling=0, top_k=2, top_k_layer=1), 16)):
        llm = make_llm(path, attention)
        try:
            assert llm.top_k_state == (2, 1, want)
            assert llm.attention_resolved.top_k_distance == want
        finally:
            llm.close()


def test_question_scope_reads_with_plain_lambda_then_selects(tiny):
    """top_k_scope='question': the document is read with the Lambda mask only (the cache keeps its middle keys),
    then the queries from the question on select them."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    cfg = dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)
    llm = make_llm(path, AttentionConfig(**cfg, top_k_scope="question"))
    try:
        assert llm.top_k_state[0] == 0
        llm.reset()
        llm.eval(tokens[:250])
        llm.set_top_k_active(True)
        assert llm.top_k_state == (3, 1, 16)
        llm.eval(tokens[250:])
        got = scores(llm, N_TOKENS)
    finally:
        llm.close()
    ref, _ = reference(model, tokens, **cfg, top_k_from=250)
    plain = forward(model, tokens, RefAttention(**LAMBDA))
    assert np.abs(ref[250:] - plain[250:]).max() > 0.5
    assert np.abs(got - ref).max() < TOL


def test_question_tokens_switch_the_middle_keys_on_for_the_end_of_each_prompt(tiny):
    """question_tokens=n: llama-cpp-python's own calls (create_completion, the server) read the last n tokens of a
    prompt and the answer with the middle keys, the rest without: the oracle's question scope from there. A
    second prompt that continues the stream again reads only its end with them."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    cfg = dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)
    llm = make_llm(path, AttentionConfig(**cfg, top_k_scope="question"), question_tokens=50)
    try:
        llm.reset()
        llm.eval(tokens[:250])  # the question: tokens 200-249
        assert llm.top_k_state == (3, 1, 16)
        first = scores(llm, 250)
    finally:
        llm.close()
    ref, _ = reference(model, tokens[:250], **cfg, top_k_from=200)
    assert np.abs(first - ref).max() < TOL
    plain, _ = reference(model, tokens[:250], **cfg, top_k_from=250)
    assert np.abs(ref[200:] - plain[200:]).max() > 0.5  # the switch is seen

    with pytest.raises(ValueError, match="question_tokens=0"):
        make_llm(path, AttentionConfig(**cfg, top_k_scope="question"), question_tokens=0)
    with pytest.raises(ValueError, match="top_k_scope='question'"):
        make_llm(path, AttentionConfig(**cfg), question_tokens=50)


def test_k_layer_distance_change_between_decodes_and_off_is_lambda(tiny):
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    llm = make_llm(path, AttentionConfig(**LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16))
    try:
        llm.set_top_k(5, distance=24)
        assert llm.top_k_state == (5, 1, 24)
        llm.set_top_k_active(False)
        llm.set_top_k_active(True)  # switches on the k set last, not the one loaded
        assert llm.top_k_state == (5, 1, 24)
        got = run(llm, tokens)
        ref, _ = reference(model, tokens, **LAMBDA, top_k=5, top_k_layer=1, top_k_distance=24)
        assert np.abs(got - ref).max() < TOL
        llm.set_top_k(0)
        assert llm.top_k_state[0] == 0
        got = run(llm, tokens)
        assert np.abs(got - forward(model, tokens, RefAttention(**LAMBDA))).max() < TOL
        with pytest.raises(ValueError, match="top_k_layer=2"):
            llm.set_top_k(3, layer=2)
    finally:
        llm.close()


@pytest.mark.parametrize("ceiling", [32, 0])
def test_alibi_middle_keys_take_the_bias_at_distance_d(tiny_mpt_model, ceiling):
    from llama_extrapolate import AttentionConfig

    model, path = tiny_mpt_model
    tokens = random_tokens(model, N_TOKENS, seed=4)  # a text whose selections have clear margins (> 1e-3)
    cfg = dict(sinks=4, window=32, ceiling=ceiling, top_k=3, top_k_layer=1, top_k_distance=16)
    llm = make_llm(path, AttentionConfig(**cfg))
    try:
        got = run(llm, tokens)
    finally:
        llm.close()
    ref, margin = reference(model, tokens, forward_mpt, **cfg)
    plain = forward_mpt(model, tokens, RefAttention(**{k: cfg[k] for k in ("sinks", "window", "ceiling")}))
    assert margin.gap > 1e-4 and np.abs(ref - plain).max() > 0.5
    # 1e-2 as in test_attention_alibi: ggml's CPU GELU goes through a half-precision table
    assert np.abs(got - ref).max() < 1e-2


def test_quantized_k_cache(tmp_path):
    """q8_0 keys with the ceiling and the middle keys, head size 64 as SmolLM2's (where llama.cpp would also
    Hadamard-rotate quantized keys, which RoPE does not commute with: off in these modes): the error is q8_0's
    own, as large as on the upstream path (Lambda mask only), and far below what the middle keys change. A
    re-based stream's K-shift rotates the q8_0 keys through F32 without the Hadamard rotation (before, it called
    the rotation with none and crashed)."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from test_attention import decode_logits
    from tinymodel import TinyLlama

    model = TinyLlama(n_embd=256)
    model.make_weights()
    path = model.write(tmp_path / "tiny-hd64.gguf")
    tokens = random_tokens(model, N_TOKENS, seed=2)
    top_k = dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)
    cases = {"lambda-only": dict(sinks=4, window=32, ceiling=0), "lambda+ceiling": LAMBDA, "top-k": top_k}
    errors, refs = {}, {}
    for name, cfg in cases.items():
        refs[name], _ = reference(model, tokens, **cfg)
        for type_k in (0, 8):  # f32, q8_0
            llm = make_llm(path, AttentionConfig(**cfg), type_k=type_k, type_v=1)
            try:
                errors[name, type_k] = np.abs(run(llm, tokens) - refs[name]).max()
            finally:
                llm.close()
    q8_upstream = errors["lambda-only", 8]
    for name in cases:
        assert errors[name, 0] < 0.05, errors  # f16 V
        assert errors[name, 8] < 1.5 * q8_upstream, errors
    assert np.abs(refs["top-k"] - refs["lambda+ceiling"]).max() > 3 * errors["top-k", 8], errors


def test_bf16_k_cache(tiny):
    """A BF16 K cache (RoPE reads F32/F16 only: the far keys, the K-shift of a re-based stream and the memory's
    keys go through F32, where before the ceiling aborted in ggml_rope): the error is BF16's own, as large as on
    the upstream path (Lambda mask only), and far below what the ceiling and the middle keys change."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from test_attention import decode_logits

    model, path, tokens = tiny
    top_k = dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)
    cases = {"lambda-only": dict(sinks=4, window=32, ceiling=0), "lambda+ceiling": LAMBDA, "top-k": top_k}
    errors, refs = {}, {}
    for name, cfg in cases.items():
        refs[name], _ = reference(model, tokens, **cfg)
        llm = make_llm(path, AttentionConfig(**cfg), type_k=30)  # GGML_TYPE_BF16
        try:
            errors[name] = np.abs(run(llm, tokens) - refs[name]).max()
        finally:
            llm.close()
    long = np.random.default_rng(9).integers(3, model.n_vocab, size=1000).tolist()
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**LAMBDA, rollback=0), n_ctx=64, n_batch=16,
                                  n_ubatch=16, n_threads=2, verbose=False, type_k=30, type_v=0)
    try:  # re-based many times: the K-shift rotates the BF16 keys
        errors["re-based"] = np.abs(decode_logits(llm, long, 16) - forward(model, long, RefAttention(**LAMBDA))).max()
    finally:
        llm.close()
    upstream = errors["lambda-only"]
    assert all(err < max(2 * upstream, 0.05) for err in errors.values()), errors
    assert np.abs(refs["lambda+ceiling"] - refs["lambda-only"]).max() > 3 * errors["lambda+ceiling"], errors
    assert np.abs(refs["top-k"] - refs["lambda+ceiling"]).max() > 3 * errors["top-k"], errors


def test_cache_keeps_the_middle_keys_and_n_ctx_is_the_limit(tiny):
    import llama_cpp
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.native import context_address

    _, path, tokens = tiny
    llm = make_llm(path, AttentionConfig(**LAMBDA, top_k=3, top_k_layer=1))
    try:
        llm.reset()
        llm.eval(tokens)
        mem = llama_cpp.llama_get_memory(llm.ctx)
        assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0  # nothing freed, nothing re-based
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == N_TOKENS - 1
        with pytest.raises(ValueError, match="exceed n_ctx=512"):
            llm.eval(tokens[:250])
        assert context_address(llm)
    finally:
        llm.close()


def test_top_k_needs_a_model_loaded_with_it(tiny):
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate

    _, path, _ = tiny
    llm = make_llm(path, AttentionConfig(**LAMBDA))
    try:
        with pytest.raises(ValueError, match="loaded without top-k"):
            llm.set_top_k_active(True)
        with pytest.raises(ValueError, match="not supported for this model"):
            llama_extrapolate._core.set_top_k(llama_extrapolate.context_address(llm), 3, 1, 16)
    finally:
        llm.close()
    llm = make_llm(path, AttentionConfig(**LAMBDA, top_k=3, top_k_layer=1))
    try:
        with pytest.raises(ValueError, match="not supported for this model"):  # statistics read one mask
            llama_extrapolate._core.stats_enable(llama_extrapolate.context_address(llm), True)
    finally:
        llm.close()


@pytest.mark.parametrize("overrides", [
    {"llama.attention.lambda.top_k": 2},  # no window
    {"llama.attention.lambda.window": 32, "llama.attention.lambda.top_k": 2, "llama.attention.lambda.top_k_layer": 2},
])
def test_library_refuses_bad_top_k_metadata_without_crashing(tiny, overrides):
    """Through plain llama_cpp (no Python checks) the model loader refuses: an exception, not a crash."""
    import llama_cpp

    _, path, _ = tiny
    with pytest.raises(ValueError, match="Failed to load model"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False, kv_overrides=overrides)


@pytest.mark.parametrize("ceiling", [32, 16])
@pytest.mark.parametrize("scope, layer", [("question", 1), ("all", 1)])
def test_long_stream_skips_hidden_cells_exactly(tiny, scope, layer, ceiling):
    """1200 tokens under a window of 32: the cache keeps ~1100 middle keys, whole 256-cell blocks of which no
    query of a ubatch sees; layers that select none (all while reading, layer 0 always) cut them out of the
    view. Same output as the oracle, which never cuts anything. With a ceiling below the window the ceiling's far
    span (the sinks up to the keys at distances [C, W)) holds the hidden run: the view is not cut there."""
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate
    from conftest import random_tokens

    model, path, _ = tiny
    # selections with clear margins (> 1e-4) in both scopes
    tokens = random_tokens(model, 1200, seed=9 if ceiling == 32 else 10)
    cfg = dict(LAMBDA, ceiling=ceiling, top_k=3, top_k_layer=layer, top_k_distance=16)
    read = 1100 if scope == "question" else 0
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**cfg, top_k_scope=scope), n_ctx=1536,
                                  n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=False, type_k=0,
                                  type_v=0)
    try:
        llm.reset()
        if read:
            llm.eval(tokens[:read])
            llm.set_top_k_active(True)
        llm.eval(tokens[read:])
        got = scores(llm, len(tokens))
    finally:
        llm.close()
    ref, margin = reference(model, tokens, **cfg, top_k_from=read)
    assert margin.gap > 1e-4
    err = np.abs(got - ref).max()
    assert err < TOL, f"{scope}: max |llama.cpp - oracle| = {err}"


def test_long_stream_behind_another_sequence_is_exact(tiny):
    """Another sequence starts halfway through this stream in a unified cache. Its first ubatch sees none of this
    stream's 576 cells, a hidden run from the first cell (the cut left one part, a view the softmax refused as its
    mask: an abort); after it, its first tokens (sinks by their positions, far from this stream's queries) sit
    amid this stream's hidden middle, so the ceiling's far span crosses that run and the view is not cut there.
    Same output as the oracle of the stream alone."""
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate

    model, path, _ = tiny
    tokens = random_tokens(model, 1200, seed=9)
    cfg = dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**cfg, top_k_scope="all"), n_ctx=1536,
                                  n_batch=64, n_ubatch=64, n_threads=2, verbose=False, type_k=0, type_v=0)
    got = read_behind_another_sequence(llm, tokens, other_at=576, n_ctx=1536)  # its cells: 576-582
    ref, margin = reference(model, tokens, **cfg)
    assert margin.gap > 1e-4
    err = np.abs(got - ref).max()
    assert err < TOL, f"max |llama.cpp - oracle| = {err}"


@pytest.mark.parametrize("top_k", [None, 2])
def test_run_reads_the_document_then_switches_the_middle_keys_on_for_the_question(tmp_path, tiny, capsys,
                                                                                  monkeypatch, top_k):
    from llama_extrapolate import cli, llama as llama_module

    _, path, _ = tiny
    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    calls = []
    original = llama_module.Llama.set_top_k_active

    def spy(self, on):
        calls.append((on, self.n_tokens))
        return original(self, on)

    monkeypatch.setattr(llama_module.Llama, "set_top_k_active", spy)
    argv = ["run", "--model", str(path), "--file", str(doc), "--prompt", "What jumps?", "--window", "32",
            "--sinks", "4", "--max-tokens", "4", "--n-batch", "32", "--no-chat", "--memory-blocks", "0", "--quiet"]
    if top_k:
        argv += ["--top-k", str(top_k), "--top-k-layer", "1"]
    assert cli.main(argv) == 0
    if not top_k:
        assert calls == []
        return
    # off at load, off again before reading, on once the document is read
    import llama_cpp

    vocab = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
    n_doc = len(vocab.tokenize(doc.read_text().encode("utf-8"), add_bos=True))
    vocab.close()
    assert [on for on, _ in calls] == [False, False, True]
    assert n_doc - 3 <= calls[-1][1] <= n_doc
    assert cli.main(argv[:-4] + ["--top-k-distance", "8", "--quiet"]) == 2  # without --top-k
    assert "need --top-k" in capsys.readouterr().err
