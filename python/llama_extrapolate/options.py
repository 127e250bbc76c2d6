"""The attention options a user gives ``run`` and ``serve``, declared and resolved in one place.

``run`` takes them as command-line flags and ``serve`` as llama-cpp-python model settings (flags, or a config
file). Both are derived from ``OPTIONS`` below, and both resolve what the user gave on a model in
``AttentionOptions``: the model path (a file, a registry model's short name, or the default model), the document
memory that is on by default where the library supports it, the top-k and memory settings, a calibration profile,
and the memory's storage type. Keeping this out of the CLI is what lets the server use it without importing the
CLI (which imports the server).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from .names import MEMORY_STORE_TYPES

# seconds of a reading between checkpoints (run --state, Llama's and serve's checkpoint_path): a stopped reading
# of hours loses at most this much
DEFAULT_CHECKPOINT_SECONDS = 600.0
# the coordinates the memory's block summaries are in (Llama(memory_axes=...), --memory-axes)
MEMORY_AXES_CHOICES = ("channels", "principal")
DEFAULT_MEMORY_AXES = "channels"
# where `run` and `serve` rank the memory's blocks by landmarks (the means of runs of this many keys) unless told
# otherwise, and rerank this many times m of them, 0: the landmarks select the m blocks themselves. The landmarks'
# ranking holds where the bound's did not (SmolLM2's needle at 32k: 2m of their candidates found 4 of 5, the bound's
# 2m 1 of 5), and reranking them wins no answer the grids ask: Qwen2.5-Coder-0.5B's needle at 16k-64k and SmolLM2's
# pass keys at 16k-32k alike with 0 and 2m, RULER at 64k on the 0.5B needles 44 against 38, on the 1.5B QA 50
# against 25 (one HotpotQA answer more), the needles alike; at Llama-2-7B's shapes and 128k tokens the first answer
# token 3.05 s / 9.05 s after an 11- / 128-token question against 4.5 s / 12.2 s with 2m (store layout 2; on layout
# 3, 2.85 s / 9.9 s against 4.0 s / 13.1 s on a noisier host: docs/results.md)
DEFAULT_MEMORY_LANDMARK = 16
LANDMARK_CANDIDATES_PER_BLOCK = 0

if TYPE_CHECKING:  # pragma: no cover
    from .config import AttentionConfig
    from .model_info import ModelInfo

MEMORY_TYPE_CHOICES = MEMORY_STORE_TYPES  # the flags' and the named configurations' one list
MEMORY_SELECTION_CHOICES = ("head", "layer")
PROFILE_MODE_CHOICES = ("pmax", "entropy")


@dataclass(frozen=True)
class OptionSpec:
    """One attention option as both front ends declare it: ``kind`` is int, str or bool (a bool is a switch,
    off by default), ``minimum`` is the server's bound (the CLI leaves range checks to AttentionConfig, whose
    errors name the value), ``choices`` a closed set of strings."""

    name: str
    kind: type
    help: str
    minimum: Optional[int] = None
    choices: Optional[Tuple[str, ...]] = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.kind not in (int, str, bool):
            raise TypeError(f"option {self.name}: kind {self.kind!r} must be int, str or bool")
        if self.kind is bool and self.default is not False:
            raise ValueError(f"option {self.name}: a switch is off by default (default=False)")
        if self.choices is not None and self.default is not None and self.default not in self.choices:
            raise ValueError(f"option {self.name}: default {self.default!r} is not among {self.choices}")

    @property
    def flag(self) -> str:
        """The command-line spelling: --top-k-layer."""
        return "--" + self.name.replace("_", "-")


def _specs() -> Dict[str, OptionSpec]:
    from .config import DEFAULT_MEMORY_BLOCKS, MEMORY_ANSWER_MODES, MEMORY_CANDIDATES_PER_BLOCK

    specs = [
        OptionSpec("sinks", int, "S, the sink tokens (default: the model's metadata, else 10)", minimum=0),
        OptionSpec("window", int, "W, the window (default: the model's metadata, else its training length; "
                                  "0 = full attention)", minimum=0),
        OptionSpec("ceiling", int, "C (default: W)", minimum=0),
        OptionSpec("top_k", int, "the question and the answer also attend to the K middle keys with the largest "
                                 "logits (LM-Infinite: 5); the cache then keeps the document", minimum=0),
        OptionSpec("top_k_layer", int, "first layer with the middle keys (default 5)", minimum=0),
        OptionSpec("top_k_distance", int, "distance they are scored at (default C/2)", minimum=1),
        OptionSpec("memory_blocks", int,
                   f"document memory: what leaves the window is kept on disk in blocks and the question "
                   f"attends to the --top-k best keys of the M blocks each head selects (default "
                   f"{DEFAULT_MEMORY_BLOCKS} on RoPE models; 0 = off). More blocks find more of the document "
                   "(64 found 8 of 10 needles at 8k where 16 found 2) at more compute per answer token, not "
                   "more RAM (docs/results.md)", minimum=0),
        OptionSpec("memory_block_size", int, "tokens per block (default 64)", minimum=32),
        OptionSpec("memory_candidates", int,
                   f"blocks the first stage (the landmarks, else Quest's bound) proposes to each head, of which the "
                   f"M with the largest exact q.k are "
                   f"selected (0: the first stage selects them; default "
                   + (f"{LANDMARK_CANDIDATES_PER_BLOCK}*M" if LANDMARK_CANDIDATES_PER_BLOCK else "0")
                   + f" with landmarks, {MEMORY_CANDIDATES_PER_BLOCK}*M with the bound)", minimum=0),
        OptionSpec("passages", bool,
                   "the question reads every key of the M selected blocks, in the order of the text, instead of "
                   "the --top-k best keys among them: whole passages (found the multi-key needle on Qwen, where "
                   "the best five keys mixed up two lines; docs/results.md)", default=False),
        OptionSpec("memory_selection", str,
                   "who selects the blocks: each KV head its own (head, the default) or the layer, whose KV "
                   "heads then read the same blocks (a block's score is its largest over them)",
                   choices=MEMORY_SELECTION_CHOICES),
        OptionSpec("memory_answer", str,
                   "what the answer attends to in the memory: the blocks its question selected (hold, the default: "
                   "an answer token then costs what those blocks cost, whatever the document's length) or blocks "
                   "each answer token selects anew (select: a scan of the candidates at every token)",
                   choices=MEMORY_ANSWER_MODES),
        OptionSpec("memory_select_tokens", int,
                   "only the question's last T tokens select the memory's blocks (default or 0: all of them): a long "
                   "prompt's selection then costs what T tokens' costs (at Llama-2-7B's shapes and 128k tokens a "
                   "128-token question's first answer token 15-18 s with T = 32 against 24-25 s; docs/results.md)",
                   minimum=0),
        OptionSpec("memory_type", str, "how the memory stores keys and values (default q8_0 where a token's keys "
                                       "and values take at most 64 KiB so, q4_0 beyond; f16 for heads not a multiple "
                                       "of 32)", choices=MEMORY_TYPE_CHOICES),
        OptionSpec("memory_axes", str, "the axes along which each block's keys are summarized for the bound: the "
                                       "key channels (Quest's) or each KV head's principal axes of the document's "
                                       f"first keys, a tighter bound (default {DEFAULT_MEMORY_AXES})",
                   choices=MEMORY_AXES_CHOICES),
        OptionSpec("memory_landmark", int, "rank the memory's blocks by landmarks, the means of each run of L of a "
                                           "block's keys (a divisor of the block size), instead of the min/max bound: "
                                           "the block that holds an answer ranks near the top where the bound puts it "
                                           "among hundreds, so fewer candidates are reranked (default "
                                           f"{DEFAULT_MEMORY_LANDMARK}; 0: the bound)",
                   minimum=0),
        OptionSpec("profile", str, "calibration profile: softmax temperature schedule tau(p)"),
        OptionSpec("profile_mode", str, "which of the profile's fits", choices=PROFILE_MODE_CHOICES,
                   default="pmax"),
    ]
    return {s.name: s for s in specs}


OPTIONS: Dict[str, OptionSpec] = _specs()


def model_path(model: Optional[str]) -> str:
    """A GGUF file, or a registry model's short name, else (None) the default model, whose absence raises
    ModelNotFoundError naming the package to install."""
    from .default_model import default_model_path
    from .registry_models import model_path as registry_path

    return registry_path(model) if model is not None else str(default_model_path())


# the document memory's store when not told, for heads of a multiple of 32 values: q8_0 (34 bytes per 32 values)
# where its keys and values take at most SMALL_STORE_BYTES_PER_TOKEN a token (8 GiB at 128k tokens: every model up to
# Qwen2.5-Coder-1.5B's and SmolLM2's widths, 6-15 KiB), else q4_0 (18 bytes: Llama-2-7B's shapes at 128k tokens 16.4
# GB against 30.8, and half the keys the question's rerank reads). q4_0 kept Qwen2.5-Coder's needle (16k, 32k, 64k)
# and SmolLM2's pass key (16k, 32k), but lost SmolLM2's needle at 32k: 1 of 5 depths against 4 of 5 with q8_0 on
# the same reading settings (docs/results.md), so the smaller store is taken only where disk asks for it
DEFAULT_MEMORY_STORE = "q4_0"  # the store of the wide models (SMALL_STORE_BYTES_PER_TOKEN)
SMALL_MEMORY_STORE = "q8_0"
SMALL_STORE_BYTES_PER_TOKEN = 64 * 1024
# what a configuration name without a store type runs with (lambda+memory:m=64:c=1024): the q8_0 store the stored
# results under such names were measured with, so that a name keeps meaning what it measured
NAMED_CONFIG_STORE = "q8_0"


def memory_store_bytes_per_token(info: "ModelInfo", type_name: str) -> int:
    """Bytes a token's keys and values take in a store of ``type_name`` (q8_0: 34 per 32 values, q4_0: 18, f16: 2
    a value) over every layer and KV head, as the store is sized."""
    kv = info.head_count_kv  # one count for every layer, or a list of each layer's
    heads = sum(int(n) for n in kv) if isinstance(kv, list) else int(kv) * int(info.block_count)
    values = 2 * heads * _key_head(info)
    per_value = {"q8_0": 34 / 32, "q4_0": 18 / 32, "f16": 2.0, "f32": 4.0}[type_name]
    return int(values * per_value)


def _key_head(info: "ModelInfo") -> int:
    head = info.key_length
    if head is None:
        n_head = info.head_count if isinstance(info.head_count, int) else max(info.head_count)
        head = int(info.embedding_length or 0) // max(1, int(n_head or 1))
    return int(head)


def memory_type_for(info: "ModelInfo", quantized: Optional[str] = None) -> str:
    """How the memory stores keys and values when not told: ``quantized`` if given, else q8_0 where that store is
    small (SMALL_STORE_BYTES_PER_TOKEN) and q4_0 beyond; both take 32 values at a time, so a head of another size is
    stored in f16. The head is the key head (attention.key_length where the file states it, as Gemma 3's and the
    KV-shape models' do), not the residual stream's width over the heads."""
    if _key_head(info) % 32 != 0:
        return "f16"
    if quantized is not None:
        return quantized
    small = memory_store_bytes_per_token(info, SMALL_MEMORY_STORE) <= SMALL_STORE_BYTES_PER_TOKEN
    return SMALL_MEMORY_STORE if small else DEFAULT_MEMORY_STORE


@dataclass(frozen=True)
class AttentionOptions:
    """What the user asked of the attention, before the model is known: every field None (or False) means "the
    default", which ``resolve_on`` and ``attention`` fill from the model's metadata. Errors name the flag as the
    CLI spells it (--top-k); the server's settings have the same names with underscores."""

    sinks: Optional[int] = None
    window: Optional[int] = None
    ceiling: Optional[int] = None
    top_k: Optional[int] = None
    top_k_layer: Optional[int] = None
    top_k_distance: Optional[int] = None
    memory_blocks: Optional[int] = None
    memory_block_size: Optional[int] = None
    memory_candidates: Optional[int] = None
    passages: bool = False
    memory_selection: Optional[str] = None
    memory_answer: Optional[str] = None
    memory_select_tokens: Optional[int] = None
    memory_type: Optional[str] = None
    memory_axes: Optional[str] = None
    memory_landmark: Optional[int] = None
    profile: Optional[str] = None
    profile_mode: str = "pmax"

    def __post_init__(self) -> None:
        for f in fields(self):
            spec, value = OPTIONS[f.name], getattr(self, f.name)
            if value is None:
                continue
            if spec.kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"{spec.flag} {value!r}: a switch is True or False")
            elif spec.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{spec.flag} {value!r}: give a whole number")
            elif spec.kind is str and not isinstance(value, str):
                raise ValueError(f"{spec.flag} {value!r}: give a string")
            if spec.choices is not None and value not in spec.choices:
                raise ValueError(f"{spec.flag} {value!r}: choose one of {', '.join(spec.choices)}")

    @classmethod
    def of(cls, source: Any) -> "AttentionOptions":
        """The options from anything that has them as attributes (an argparse Namespace, the server's settings);
        an attribute a command does not declare (nll has no --top-k) counts as not given."""
        given = {f.name: getattr(source, f.name) for f in fields(cls) if getattr(source, f.name, None) is not None}
        return cls(**given)

    def resolve_on(self, info: "ModelInfo") -> Tuple["AttentionOptions", Optional[str]]:
        """These options with the document memory's default applied: it is on (config.DEFAULT_MEMORY_BLOCKS) where
        the library supports it (RoPE or ALiBi, and a window) and memory_blocks was not given; elsewhere it stays
        off and the second value says why (run prints it, the server does not)."""
        from .config import DEFAULT_MEMORY_BLOCKS
        from .model_info import knob_support

        if self.memory_blocks is not None:
            return self, None
        refused = knob_support(info)["memory"]  # the position encoding among its reasons
        if refused is not None:
            return self, f"document memory off: the library refuses it on this {info.architecture} model ({refused})"
        if self.window == 0:
            return self, "document memory off: full attention (--window 0) keeps every key"
        return replace(self, memory_blocks=DEFAULT_MEMORY_BLOCKS), None

    def attention(self, info: "ModelInfo") -> "AttentionConfig":
        """AttentionConfig from the model's metadata and defaults, then these options (call ``resolve_on`` first
        for the memory's default). ValueError names a flag given without the one it needs."""
        from .config import AttentionConfig

        overrides = {k: getattr(self, k) for k in ("sinks", "window", "ceiling") if getattr(self, k) is not None}
        memory = self.memory_blocks or 0
        if memory > 0:
            # the document memory: what leaves the window goes to disk, the question selects blocks and takes the
            # top-k middle keys among them
            from .config import DEFAULT_MEMORY_BLOCK, DEFAULT_TOP_K_LAYER, memory_question_top_k

            layer = (self.top_k_layer if self.top_k_layer is not None
                     else min(DEFAULT_TOP_K_LAYER, int(info.block_count) - 1))
            if self.passages and self.top_k:
                raise ValueError(f"--passages with --top-k {self.top_k}: the passages are every key of the selected "
                                 "blocks (top-k = M*B); drop one of them")
            top_k = self.top_k or memory_question_top_k(memory, self.memory_block_size or DEFAULT_MEMORY_BLOCK,
                                                        self.passages)
            overrides.update(memory_blocks=memory, top_k=top_k, top_k_layer=layer,
                             top_k_distance=self.top_k_distance, top_k_scope="question")
            if self.memory_block_size:
                overrides.update(memory_block_size=self.memory_block_size)
            if self.memory_candidates is not None:
                overrides.update(memory_candidates=self.memory_candidates)
            elif self.memory_landmark_or_default():
                overrides.update(memory_candidates=LANDMARK_CANDIDATES_PER_BLOCK * memory)
            if self.memory_selection is not None:
                overrides.update(memory_selection=self.memory_selection)
        elif (flag := next((f for f in ("memory_candidates", "memory_selection", "memory_block_size", "passages",
                                        "memory_answer", "memory_select_tokens", "memory_landmark")
                            if getattr(self, f) not in (None, False)), None)) is not None:
            value = "" if flag == "passages" else f" {getattr(self, flag)}"
            raise ValueError(f"{OPTIONS[flag].flag}{value} without the document memory: it says how "
                             "the memory selects its blocks; drop it or set --memory-blocks M (e.g. 64)")
        elif self.top_k:
            # the document is read with the Lambda mask, the question and the answer add the middle keys
            overrides.update(top_k=self.top_k, top_k_layer=self.top_k_layer, top_k_distance=self.top_k_distance,
                             top_k_scope="question")
        elif self.top_k_layer is not None or self.top_k_distance is not None:
            raise ValueError("--top-k-layer/--top-k-distance need --top-k K (the number of middle keys per head)")
        if self.profile:
            from .profile import CalibrationProfile

            prof = CalibrationProfile.load(self.profile)
            prof.check_model(info.path)
            overrides.update(prof.temperature_fields(self.profile_mode))
        return AttentionConfig.from_model(info, **overrides)

    def memory_axes_or_default(self) -> str:
        """The axes of the memory's block summaries: the ones given, else DEFAULT_MEMORY_AXES."""
        return self.memory_axes or DEFAULT_MEMORY_AXES

    def memory_landmark_or_default(self) -> int:
        """Tokens a landmark of the memory's blocks averages: the number given (0: the bound ranks the blocks), else
        DEFAULT_MEMORY_LANDMARK where the blocks are summarized along the key channels (the principal axes are the
        bound's, which the landmarks replace, so with them the bound ranks)."""
        if self.memory_landmark is not None:
            return self.memory_landmark
        return DEFAULT_MEMORY_LANDMARK if self.memory_axes_or_default() == "channels" else 0

    def memory_answer_or_default(self) -> str:
        """What the answer attends to in the memory: the mode given, else config.DEFAULT_MEMORY_ANSWER."""
        from .config import DEFAULT_MEMORY_ANSWER

        return self.memory_answer or DEFAULT_MEMORY_ANSWER

    def memory_type_on(self, info: "ModelInfo") -> str:
        """The memory's storage type: the one given, else the one the model's head size allows (memory_type_for)."""
        return self.memory_type or memory_type_for(info)


def add_flags(parser: Any, names: Sequence[str]) -> None:
    """Add the named options to an argparse parser as flags (--top-k-layer), with their help and choices."""
    for name in names:
        spec = OPTIONS[name]
        if spec.kind is bool:
            parser.add_argument(spec.flag, action="store_true", help=spec.help)
        else:
            kwargs: Dict[str, Any] = dict(type=spec.kind, help=spec.help)
            if spec.choices is not None:
                kwargs["choices"] = list(spec.choices)
            if spec.default is not None:
                kwargs["default"] = spec.default
            parser.add_argument(spec.flag, **kwargs)
