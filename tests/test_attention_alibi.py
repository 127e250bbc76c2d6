"""Lambda mask and ALiBi distance ceiling against the numpy oracle, on a tiny MPT-like (ALiBi) model.

Tolerance 1e-2: besides float rounding, ggml's CPU GELU goes through a
half-precision table (vanilla attention alone differs from the tanh-form
reference by ~3e-3); each knob moves the logits by more than 2.
"""

import numpy as np
import pytest

from reference import RefAttention, forward_mpt
from conftest import random_tokens, two_sequence_context

TOL = 1e-2


@pytest.fixture(scope="module")
def tiny_mpt(tiny_mpt_model):
    model, path = tiny_mpt_model
    return model, path, random_tokens(model, 300, seed=5)


CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda": (dict(sinks=4, window=32, ceiling=0), RefAttention(sinks=4, window=32)),
    "lambda+ceiling": (dict(sinks=4, window=32, ceiling=32), RefAttention(sinks=4, window=32, ceiling=32)),
    "ceiling-only": (dict(sinks=0, window=0, ceiling=16), RefAttention(ceiling=16)),
}


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_alibi_knobs_match_reference(tiny_mpt, case, ubatch):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny_mpt
    kwargs, ref_cfg = CASES[case]
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**kwargs), n_ctx=512, n_batch=ubatch,
                                  n_ubatch=ubatch, n_threads=2, logits_all=True, verbose=False,
                                  type_k=0, type_v=0)
    try:
        assert llm.model_info.position_encoding == "alibi"
        llm.eval(tokens)
        got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    err = np.abs(got - forward_mpt(model, tokens, ref_cfg)).max()
    assert err < TOL, f"{case}, ubatch {ubatch}: max |llama.cpp - reference| = {err}"


def test_alibi_knobs_move_the_reference(tiny_mpt):
    model, _, tokens = tiny_mpt
    base = forward_mpt(model, tokens)
    for _, cfg in CASES.values():
        if cfg != RefAttention():
            assert np.abs(forward_mpt(model, tokens, cfg) - base).max() > 100 * TOL
    # and so does a temperature
    scaled = forward_mpt(model, tokens, RefAttention(tau=0.8))
    assert np.abs(scaled - base).max() > 10 * TOL


@pytest.mark.parametrize("ubatch", [1, 64])
def test_alibi_temperature_scales_the_bias_too(tiny_mpt, ubatch):
    """logits = (q.k * scale - m_h * min(d, C)) / tau: per head, per layer, log-length, changed at run time."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny_mpt
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32,
                                                                       temperature=0.8),
                                  n_ctx=512, n_batch=ubatch, n_ubatch=ubatch, n_threads=2, logits_all=True,
                                  verbose=False, type_k=0, type_v=0)
    per_head = np.random.default_rng(12).uniform(0.6, 1.4, size=(model.n_layer, model.n_head)).astype(np.float32)
    try:
        for tau, schedule in ((0.8, None), (per_head, None), (per_head, "log-length")):
            if not (isinstance(tau, float) and schedule is None):
                llm.set_temperature(tau, schedule, 32 if schedule else None)
            llm.reset()
            llm.eval(tokens)
            got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
            ref = forward_mpt(model, tokens, RefAttention(sinks=4, window=32, ceiling=32, tau=tau,
                                                          log_length=32 if schedule else 0))
            err = np.abs(got - ref).max()
            assert err < TOL, f"tau {np.asarray(tau).shape}, {schedule}: {err}"
    finally:
        llm.close()


def test_alibi_temperature_with_flash_attention_is_refused(tiny_mpt):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    _, path, _ = tiny_mpt
    with pytest.raises(ValueError, match="flash_attn=True with a softmax temperature on an ALiBi model"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32,
                                                                     temperature=0.9), n_ctx=512, n_ubatch=64,
                                flash_attn=True, verbose=False)


def test_alibi_flash_attention_beyond_f16_range_is_refused(tiny_mpt):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    _, path, _ = tiny_mpt
    with pytest.raises(ValueError, match="flash_attn=True on an ALiBi model needs a ceiling in 1..2048"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig.lambda_only(sinks=4, window=32), n_ctx=512,
                                n_ubatch=64, flash_attn=True, verbose=False)


def test_alibi_flash_attention_with_small_ceiling_is_exact(tiny_mpt):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny_mpt
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32), n_ctx=512,
                                  n_batch=64, n_ubatch=64, flash_attn=True, logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        got = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    # flash attention keeps K and V in f16: against the oracle with that rounding (5e-3 measured; 1.3e-2 against
    # the float64 oracle), and the ceiling it must show moves the logits by more than 10 x TOL
    ref = forward_mpt(model, tokens, RefAttention(sinks=4, window=32, ceiling=32), f16_cache=True)
    err = np.abs(got - ref).max()
    assert err < TOL, err
    effect = np.abs(forward_mpt(model, tokens, RefAttention(sinks=4, window=32), f16_cache=True) - ref).max()
    assert effect > 10 * TOL, effect


def test_alibi_temperature_with_two_sequences_in_one_ubatch(tiny_mpt):
    """A cache that is not unified keeps one stream per sequence, and a ubatch carrying both lays its logits out
    [n_kv, n_tokens/2, n_head, 2]: the bias's m_h / tau must take that layout too (each sequence its own rows, and a
    log-length temperature by each one's own positions), where it once failed ggml_mul's broadcast check."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig, native

    model, path, tokens = tiny_mpt
    other = random_tokens(model, len(tokens), seed=6)
    per_head = np.random.default_rng(13).uniform(0.6, 1.4, size=(model.n_layer, model.n_head)).astype(np.float32)
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32,
                                                                       temperature=0.8), n_ctx=512, n_ubatch=64,
                                  n_threads=2, verbose=False, type_k=0, type_v=0)
    ctx = two_sequence_context(llm, 64, n_ctx=1024, unified=False)
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    n_vocab, half = llm.n_vocab(), 32
    got = [np.empty((len(tokens), n_vocab)), np.empty((len(other), n_vocab))]
    try:
        native.set_temperature(native.context_address(ctx), per_head, 32, [], np.zeros(0, dtype=np.float32))
        for start in range(0, len(tokens), half):
            n = len(tokens[start:start + half])
            batch.n_tokens = 2 * n
            for s, seq in enumerate((tokens, other)):  # both sequences' chunks in one ubatch
                for i in range(n):
                    j = s * n + i
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = seq[start + i], start + i, 1
                    batch.seq_id[j][0], batch.logits[j] = s, True
            assert llama_cpp.llama_decode(ctx, batch) == 0
            rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(2 * n, n_vocab))
            got[0][start:start + n], got[1][start:start + n] = rows[:n], rows[n:]
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llm.close()
    cfg = RefAttention(sinks=4, window=32, ceiling=32, tau=per_head, log_length=32)
    for seq, logits in zip((tokens, other), got):
        err = np.abs(logits - forward_mpt(model, seq, cfg)).max()
        assert err < TOL, err
