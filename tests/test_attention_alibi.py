"""Lambda mask and ALiBi distance ceiling against the numpy oracle, on a tiny MPT-like (ALiBi) model.

Tolerance 1e-2: besides float rounding, ggml's CPU GELU goes through a
half-precision table (vanilla attention alone differs from the tanh-form
reference by ~3e-3); each knob moves the logits by more than 2.
"""

import numpy as np
import pytest

from reference import RefAttention, forward_mpt
from tinymodel import TinyMPT

TOL = 1e-2


@pytest.fixture(scope="module")
def tiny_mpt(tmp_path_factory):
    model = TinyMPT()
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp("tiny") / "tiny-mpt.gguf")
    tokens = np.random.default_rng(5).integers(3, model.n_vocab, size=300).tolist()
    return model, path, tokens


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


def test_alibi_temperature_is_refused_not_ignored(tiny_mpt):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    _, path, _ = tiny_mpt
    with pytest.raises(NotImplementedError, match="temperature on an ALiBi model"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32, ceiling=32,
                                                                     temperature=0.9), n_ctx=512, n_ubatch=64,
                                verbose=False)


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
    err = np.abs(got - forward_mpt(model, tokens, RefAttention(sinks=4, window=32, ceiling=32))).max()
    assert err < 0.1, err
