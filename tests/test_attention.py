"""Lambda mask and softmax temperature in llama.cpp against the numpy oracle, on a tiny model.

Tiny random llama-like model (RoPE, GQA 4/2 heads, 2 layers, L_pre = 64),
300-token streams, window 32 and 4 sinks, ubatch 1 and 64, f32 KV cache so
that only float rounding separates llama.cpp from the reference (tolerance
2e-3 on logits of magnitude ~5; the knobs move logits by > 0.5). The f16 and
flash-attention paths are checked against the oracle with the cache's half
precision (TOL_F16), at least 10x below the effect each of those tests guards.
"""

import numpy as np
import pytest

from reference import RefAttention, forward
from conftest import random_tokens, read_behind_another_sequence, tiny_llm, two_sequence_context
from tinymodel import TinyLlama

N_TOKENS = 300
TOL = 2e-3
# f16 K/V (the default cache, and flash attention's): against the oracle with K and V rounded as the cache rounds
# them, the largest error measured is 0.015 (q.k and the softmax sums still run in half precision on these paths)
TOL_F16 = 3e-2


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    model, path = tiny_llama
    return model, path, random_tokens(model, N_TOKENS, seed=2)


make_llm = tiny_llm


def run(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.asarray(llm.scores[: len(tokens)], dtype=np.float64)


def check(got, ref, what):
    err = np.abs(got - ref).max()
    assert err < TOL, f"{what}: max |llama.cpp - reference| = {err}"


CASES = {
    "lambda": (dict(sinks=4, window=32, ceiling=0), RefAttention(sinks=4, window=32)),
    "window-only": (dict(sinks=0, window=32, ceiling=0), RefAttention(window=32)),
    "temperature": (dict(sinks=0, window=0, ceiling=0, temperature=0.8), RefAttention(tau=0.8)),
    "lambda+log-length": (dict(sinks=4, window=32, ceiling=0, temperature_schedule="log-length", log_length=32),
                          RefAttention(sinks=4, window=32, log_length=32)),
    "lambda+ceiling": (dict(sinks=4, window=32, ceiling=32), RefAttention(sinks=4, window=32, ceiling=32)),
    "lambda+short-ceiling": (dict(sinks=4, window=32, ceiling=16), RefAttention(sinks=4, window=32, ceiling=16)),
    "ceiling-only": (dict(sinks=0, window=0, ceiling=16), RefAttention(ceiling=16)),
    "lambda+ceiling+temperature": (dict(sinks=4, window=32, ceiling=32, temperature=0.9),
                                   RefAttention(sinks=4, window=32, ceiling=32, tau=0.9)),
}


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_knobs_match_reference(tiny, case, ubatch):
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    kwargs, ref_cfg = CASES[case]
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=ubatch)
    try:
        check(run(llm, tokens), forward(model, tokens, ref_cfg), f"{case}, ubatch {ubatch}")
    finally:
        llm.close()


def test_per_layer_and_per_head_temperature_change_between_decodes(tiny):
    """One context: tau changes without reload, and back to 1 gives vanilla again."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    tokens = tokens[:160]
    llm = make_llm(path, AttentionConfig(sinks=4, window=32, ceiling=0))
    try:
        base = run(llm, tokens)
        check(base, forward(model, tokens, RefAttention(sinks=4, window=32)), "tau = 1")

        per_layer = np.array([0.7, 1.3])
        llm.set_temperature(per_layer)
        check(run(llm, tokens), forward(model, tokens, RefAttention(sinks=4, window=32, tau=per_layer)),
              "per-layer tau")

        per_head = np.random.default_rng(3).uniform(0.6, 1.4, size=(model.n_layer, model.n_head))
        llm.set_temperature(per_head.astype(np.float32))
        check(run(llm, tokens),
              forward(model, tokens, RefAttention(sinks=4, window=32, tau=per_head.astype(np.float32))),
              "per-head tau")
        tau, log_length = llm.get_temperature()
        np.testing.assert_array_equal(tau, per_head.astype(np.float32))
        assert log_length == 0

        llm.set_temperature(1.0)
        np.testing.assert_array_equal(run(llm, tokens), base)
    finally:
        llm.close()


def test_nothing_enabled_equals_plain_llama_cpp(tiny):
    import llama_cpp
    from llama_extrapolate import AttentionConfig

    _, path, tokens = tiny
    llm = make_llm(path, None)
    plain = llama_cpp.Llama(str(path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                            verbose=False, type_k=0, type_v=0)
    off = make_llm(path, AttentionConfig.vanilla())
    try:
        a, b, c = run(llm, tokens), run(plain, tokens), run(off, tokens)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)
    finally:
        llm.close(), plain.close(), off.close()


def test_metadata_keys_reach_llama_cpp_through_kv_overrides(tiny):
    import llama_cpp
    import llama_extrapolate

    _, path, _ = tiny
    llm = llama_cpp.Llama(str(path), n_ctx=256, verbose=False, kv_overrides={
        "llama.attention.lambda.sink_count": 3,
        "llama.attention.lambda.window": 40,
        "llama.attention.softmax_temperature": 0.9,
        "llama.attention.softmax_temperature.log_length": 50,
        "llama.attention.lambda.top_k": 2,
        "llama.attention.lambda.top_k_layer": 1,
    })
    try:
        got = llama_extrapolate._core.model_attention(llama_extrapolate.native.model_address(llm))
        assert got == {"n_sink": 3, "n_window": 40, "n_ceiling": 0, "n_rollback": 0, "temperature": pytest.approx(0.9),
                       "temperature_log_length": 50, "n_top_k": 2, "n_top_k_layer": 1, "n_top_k_distance": 20,
                       "n_memory_blocks": 0, "n_memory_block_size": 64,
                       "n_memory_candidates": 0, "memory_per_layer": False}
        assert llama_extrapolate._core.get_top_k(llama_extrapolate.context_address(llm)) == (2, 1, 20)
        tau, log_length = llama_extrapolate._core.get_temperature(llama_extrapolate.context_address(llm))
        assert np.allclose(tau, 0.9) and log_length == 50
    finally:
        llm.close()


def test_each_knob_moves_the_reference_beyond_tolerance(tiny):
    """The cases above are not passing by accident: each knob changes the logits by far more than TOL."""
    model, _, tokens = tiny
    pairs = [
        (RefAttention(sinks=4, window=32), RefAttention(window=32)),  # sinks
        (RefAttention(sinks=4, window=32), RefAttention(sinks=4, window=32, ceiling=32)),  # ceiling on sinks
        (RefAttention(sinks=4, window=32, ceiling=32), RefAttention(sinks=4, window=32, ceiling=16)),
        (RefAttention(), RefAttention(log_length=32)),
    ]
    for a, b in pairs:
        moved = np.abs(forward(model, tokens, a) - forward(model, tokens, b)).max()
        assert moved > 100 * TOL, (a, b, moved)


def check_f16(model, tokens, got, ref_cfg, without_cfg, what):
    """got matches the half-precision oracle within TOL_F16, and the same oracle without the knob under test
    differs from it by more than 10 * TOL_F16: a path that ignored the knob could not pass."""
    ref = forward(model, tokens, ref_cfg, f16_cache=True)
    err = np.abs(got - ref).max()
    assert err < TOL_F16, f"{what}: max |llama.cpp - f16 reference| = {err}"
    effect = np.abs(forward(model, tokens, without_cfg, f16_cache=True) - ref).max()
    assert effect > 10 * TOL_F16, f"{what}: the knob moves the logits by only {effect}"


def test_ceiling_with_default_f16_cache(tiny):
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate

    model, path, tokens = tiny
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32), n_ctx=512,
                                  n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=False)
    try:
        check_f16(model, tokens, run(llm, tokens), RefAttention(sinks=4, window=32, ceiling=32),
                  RefAttention(sinks=4, window=32), "f16 cache, ceiling on the sinks")
    finally:
        llm.close()


def test_f16_reference_is_closer_than_the_float64_one(tiny):
    """The rounding the f16 oracle adds is the cache's: llama.cpp's f16 logits are nearer to it than to float64."""
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate

    model, path, tokens = tiny
    cfg = RefAttention(sinks=4, window=32)
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=0), n_ctx=512,
                                  n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=False)
    try:
        got = run(llm, tokens)
    finally:
        llm.close()
    near = np.abs(got - forward(model, tokens, cfg, f16_cache=True)).mean()
    far = np.abs(got - forward(model, tokens, cfg)).mean()
    assert near < 0.8 * far, (near, far)


@pytest.mark.parametrize("ceiling, kwargs, words", [
    (16, dict(flash_attn=True), "flash_attn=True with ceiling=16, window=32"),
    (32, dict(flash_attn=True, embedding=True), "embedding=True: the RoPE distance ceiling"),
    (32, dict(type_k=8, type_v=8), "type_v=8: a quantized V cache needs flash attention"),
])
def test_ceiling_refuses_inexact_settings(tiny, ceiling, kwargs, words):
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate

    _, path, _ = tiny
    with pytest.raises(ValueError, match=words):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=ceiling), n_ctx=512,
                                n_batch=64, n_ubatch=64, verbose=False, **kwargs)


@pytest.mark.parametrize("overrides", [{"llama.attention.lambda.ceiling": 32},
                                       {"llama.attention.lambda.ceiling": 16, "llama.attention.lambda.window": 32,
                                        "llama.attention.lambda.sink_count": 4}])
def test_library_refuses_flash_attention_with_ceiling_without_crashing(tiny, overrides):
    """Through plain llama_cpp (no Python checks) the library itself refuses where only the sinks are not the far
    keys (no Lambda mask, or C < W): an exception, not a crash."""
    import llama_cpp

    _, path, _ = tiny
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        llama_cpp.Llama(str(path), n_ctx=256, flash_attn=True, verbose=False, kv_overrides=overrides)


# the ceiling with flash attention: the sinks are far (C >= W); the oracle without the ceiling must differ
FLASH_CEILING = {"lambda+ceiling": RefAttention(sinks=4, window=32),
                 "lambda+ceiling+temperature": RefAttention(sinks=4, window=32, tau=0.9)}


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(FLASH_CEILING))
def test_flash_attention_with_the_ceiling_matches_the_oracle(tiny, case, ubatch):
    """Flash attention scores a far sink through one copy of it per query, rotated to p - C: the logits are the
    oracle's (f16 K/V) and those of the non-flash path, for one query per ubatch and for 64."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    kwargs, ref_cfg = CASES[case]
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=ubatch, flash_attn=True, type_k=1, type_v=1)
    try:
        got = run(llm, tokens)
    finally:
        llm.close()
    check_f16(model, tokens, got, ref_cfg, FLASH_CEILING[case], f"flash attention, {case}, ubatch {ubatch}")
    plain = make_llm(path, AttentionConfig(**kwargs), ubatch=ubatch, flash_attn=False, type_k=1, type_v=1)
    try:
        err = np.abs(got - run(plain, tokens)).max()
    finally:
        plain.close()
    assert err < TOL_F16, f"flash vs non-flash, {case}, ubatch {ubatch}: {err}"


def test_flash_attention_with_the_ceiling_takes_a_quantized_cache(tmp_path):
    """q8_0 K and V (flash attention is what lets llama.cpp quantize V): the far sinks' copies are dequantized,
    rotated and quantized again. q8_0's own rounding on this random model is 0.5 on the logits (measured with the
    Λ mask alone, no ceiling); with the ceiling the logits stay within 0.75 of the f16 oracle, which the ceiling moves
    by 3.6."""
    from llama_extrapolate import AttentionConfig

    model = TinyLlama(n_embd=128)  # head dim 32: a q8_0 block
    model.make_weights()
    path = model.write(tmp_path / "tiny-hd32.gguf")
    tokens = random_tokens(model, N_TOKENS, seed=2)
    kwargs, ref_cfg = CASES["lambda+ceiling"]
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=64, flash_attn=True, type_k=8, type_v=8)
    try:
        got = run(llm, tokens)
    finally:
        llm.close()
    ref = forward(model, tokens, ref_cfg, f16_cache=True)
    assert np.abs(got - ref).max() < 0.75
    assert np.abs(forward(model, tokens, FLASH_CEILING["lambda+ceiling"], f16_cache=True) - ref).max() > 2.0


def test_library_takes_flash_attention_with_the_ceiling_on_the_sinks(tiny):
    """Plain llama_cpp with C >= W and flash attention: the context is made, the ceiling moves the logits and they
    are the non-flash path's."""
    import llama_cpp

    _, path, tokens = tiny
    base = {"llama.attention.lambda.window": 32, "llama.attention.lambda.sink_count": 4}

    def logits(ceiling, flash):
        llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=64, n_ubatch=64, flash_attn=flash, logits_all=True,
                              verbose=False, kv_overrides=dict(base, **{"llama.attention.lambda.ceiling": ceiling}))
        try:
            llm.eval(tokens)
            return np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
        finally:
            llm.close()

    flash = logits(32, True)
    assert np.abs(flash - logits(0, True)).max() > 0.5
    assert np.abs(flash - logits(32, False)).max() < TOL_F16


def decode_logits(llm, tokens, n_batch, start_pos=0):
    """Logits of every token of a stream decoded n_batch at a time, for streams longer than the cache."""
    import llama_cpp

    n_vocab = llm.n_vocab()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    out = np.empty((len(tokens), n_vocab))
    try:
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start:start + n_batch]
            batch.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, start_pos + start + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, True
            assert llama_cpp.llama_decode(llm.ctx, batch) == 0, f"decode failed at {start}"
            out[start:start + len(chunk)] = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx),
                                                                   shape=(len(chunk), n_vocab))
    finally:
        llama_cpp.llama_batch_free(batch)
    return out


@pytest.mark.parametrize("ubatch", [1, 16])
@pytest.mark.parametrize("ceiling", [0, 32])
def test_bounded_cache_streams_past_its_size(tiny, ubatch, ceiling):
    """900 tokens through a 256-cell cache: freed cells are reused, sinks are kept, results stay exact."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(4).integers(3, model.n_vocab, size=900).tolist()
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=ceiling,
                                                                       rollback=0),
                                  n_ctx=64, n_batch=ubatch, n_ubatch=ubatch, n_threads=2, verbose=False,
                                  type_k=0, type_v=0)
    try:
        assert llm.n_ctx() == 256  # llama.cpp pads the cache to 256 cells
        got = decode_logits(llm, tokens, ubatch)
        mem = llama_cpp.llama_get_memory(llm.ctx)
        assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0  # the sinks survived
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 899
    finally:
        llm.close()
    check(got, forward(model, tokens, RefAttention(sinks=4, window=32, ceiling=ceiling)),
          f"bounded cache, ubatch {ubatch}, ceiling {ceiling}")


def test_without_window_the_cache_still_fills(tiny):
    """Vanilla attention keeps every key: the same stream fails cleanly when the cache is full."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=64, n_batch=16,
                                  n_ubatch=16, verbose=False)
    try:
        with pytest.raises(AssertionError, match="decode failed at 256"):
            decode_logits(llm, list(range(3, 63)) * 6, 16)
    finally:
        llm.close()


@pytest.mark.parametrize("cfg", [dict(sinks=4, window=32, ceiling=32), dict(sinks=0, window=0, ceiling=16)])
def test_stream_starting_at_two_billion_equals_stream_starting_at_zero(tiny, cfg):
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**cfg, rollback=0), n_ctx=512, n_batch=64,
                                  n_ubatch=64, n_threads=2, verbose=False, type_k=0, type_v=0)
    try:
        at_zero = decode_logits(llm, tokens, 64)
        at_2e9 = decode_logits(llm, tokens, 64, start_pos=2_000_000_000)
        mem = llama_cpp.llama_get_memory(llm.ctx)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 2_000_000_000 + len(tokens) - 1
        assert llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm)) >= 2_000_000_000
    finally:
        llm.close()
    assert np.abs(at_2e9 - at_zero).max() < 1e-4
    check(at_zero, forward(model, tokens, RefAttention(**cfg)), "from position 0")


def test_long_stream_is_rebased_and_stays_exact(tiny):
    """2000 tokens, window 32: positions are shifted back many times, results (and tau(p)) stay exact."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=2000).tolist()
    cfg = AttentionConfig(sinks=4, window=32, ceiling=32, rollback=0, temperature_schedule="log-length",
                          log_length=32)
    llm = llama_extrapolate.Llama(str(path), attention=cfg, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=2,
                                  verbose=False, type_k=0, type_v=0)
    try:
        got = decode_logits(llm, tokens, 16)
        offset = llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm))
        mem = llama_cpp.llama_get_memory(llm.ctx)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 1999  # caller positions are unchanged
    finally:
        llm.close()
    # memory positions stay below S + 2*max(W, C) + n_ubatch = 4 + 64 + 16
    assert 1999 - offset < 4 + 64 + 16 and offset > 1800
    ref = forward(model, tokens, RefAttention(sinks=4, window=32, ceiling=32, log_length=32))
    # K is re-rotated in place at each shift: allow a little more than pure rounding
    err = np.abs(got - ref).max()
    assert err < 5e-3, err


@pytest.fixture(scope="module")
def tiny_neox(tmp_path_factory):
    model = TinyLlama(arch="qwen2")
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf")
    tokens = np.random.default_rng(10).integers(3, model.n_vocab, size=N_TOKENS).tolist()
    return model, path, tokens


@pytest.mark.parametrize("case", ["lambda+ceiling", "lambda+short-ceiling", "ceiling-only", "temperature"])
def test_neox_rope_knobs_match_reference(tiny_neox, case):
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny_neox
    kwargs, ref_cfg = CASES[case]
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=64)
    try:
        assert llm.model_info.rope_type == "neox"
        check(run(llm, tokens), forward(model, tokens, ref_cfg), f"NEOX {case}")
    finally:
        llm.close()


def test_neox_reference_differs_from_normal_rope(tiny, tiny_neox):
    model, _, tokens = tiny
    neox_model, _, _ = tiny_neox
    assert np.abs(forward(model, tokens[:64]) - forward(neox_model, tokens[:64])).max() > 100 * TOL


# what each flash-attention case must show: the oracle without its knob
FLASH_WITHOUT = {"lambda": RefAttention(), "lambda+log-length": RefAttention(sinks=4, window=32),
                 "temperature": RefAttention()}


@pytest.mark.parametrize("case", sorted(FLASH_WITHOUT))
def test_flash_attention_is_exact_for_mask_and_temperature(tiny, case):
    """The Lambda mask and the temperature also hold on the flash-attention path (f16 K/V there)."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    kwargs, ref_cfg = CASES[case]
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=64, flash_attn=True)
    try:
        check_f16(model, tokens, run(llm, tokens), ref_cfg, FLASH_WITHOUT[case], f"flash attention, {case}")
    finally:
        llm.close()


@pytest.mark.parametrize("ceiling", [32, 16])
def test_ceiling_with_far_cells_behind_another_sequence(tiny, ceiling):
    """The distance ceiling (patch 0008) scores only the span of cells that some query sees at distance >= C. Here another
    sequence holds the first cells of a unified cache, so the stream's sinks sit at cells 7-10 and the
    span starts with the other sequence's sinks, which the far mask must hide from this stream."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens = tiny
    cfg = RefAttention(sinks=4, window=32, ceiling=ceiling)
    llm = make_llm(path, AttentionConfig(sinks=4, window=32, ceiling=ceiling))
    got = read_behind_another_sequence(llm, tokens, other_at=0)  # the other sequence takes cells 0-6
    check(got, forward(model, tokens, cfg), f"ceiling {ceiling}, sinks after another sequence's cells")


def test_a_rebased_stream_copied_to_another_sequence_keeps_both_exact(tiny):
    """llama_memory_seq_cp gives a second sequence the cells of a re-based stream (and its position offsets). When
    the first stream goes on, re-basing it would move the cells the copy shares too, without the copy's offsets: the
    copy's keys would sit delta positions off. A stream whose kept cells another sequence shares is not re-based
    until they are its own, so both sequences read exactly what a fresh stream reads."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(11).integers(3, model.n_vocab, size=400).tolist()
    fork = tokens[:150] + np.random.default_rng(12).integers(3, model.n_vocab, size=50).tolist()
    cfg = RefAttention(sinks=4, window=32, ceiling=32)
    llm = make_llm(path, AttentionConfig(sinks=4, window=32, ceiling=32, rollback=0))  # re-based every 32 tokens
    ctx = two_sequence_context(llm, 16)
    n_vocab = llm.n_vocab()
    batch = llama_cpp.llama_batch_init(16, 0, 1)
    mem = llama_cpp.llama_get_memory(ctx)

    def read(seq, toks, start, step=16):
        out = np.empty((len(toks) - start, n_vocab))
        for s in range(start, len(toks), step):
            chunk = toks[s:s + step]
            batch.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, s + i, 1
                batch.seq_id[i][0], batch.logits[i] = seq, True
            assert llama_cpp.llama_decode(ctx, batch) == 0
            out[s - start:s - start + len(chunk)] = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                                                           shape=(len(chunk), n_vocab))
        return out

    try:
        read(0, tokens[:150], 0)
        address = llama_extrapolate.context_address(ctx)
        offset = llama_extrapolate._core.seq_pos_offset(address, 0)
        assert offset > 0, "the stream was not re-based before the copy: the test would not test anything"
        llama_cpp.llama_memory_seq_cp(mem, 0, 1, -1, -1)
        # the first stream goes on past the shared cells, in steps that re-base it while it still keeps some of them
        got0 = read(0, tokens, 150, step=4)
        got1 = read(1, fork, 150)    # then the copy reads its own continuation
        assert llama_extrapolate._core.seq_pos_offset(address, 0) > offset, "the first stream is re-based again later"
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llm.close()
    check(got0, forward(model, tokens, cfg)[150:], "the stream after the copy")
    check(got1, forward(model, fork, cfg)[150:], "the copy, after the stream it was copied from moved on")


def test_a_rollback_on_a_rebased_stream_removes_the_callers_positions(tiny):
    """llama-cpp-python rolls a cache back with kv_cache_seq_rm(-1, n_tokens, -1) (every sequence, caller
    positions). On a re-based stream those positions are not the memory's: the call is made for each sequence with
    its own translation (before, it removed nothing and the next decode failed on inconsistent positions)."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=2000).tolist()
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32, rollback=16),
                                  n_ctx=128, n_batch=16, n_ubatch=16, n_threads=2, verbose=False, type_k=0, type_v=0)

    def last_logits():
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()

    try:
        llm.eval(tokens)
        first = last_logits()
        assert llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm)) > 1000
        mem = llama_cpp.llama_get_memory(llm.ctx)
        llm.n_tokens = 1990  # a prompt that differs in its last 10 tokens: within the rollback
        llm.eval(tokens[1990:])
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 1999
        again = last_logits()
        assert llama_cpp.llama_memory_seq_rm(mem, -1, 1995, -1)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 1994
    finally:
        llm.close()
    assert np.abs(again - first).max() < 1e-4
    check(first[None], forward(model, tokens, RefAttention(sinks=4, window=32, ceiling=32))[-1:], "re-based stream")


@pytest.mark.parametrize("op", ["add", "div"])
def test_shifting_every_sequence_of_a_rebased_stream_takes_the_callers_positions(tiny, op):
    """llama_memory_seq_add / seq_div with seq_id -1 (every sequence) on a re-based stream translate the caller's
    positions for each sequence, as seq_id 0 does: the last 10 of 1200 tokens moved by +5 (add) or halved (div)
    give the same positions either way (memory positions would match no cell: nothing would move)."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=1200).tolist()
    got = {}
    for seq in (0, -1):
        llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32,
                                                                           rollback=16),
                                      n_ctx=128, n_batch=16, n_ubatch=16, n_threads=2, verbose=False, type_k=0,
                                      type_v=0)
        try:
            llm.eval(tokens)
            assert llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm)) > 500
            mem = llama_cpp.llama_get_memory(llm.ctx)
            if op == "add":
                llama_cpp.llama_memory_seq_add(mem, seq, 1190, -1, 5)
            else:
                llama_cpp.llama_memory_seq_div(mem, seq, 1190, 1200, 2)
            got[seq] = (llama_cpp.llama_memory_seq_pos_min(mem, 0), llama_cpp.llama_memory_seq_pos_max(mem, 0))
        finally:
            llm.close()
    assert got[-1] == got[0], got
    if op == "add":
        assert got[0][1] == 1204, got


def test_the_cache_refuses_to_go_back_past_its_rollback_margin(tiny):
    """llama_memory_seq_rm on a bounded stream (patch 0007): back within the rollback margin, or to the sinks, it
    works; further back, where the window's keys are freed, it returns false and leaves the stream as it was (a C
    caller, llama-server among them, then reads its prompt again), for one sequence and for every sequence (-1)."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(4).integers(3, model.n_vocab, size=200).tolist()
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32, rollback=16),
                                  n_ctx=128, n_batch=16, n_ubatch=16, n_threads=2, verbose=False, type_k=0, type_v=0)
    try:
        mem = llama_cpp.llama_get_memory(llm.ctx)
        llm.eval(tokens[:40])  # S + W + R = 52 > 40: nothing freed yet, any rollback works
        assert llama_cpp.llama_memory_seq_rm(mem, 0, 10, -1)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 9
        llm.n_tokens = 10
        llm.eval(tokens[10:200])
        for seq in (0, -1):
            assert not llama_cpp.llama_memory_seq_rm(mem, seq, 150, -1), f"seq {seq}: 150 < 200 - 16"
            assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 199
        assert llama_cpp.llama_memory_seq_rm(mem, 0, 190, -1)  # within the margin
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 189
        assert llama_cpp.llama_memory_seq_rm(mem, 0, 3, -1)  # back to the sinks
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 2
        llm.n_tokens = 3
        llm.eval(tokens[3:60])
        got = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
    finally:
        llm.close()
    check(got[None], forward(model, tokens[:60], RefAttention(sinks=4, window=32, ceiling=32))[-1:],
          "read again from the sinks")


def test_a_stream_fed_without_positions_is_rebased_too(tiny):
    """llama_decode with batch.pos = NULL (positions continue from the cache): the batch takes the caller's next
    positions and is re-based like any other (before, such a stream was never re-based: its memory positions grew
    with the stream, where float32 RoPE angles lose precision past ~1e6)."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path, _ = tiny
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=2000).tolist()
    cfg = dict(sinks=4, window=32, ceiling=32)
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(**cfg, rollback=0), n_ctx=64, n_batch=16,
                                  n_ubatch=16, n_threads=2, verbose=False, type_k=0, type_v=0)
    n_vocab = llm.n_vocab()
    batch = llama_cpp.llama_batch_init(16, 0, 1)
    pos = batch.pos
    got = np.empty((len(tokens), n_vocab))
    try:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        batch.pos = None
        for start in range(0, len(tokens), 16):
            chunk = tokens[start:start + 16]
            batch.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                batch.token[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = t, 1, 0, True
            assert llama_cpp.llama_decode(llm.ctx, batch) == 0, f"decode failed at {start}"
            got[start:start + len(chunk)] = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx),
                                                                   shape=(len(chunk), n_vocab))
        mem = llama_cpp.llama_get_memory(llm.ctx)
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 1999
        offset = llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm))
    finally:
        batch.pos = pos
        llama_cpp.llama_batch_free(batch)
        llm.close()
    assert offset > 1800, offset
    err = np.abs(got - forward(model, tokens, RefAttention(**cfg))).max()
    assert err < 5e-3, err
