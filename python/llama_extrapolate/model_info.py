"""Facts of a GGUF model that the attention depends on, read from its metadata.

The pretraining length L_pre (``<arch>.context_length``) sets the defaults of
the window and the ceiling, and the position encoding decides how the ceiling
is applied (RoPE rotation or ALiBi bias), so these are read once here and
checked, with errors that name the file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from .default_model import ModelNotFoundError

# enum llama_rope_type in llama.h
_ROPE_TYPES = {-1: "none", 0: "normal", 2: "neox", 8: "mrope", 24: "vision", 40: "imrope"}


class InvalidModelError(ValueError):
    """The file is not a usable GGUF model; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: Optional[str]
    architecture: str
    context_length: int
    block_count: int
    head_count: Union[int, list]
    head_count_kv: Union[int, list]
    embedding_length: Optional[int]
    # "rope", "alibi", "learned" (an embedding per position up to the context length, GPT-2 and StarCoder: none
    # past it) or "none"
    position_encoding: str
    rope_type: Optional[str]
    rope_freq_base: Optional[float]
    rope_dimension_count: Optional[int]
    rope_scaling_type: Optional[str]
    alibi_max_bias: Optional[float]
    sliding_window: Optional[int]
    # layers llama.cpp builds without RoPE (NoPE) in a RoPE model, and its sliding-window layers
    nope_layers: Tuple[int, ...]
    swa_layers: Tuple[int, ...]
    # layers that keep a recurrent state instead of attending (Mamba, RWKV; the convolution layers of LFM2 and
    # the other hybrid models)
    recurrent_layers: Tuple[int, ...]
    rope_freq_factors: bool  # the file carries RoPE frequency factors (Llama 3's rope_freqs, Phi-3's long factors)
    file_size: int
    # llama-extrapolate keys written into the file (sink_count, window, ceiling, rollback,
    # softmax_temperature, log_length), so a prepared GGUF carries its own attention settings
    attention_metadata: dict = field(default_factory=dict)
    # multi-head latent attention (DeepSeek-V2 and kin, attention.key_length_mla): llama.cpp caches one latent
    # "key" per token and reads the values from it, through an attention path of its own (a K-only cache)
    latent_attention: bool = False
    # attention logits capped before the softmax (cap * tanh(s / cap)): llama.cpp does it for Gemma 2 and Grok, and
    # the temperature then divides the capped logits
    softcapped_logits: bool = False
    # a learned sink logit per head (gpt-oss: attn_sinks), which enters the softmax beside the logits
    learned_sinks: bool = False
    # the size of a key head (attention.key_length, else embedding_length / head_count): what the cache and the
    # document memory store per KV head, apart from the residual stream's width
    key_length: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def lambda_refusal(self) -> Optional[str]:
        """Why the Lambda window, its ceiling and what rides on them do not apply to this model at all, or None:
        learned absolute position embeddings have a row per position up to the training length, and the window
        would carry the text past it; T5 reads its input with the encoder, not through a decoder's cache."""
        if self.position_encoding == "learned":
            return LEARNED_POSITIONS
        if self.architecture in ("t5", "t5encoder"):
            return ENCODER_MODEL
        return None

    @property
    def no_global_attention(self) -> bool:
        """Sliding-window layers, and every layer either one or recurrent: the Lambda window, its ceiling and the
        temperature, which act on the global layers, have none to act on (patch 0014 refuses them)."""
        return bool(self.swa_layers) and set(range(self.block_count)) <= set(self.swa_layers) | set(
            self.recurrent_layers or ())


def _field_value(field) -> Any:
    value = field.contents()
    if isinstance(value, list) and value and all(v == value[0] for v in value):
        return value[0]  # per-layer arrays that are uniform read as one number
    return value


def _layout_from_library(path: Path) -> dict:
    """Ask the patched llama.cpp (native.model_layout) how it builds the architecture (RoPE type, NoPE,
    sliding-window and recurrent layers) and why it refuses each of the KNOBS on it. One load per file (path, size
    and modification time), shared by read_model_info and knob_support."""
    from . import logs
    from .native import model_layout  # loaded on the patched library by the package import

    key = _file_key(path)
    layout = _LAYOUT_CACHE.get(key)
    if layout is None:
        mark = logs.error_mark()
        layout = model_layout(path, KNOBS)
        if layout is None:
            reason = logs.errors_since(mark) or "unsupported architecture or corrupt tensors"
            raise InvalidModelError(f"{path}: llama.cpp could not load this model: {reason}")
        _LAYOUT_CACHE[key] = layout
    return layout


def _file_key(path: Path) -> Tuple[str, int, int]:
    if path.is_dir():
        raise ModelNotFoundError(f"model path {path} is a directory: pass the path of a .gguf file")
    if not path.is_file():
        raise ModelNotFoundError(f"model file {path} does not exist: pass the path of a .gguf file")
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


_LAYOUT_CACHE: Dict[Tuple[str, int, int], dict] = {}
_INFO_CACHE: Dict[Tuple[str, int, int], "ModelInfo"] = {}


def read_model_info(path: Union[str, os.PathLike]) -> ModelInfo:
    """Read and check the metadata of a GGUF model file.

    A command reads the metadata to size the cache and ``Llama`` reads it again to check the load; the result
    is kept per file (path, size and modification time), so one load parses the GGUF once and a file changed
    on disk is read afresh. ModelInfo is frozen, so the shared copy cannot be altered by a caller."""
    path = Path(path)
    key = _file_key(path)
    info = _INFO_CACHE.get(key)
    if info is None:
        info = _INFO_CACHE[key] = _read_model_info(path)
    return info


def _read_model_info(path: Path) -> ModelInfo:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors ... on bad files
        raise InvalidModelError(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
            "check that the download or copy is complete"
        ) from exc

    fields = reader.fields

    def get(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return default if field is None else _field_value(field)

    arch = get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidModelError(f"{path}: GGUF metadata has no general.architecture")

    def required(suffix: str) -> Any:
        value = get(f"{arch}.{suffix}")
        if value is None:
            raise InvalidModelError(f"{path}: GGUF metadata has no {arch}.{suffix}")
        return value

    context_length = int(required("context_length"))
    if context_length <= 0:
        raise InvalidModelError(f"{path}: {arch}.context_length = {context_length} must be positive")

    alibi = get(f"{arch}.attention.max_alibi_bias")
    layout = _layout_from_library(path)
    rope_type = _ROPE_TYPES.get(layout["rope_type"], "unknown")
    if any(t.name == "position_embd.weight" for t in reader.tensors):
        encoding = "learned"  # (an MPT GGUF may carry them beside ALiBi: they bound its positions all the same)
    elif rope_type != "none":
        encoding = "rope"
    elif alibi is not None and float(alibi) > 0:
        encoding = "alibi"
    else:
        encoding = "none"

    return ModelInfo(
        path=str(path),
        name=get("general.name"),
        architecture=arch,
        context_length=context_length,
        block_count=int(required("block_count")),
        head_count=required("attention.head_count"),
        head_count_kv=get(f"{arch}.attention.head_count_kv", get(f"{arch}.attention.head_count")),
        embedding_length=get(f"{arch}.embedding_length"),
        position_encoding=encoding,
        rope_type=rope_type if encoding == "rope" else None,
        rope_freq_base=(float(get(f"{arch}.rope.freq_base", 10000.0)) if encoding == "rope" else None),
        rope_dimension_count=_rope_dimensions(get, arch) if encoding == "rope" else None,
        rope_scaling_type=get(f"{arch}.rope.scaling.type") if encoding == "rope" else None,
        alibi_max_bias=float(alibi) if alibi is not None else None,
        sliding_window=get(f"{arch}.attention.sliding_window"),
        nope_layers=(tuple(i for i, r in enumerate(layout["rope"]) if not r) if rope_type != "none" else ()),
        swa_layers=tuple(i for i, w in enumerate(layout["swa"]) if w),
        recurrent_layers=tuple(i for i, r in enumerate(layout["recurrent"]) if r),
        rope_freq_factors=any(t.name in ("rope_freqs.weight", "rope_factors_long.weight") for t in reader.tensors),
        file_size=path.stat().st_size,
        attention_metadata={name: get(key) for name, key in _attention_keys(arch).items() if get(key) is not None},
        latent_attention=all(get(f"{arch}.attention.{key}_length_mla") for key in ("key", "value")),
        softcapped_logits=arch in SOFTCAPPED_ARCHITECTURES,
        learned_sinks=any(t.name.endswith(".attn_sinks.weight") for t in reader.tensors),
        key_length=_key_length(get, arch),
    )


# the architectures whose attention logits llama.cpp caps (gemma2 always, grok in its own graph)
SOFTCAPPED_ARCHITECTURES = ("gemma2", "grok")


def _key_length(get, arch: str) -> Optional[int]:
    """The key head size as llama.cpp loads it: attention.key_length, else embedding_length / head_count."""
    key_length = get(f"{arch}.attention.key_length")
    if key_length is not None:
        return int(key_length)
    n_embd, n_head = get(f"{arch}.embedding_length"), get(f"{arch}.attention.head_count")
    if isinstance(n_embd, int) and isinstance(n_head, int) and n_head > 0:
        return n_embd // n_head
    return None


def _rope_dimensions(get, arch: str) -> Optional[int]:
    """The channels RoPE rotates as llama.cpp loads them: rope.dimension_count, else the key head size
    (_key_length), which many GGUFs (Qwen2.5) leave implicit."""
    n_rot = get(f"{arch}.rope.dimension_count")
    if n_rot is not None:
        return int(n_rot)
    return _key_length(get, arch)


def _attention_keys(arch: str) -> dict:
    a = f"{arch}.attention"
    return {"sinks": f"{a}.lambda.sink_count", "window": f"{a}.lambda.window", "ceiling": f"{a}.lambda.ceiling",
            "rollback": f"{a}.lambda.rollback", "temperature": f"{a}.softmax_temperature",
            "log_length": f"{a}.softmax_temperature.log_length"}


# why a model takes no Lambda window whatever its layers, for AttentionConfig.resolve to refuse before loading: the
# library's words (llama_model::ext_refusal, patch 0014), which tests/test_families.py holds knob_support's to
LEARNED_POSITIONS = "learned absolute position embeddings (none past the training length)"
ENCODER_MODEL = "an encoder model (T5: its encoder reads the whole input at once, which the Lambda window does not bound)"

# the knobs of AttentionConfig as ``knob_support`` names them
KNOBS = ("lambda", "ceiling", "temperature", "top_k", "memory")


def knob_support(info: ModelInfo) -> Dict[str, Optional[str]]:
    """Each knob -> None when the patched library accepts it on this model, else the reason it refuses it: the
    library's own (llama_ext_model_get_refusal), from the one list its refusals at context creation read, so the
    reason here is the one its exception gives. Asked of the file's hyperparameters in the load read_model_info
    makes (no tensor data), so that ``info`` and the options can answer before a model is loaded."""
    refusals = _layout_from_library(Path(info.path))["refusals"]
    return {knob: refusals[knob] for knob in KNOBS}
