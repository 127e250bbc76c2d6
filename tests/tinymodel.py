"""Tiny GGUF models with random weights, written with ``gguf``, and their weights for the oracle.

The numerical paths are checked on models small enough that a numpy forward
pass (tests/reference.py) is instant: a llama-like RoPE model with GQA. All
tensors are f32 so that the only differences to llama.cpp are float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

import numpy as np


TRAINING_LENGTH = "n_ctx_train"  # write the model's own context length
# Qwen2-VL's rotated pairs per section (temporal, height, width, unused), here for a 16-dimension head: llama.cpp
# gives a text token its position in the first three and 0 in the fourth, which must stay empty
ROPE_SECTIONS = [2, 3, 3, 0]


def _write(path: Path, arch: str, model, n_head_kv: int, add_hparams, context_length=TRAINING_LENGTH,
           name: Optional[str] = None, weights: Optional[Dict[str, np.ndarray]] = None) -> Path:
    """A GGUF file of the model's f32 tensors with a byte-level SentencePiece vocabulary (tests feed token ids).

    ``context_length``: the metadata value to write, None to leave the key out (bad-input tests); ``weights``: the
    tensors to write in place of the model's own (the same network in another layout)."""
    import gguf

    if not model.weights:
        model.make_weights()
    n_vocab = model.n_vocab
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name or f"tiny-{arch}-test")
    if context_length == TRAINING_LENGTH:
        writer.add_context_length(model.n_ctx_train)
    elif context_length is not None:
        writer.add_context_length(context_length)
    writer.add_embedding_length(model.n_embd)
    writer.add_block_count(model.n_layer)
    writer.add_feed_forward_length(model.n_ff)
    writer.add_head_count(model.n_head)
    writer.add_head_count_kv(n_head_kv)
    add_hparams(writer)
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(n_vocab - 3)])
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types([2, 3, 3] + [6] * (n_vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for tensor_name, tensor in (weights or model.weights).items():
        writer.add_tensor(tensor_name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass
class TinyLlama:
    """llama-like; arch "qwen2" gives the same network with NEOX-style RoPE, arch "phi3" too, written in Phi-3's
    layout (fused attn_qkv, gate and up fused in ffn_up; llama.cpp scales q by 1/sqrt(head_dim) before the
    attention and the scores by 1); arch "qwen2vl" with Qwen2-VL's multi-section RoPE (``ROPE_SECTIONS``: text
    tokens take the same position in every section, so their rotation is NEOX's)."""

    arch: str = "llama"
    n_vocab: int = 259  # 3 specials + all 256 byte tokens (the SPM tokenizer needs every byte)
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_layer: int = 2
    n_ff: int = 96
    n_ctx_train: int = 64
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0
    # Llama 3's RoPE frequency factors (head_dim/2 values, written as rope_freqs.weight): pair i turns 1/factor_i
    # as fast
    rope_freqs: Optional[np.ndarray] = None
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: q and k scaled by it with their rotation
    yarn_factor: float = 0.0  # > 0: YaRN RoPE scaling by this factor from the training length
    # Llama 4's attention temperature tuning as mistral3 reads it (attention.temperature_scale; the floor is
    # rope.scaling.original_context_length): q times 1 + scale*log(floor(p/floor) + 1) at position p
    attn_temp_scale: float = 0.0
    attn_temp_floor: int = 16
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def neox(self) -> bool:
        return self.arch in ("qwen2", "phi3", "qwen2vl")

    def has_rope(self, il: int) -> bool:
        """SmolLM3 ("smollm3") leaves every fourth layer without RoPE (NoPE), as llama.cpp builds it."""
        return self.arch != "smollm3" or (il + 1) % 4 != 0

    def rope_frequencies(self) -> np.ndarray:
        """The angle per position of each rotated pair (the oracle's RoPE), with the frequency factors and YaRN
        (each pair's frequency blended between interpolated and original by a ramp over the pairs that turn
        fewer than beta_slow..beta_fast times in the original context: 1 and 32, llama.cpp's defaults)."""
        n = self.head_dim
        inv = self.rope_base ** (-np.arange(0, n, 2, dtype=np.float64) / n)
        if self.rope_freqs is not None:
            inv = inv / np.asarray(self.rope_freqs, dtype=np.float64)
        if self.yarn_factor > 0:
            def pair_turning(turns):  # the pair index that turns `turns` times over the original context
                return n * np.log(self.n_ctx_train / (turns * 2 * np.pi)) / (2 * np.log(self.rope_base))

            low, high = max(0.0, np.floor(pair_turning(32.0))), min(n - 1.0, np.ceil(pair_turning(1.0)))
            mix = 1 - np.clip((np.arange(n // 2) - low) / max(0.001, high - low), 0, 1)
            inv = inv * ((1 - mix) / self.yarn_factor + mix)
        return inv

    def attn_temp_factor(self, positions: np.ndarray) -> np.ndarray:
        """The factor q takes at each position in the text (1 without temperature tuning)."""
        positions = np.asarray(positions, dtype=np.float64)
        if not self.attn_temp_scale:
            return np.ones_like(positions)
        return np.log(np.floor(positions / self.attn_temp_floor) + 1.0) * self.attn_temp_scale + 1.0

    def rope_magnitude(self) -> float:
        """What RoPE scales q and k by as it rotates them: the attention factor, and YaRN's 1 + 0.1 ln(factor)."""
        yarn = 1 + 0.1 * np.log(self.yarn_factor) if self.yarn_factor > 1 else 1.0
        return self.rope_attn_factor * yarn

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d, hd = self.n_embd, self.head_dim

        def mat(rows, cols, scale=1.0):
            return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

        def norm(n):
            return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "output_norm.weight": norm(d),
             "output.weight": mat(self.n_vocab, d)}
        for i in range(self.n_layer):
            # q and k scaled up so that attention is peaked enough for position to matter
            w[f"blk.{i}.attn_norm.weight"] = norm(d)
            w[f"blk.{i}.attn_q.weight"] = mat(self.n_head * hd, d, 3.0)
            w[f"blk.{i}.attn_k.weight"] = mat(self.n_head_kv * hd, d, 3.0)
            w[f"blk.{i}.attn_v.weight"] = mat(self.n_head_kv * hd, d)
            w[f"blk.{i}.attn_output.weight"] = mat(d, self.n_head * hd)
            w[f"blk.{i}.ffn_norm.weight"] = norm(d)
            w[f"blk.{i}.ffn_gate.weight"] = mat(self.n_ff, d)
            w[f"blk.{i}.ffn_up.weight"] = mat(self.n_ff, d)
            w[f"blk.{i}.ffn_down.weight"] = mat(d, self.n_ff)
        if self.rope_freqs is not None:
            w["rope_freqs.weight"] = np.asarray(self.rope_freqs, dtype=np.float32)
        self.weights = w

    def write(self, path: Path, arch: Optional[str] = None, context_length=TRAINING_LENGTH,
              rope_dimension_count: bool = True) -> Path:
        """``arch`` and ``context_length`` override the metadata (the same tensors under another name);
        ``rope_dimension_count=False`` leaves that key out, as Qwen2.5's GGUFs do."""
        def hparams(w):
            if rope_dimension_count:
                w.add_rope_dimension_count(self.head_dim)
            w.add_rope_freq_base(self.rope_base)
            w.add_layer_norm_rms_eps(self.rms_eps)
            if self.rope_attn_factor != 1.0:
                w.add_rope_scaling_attn_factors(self.rope_attn_factor)
            if self.yarn_factor > 0:
                import gguf

                w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
                w.add_rope_scaling_factor(self.yarn_factor)
                w.add_rope_scaling_orig_ctx_len(self.n_ctx_train)
            if arch == "qwen2vl":
                w.add_rope_dimension_sections(ROPE_SECTIONS)
            if self.attn_temp_scale:
                w.add_float32(f"{arch}.attention.temperature_scale", self.attn_temp_scale)
                w.add_rope_scaling_orig_ctx_len(self.attn_temp_floor)

        arch = arch or self.arch
        if arch != "phi3":
            return _write(path, arch, self, self.n_head_kv, hparams, context_length)
        if not self.weights:
            self.make_weights()
        # a model named "phi3" gets Phi-3's special tokens looked up in its vocabulary, which has none
        return _write(path, arch, self, self.n_head_kv, hparams, context_length, name="tiny-phi-three-test",
                      weights=self.phi3_layout(self.weights))

    def phi3_layout(self, w: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The same network as Phi-3's GGUFs store it: q, k, v in one attn_qkv; ffn_up holds the gate's rows
        first (SwiGLU takes silu of the first half times the second)."""
        out = {}
        for name, tensor in w.items():
            parts = name.split(".")
            if len(parts) == 4 and parts[2] in ("attn_k", "attn_v", "ffn_gate"):
                continue
            i = parts[1] if parts[0] == "blk" else None
            if parts[2:3] == ["attn_q"]:
                out[f"blk.{i}.attn_qkv.weight"] = np.concatenate(
                    [w[f"blk.{i}.attn_q.weight"], w[f"blk.{i}.attn_k.weight"], w[f"blk.{i}.attn_v.weight"]])
            elif parts[2:3] == ["ffn_up"]:
                out[name] = np.concatenate([w[f"blk.{i}.ffn_gate.weight"], tensor])
            else:
                out[name] = tensor
        return out


@dataclass
class TinyMPT:
    """An MPT-like model: ALiBi (no RoPE), fused QKV, LayerNorm, GELU MLP."""

    n_vocab: int = 259  # 3 specials + all 256 byte tokens (the SPM tokenizer needs every byte)
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 128
    n_ctx_train: int = 64
    max_alibi_bias: float = 8.0
    norm_eps: float = 1e-5
    seed: int = 0
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def alibi_slopes(self) -> np.ndarray:
        """Per-head slopes as ALiBi defines them for any head count (powers of 2^(-max_alibi_bias/n))."""
        n2 = 2 ** int(np.floor(np.log2(self.n_head)))
        m0 = 2.0 ** (-self.max_alibi_bias / n2)
        m1 = 2.0 ** (-(self.max_alibi_bias / 2.0) / n2)
        return np.array([m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(self.n_head)])

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d = self.n_embd

        def mat(rows, cols, scale=1.0):
            return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

        def vec(n, center=0.0, spread=0.1):
            return (center + spread * rng.standard_normal(n)).astype(np.float32)

        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "output_norm.weight": vec(d, 1.0), "output_norm.bias": vec(d),
             "output.weight": mat(self.n_vocab, d)}
        for i in range(self.n_layer):
            w[f"blk.{i}.attn_norm.weight"] = vec(d, 1.0)
            w[f"blk.{i}.attn_norm.bias"] = vec(d)
            qkv = np.concatenate([mat(d, d, 3.0), mat(d, d, 3.0), mat(d, d)])
            w[f"blk.{i}.attn_qkv.weight"] = qkv
            w[f"blk.{i}.attn_output.weight"] = mat(d, d)
            w[f"blk.{i}.ffn_norm.weight"] = vec(d, 1.0)
            w[f"blk.{i}.ffn_norm.bias"] = vec(d)
            w[f"blk.{i}.ffn_up.weight"] = mat(self.n_ff, d)
            w[f"blk.{i}.ffn_down.weight"] = mat(d, self.n_ff)
        self.weights = w

    def write(self, path: Path) -> Path:
        def hparams(w):
            w.add_layer_norm_eps(self.norm_eps)
            w.add_max_alibi_bias(self.max_alibi_bias)

        return _write(path, "mpt", self, self.n_head, hparams)


@dataclass
class TinyGpt2(TinyMPT):
    """A GPT-2: MPT's layout without ALiBi, a learned embedding per position up to the context length
    (``position_embd``, none past it: the refusals' patch, 0014) and biases on every projection."""

    def alibi_slopes(self) -> np.ndarray:
        return np.zeros(self.n_head)  # no bias by distance: the position is in the embedding

    def make_weights(self) -> None:
        super().make_weights()
        rng = np.random.default_rng(self.seed + 1)
        d, w = self.n_embd, self.weights

        def vec(*shape, scale=0.1):
            return (scale * rng.standard_normal(shape)).astype(np.float32)

        w["position_embd.weight"] = vec(self.n_ctx_train, d, scale=0.3)
        for i in range(self.n_layer):
            w[f"blk.{i}.attn_qkv.bias"] = vec(3 * d)
            w[f"blk.{i}.attn_output.bias"] = vec(d)
            w[f"blk.{i}.ffn_up.bias"] = vec(self.n_ff)
            w[f"blk.{i}.ffn_down.bias"] = vec(d)

    def write(self, path: Path) -> Path:
        return _write(path, "gpt2", self, self.n_head, lambda w: w.add_layer_norm_eps(self.norm_eps))


@dataclass
class TinyT5:
    """A T5 (encoder-decoder, a relative position bias per head and distance bucket in the first layer of each
    stack): for what loading does with it, not for an oracle."""

    n_vocab: int = 259
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 48
    n_ctx_train: int = 512
    n_buckets: int = 32
    seed: int = 0
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d = self.n_embd

        def mat(rows, cols):
            return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "enc.output_norm.weight": np.ones(d, np.float32), "dec.output_norm.weight": np.ones(d, np.float32)}
        for stack, parts in (("enc", ("attn",)), ("dec", ("attn", "cross_attn"))):
            w[f"{stack}.blk.0.attn_rel_b.weight"] = mat(self.n_buckets, self.n_head)
            for i in range(self.n_layer):
                for part in parts:
                    w[f"{stack}.blk.{i}.{part}_norm.weight"] = np.ones(d, np.float32)
                    for proj in "qkvo":
                        w[f"{stack}.blk.{i}.{part}_{proj}.weight"] = mat(d, d)
                w[f"{stack}.blk.{i}.ffn_norm.weight"] = np.ones(d, np.float32)
                w[f"{stack}.blk.{i}.ffn_up.weight"] = mat(self.n_ff, d)
                w[f"{stack}.blk.{i}.ffn_down.weight"] = mat(d, self.n_ff)
        self.weights = w

    def write(self, path: Path) -> Path:
        def hparams(w):
            w.add_layer_norm_rms_eps(1e-6)
            w.add_relative_attn_buckets_count(self.n_buckets)
            w.add_decoder_start_token_id(0)

        return _write(path, "t5", self, self.n_head, hparams)


@dataclass
class TinyGemma3(TinyLlama):
    """Gemma 3's layout: five sliding-window layers (their own window and RoPE base) to one global layer, NEOX RoPE,
    the embeddings scaled by sqrt(n_embd), q/k norms, post-norms around attention and FFN, a GELU-gated FFN.
    llama.cpp caches the two kinds of layer apart (iSWA)."""

    arch: str = "gemma3"
    n_layer: int = 6
    sliding_window: int = 16
    rope_base: float = 100000.0  # the global layers'
    rope_base_swa: float = 10000.0  # the sliding-window layers'
    qk_norm_scale: float = 2.0  # q and k are normalised per head: scaled so that attention is peaked

    @property
    def neox(self) -> bool:
        return True

    def is_swa(self, il: int) -> bool:
        """llama.cpp's pattern for gemma3: five sliding-window layers, then a global one."""
        return il % 6 < 5

    def make_weights(self) -> None:
        super().make_weights()
        rng = np.random.default_rng(self.seed + 1)
        for i in range(self.n_layer):
            for name, n, scale in (("post_attention_norm", self.n_embd, 1.0), ("post_ffw_norm", self.n_embd, 1.0),
                                   ("attn_q_norm", self.head_dim, self.qk_norm_scale),
                                   ("attn_k_norm", self.head_dim, self.qk_norm_scale)):
                self.weights[f"blk.{i}.{name}.weight"] = (scale * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)

    def write(self, path: Path, arch: Optional[str] = None, context_length=TRAINING_LENGTH,
              rope_dimension_count: bool = True) -> Path:
        a = arch or self.arch
        return _write(path, a, self, self.n_head_kv, lambda w: self.add_hparams(w, a), context_length)

    def add_hparams(self, w, arch: str) -> None:
        w.add_rope_dimension_count(self.head_dim)
        w.add_rope_freq_base(self.rope_base)
        w.add_float32(f"{arch}.rope.freq_base_swa", self.rope_base_swa)
        w.add_layer_norm_rms_eps(self.rms_eps)
        w.add_sliding_window(self.sliding_window)


@dataclass
class TinyGemma2(TinyGemma3):
    """Gemma 2's layout: sliding-window and global layers alternate (one RoPE base), no q/k norms, the attention
    logits softcapped (cap * tanh(s / cap), small here so that the cap bends them) and the output logits too, the
    output tied to the embeddings."""

    arch: str = "gemma2"
    n_layer: int = 4
    rope_base: float = 10000.0
    rope_base_swa: float = 10000.0
    attn_softcap: float = 3.0
    final_softcap: float = 30.0

    def is_swa(self, il: int) -> bool:
        return il % 2 == 0

    def make_weights(self) -> None:
        super().make_weights()
        for i in range(self.n_layer):
            del self.weights[f"blk.{i}.attn_q_norm.weight"], self.weights[f"blk.{i}.attn_k_norm.weight"]
        del self.weights["output.weight"]

    def add_hparams(self, w, arch: str) -> None:
        super().add_hparams(w, arch)
        w.add_float32(f"{arch}.attn_logit_softcapping", self.attn_softcap)
        w.add_float32(f"{arch}.final_logit_softcapping", self.final_softcap)


@dataclass
class TinyDeepseek2:
    """DeepSeek-V2's multi-head latent attention (MLA) as llama.cpp builds it: one cached "key" per token (the
    compressed latent and a shared RoPE part) from which the values are read too, a K-only cache with its own
    attention path. Dense layers only; reference.forward_mla is its oracle."""

    n_vocab: int = 259
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 96
    n_ctx_train: int = 64
    kv_lora_rank: int = 32
    n_rot: int = 16  # the RoPE part of each head, shared by the heads in the cache
    n_nope: int = 16  # the part of q and k without RoPE
    n_v: int = 32
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    seed: int = 0
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d, h = self.n_embd, self.n_head

        def mat(*shape):
            return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

        def norm(n):
            return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "output_norm.weight": norm(d), "output.weight": mat(self.n_vocab, d)}
        for i in range(self.n_layer):
            w[f"blk.{i}.attn_norm.weight"] = norm(d)
            w[f"blk.{i}.attn_q.weight"] = mat(h * (self.n_nope + self.n_rot), d)
            w[f"blk.{i}.attn_kv_a_mqa.weight"] = mat(self.kv_lora_rank + self.n_rot, d)
            w[f"blk.{i}.attn_kv_a_norm.weight"] = norm(self.kv_lora_rank)
            w[f"blk.{i}.attn_k_b.weight"] = mat(h, self.kv_lora_rank, self.n_nope)
            w[f"blk.{i}.attn_v_b.weight"] = mat(h, self.n_v, self.kv_lora_rank)
            w[f"blk.{i}.attn_output.weight"] = mat(d, h * self.n_v)
            w[f"blk.{i}.ffn_norm.weight"] = norm(d)
            w[f"blk.{i}.ffn_gate.weight"] = mat(self.n_ff, d)
            w[f"blk.{i}.ffn_up.weight"] = mat(self.n_ff, d)
            w[f"blk.{i}.ffn_down.weight"] = mat(d, self.n_ff)
        self.weights = w

    def write(self, path: Path) -> Path:
        def hparams(w):
            w.add_layer_norm_rms_eps(self.rms_eps)
            w.add_rope_freq_base(self.rope_base)
            w.add_rope_dimension_count(self.n_rot)
            w.add_leading_dense_block_count(self.n_layer)
            w.add_q_lora_rank(0)
            w.add_kv_lora_rank(self.kv_lora_rank)
            # the cache's "heads": the latent and the RoPE part as key, the latent as value (MLA's layout)
            w.add_key_length(self.kv_lora_rank + self.n_rot)
            w.add_value_length(self.kv_lora_rank)
            w.add_key_length_mla(self.n_nope + self.n_rot)
            w.add_value_length_mla(self.n_v)
            w.add_expert_feed_forward_length(self.n_ff)
            w.add_expert_shared_count(0)

        return _write(path, "deepseek2", self, 1, hparams)


@dataclass
class TinyGptOss:
    """gpt-oss (llama.cpp's ``gpt-oss`` architecture) in its smallest form: sliding-window and global layers
    alternating, a learned sink logit per head (``attn_sinks``), a mixture of experts for the feed-forward part.
    The sink logits enter the softmax beside the scores, so a softmax temperature would not divide them (refused);
    the Lambda window and its ceiling act on the global layers (tests/reference.py's forward_gptoss)."""

    n_vocab: int = 259
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_layer: int = 2
    n_ff: int = 64
    n_expert: int = 2
    n_ctx_train: int = 64
    sliding_window: int = 16
    seed: int = 0
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    def is_swa(self, il: int) -> bool:
        """llama.cpp's layer pattern for gpt-oss: sliding-window layers first, every other one."""
        return il % 2 == 0

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d, hd, e, f = self.n_embd, self.head_dim, self.n_expert, self.n_ff

        def mat(*shape):
            return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

        def vec(*shape):
            return (0.1 * rng.standard_normal(shape)).astype(np.float32)

        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "output_norm.weight": 1.0 + vec(d), "output.weight": mat(self.n_vocab, d)}
        for i in range(self.n_layer):
            w[f"blk.{i}.attn_norm.weight"] = 1.0 + vec(d)
            w[f"blk.{i}.post_attention_norm.weight"] = 1.0 + vec(d)
            # q and k scaled up so that attention is peaked enough for position to matter (tests/reference.py's
            # forward_gptoss is the oracle), sink logits about as large as the keys'
            w[f"blk.{i}.attn_q.weight"] = 3 * mat(self.n_head * hd, d)
            w[f"blk.{i}.attn_k.weight"] = 3 * mat(self.n_head_kv * hd, d)
            w[f"blk.{i}.attn_v.weight"] = mat(self.n_head_kv * hd, d)
            w[f"blk.{i}.attn_output.weight"] = mat(d, self.n_head * hd)
            w[f"blk.{i}.attn_output.bias"] = vec(d)
            w[f"blk.{i}.attn_sinks.weight"] = 30 * vec(self.n_head)
            w[f"blk.{i}.ffn_gate_inp.weight"] = mat(e, d)
            w[f"blk.{i}.ffn_gate_inp.bias"] = vec(e)
            w[f"blk.{i}.ffn_gate_exps.weight"] = mat(e, f, d)
            w[f"blk.{i}.ffn_gate_exps.bias"] = vec(e, f)
            w[f"blk.{i}.ffn_up_exps.weight"] = mat(e, f, d)
            w[f"blk.{i}.ffn_up_exps.bias"] = vec(e, f)
            w[f"blk.{i}.ffn_down_exps.weight"] = mat(e, d, f)
            w[f"blk.{i}.ffn_down_exps.bias"] = vec(e, d)
        self.weights = w

    def write(self, path: Path) -> Path:
        def hparams(w):
            w.add_layer_norm_rms_eps(1e-5)
            w.add_rope_freq_base(10000.0)
            w.add_rope_dimension_count(self.head_dim)
            w.add_key_length(self.head_dim)
            w.add_value_length(self.head_dim)
            w.add_sliding_window(self.sliding_window)
            w.add_expert_count(self.n_expert)
            w.add_expert_used_count(1)
            w.add_expert_feed_forward_length(self.n_ff)

        return _write(path, "gpt-oss", self, self.n_head_kv, hparams)


@dataclass
class TinyLfm2(TinyLlama):
    """LFM2 (llama.cpp's ``lfm2``), a hybrid: gated short-convolution layers (a recurrent state of the last L - 1
    inputs, no attention) between attention layers with q/k norms and NEOX RoPE; llama.cpp caches the two kinds
    apart (llama_memory_hybrid: a KV cache for the attention layers, a recurrent state for the others). Here the
    even layers convolve, the odd ones attend. With ``sliding_window`` every attention layer is sliding-window
    (llama.cpp's hybrid-iSWA memory): the model has no global attention layer."""

    arch: str = "lfm2"
    n_layer: int = 4
    l_cache: int = 3  # shortconv.l_cache: the convolution's length, the state holds l_cache - 1 inputs
    sliding_window: int = 0

    @property
    def neox(self) -> bool:
        return True

    def is_recurrent(self, il: int) -> bool:
        return il % 2 == 0

    def make_weights(self) -> None:
        super().make_weights()
        rng = np.random.default_rng(self.seed + 1)
        w, d, hd = self.weights, self.n_embd, self.head_dim
        w["token_embd_norm.weight"] = w.pop("output_norm.weight")  # LFM2's final norm under this name
        for i in range(self.n_layer):
            if self.is_recurrent(i):
                for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                    del w[f"blk.{i}.{name}.weight"]
                w[f"blk.{i}.shortconv.conv.weight"] = (0.5 * rng.standard_normal((d, self.l_cache))).astype(np.float32)
                w[f"blk.{i}.shortconv.in_proj.weight"] = (rng.standard_normal((3 * d, d)) / np.sqrt(d)).astype(np.float32)
                w[f"blk.{i}.shortconv.out_proj.weight"] = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
            else:
                # the norms' gains large enough that attention is peaked (q and k are normalised before RoPE)
                w[f"blk.{i}.attn_q_norm.weight"] = (3.0 + 0.3 * rng.standard_normal(hd)).astype(np.float32)
                w[f"blk.{i}.attn_k_norm.weight"] = (3.0 + 0.3 * rng.standard_normal(hd)).astype(np.float32)

    def write(self, path: Path, arch: Optional[str] = None, context_length=TRAINING_LENGTH,
              rope_dimension_count: bool = True) -> Path:
        def hparams(w):
            w.add_rope_dimension_count(self.head_dim)
            w.add_rope_freq_base(self.rope_base)
            w.add_layer_norm_rms_eps(self.rms_eps)
            w.add_uint32("lfm2.shortconv.l_cache", self.l_cache)
            if self.sliding_window:
                w.add_sliding_window(self.sliding_window)

        # the convolution layers have no KV heads: that is how llama.cpp tells them apart
        kv_heads = [0 if self.is_recurrent(i) else self.n_head_kv for i in range(self.n_layer)]
        return _write(path, "lfm2", self, kv_heads, hparams, context_length)


def mamba_layer(rng: np.random.Generator, i: int, d: int, d_inner: int, d_state: int, d_conv: int, dt_rank: int,
                norms: bool = False) -> Dict[str, np.ndarray]:
    """Layer i's tensors of a Mamba-1 selective state-space layer (llama.cpp's layout): in_proj to x and the gate z,
    a causal depthwise convolution over d_conv inputs (with a bias), x_proj to dt, B and C, dt_proj (with a bias), the
    decay A < 0 per (channel, state) and the skip D. ``norms``: Jamba's RMS norms of dt, B and C (weights near 1).
    The biases, A and D are drawn, not left at their usual initial values, so that an oracle which dropped or
    misplaced one of them would differ; A spans slow decays (a state that carries many tokens, across ubatches) and
    fast ones."""
    def mat(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def vec(n, center=0.0, spread=0.1):
        return (center + spread * rng.standard_normal(n)).astype(np.float32)

    b = f"blk.{i}."
    w = {b + "ssm_in.weight": mat(2 * d_inner, d),
         b + "ssm_conv1d.weight": mat(d_inner, d_conv),
         b + "ssm_conv1d.bias": vec(d_inner),
         b + "ssm_x.weight": mat(dt_rank + 2 * d_state, d_inner),
         b + "ssm_dt.weight": mat(d_inner, dt_rank),
         b + "ssm_dt.bias": vec(d_inner, -1.0, 0.5),  # softplus(dt) about 0.1 to 1
         b + "ssm_a": -np.exp(rng.uniform(-3.0, 1.0, (d_inner, d_state))).astype(np.float32),
         b + "ssm_d": vec(d_inner, 1.0, 0.3),
         b + "ssm_out.weight": mat(d, d_inner)}
    if norms:
        w[b + "ssm_dt_norm.weight"] = vec(dt_rank, 1.0)
        w[b + "ssm_b_norm.weight"] = vec(d_state, 1.0)
        w[b + "ssm_c_norm.weight"] = vec(d_state, 1.0)
    return w


def _add_ssm_hparams(w, model) -> None:
    """The Mamba layers' sizes (``ssm.*``), which llama.cpp reads for mamba and jamba alike."""
    w.add_ssm_conv_kernel(model.d_conv)
    w.add_ssm_inner_size(model.d_inner)
    w.add_ssm_state_size(model.d_state)
    w.add_ssm_time_step_rank(model.dt_rank)


@dataclass
class TinyMamba:
    """Mamba (llama.cpp's ``mamba``): every layer a selective state-space layer, no attention at all. Loaded to
    check what the library refuses: no knob of the attention has anything to act on."""

    n_vocab: int = 259
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 0
    n_ff: int = 0
    d_inner: int = 64
    d_state: int = 8
    d_conv: int = 4
    dt_rank: int = 4
    n_ctx_train: int = 64
    seed: int = 0
    weights: Dict[str, np.ndarray] = field(default_factory=dict)

    def make_weights(self) -> None:
        rng = np.random.default_rng(self.seed)
        d = self.n_embd
        w = {"token_embd.weight": rng.standard_normal((self.n_vocab, d)).astype(np.float32),
             "output_norm.weight": np.ones(d, np.float32),
             "output.weight": (rng.standard_normal((self.n_vocab, d)) / np.sqrt(d)).astype(np.float32)}
        for i in range(self.n_layer):
            w[f"blk.{i}.attn_norm.weight"] = np.ones(d, np.float32)
            w.update(mamba_layer(rng, i, d, self.d_inner, self.d_state, self.d_conv, self.dt_rank))
        self.weights = w

    def write(self, path: Path) -> Path:
        def hparams(w):
            w.add_layer_norm_rms_eps(1e-5)
            _add_ssm_hparams(w, self)

        return _write(path, "mamba", self, 0, hparams)


@dataclass
class TinyJamba(TinyLlama):
    """Jamba (llama.cpp's ``jamba``), a hybrid with attention layers WITHOUT any position encoding (no RoPE, no
    ALiBi: a logit is q.k at every distance) between Mamba-1 layers (``mamba_layer`` with Jamba's RMS norms of dt, B
    and C), each followed by the llama layout's SwiGLU FFN; llama.cpp caches the two kinds apart (hybrid memory, as
    LFM2). Here the even layers are Mamba layers, the odd ones attend (GQA, q and k scaled up as TinyLlama's so that
    attention is peaked: with no position encoding the Lambda mask is the only thing distance changes).
    reference.forward_jamba is its oracle."""

    arch: str = "jamba"
    n_layer: int = 4
    d_state: int = 8
    d_conv: int = 4
    dt_rank: int = 4

    @property
    def d_inner(self) -> int:
        return 2 * self.n_embd  # the only expansion llama.cpp's jamba loads

    def is_recurrent(self, il: int) -> bool:
        return il % 2 == 0

    def make_weights(self) -> None:
        super().make_weights()
        rng = np.random.default_rng(self.seed + 1)
        for i in range(self.n_layer):
            if self.is_recurrent(i):
                for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                    del self.weights[f"blk.{i}.{name}.weight"]
                self.weights.update(mamba_layer(rng, i, self.n_embd, self.d_inner, self.d_state, self.d_conv,
                                                self.dt_rank, norms=True))

    def write(self, path: Path, arch: Optional[str] = None, context_length=TRAINING_LENGTH,
              rope_dimension_count: bool = True) -> Path:
        def hparams(w):
            w.add_layer_norm_rms_eps(self.rms_eps)
            _add_ssm_hparams(w, self)

        # the Mamba layers have no KV heads: that is how llama.cpp tells them apart
        kv_heads = [0 if self.is_recurrent(i) else self.n_head_kv for i in range(self.n_layer)]
        return _write(path, "jamba", self, kv_heads, hparams, context_length)
