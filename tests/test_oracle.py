"""The numpy oracle (tests/reference.py) against llama.cpp on tiny random GGUF models.

With every knob off the patched llama.cpp must compute exactly the reference
attention; these tests pin the oracle to llama.cpp (so later knob tests compare
against something proven) and show the oracle is sensitive to the attention
shape (a window changes the logits far beyond the tolerance).
"""

import numpy as np
import pytest

from reference import RefAttention, forward, rope_angles, rotate
from conftest import random_tokens

N_TOKENS = 300
# f32 KV cache: only float rounding; f16 KV cache (llama.cpp's default): against the oracle with K and V rounded
# as that cache rounds them (q.k and the sums still run in half precision: up to ~1.5e-2 measured)
TOL = {"f32": 2e-3, "f16": 3e-2}
GGML_TYPE = {"f32": 0, "f16": 1}


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    model, path = tiny_llama
    return model, path, random_tokens(model, N_TOKENS, seed=1)


def llama_cpp_logits(path, tokens, *, ubatch, cache):
    import llama_extrapolate  # noqa: F401
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=ubatch, n_ubatch=ubatch, n_threads=2,
                          logits_all=True, verbose=False,
                          type_k=GGML_TYPE[cache], type_v=GGML_TYPE[cache])
    try:
        llm.eval(tokens)
        return np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_vanilla_llama_cpp_equals_reference(tiny, ubatch, cache):
    model, path, tokens = tiny
    got = llama_cpp_logits(path, tokens, ubatch=ubatch, cache=cache)
    ref = forward(model, tokens, f16_cache=cache == "f16")
    err = np.abs(got - ref).max()
    assert err < TOL[cache], f"max |llama.cpp - reference| = {err}"


def test_reference_is_sensitive_to_the_attention_shape(tiny):
    model, _, tokens = tiny
    full = forward(model, tokens)
    for cfg in (RefAttention(window=32), RefAttention(window=32, sinks=4),
                RefAttention(ceiling=16), RefAttention(tau=0.8)):
        changed = np.abs(forward(model, tokens, cfg) - full)[64:].max()
        assert changed > 10 * TOL["f16"], (cfg, changed)


def test_reference_depends_on_relative_positions_only(tiny):
    model, _, tokens = tiny
    base = forward(model, tokens[:80])
    shifted = forward(model, tokens[:80], positions=np.arange(80) + 1_000_000)
    np.testing.assert_allclose(shifted, base, atol=1e-6)


def test_rotation_composes():
    # R(a) R(b) = R(a + b) for both pair layouts: the identity the ceiling relies on
    rng = np.random.default_rng(0)
    x = rng.standard_normal(16)
    for neox in (False, True):
        two = rotate(rotate(x, rope_angles(7, 16, 10000.0), neox), rope_angles(5, 16, 10000.0), neox)
        one = rotate(x, rope_angles(12, 16, 10000.0), neox)
        np.testing.assert_allclose(two, one, atol=1e-12)
