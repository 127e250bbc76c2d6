"""Model families whose layers carry their own RoPE, against the numpy oracle (the ceiling's patch
0008 and the top-k keys' 0011 rotate with each layer's own RoPE).

The distance ceiling, the top-k middle keys and the document memory rotate q and the cached keys once more
inside the attention. That rotation must be the one the model gave the layer:

- Llama 3.x GGUFs carry frequency factors (``rope_freqs``): pair i turns 1/factor_i as fast; Phi-3 and others
  scale q and k by an attention factor as RoPE rotates them (the second rotation must not scale them again);
- SmolLM3 leaves every fourth layer without RoPE (NoPE): its keys are never rotated, neither by the attention
  nor by the K-shift that re-bases a long stream's positions;
- YaRN scales the frequencies by a ramp over the pairs and q and k by 1 + 0.1 ln(factor) on every rotation;
- Qwen2 rotates the halves of each head (NEOX), for every knob including the top-k keys and the memory;
- Phi-3 (NEOX too) stores q, k, v fused and scales q by 1/sqrt(head_dim) before the attention, which then scales
  the scores by 1: the temperature divides those logits all the same;
- mistral3 (Llama 4's attention temperature tuning) scales q by 1 + s*log(floor(p/F) + 1) of the token's position
  p in the text: a re-based stream must keep the text's positions there (patch 0009; before it the long stream
  below scaled q by the cache's positions);
- LFM2, a hybrid, caches its attention layers apart from its convolution layers' recurrent state: the knobs act
  on the attention layers (before patch 0013 the ceiling was wrong there and the top-k keys aborted), and a
  recurrent model (Mamba) refuses them all;
- Jamba, a hybrid too, attends without any position encoding (its attention layers, between Mamba layers, score
  q.k at every distance): the Lambda mask, the temperature and the top-k keys act as elsewhere; the ceiling and the
  memory, with no distance to bound, are refused;
- Qwen2-VL's multi-section RoPE takes the mask and the temperature (a text token's rotation is NEOX's) and refuses
  the second rotation; GPT-2's learned positions take the temperature and refuse the Lambda window (none past the
  training length), as T5, whose encoder reads the whole input, does (both the refusals' patch, 0014).

Tiny random models of each layout (f32 caches), the same cases as tests/test_attention.py and test_top_k.py.
Before the patches rotated with each layer's own RoPE the first model was refused (rope_freqs, attention factor)
and the second was wrong.
"""

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from conftest import memory_state_round_trip, random_tokens, tiny_llm
from reference import RefAttention, TopKMargin, forward
from tinymodel import TinyLlama

N_TOKENS = 300
TOL = 2e-3
LAMBDA = dict(sinks=4, window=32, ceiling=32)


def _llama3() -> TinyLlama:
    # factors from 1 (the fastest pairs) to 8 (the slowest), as Llama 3.1's run from 1 to its scaling factor 8
    return TinyLlama(rope_freqs=np.geomspace(1.0, 8.0, 8), rope_attn_factor=1.25)


FAMILIES = {
    "llama-rope-freqs": _llama3,
    "llama-yarn": lambda: TinyLlama(yarn_factor=4.0),
    "qwen2-neox": lambda: TinyLlama(arch="qwen2"),
    "phi3": lambda: TinyLlama(arch="phi3"),
    "smollm3-nope": lambda: TinyLlama(arch="smollm3", n_layer=4),
    "mistral3-temperature-tuning": lambda: TinyLlama(arch="mistral3", attn_temp_scale=0.5, attn_temp_floor=16),
}


def _written(tmp_path_factory, model, name):
    """(model, its GGUF file, N_TOKENS random tokens): a module fixture's tiny model."""
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp(name) / f"tiny-{name}.gguf")
    return model, path, random_tokens(model, N_TOKENS, seed=2)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    model = FAMILIES[request.param]()
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp("family") / f"tiny-{request.param}.gguf")
    return request.param, model, path, random_tokens(model, N_TOKENS, seed=2)


make_llm = tiny_llm


def logits(llm, tokens, question=None):
    llm.reset()
    if question is None:
        llm.eval(tokens)
    else:
        llm.eval(tokens[:question])
        llm.set_top_k_active(True)
        llm.eval(tokens[question:])
    return np.asarray(llm.scores[:len(tokens)], dtype=np.float64)


def test_the_families_differ_from_plain_llama_in_the_oracle(family):
    """The oracle's RoPE of each family is not a plain llama's: a library that ignored it would fail below."""
    name, model, _, tokens = family
    plain = TinyLlama(n_layer=model.n_layer)
    plain.weights = model.weights
    cfg = RefAttention(**LAMBDA)
    assert np.abs(forward(model, tokens, cfg) - forward(plain, tokens, cfg)).max() > 0.5, name


CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda+ceiling+temperature": (dict(LAMBDA, temperature=0.9), RefAttention(**LAMBDA, tau=0.9)),
    "ceiling-only": (dict(sinks=0, window=0, ceiling=16), RefAttention(ceiling=16)),
    "top-k": (dict(LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16),
              RefAttention(**LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16)),
}


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_knobs_match_the_oracle(family, case, ubatch):
    name, model, path, tokens = family
    oracle = partial(forward, model, tokens)
    ref = _check_case_against_oracle(name, path, tokens, case, ubatch, oracle)
    _knobs_move_the_logits(f"{name}, {case}", ref, oracle, CASES[case][1], TOL)


def knobs_off(cfg: RefAttention) -> dict:
    """The oracle's configuration with each knob of ``cfg`` turned off in turn, by the knob's name: what a library
    that silently ignored that knob would compute."""
    off = {}
    if np.any(np.asarray(cfg.tau) != 1.0) or cfg.log_length:
        off["temperature"] = replace(cfg, tau=1.0, log_length=0)
    if cfg.ceiling:
        off["ceiling"] = replace(cfg, ceiling=0)
    if cfg.top_k:
        off["top_k"] = replace(cfg, top_k=0)
    if cfg.window or cfg.sinks:
        off["lambda"] = replace(cfg, sinks=0, window=0)
    return off


def _knobs_move_the_logits(what, ref, oracle, cfg, tol):
    """Each knob of ``cfg`` moves the oracle's logits ``ref`` by more than ten times the tolerance in this family:
    a library ignoring it would be that far from ``ref`` and fail the comparison (only "vanilla" has no knob)."""
    for knob, cfg_off in knobs_off(cfg).items():
        moved = np.abs(ref - oracle(cfg_off)).max()
        assert moved > 10 * tol, f"{what}: without {knob} the oracle moves by {moved:.2e} only (tolerance {tol})"


def _check_case_against_oracle(name, path, tokens, case, ubatch, oracle, cases=CASES):
    """The library's logits for cases[case] against ``oracle(cfg, margin)``, the reference forward pass over tokens."""
    kwargs, ref_cfg = cases[case]
    margin = TopKMargin()
    ref = oracle(ref_cfg, margin=margin)
    if ref_cfg.top_k:
        assert margin.rows > 0 and margin.gap > 1e-4, f"top-k choice ill-defined (gap {margin.gap})"
    _matches(f"{name}, {case}", path, tokens, kwargs, ubatch, ref)
    return ref


def _matches(what, path, tokens, kwargs, ubatch, ref, plain=None, tol=TOL):
    """The library's logits over tokens with AttentionConfig(**kwargs) equal the oracle's ``ref`` within tol;
    ``plain``, the oracle without the knob, must differ from ref (so that a library ignoring it would fail)."""
    from llama_extrapolate import AttentionConfig

    if plain is not None:
        assert np.abs(ref - plain).max() > 0.5, f"{what}: the knob must change the logits"
    llm = make_llm(path, AttentionConfig(**kwargs), ubatch=ubatch)
    try:
        got = logits(llm, tokens)
    finally:
        llm.close()
    err = np.abs(got - ref).max()
    assert err < tol, f"{what}, ubatch {ubatch}: max |llama.cpp - oracle| = {err}"


@pytest.mark.parametrize("top_k", [3, 64])
def test_document_memory_matches_the_oracle_given_its_selection(family, tmp_path, top_k):
    """top_k = 3: keys picked among the blocks, at D; 64 = m*B: the whole blocks in the order of the text (the
    layer's own RoPE rotates them: frequency factors, YaRN, NEOX; NoPE layers keep them at D)."""
    from llama_extrapolate import AttentionConfig

    name, model, path, tokens = family
    _memory_matches(name, path, tokens, range(1, model.n_layer), top_k,
                    lambda cfg, margin=None: forward(model, tokens, cfg, margin=margin))


def _memory_matches(name, path, tokens, layers, top_k, oracle):
    """The question's logits with the document memory against ``oracle(cfg, margin)`` given the blocks the library
    selected in ``layers`` (the stored ones); returns the library's memory_info."""
    from llama_extrapolate import AttentionConfig

    cfg = dict(LAMBDA, top_k=top_k, top_k_layer=1, top_k_distance=16)
    llm = make_llm(path, AttentionConfig(**cfg, top_k_scope="question", memory_blocks=2, memory_block_size=32),
                   memory_type="f32", memory_capacity=512)
    try:
        got = logits(llm, tokens, question=250)
        sel = {il: llm.memory_selection(il) for il in layers}
        info = llm.memory_info()
    finally:
        llm.close()
    margin = TopKMargin()
    ref = oracle(RefAttention(**cfg, top_k_from=250, memory_blocks=sel, memory_block=32), margin=margin)
    plain = oracle(RefAttention(**LAMBDA))
    assert np.abs(ref[250:] - plain[250:]).max() > 0.5, "the memory must change the answer's logits"
    if top_k < 64:
        assert margin.gap > 1e-4, f"top-k choice ill-defined (gap {margin.gap})"
    err = np.abs(got - ref).max()
    assert err < TOL, f"{name}, memory, top_k {top_k}: max |llama.cpp - oracle| = {err}"
    return info


def test_a_long_stream_is_rebased_and_stays_exact(family):
    """2000 tokens through a 64-cell window: the positions are moved back many times, and the K-shift that
    re-rotates the cached keys uses each layer's RoPE (factors) and leaves the NoPE layers' keys alone."""
    name, model, path, _ = family
    tokens, got, _ = _long_stream(path, model.n_vocab)
    err = np.abs(got - forward(model, tokens, RefAttention(**LAMBDA))).max()
    assert err < 5e-3, f"{name}: max |llama.cpp - oracle| = {err}"


def _long_stream(path, n_vocab, lam=LAMBDA):
    """2000 random tokens decoded 16 at a time through a 64-cell Lambda cache: (tokens, their logits, the stream's
    position offset at the end)."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from test_attention import decode_logits

    tokens = np.random.default_rng(9).integers(3, n_vocab, size=2000).tolist()
    llm = make_llm(path, AttentionConfig(**lam, rollback=0), ubatch=16, n_ctx=64, logits_all=False)
    try:
        got = decode_logits(llm, tokens, 16)
        offset = llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm))
    finally:
        llm.close()
    return tokens, got, offset


# --- what the library accepts, said before loading (info) and done at load ------------------------------------------

def _gemma3(tmp_path):
    from tinymodel import TinyGemma3

    model = TinyGemma3()
    model.make_weights()
    return model.write(tmp_path / "tiny-gemma3.gguf")


KNOB_CONFIGS = {
    "lambda": dict(sinks=4, window=32, ceiling=0),
    "ceiling": dict(sinks=0, window=0, ceiling=16),
    "temperature": dict(sinks=0, window=0, ceiling=0, temperature=0.9),
    "top_k": dict(LAMBDA, top_k=3, top_k_layer=1),
    "memory": dict(LAMBDA, top_k=3, top_k_layer=1, top_k_scope="question", memory_blocks=2, memory_block_size=32),
}


def _support_holds(path, configs=KNOB_CONFIGS):
    """Each knob (its configuration in ``configs``) loads where knob_support says supported, and is refused with its
    reason where not."""
    from llama_extrapolate import AttentionConfig, knob_support, read_model_info

    support = knob_support(read_model_info(path))
    assert set(support) == set(configs)
    for knob, cfg in configs.items():
        extra = dict(memory_type="f32", memory_capacity=512) if knob == "memory" else {}
        try:
            make_llm(path, AttentionConfig(**cfg), **extra).close()
            refused = None
        except ValueError as exc:
            refused = str(exc)
        if support[knob] is None:
            assert refused is None, f"{knob}: said supported, refused at load: {refused}"
        else:
            assert refused is not None and support[knob] in refused, f"{knob}: said {support[knob]!r}, got {refused}"
    return support


def test_knob_support_says_what_loading_does(family, tiny_mpt_model, tiny_llama):
    for path in (family[2], tiny_mpt_model[1], tiny_llama[1]):
        assert all(reason is None for reason in _support_holds(path).values()), path


def _every_family():
    """A tiny model of each family these tests hold the knobs to: name -> a model to write."""
    from tinymodel import (TinyDeepseek2, TinyGemma2, TinyGemma3, TinyGpt2, TinyGptOss, TinyJamba, TinyLfm2, TinyMamba,
                           TinyMPT, TinyT5)

    return {"llama": TinyLlama, **FAMILIES, "mpt-alibi": TinyMPT,
            "gpt2-learned-positions": lambda: TinyGpt2(n_ctx_train=512), "t5": TinyT5, "gemma2": TinyGemma2,
            "gemma3": TinyGemma3, "gemma3-five-layers": lambda: TinyGemma3(n_layer=5), "gpt-oss": TinyGptOss,
            "deepseek2-mla": TinyDeepseek2, "qwen2vl-mrope": lambda: TinyLlama(arch="qwen2vl"), "lfm2": TinyLfm2,
            "lfm2-sliding-window": lambda: TinyLfm2(sliding_window=16), "mamba": TinyMamba, "jamba": TinyJamba}


def _knob_metadata(arch: str) -> dict:
    """Each knob of knob_support asked as the GGUF metadata asks it, with no more than the knobs it needs (the top-k
    keys a window, the memory both)."""
    key = f"{arch}.attention.lambda."
    window = {key + "sink_count": 4, key + "window": 32}
    top_k = {**window, key + "top_k": 3, key + "top_k_layer": 1}
    return {"lambda": window, "ceiling": {key + "ceiling": 16},
            "temperature": {f"{arch}.attention.softmax_temperature": 0.9}, "top_k": top_k,
            "memory": {**top_k, key + "memory_blocks": 2, key + "memory_block_size": 32}}


_LOAD_EACH = """
import json, sys
from llama_extrapolate import logs  # first: llama_cpp on the patched library
import llama_cpp
for overrides in json.loads(sys.argv[2]):
    mark = logs.error_mark()
    try:
        llama_cpp.Llama(sys.argv[1], n_ctx=256, n_batch=64, flash_attn=False, verbose=False,
                        kv_overrides=overrides).close()
    except ValueError as exc:
        print(json.dumps({"refused": str(exc), "log": logs.errors_since(mark)}))
    else:
        print(json.dumps({"refused": None}))
"""


@pytest.mark.parametrize("name", sorted(_every_family()))
def test_knob_support_is_what_the_library_refuses(tmp_path, name):
    """For each family, each knob that knob_support says refused is refused by the library, asked through plain
    llama_cpp (no Python check before it) with only that knob's metadata, and the library's reason is knob_support's
    word for word; each knob said supported loads. knob_support asks the library's own list
    (llama_ext_model_get_refusal), so the two cannot drift."""
    import json
    import re

    from llama_extrapolate import knob_support, read_model_info

    path = _every_family()[name]().write(tmp_path / f"tiny-{name}.gguf")
    info = read_model_info(path)
    support = knob_support(info)
    metadata = _knob_metadata(info.architecture)
    assert set(support) == set(metadata)
    out = _survives(_LOAD_EACH, path, json.dumps([metadata[knob] for knob in support]))
    for (knob, reason), line in zip(support.items(), out.splitlines(), strict=True):
        got = json.loads(line)
        if reason is None:
            assert got["refused"] is None, f"{name}, {knob}: said supported, the library refused: {got['log']}"
            continue
        assert got["refused"] is not None, f"{name}, {knob}: said refused ({reason}), the library loaded it"
        said = re.search(r"is not supported with (.*?); set ", got["log"])
        assert said is not None and said.group(1) == reason, f"{name}, {knob}: said {reason!r}, got {got['log']}"
    if name in ("llama", "mpt-alibi", *FAMILIES):
        assert all(reason is None for reason in support.values()), support  # (the families that take every knob)


def test_sliding_window_layers_are_shown_and_the_global_layers_take_the_window(tmp_path):
    """Gemma 3's sliding-window layers keep their own window: the Lambda window, its ceiling and the temperature
    load (they apply to the global layers, see below); the top-k keys and the memory, which select among one cache
    for every layer, are refused with the reason (before patch 0013 the Lambda window and ceiling were refused)."""
    from llama_extrapolate import read_model_info

    path = _gemma3(tmp_path)
    info = read_model_info(path)
    assert info.swa_layers == (0, 1, 2, 3, 4) and info.nope_layers == ()
    support = _support_holds(path)
    assert support["lambda"] is None and support["ceiling"] is None and support["temperature"] is None
    assert support["top_k"] == "sliding-window layers" and support["memory"] == "sliding-window layers"


# --- Gemma 2/3 (iSWA: sliding-window layers beside global ones) against their oracle ---------------------------------

def _tiny_gemma(name):
    from tinymodel import TinyGemma2, TinyGemma3

    return {"gemma3": TinyGemma3, "gemma2": TinyGemma2}[name]()


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(request, tmp_path_factory):
    """Gemma 3: five sliding-window layers to one global one, each with its RoPE base; Gemma 2: alternating, with
    softcapped attention and output logits (the output, about 30 in size here, sets a looser float tolerance)."""
    model = _tiny_gemma(request.param)
    model.make_weights()
    path = model.write(tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}.gguf")
    tol = 5e-3 if request.param == "gemma2" else TOL
    return model, path, random_tokens(model, N_TOKENS, seed=2), tol


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _written(tmp_path_factory, _tiny_gemma("gemma3"), "gemma3")


def _per_layer_tau(model):
    # a value per layer: the sliding-window layers at 1
    return np.array([1.0 if model.is_swa(il) else 0.8 for il in range(model.n_layer)])


GEMMA_CASES = {
    "vanilla": lambda m: (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda": lambda m: (dict(LAMBDA, ceiling=0), RefAttention(sinks=4, window=32)),
    "lambda+ceiling+temperature": lambda m: (dict(LAMBDA, temperature=0.9), RefAttention(**LAMBDA, tau=0.9)),
    "lambda+ceiling+per-layer-temperature": lambda m: (dict(LAMBDA, temperature=_per_layer_tau(m)),
                                                       RefAttention(**LAMBDA, tau=_per_layer_tau(m))),
    "ceiling-only": lambda m: (dict(sinks=0, window=0, ceiling=16), RefAttention(ceiling=16)),
    "log-length": lambda m: (dict(LAMBDA, temperature_schedule="log-length", log_length=32),
                             RefAttention(**LAMBDA, log_length=32)),
}


def test_the_gemma_oracles_keep_the_sliding_window_layers_apart(gemma):
    """The oracle's Gemma is not one whose every layer takes the Lambda window, nor (Gemma 3) one whose sliding-window
    layers rotate with the global base, nor one that puts the temperature on the sliding-window layers, nor (Gemma 2)
    one that divides the logits by tau before the softcap: a library doing any of these would fail below."""
    from dataclasses import replace

    from reference import forward_gemma3

    model, _, tokens, tol = gemma
    cfg = RefAttention(**LAMBDA)
    ref = forward_gemma3(model, tokens, cfg)
    every_layer = replace(model, sliding_window=10**6)  # no sliding window: the Lambda window's alone...
    assert np.abs(ref - forward_gemma3(every_layer, tokens, cfg)).max() > 0.1  # ...differs
    if model.rope_base_swa != model.rope_base:
        one_base = replace(model, rope_base_swa=model.rope_base)
        assert np.abs(ref - forward_gemma3(one_base, tokens, cfg)).max() > 0.1
    tau_cfg = RefAttention(**LAMBDA, tau=0.9)
    tau = forward_gemma3(model, tokens, tau_cfg)
    assert np.abs(ref - tau).max() > 10 * tol
    # the temperature on every layer: the sliding-window ones too
    assert np.abs(tau - forward_gemma3(model, tokens, tau_cfg,
                                       swa=RefAttention(window=model.sliding_window, tau=0.9))).max() > 10 * tol
    if hasattr(model, "attn_softcap"):
        # tau before the cap: the global layers' q divided by tau, the capped logits left alone
        before = replace(model, weights=dict(model.weights))
        for il in range(model.n_layer):
            if not model.is_swa(il):
                before.weights[f"blk.{il}.attn_q.weight"] = model.weights[f"blk.{il}.attn_q.weight"] / np.float32(0.9)
        assert np.abs(tau - forward_gemma3(before, tokens, cfg)).max() > 10 * tol


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(GEMMA_CASES))
def test_gemma_knobs_match_the_oracle(gemma, case, ubatch):
    from reference import forward_gemma3

    model, path, tokens, tol = gemma
    kwargs, ref_cfg = GEMMA_CASES[case](model)
    ref = forward_gemma3(model, tokens, ref_cfg)
    _knobs_move_the_logits(f"{model.arch}, {case}", ref, partial(forward_gemma3, model, tokens), ref_cfg, tol)
    _matches(f"{model.arch}, {case}", path, tokens, kwargs, ubatch, ref, tol=tol)


# flash attention reads K and V in half precision: against the f16 oracle, or the non-flash path. Largest measured:
# 0.075 (smollm3, 4 layers, ubatch 1; its non-flash path with the same f16 cache is 0.073 from that oracle)
TOL_FLASH = 0.1


@pytest.mark.parametrize("ubatch", [1, 64])
def test_flash_attention_with_the_ceiling_matches_the_oracle(family, ubatch):
    """The far sinks through one rotated copy per query (patch 0008) hold for each RoPE family's rotation (frequency
    factors, YaRN, NEOX, NoPE layers left alone)."""
    from llama_extrapolate import AttentionConfig

    name, model, path, tokens = family
    llm = make_llm(path, AttentionConfig(**LAMBDA), ubatch=ubatch, flash_attn=True, type_k=1, type_v=1)
    try:
        got = logits(llm, tokens)
    finally:
        llm.close()
    ref = forward(model, tokens, RefAttention(**LAMBDA), f16_cache=True)
    err = np.abs(got - ref).max()
    assert err < TOL_FLASH, f"{name}, flash attention, ubatch {ubatch}: max |llama.cpp - f16 oracle| = {err}"
    without = forward(model, tokens, RefAttention(sinks=4, window=32), f16_cache=True)
    assert np.abs(without - ref).max() > 5 * TOL_FLASH


@pytest.mark.parametrize("ubatch", [1, 64])
def test_gemma_flash_attention_with_the_ceiling_is_the_exact_path(gemma, ubatch):
    """Gemma 2/3 with flash attention: the global layers' ceiling on their own cache, the sliding-window layers
    apart; the logits are the non-flash path's (which the oracle tests check) within half precision."""
    from llama_extrapolate import AttentionConfig

    model, path, tokens, _ = gemma
    out = {}
    for flash in (True, False):
        llm = make_llm(path, AttentionConfig(**LAMBDA), ubatch=ubatch, flash_attn=flash, type_k=1, type_v=1)
        try:
            out[flash] = logits(llm, tokens)
        finally:
            llm.close()
    err = np.abs(out[True] - out[False]).max()
    assert err < TOL_FLASH, f"{model.arch}, ubatch {ubatch}: max |flash - non-flash| = {err}"
    # the knobs move these logits by several times the tolerance: flash attention ignoring the ceiling (or the
    # whole Lambda window) on the global layers would be that far from the non-flash path and fail above
    from reference import forward_gemma3

    for knob, cfg_off in knobs_off(RefAttention(**LAMBDA)).items():
        moved = np.abs(out[False] - forward_gemma3(model, tokens, cfg_off)).max()
        assert moved > 3 * TOL_FLASH, f"{model.arch}: without {knob} the logits move by {moved:.3f} only"


def test_a_temperature_on_softcapped_logits_refuses_flash_attention(tmp_path):
    """Gemma 2's temperature divides the capped logits, which flash attention caps inside its kernel: refused with
    the reason (the library refuses it too: its own message was "not supported")."""
    from llama_extrapolate import AttentionConfig

    path = _tiny_gemma("gemma2").write(tmp_path / "tiny-gemma2.gguf")
    with pytest.raises(ValueError, match="flash_attn=True with a softmax temperature on gemma2"):
        make_llm(path, AttentionConfig(**dict(LAMBDA, ceiling=0), temperature=0.9), flash_attn=True)
    make_llm(path, AttentionConfig(**dict(LAMBDA, ceiling=0)), flash_attn=True).close()  # no temperature: flash runs


@pytest.mark.parametrize("lam", [LAMBDA, dict(sinks=2, window=8, ceiling=8)], ids=["W>window", "W<window"])
def test_a_gemma_stream_is_rebased_and_stays_exact(gemma, lam):
    """A stream far past the cache: the global layers' cache is bounded and both caches are re-based together (the
    sliding-window keys keep their distances, also when the Lambda window is shorter than the sliding one)."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from reference import forward_gemma3
    from test_attention import decode_logits

    model, path, _, tol = gemma
    n = 2000 if lam is LAMBDA else 600
    ubatch = 16 if lam is LAMBDA else 4
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=n).tolist()
    llm = make_llm(path, AttentionConfig(**lam, rollback=0), ubatch=ubatch, n_ctx=64 if lam is LAMBDA else 32,
                   logits_all=False)
    try:
        got = decode_logits(llm, tokens, ubatch)
        offset = llama_extrapolate._core.seq_pos_offset(llama_extrapolate.context_address(llm))
    finally:
        llm.close()
    assert offset > n - 200, f"the stream was not re-based (offset {offset})"
    err = np.abs(got - forward_gemma3(model, tokens, RefAttention(**lam))).max()
    assert err < tol, f"{model.arch}, {lam}: max |llama.cpp - oracle| = {err}"


def test_a_gemma3_state_resumes_exactly(gemma3):
    """save_state after a re-based stream holds both caches and the position offsets: the continuation after
    load_state equals the first one and the oracle."""
    import llama_cpp
    from llama_extrapolate import AttentionConfig
    from reference import forward_gemma3

    model, path, _ = gemma3
    tokens = np.random.default_rng(9).integers(3, model.n_vocab, size=560).tolist()

    def last(llm):
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(model.n_vocab,)).copy()

    llm = make_llm(path, AttentionConfig(**LAMBDA, rollback=16), ubatch=16, n_ctx=128, logits_all=False)
    try:
        llm.eval(tokens[:500])
        state = llm.save_state()
        llm.eval(tokens[500:])
        first = last(llm)
        llm.load_state(state)
        llm.eval(tokens[500:])
        again = last(llm)
    finally:
        llm.close()
    assert np.abs(first - again).max() < 1e-4
    err = np.abs(again - forward_gemma3(model, tokens, RefAttention(**LAMBDA))[-1]).max()
    assert err < TOL, f"gemma3 state: max |llama.cpp - oracle| = {err}"


def test_a_temperature_on_a_sliding_window_layer_is_refused(gemma3):
    """The sliding-window layers keep tau = 1 (they never attend past their own window): one value applies to the
    global layers, a value per layer or head that is not 1 there is refused, naming the layers."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig, native, read_model_info

    _, path, _ = gemma3
    tau = np.array([0.9] * 6)
    with pytest.raises(ValueError, match=r"temperature: layers \[0, 1, 2, 3, 4\] are sliding-window layers"):
        AttentionConfig(**LAMBDA, temperature=tau).resolve(read_model_info(path))
    points = [(64, 0.9), (256, np.array([1.0] * 5 + [0.8]))]
    resolved = AttentionConfig(**LAMBDA, temperature_schedule="points", temperature_points=points).resolve(read_model_info(path))
    assert (resolved.points_tau[:, :5] == 1.0).all() and resolved.points_tau[0, 5, 0] == np.float32(0.9)
    with pytest.raises(ValueError, match="at length 256: layers \\[4\\]"):
        AttentionConfig(**LAMBDA, temperature_schedule="points", temperature_points=[(256, np.array([1.0] * 4 + [0.7, 0.8]))]).resolve(
            read_model_info(path))
    # the library itself refuses it too (a caller of the C API), and keeps one value off those layers
    llm = make_llm(path, AttentionConfig(**LAMBDA))
    try:
        ctx = llama_extrapolate.context_address(llm)
        with pytest.raises(ValueError, match="out of range"):
            native.set_temperature(ctx, np.full((6, 4), 0.9, np.float32), 0, (), np.zeros((0, 6, 4), np.float32))
        native.set_temperature(ctx, np.full((1,), 0.9, np.float32), 0, (), np.zeros((0, 6, 4), np.float32))
        got, _ = native.get_temperature(ctx)
        assert (np.asarray(got).reshape(6, 4)[:5] == 1.0).all() and (np.asarray(got).reshape(6, 4)[5] == np.float32(0.9)).all()
    finally:
        llm.close()


@pytest.mark.parametrize("family, words", [("gpt-oss", "learned attention sinks"),
                                           ("t5", "T5's relative position bias")])
def test_a_temperature_the_softmax_would_not_take_whole_is_refused(tmp_path, family, words):
    """gpt-oss's learned sink logits and T5's relative bias enter the softmax beside the logits, where the
    temperature does not reach: refused (knob_support says so, and Llama before loading; llama.cpp refuses
    llama_ext_set_temperature too) instead of a softmax that is not the paper's."""
    from llama_extrapolate import AttentionConfig, knob_support, read_model_info
    from tinymodel import TinyGptOss, TinyT5

    path = {"gpt-oss": TinyGptOss, "t5": TinyT5}[family]().write(tmp_path / f"tiny-{family}.gguf")
    assert words in knob_support(read_model_info(path))["temperature"]
    with pytest.raises(ValueError, match=words):  # (the temperature alone: T5 refuses the Lambda window too)
        make_llm(path, AttentionConfig(**KNOB_CONFIGS["temperature"]))
    if family == "gpt-oss":
        make_llm(path, AttentionConfig(**LAMBDA)).close()  # no temperature: loads


def test_learned_sink_logits_refuse_the_temperature_in_python_and_in_the_library(tmp_path):
    """A tiny gpt-oss (learned sink logits per head, patch 0009): the temperature is refused by Python before
    loading (from the file's own tensors), by llama.cpp's C API on a live context (set_temperature,
    set_temperature_points) and at context creation from metadata through plain llama_cpp; the Lambda mask runs."""
    import llama_cpp

    import llama_extrapolate
    from llama_extrapolate import AttentionConfig, native, read_model_info
    from tinymodel import TinyGptOss

    path = TinyGptOss().write(tmp_path / "tiny-gpt-oss.gguf")
    assert read_model_info(path).learned_sinks
    words = "learned attention sinks"
    assert words in _support_holds(path)["temperature"]
    with pytest.raises(ValueError, match=words):
        make_llm(path, AttentionConfig(**KNOB_CONFIGS["lambda"], temperature=0.9))
    llm = make_llm(path, AttentionConfig(**KNOB_CONFIGS["lambda"]))
    try:
        llm.eval(list(range(3, 80)))
        assert np.isfinite(np.asarray(llm.scores[:77])).all()
        ctx = llama_extrapolate.context_address(llm)
        n_layer, n_head = np.asarray(native.get_temperature(ctx)[0]).reshape(2, -1).shape
        with pytest.raises(ValueError):
            native.set_temperature(ctx, np.full((1,), 0.9, np.float32), 0, (), np.zeros((0, n_layer, n_head), np.float32))
        with pytest.raises(ValueError):
            native.set_temperature(ctx, np.ones((1,), np.float32), 0, (64,), np.full((1, n_layer, n_head), 0.9, np.float32))
        assert (np.asarray(native.get_temperature(ctx)[0]) == 1.0).all(), "a refused temperature must change nothing"
    finally:
        llm.close()
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False,
                        kv_overrides={"gpt-oss.attention.softmax_temperature": 0.9})
    llama_cpp.Llama(str(path), n_ctx=256, verbose=False).close()  # the file itself loads


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    from tinymodel import TinyGptOss

    return _written(tmp_path_factory, TinyGptOss(), "gpt-oss")


GPTOSS_CASES = {name: GEMMA_CASES[name] for name in ("vanilla", "lambda", "ceiling-only")}
GPTOSS_CASES["lambda+ceiling"] = lambda m: (dict(LAMBDA), RefAttention(**LAMBDA))


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(GPTOSS_CASES))
def test_gpt_oss_takes_the_lambda_window_and_the_ceiling_exactly(gptoss, case, ubatch):
    """gpt-oss: the sink logits enter every softmax (the sliding-window layers' and the global ones', where the
    Lambda window and its ceiling act) beside the keys' logits, once; the oracle without them differs."""
    from reference import forward_gptoss

    model, path, tokens = gptoss
    kwargs, ref_cfg = GPTOSS_CASES[case](model)
    ref = forward_gptoss(model, tokens, ref_cfg)
    assert np.abs(ref - forward_gptoss(model, tokens, ref_cfg, sinks=False)).max() > 0.5, "the sinks must matter"
    plain = forward_gptoss(model, tokens) if case != "vanilla" else None
    _matches(f"gpt-oss, {case}", path, tokens, kwargs, ubatch, ref, plain)


def test_latent_attention_refuses_the_knobs_its_k_only_cache_has_not(tmp_path, capsys):
    """DeepSeek-V2's MLA caches one latent key per token and attends through llama.cpp's K-only path, which has
    the Lambda mask and the temperature but no ceiling, top-k keys or statistics: those are refused at load with
    the reason (before the refusals' patch, 0014, they loaded and did nothing)."""
    from llama_extrapolate import AttentionConfig, read_model_info
    from llama_extrapolate.harness import stats
    from llama_extrapolate.cli import main
    from tinymodel import TinyDeepseek2

    path = TinyDeepseek2().write(tmp_path / "tiny-deepseek2.gguf")
    assert read_model_info(path).latent_attention
    support = _support_holds(path)
    assert support["lambda"] is None and support["temperature"] is None
    for knob in ("ceiling", "top_k", "memory"):
        assert support[knob] == "a K-only cache (MLA)", (knob, support[knob])
    llm = make_llm(path, AttentionConfig(**KNOB_CONFIGS["lambda"]))
    try:
        llm.eval(list(range(3, 80)))  # the Lambda mask runs on the K-only path
        assert np.isfinite(np.asarray(llm.scores[:77])).all()
        with pytest.raises(ValueError, match=r"this model has a K-only \(MLA\) cache"):
            stats.enable(llm)
    finally:
        llm.close()
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ceiling          refused: a K-only cache (MLA)" in out, out


MLA_CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda": (dict(sinks=4, window=32, ceiling=0), RefAttention(sinks=4, window=32)),
    "lambda+temperature": (dict(sinks=4, window=32, ceiling=0, temperature=0.9, temperature_schedule="log-length",
                                log_length=40),
                           RefAttention(sinks=4, window=32, tau=0.9, log_length=40)),
}


@pytest.fixture(scope="module")
def tiny_mla(tmp_path_factory):
    from tinymodel import TinyDeepseek2

    return _written(tmp_path_factory, TinyDeepseek2(), "deepseek2")


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(MLA_CASES))
def test_latent_attention_matches_the_oracle(tiny_mla, case, ubatch):
    """The knobs the K-only (MLA) path keeps, the Lambda mask and the temperature, against an oracle that writes
    the latent attention out head by head (reference.forward_mla): 300 tokens through a 4 + 32 cache, so the
    bounded cache frees and re-bases the latent keys' RoPE part as it goes."""
    from reference import forward_mla

    model, path, tokens = tiny_mla
    kwargs, ref_cfg = MLA_CASES[case]
    plain = forward_mla(model, tokens) if case != "vanilla" else None
    _matches(f"deepseek2, {case}", path, tokens, kwargs, ubatch, forward_mla(model, tokens, ref_cfg), plain)


def test_info_shows_nope_layers_and_knobs(family, capsys):
    from llama_extrapolate.cli import main

    name, model, path, _ = family
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("NoPE layers      3 (no RoPE" in out) == (name == "smollm3-nope"), out
    assert ("RoPE factors     yes" in out) == (name == "llama-rope-freqs"), out
    for knob in KNOB_CONFIGS:
        assert f"  {knob:16s} supported" in out, out


# --- multi-section RoPE (Qwen2-VL): the Lambda mask and the temperature, not the second rotation ------------------------

@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory):
    return _written(tmp_path_factory, TinyLlama(arch="qwen2vl"), "qwen2vl")


MROPE_CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda": (dict(LAMBDA, ceiling=0), RefAttention(sinks=4, window=32)),
    "lambda+temperature": (dict(LAMBDA, ceiling=0, temperature=0.9), RefAttention(sinks=4, window=32, tau=0.9)),
    "temperature": (dict(sinks=0, window=0, ceiling=0, temperature=0.8), RefAttention(tau=0.8)),
}


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(MROPE_CASES))
def test_multi_section_rope_takes_the_lambda_mask_and_the_temperature_exactly(qwen2vl, case, ubatch):
    """A text token takes one position in every section, so the oracle is NEOX RoPE; the mask and the temperature
    touch no rotation and are exact. The ceiling, the top-k keys and the memory rotate q and the keys a second time,
    which llama.cpp's multi-section rotation does not take from one position: refused with the reason."""
    model, path, tokens = qwen2vl
    kwargs, ref_cfg = MROPE_CASES[case]
    plain = forward(model, tokens) if case != "vanilla" else None
    _matches(f"qwen2vl, {case}", path, tokens, kwargs, ubatch, forward(model, tokens, ref_cfg), plain)


def test_multi_section_rope_refuses_the_second_rotation_and_streams_without_rebasing(qwen2vl):
    """knob_support holds (the ceiling, the top-k keys and the memory refused as "multi-section RoPE"); llama.cpp
    cannot K-shift multi-section keys, so a long stream keeps the text's positions (never re-based) and stays exact
    in its 64 cells: the mask needs no re-basing without a ceiling."""
    from llama_extrapolate import read_model_info

    model, path, _ = qwen2vl
    info = read_model_info(path)
    assert info.rope_type == "mrope", info.rope_type
    support = _support_holds(path)
    assert {k: v for k, v in support.items() if v is not None} == {
        "ceiling": "multi-section RoPE", "top_k": "multi-section RoPE", "memory": "multi-section RoPE"}, support
    tokens, got, offset = _long_stream(path, model.n_vocab, dict(LAMBDA, ceiling=0))
    assert offset == 0, f"a multi-section stream cannot be re-based (offset {offset})"
    err = np.abs(got - forward(model, tokens, RefAttention(sinks=4, window=32))).max()
    assert err < 5e-3, f"qwen2vl stream: max |llama.cpp - oracle| = {err}"


# --- learned absolute position embeddings (GPT-2, StarCoder): the temperature, no Lambda window --------------------------

# ggml's GELU reads a half-precision table: 2.5e-3 on this GPT-2 and 3.2e-3 on the tiny MPT at ubatch 1 (measured; the
# tanh form the oracle computes, float64)
TOL_GELU = 5e-3


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from tinymodel import TinyGpt2

    return _written(tmp_path_factory, TinyGpt2(n_ctx_train=512), "gpt2")  # rows for the oracle's 300 tokens


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("tau", [1.0, 0.8])
def test_learned_positions_take_the_temperature_exactly(gpt2, tau, ubatch):
    """The temperature divides the logits and touches no position: exact on a GPT-2 (the oracle adds each position's
    embedding to its token's, and the biases)."""
    from dataclasses import replace

    from reference import forward_mpt

    model, path, tokens = gpt2
    ref = forward_mpt(model, tokens, RefAttention(tau=tau))
    zeros = np.zeros_like(model.weights["position_embd.weight"])
    no_positions = replace(model, weights={**model.weights, "position_embd.weight": zeros})
    assert np.abs(ref - forward_mpt(no_positions, tokens, RefAttention(tau=tau))).max() > 0.5, "positions must matter"
    plain = forward_mpt(model, tokens) if tau != 1.0 else None
    _matches(f"gpt2, tau {tau}", path, tokens, KNOB_CONFIGS["temperature"] | dict(temperature=tau), ubatch, ref, plain,
             tol=TOL_GELU)


def _survives(code: str, path, *args: str) -> str:
    """Run ``code`` (argv[1]: the model, then ``args``) in a process of its own, where an abort in llama.cpp would end
    only that one and fail here with its output; its stdout."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", code, str(path), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the process died ({run.returncode}): {run.stdout[-1000:]} {run.stderr[-2000:]}"
    return run.stdout


_PAST_THE_POSITIONS = """
import sys
from llama_extrapolate import logs  # first: llama_cpp on the patched library
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=1024, n_batch=64, n_ubatch=64, verbose=False)
mark = logs.error_mark()
try:
    llm.eval(list(range(3, 259)) * 3)
except RuntimeError as exc:
    print("refused:", exc, "|", logs.errors_since(mark))
else:
    print("read", llm.n_tokens)
"""


def test_learned_positions_refuse_the_lambda_window_and_the_positions_past_them(gpt2, capsys):
    """A GPT-2 has an embedding per position up to its training length and none past it (patch 0014): the Lambda
    window, its ceiling, the top-k keys and the memory are refused at load with the reason (in Python before
    loading, in llama.cpp from the file's metadata), llama_extrapolate.Llama refuses n_ctx past the positions, and
    plain llama_cpp with such an n_ctx gets a refused batch where the first position past them aborted the process."""
    import llama_cpp

    import llama_extrapolate
    from llama_extrapolate import read_model_info
    from llama_extrapolate.cli import main
    from llama_extrapolate.model_info import LEARNED_POSITIONS

    model, path, _ = gpt2
    assert read_model_info(path).position_encoding == "learned"
    support = _support_holds(path)
    assert support == {"lambda": LEARNED_POSITIONS, "ceiling": LEARNED_POSITIONS, "temperature": None,
                       "top_k": LEARNED_POSITIONS, "memory": LEARNED_POSITIONS}, support
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False,
                        kv_overrides={"gpt2.attention.lambda.sink_count": 4, "gpt2.attention.lambda.window": 32})
    with pytest.raises(ValueError, match=r"n_ctx=1024: gpt2 has learned absolute position embeddings.*n_ctx <= 512"):
        llama_extrapolate.Llama(str(path), n_ctx=1024, verbose=False)
    llama_extrapolate.Llama(str(path), n_ctx=512, verbose=False).close()
    out = _survives(_PAST_THE_POSITIONS, path)
    assert "refused: llama_decode returned -1" in out, out
    assert "is at position 512: the model's learned absolute position embeddings cover positions 0 to 511" in out, out
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "position         learned absolute embeddings, one per position up to 512" in out, out
    assert f"  lambda           refused: {LEARNED_POSITIONS}" in out, out


_DECODE_BEFORE_ENCODE = """
import sys
from llama_extrapolate import logs  # first: llama_cpp on the patched library
import llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=256, verbose=False)
mark = logs.error_mark()
try:
    llm.create_completion("abc", max_tokens=3)
except RuntimeError as exc:
    print("refused:", exc, "|", logs.errors_since(mark))
else:
    print("answered")
"""


def test_t5_refuses_the_lambda_knobs_and_a_decode_before_its_encoder(tmp_path):
    """T5 reads its input with the encoder, all at once and without a cache (patch 0014): the Lambda knobs are refused
    at load with the reason (the temperature for its relative position bias too). llama-cpp-python's Llama
    decodes a T5 prompt without encoding it, which aborted the process in llama.cpp: the decode is refused now."""
    import llama_cpp

    from llama_extrapolate.model_info import ENCODER_MODEL
    from tinymodel import TinyT5

    path = TinyT5().write(tmp_path / "tiny-t5.gguf")
    support = _support_holds(path)
    assert support == {"lambda": ENCODER_MODEL, "ceiling": ENCODER_MODEL, "top_k": ENCODER_MODEL,
                       "memory": ENCODER_MODEL, "temperature": support["temperature"]}, support
    assert "relative position bias" in support["temperature"]
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False,
                        kv_overrides={"t5.attention.lambda.sink_count": 4, "t5.attention.lambda.window": 32})
    out = _survives(_DECODE_BEFORE_ENCODE, path)
    assert "refused: llama_decode returned -1" in out and "call llama_encode on the input first" in out, out


# --- hybrid models (recurrent layers beside attention layers: LFM2) and recurrent ones (Mamba) ------------------------

@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    from tinymodel import TinyLfm2

    # weights whose top-3 middle keys are well apart (TopKMargin below)
    return _written(tmp_path_factory, TinyLfm2(seed=5), "lfm2")


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hybrid_model_matches_the_oracle(lfm2, case, ubatch):
    """LFM2's attention layers live in a KV cache beside the convolution layers' recurrent state (llama.cpp's hybrid
    memory), whose graph input set the attention tensors itself: before patch 0013 the ceiling's far span was never
    set (3.6 logits off past C) and the top-k keys aborted the process. The convolution layers see every token."""
    from reference import forward_lfm2

    model, path, tokens = lfm2
    ref = _check_case_against_oracle("lfm2", path, tokens, case, ubatch,
                                     lambda cfg, margin=None: forward_lfm2(model, tokens, cfg, margin=margin))
    if case != "vanilla":
        assert np.abs(ref - forward_lfm2(model, tokens)).max() > 0.5, "the knobs must change the logits"


def test_a_hybrid_stream_is_rebased_and_stays_exact(lfm2):
    """2000 tokens through a 64-cell cache: the attention layers' positions are re-based many times (their keys
    rotated by the K-shift), the recurrent state goes on through every token."""
    from reference import forward_lfm2

    model, path, _ = lfm2
    tokens, got, offset = _long_stream(path, model.n_vocab)
    assert offset > 1800, f"the stream was not re-based (offset {offset})"
    err = np.abs(got - forward_lfm2(model, tokens, RefAttention(**LAMBDA))).max()
    assert err < 5e-3, f"lfm2 stream: max |llama.cpp - oracle| = {err}"


@pytest.mark.parametrize("top_k", [3, 64])
def test_a_hybrid_model_reads_from_the_document_memory(lfm2, top_k):
    """Patch 0012: the store holds the attention layers' keys from the top-k layer on (1 and 3), not the convolution
    layers' (they have none); the question's logits equal the oracle's given the blocks those selected. Before, the
    memory was refused on hybrid models: it stored every layer from the top-k layer on."""
    from reference import forward_lfm2

    model, path, tokens = lfm2
    info = _memory_matches("lfm2", path, tokens, (1, 3), top_k,
                           lambda cfg, margin=None: forward_lfm2(model, tokens, cfg, margin=margin))
    # two stored layers: a record per block holds their K and V rows per KV head (F32)
    assert info["n_blocks"] == (300 - LAMBDA["sinks"]) // 32, info
    assert info["bytes_on_disk"] == 4096 + info["n_blocks"] * 2 * model.n_head_kv * 2 * 32 * model.head_dim * 4, info


def test_a_hybrid_models_memory_goes_with_its_state(lfm2):
    """Saved after the document (a block half filled), restored into another context: the recurrent states, the
    cache and the memory come back together, and the question gives the same logits and selects the same blocks
    as the stream that never stopped; a convolution layer has no selection to ask for."""
    from llama_extrapolate import AttentionConfig

    _, path, tokens = lfm2
    cfg = AttentionConfig(**LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16, top_k_scope="question",
                          memory_blocks=2, memory_block_size=32)
    doc = 243  # (doc - sinks) % 32 != 0: the store's last block is pending
    make = lambda: make_llm(path, cfg, memory_type="f32", memory_capacity=512)  # noqa: E731
    r = memory_state_round_trip(make, tokens, doc, (1, 3))
    for il, sel in r["want_sel"].items():
        assert (sel >= 0).all()
        np.testing.assert_array_equal(r["got_sel"][il], sel)
    np.testing.assert_allclose(r["got"], r["want"], atol=1e-4, rtol=0)
    llm = make()
    try:
        with pytest.raises(ValueError, match="recurrent"):
            llm.memory_selection(2)
    finally:
        llm.close()


def test_a_hybrid_model_takes_every_knob(lfm2, capsys):
    """Every knob loads (and is exact, above); info shows the recurrent layers."""
    from llama_extrapolate import read_model_info

    _, path, _ = lfm2
    assert read_model_info(path).recurrent_layers == (0, 2)
    support = _support_holds(path)
    assert all(v is None for v in support.values()), support
    out = _hybrid_info(path, capsys)
    assert "  memory           supported" in out, out


def _hybrid_info(path, capsys):
    """What `info` prints for a hybrid model with recurrent layers 0 and 2 of 4 (checked), whose statistics are
    refused with that reason."""
    from llama_extrapolate.harness import stats
    from llama_extrapolate.cli import main

    llm = make_llm(path, None)
    try:
        with pytest.raises(ValueError, match=r"this model has recurrent layers \(2 of 4"):
            stats.enable(llm)
    finally:
        llm.close()
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    assert "recurrent layers 0, 2 (a state instead of attention" in out, out
    return out


@pytest.mark.parametrize("name", ["lfm2-sliding-window", "gemma3-five-layers"])
def test_a_model_without_a_global_layer_refuses_the_lambda_knobs(tmp_path, name):
    """The Lambda window, its ceiling and the temperature act on the global layers; the sliding-window layers keep
    their own window and tau = 1. With every attention layer sliding-window (LFM2 with a window, whose hybrid-iSWA
    memory then has an empty global cache; Gemma 3's pattern of five sliding-window layers to a global one, cut at
    five layers) there is nothing for them to act on: before patch 0014 they loaded and the model computed its own
    attention. Now each is refused at load with the reason, as the top-k keys and the memory already were; without
    knobs the model loads."""
    import llama_cpp
    import llama_extrapolate
    from llama_extrapolate import native, read_model_info
    from llama_extrapolate.harness import stats
    from tinymodel import TinyGemma3, TinyLfm2

    model = TinyLfm2(seed=5, sliding_window=16) if name.startswith("lfm2") else TinyGemma3(n_layer=5)
    model.make_weights()
    path = model.write(tmp_path / f"tiny-{name}.gguf")
    info = read_model_info(path)
    attention = set(range(info.block_count)) - set(info.recurrent_layers)
    assert attention and set(info.swa_layers) == attention, info
    support = _support_holds(path)
    why = "a model without a global attention layer (every attention layer is sliding-window)"
    assert {knob: support[knob] for knob in ("lambda", "ceiling", "temperature")} == dict.fromkeys(
        ("lambda", "ceiling", "temperature"), why), support
    assert support["top_k"] == "sliding-window layers"
    llm = make_llm(path, None)
    try:
        # nor can it collect statistics (one unified cache's softmax): the reason names the model's layers
        with pytest.raises(ValueError, match="this model has sliding-window layers"):
            stats.enable(llm)
        # the library refuses a temperature too where the configuration does not stand before it: a caller of the
        # C API (every layer keeps tau = 1, so nothing was enabled and the call returned 0) and the metadata's
        ctx = llama_extrapolate.context_address(llm)
        n_layer, n_head = np.asarray(native.get_temperature(ctx)[0]).reshape(info.block_count, -1).shape
        with pytest.raises(ValueError, match="not supported"):
            native.set_temperature(ctx, np.full((1,), 0.9, np.float32), 0, (), np.zeros((0, n_layer, n_head), np.float32))
    finally:
        llm.close()
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        llama_cpp.Llama(str(path), n_ctx=256, verbose=False,
                        kv_overrides={f"{info.architecture}.attention.softmax_temperature": 0.9})


def test_a_recurrent_model_refuses_every_knob(tmp_path):
    """Mamba has no attention layer: a Lambda window, a temperature or top-k keys would do nothing, and each is
    refused at load naming the reason (before, they loaded and did nothing); without knobs the model loads."""
    import re

    from llama_extrapolate import AttentionConfig, knob_support, read_model_info
    from tinymodel import TinyMamba

    model = TinyMamba()
    model.make_weights()
    path = model.write(tmp_path / "tiny-mamba.gguf")
    info = read_model_info(path)
    assert info.recurrent_layers == (0, 1) and info.position_encoding == "none"
    support = knob_support(info)
    why = "a recurrent model (it has no attention layers)"
    # each knob alone (no ceiling: the configuration refuses it first, for the missing position encoding, as it
    # does the memory)
    for knob, cfg in (("lambda", KNOB_CONFIGS["lambda"]), ("temperature", KNOB_CONFIGS["temperature"]),
                      ("top_k", dict(KNOB_CONFIGS["top_k"], ceiling=0))):
        assert support[knob] == why, (knob, support)
        with pytest.raises(ValueError, match=re.escape(why)):
            make_llm(path, AttentionConfig(**cfg)).close()
    assert "position encoding" in support["ceiling"] and "RoPE or ALiBi" in support["memory"]
    make_llm(path, None).close()


# --- attention without a position encoding (Jamba: NoPE attention layers between Mamba layers) ------------------------

@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    from tinymodel import TinyJamba

    # weights whose top-3 middle keys are well apart (TopKMargin below)
    return _written(tmp_path_factory, TinyJamba(seed=2), "jamba")


NOPE_LAMBDA = dict(LAMBDA, ceiling=0)  # a ceiling needs a position encoding to bound (refused below)
NOPE_CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention()),
    "lambda": (NOPE_LAMBDA, RefAttention(sinks=4, window=32)),
    "lambda+temperature": (dict(NOPE_LAMBDA, temperature=0.8), RefAttention(sinks=4, window=32, tau=0.8)),
    "top-k": (dict(NOPE_LAMBDA, top_k=3, top_k_layer=1, top_k_distance=16),
              RefAttention(sinks=4, window=32, top_k=3, top_k_layer=1, top_k_distance=16)),
}


def test_the_jamba_oracle_has_no_position_encoding_and_its_mamba_layers_count(jamba):
    """The oracle's Jamba is not one whose attention layers rotate q and k (a library that applied RoPE there would
    fail below), and its Mamba layers are not bystanders: without them, or without Jamba's RMS norms of dt, B and C,
    the logits differ too."""
    from dataclasses import replace

    from reference import forward_jamba

    model, _, tokens = jamba
    cfg = RefAttention(sinks=4, window=32)
    ref = forward_jamba(model, tokens, cfg)
    assert np.abs(ref - forward_jamba(model, tokens, cfg, rope_base=10000.0)).max() > 0.5, "RoPE must not be there"
    norms = [name for name in model.weights if name.endswith(("ssm_dt_norm.weight", "ssm_b_norm.weight",
                                                               "ssm_c_norm.weight"))]
    assert len(norms) == 3 * 2  # (the oracle applies the norms the model has)
    no_norms = {name: t for name, t in model.weights.items() if name not in norms}
    no_mamba = {name: np.zeros_like(t) if name.endswith("ssm_out.weight") else t for name, t in model.weights.items()}
    for weights in (no_norms, no_mamba):
        assert np.abs(ref - forward_jamba(replace(model, weights=weights), tokens, cfg)).max() > 0.5


@pytest.mark.parametrize("ubatch", [1, 64])
@pytest.mark.parametrize("case", sorted(NOPE_CASES))
def test_jamba_attention_without_a_position_encoding_matches_the_oracle(jamba, case, ubatch):
    """Jamba's attention layers have no position encoding at all: a key scores q.k at any distance, so the Lambda
    mask (which keys are seen), the temperature and the top-k middle keys are all that distance changes. They sit in
    the hybrid memory's KV cache beside the Mamba layers' states (conv and scan), which see every token."""
    from reference import forward_jamba

    model, path, tokens = jamba
    ref = _check_case_against_oracle("jamba", path, tokens, case, ubatch,
                                     lambda cfg, margin=None: forward_jamba(model, tokens, cfg, margin=margin),
                                     cases=NOPE_CASES)
    if case != "vanilla":
        assert np.abs(ref - forward_jamba(model, tokens)).max() > 0.5, "the knobs must change the logits"
    if case == "top-k":  # (the middle keys bring the logits back towards vanilla's: they must differ from the mask's)
        mask = forward_jamba(model, tokens, NOPE_CASES["lambda"][1])
        assert np.abs(ref - mask).max() > 0.5, "the top-k keys must change the logits"


def test_a_jamba_stream_without_a_position_encoding_stays_exact_unrebased(jamba):
    """2000 tokens through a 64-cell Lambda cache: the attention layers' keys leave the cache as the window moves on,
    the Mamba states go on through every token. With no position encoding no logit depends on a position, only the
    mask on p - j (exact integers), so the library does not re-base the positions (it re-bases RoPE models only,
    whose rotations lose precision far out): the offset stays 0 and the stream stays exact."""
    from reference import forward_jamba

    model, path, _ = jamba
    tokens, got, offset = _long_stream(path, model.n_vocab, NOPE_LAMBDA)
    assert offset == 0, f"a stream without a position encoding has nothing to re-base (offset {offset})"
    err = np.abs(got - forward_jamba(model, tokens, RefAttention(sinks=4, window=32))).max()
    assert err < 5e-3, f"jamba stream: max |llama.cpp - oracle| = {err}"


_LOAD_WITH_OVERRIDES = """
import json, sys
from llama_extrapolate import logs  # first: llama_cpp on the patched library
import llama_cpp
for overrides in json.loads(sys.argv[2]):
    mark = logs.error_mark()
    try:
        llama_cpp.Llama(sys.argv[1], n_ctx=256, verbose=False, kv_overrides=overrides).close()
    except ValueError as exc:
        print("refused:", exc, "|", logs.errors_since(mark).strip())
    else:
        print("loaded")
"""


def test_jamba_without_a_position_encoding_refuses_the_ceiling_and_the_memory(jamba, capsys):
    """A distance ceiling has no position encoding to bound and the document memory no bounded distance to score its
    keys at: both are refused with the reason, in Python before loading (knob_support and AttentionConfig, which
    say the same) and in llama.cpp from the file's metadata as the context is created. The Lambda mask, the
    temperature and the top-k keys load (exact, above); info says all that."""
    import json

    from llama_extrapolate import read_model_info

    _, path, _ = jamba
    info = read_model_info(path)
    assert (info.architecture, info.position_encoding, info.rope_type) == ("jamba", "none", None), info
    assert info.recurrent_layers == (0, 2) and info.nope_layers == () and info.swa_layers == (), info
    assert info.head_count == 4 and list(info.head_count_kv) == [0, 2, 0, 2], info
    # each knob alone: without the ceiling, whose refusal would come first
    support = _support_holds(path, {knob: cfg if knob == "ceiling" else dict(cfg, ceiling=0)
                                    for knob, cfg in KNOB_CONFIGS.items()})
    assert {k: v for k, v in support.items() if v is not None} == {
        "ceiling": "no position encoding (no RoPE, no ALiBi)",
        "memory": "no RoPE or ALiBi, through which the document memory scores its keys at a bounded distance"}, support
    # plain llama_cpp with the settings in the metadata: the ceiling and the memory refused as the context is created,
    # with knob_support's reasons (the library's one list, patch 0014; the hybrid's recurrent layers refuse neither)
    key = "jamba.attention.lambda."
    ceiling, memory = _survives(_LOAD_WITH_OVERRIDES, path, json.dumps([
        {key + "window": 32, key + "ceiling": 16},
        {key + "sink_count": 4, key + "window": 32, key + "top_k": 3, key + "memory_blocks": 2,
         key + "memory_block_size": 32}])).splitlines()
    assert ceiling.startswith("refused: Failed to create llama_context"), ceiling
    assert ("the distance ceiling (jamba.attention.lambda.ceiling = 16) is not supported with no position encoding "
            "(no RoPE, no ALiBi); set jamba.attention.lambda.ceiling = 0") in ceiling, ceiling
    assert memory.startswith("refused: Failed to create llama_context"), memory
    assert ("the document memory (jamba.attention.lambda.memory_blocks = 2) is not supported with no RoPE or ALiBi, "
            "through which the document memory scores its keys at a bounded distance; set "
            "jamba.attention.lambda.memory_blocks = 0") in memory, memory
    out = _hybrid_info(path, capsys)
    assert "position         none (no RoPE, no ALiBi)" in out, out
    assert "NoPE layers" not in out, out
    assert "  ceiling          refused: no position encoding (no RoPE, no ALiBi)" in out, out
    for knob in ("lambda", "temperature", "top_k"):
        assert f"  {knob:16s} supported" in out, out
