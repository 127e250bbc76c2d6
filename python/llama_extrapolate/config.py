"""AttentionConfig: the attention of DESIGN.md as one validated value.

LM-Infinite (Han et al.) gives the Lambda-shaped mask (S sink tokens + the W
most recent tokens) and the distance ceiling C; attention alignment (Chi et
al.) gives the softmax temperature tau. Unset lengths default from the model:
W = C = its pretraining length L_pre, the lengths it has seen distances for.

S defaults to 10: in LM-Infinite's Table 4 (Llama-2, 16k tokens) the NLL is
6.43 with no sinks, 1.03 with 1-2, 1.02 with 10 and 100, and worse again from
1000 on (1.81, 4.96); 10 is the smallest count at the best value, and a few
extra cells cost nothing.

Every invalid value raises ValueError (or TypeError) naming the field and the
fix; nothing falls back to vanilla attention silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .model_info import ModelInfo

DEFAULT_SINKS = 10
# a chat turn's re-tokenized tail differs from the generated tokens by a few tokens; 256 covers it
DEFAULT_ROLLBACK = 256
# LM-Infinite's choice for Llama-2 (Appendix A.3, picked on held-out passkey retrieval): k = 5 keys from layer 5 on
DEFAULT_TOP_K_LAYER = 5
TOP_K_SCOPES = ("all", "question")
# how the document memory's blocks are selected: by each KV head for itself, or by the layer (a block's score is its
# largest over the layer's KV heads, and every head reads the same blocks)
MEMORY_SELECTIONS = ("head", "layer")
# the document memory: blocks of 64 tokens (docs/document-memory-study.md: Quest's bound at B = 64 finds 0.87 of the
# exhaustive top-5 keys with m = 16 blocks per KV head), stored as q8_0
DEFAULT_MEMORY_BLOCK = 64
# blocks each KV head selects where `run`, `serve` and the benchmarks switch the memory on by default: 64 finds more
# needles in essays than 16 (SmolLM2, W = 1024, 2 trials x 5 depths: 8/10 at 8k and 6/10 at 16k against 2/10 and
# 1/10) and as many pass keys; since the earlier series' patch 0023 the selected blocks take no cells of the cache (peak RSS at 16k,
# W = 8192: 1.03x the bounded stream; docs/results.md)
DEFAULT_MEMORY_BLOCKS = 64
# the bound proposes this many times m blocks, of which the m with the largest exact q.k are selected (patch 0012;
# AttentionConfig's default, and run's and serve's with --memory-landmark 0: with landmarks they take
# options.LANDMARK_CANDIDATES_PER_BLOCK):
# the bound alone lets blocks of scattered keys crowd the needle's block out as the document grows (the needle's
# block selected by 63 and 53 of 75 layer/KV-head pairs at 16k and 32k tokens with m = 64, and both answers lost;
# reranking 4m candidates: 73 and 64 pairs, both found). At 32k 4m still lose it: the needle in essays, two trials
# per depth, 4 of 10 with 4m and 7 of 10 with 16m; a decode step with the memory opened for 128k tokens (W = 1024)
# takes 113 ms with the bound alone, 144 ms with 4m and 232 ms with 16m since the earlier series' patch 0029 (docs/results.md)
MEMORY_CANDIDATES_PER_BLOCK = 16
# the question takes LM-Infinite's 5 best keys of the memory's selected blocks, or with passages every key of the m
# blocks in the order of the text (patch 0012's passages mode, on when top_k >= m*B)
DEFAULT_MEMORY_TOP_K = 5
# what `run` and `serve` answer with: "hold", the blocks the question selected (Llama(memory_answer=...)). At
# Llama-2-7B's KV shapes an answer token costs 0.28 s holding them against 3.3 s selecting anew (memory opened for
# 128k tokens, 2 threads), and on Qwen2.5-Coder's multi-key needle the top-5 keys found the same needles either way
# (3/5 at 16k and at 32k; docs/results.md)
MEMORY_ANSWER_MODES = ("select", "hold")
DEFAULT_MEMORY_ANSWER = "hold"


def memory_question_top_k(blocks: int, block_size: int, passages: bool) -> int:
    """top_k for a memory of ``blocks`` selected blocks of ``block_size`` tokens: m*B reads them whole."""
    return blocks * block_size if passages else DEFAULT_MEMORY_TOP_K
MEMORY_TYPES = {"q8_0": 8, "q4_0": 2, "f16": 1, "f32": 0}  # name -> enum ggml_type
# the position encodings the document memory scores its keys through, at a bounded distance
MEMORY_POSITION_ENCODINGS = ("rope", "alibi")

Temperature = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]


def _check_count(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        default = " (or None for the default)" if allow_none else ""
        raise TypeError(f"{name}={value!r} must be a whole number of tokens{default}")
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0 (0 switches it off)")
    if value >= 2**31:
        raise ValueError(f"{name}={value} is too large: positions are 32-bit, use a value below 2**31")


@dataclass(frozen=True)
class ResolvedAttention:
    """Concrete values for one model: what reaches llama.cpp."""

    sinks: int
    window: int  # 0 = every past key visible
    ceiling: int  # 0 = no ceiling
    rollback: int  # keys stay this many tokens past the window (prompt-prefix reuse)
    temperature: np.ndarray  # float32 [n_layer, n_head]
    log_length: int  # 0 = no schedule
    points_lengths: Tuple[int, ...] = ()  # schedule by points: tau also times the value interpolated in log length
    points_tau: np.ndarray = None  # float32 [n_points, n_layer, n_head]
    top_k: int = 0  # middle keys per head (0 = off; > 0: the cache keeps every key)
    top_k_layer: int = 0
    top_k_distance: int = 0  # as resolved (> 0 when top_k > 0)
    top_k_scope: str = "all"
    memory_blocks: int = 0  # document memory: blocks each KV head selects (0 = off)
    memory_block_size: int = DEFAULT_MEMORY_BLOCK
    memory_candidates: int = 0  # blocks the bound proposes, of which the exact q.k selects m (0 = the bound selects)
    memory_selection: str = "head"  # one of MEMORY_SELECTIONS

    @property
    def memory(self) -> bool:
        return self.memory_blocks > 0

    @property
    def memory_cells(self) -> int:
        """The keys each KV head reads from the selected blocks (m*B; they are brought into the graph, not the
        cache)."""
        return self.memory_blocks * self.memory_block_size

    @property
    def memory_passages(self) -> bool:
        """The question reads every key of the selected blocks in the order of the text (patch 0012: top_k >= m*B)."""
        return self.memory and self.top_k >= self.memory_cells

    @property
    def memory_edge_cells(self) -> int:
        """With the memory a key stays cached until its whole block has left the window (the question selects
        whole blocks behind its window and takes the keys of the block at the edge from the cache): one block more."""
        return self.memory_block_size if self.memory else 0

    @property
    def lambda_mask(self) -> bool:
        return self.window > 0

    @property
    def temperature_on(self) -> bool:
        return self.log_length > 0 or bool(self.points_lengths) or bool(np.any(self.temperature != 1.0))

    def kv_overrides(self, architecture: str, temperature: bool = True) -> dict:
        """GGUF metadata overrides (llama-cpp-python's kv_overrides, llama.cpp's --override-kv).

        ``temperature=False`` leaves out the softmax temperature: ``Llama`` sets it through the C API alone
        (tables and schedules do not fit in metadata), so it reaches llama.cpp by one route; the full set is
        for a GGUF or a ``llama-server`` command line, where metadata is the only route."""
        a = f"{architecture}.attention"
        out = {
            f"{a}.lambda.sink_count": int(self.sinks),
            f"{a}.lambda.window": int(self.window),
            f"{a}.lambda.ceiling": int(self.ceiling),
            f"{a}.lambda.rollback": int(self.rollback),
        }
        if self.top_k > 0:
            out[f"{a}.lambda.top_k"] = int(self.top_k)
            out[f"{a}.lambda.top_k_layer"] = int(self.top_k_layer)
            out[f"{a}.lambda.top_k_distance"] = int(self.top_k_distance)
        if self.memory_blocks > 0:
            out[f"{a}.lambda.memory_blocks"] = int(self.memory_blocks)
            out[f"{a}.lambda.memory_block_size"] = int(self.memory_block_size)
            out[f"{a}.lambda.memory_candidates"] = int(self.memory_candidates)
            out[f"{a}.lambda.memory_per_layer"] = self.memory_selection == "layer"
        if temperature and self.temperature.size:  # (a model without attention heads has no temperature)
            out[f"{a}.softmax_temperature.log_length"] = int(self.log_length)
            uniform = self.temperature.flat[0]
            if np.all(self.temperature == uniform):
                out[f"{a}.softmax_temperature"] = float(uniform)
        return out

    @property
    def bounded_cache(self) -> bool:
        """The cache frees the keys the window hides (not with top-k middle keys over the cache, which may select
        them; with the document memory they are on disk)."""
        return self.window > 0 and (self.top_k == 0 or self.memory_blocks > 0)

    def check_context(self, n_ctx: int, n_ubatch: int) -> None:
        """The cache must hold the sinks, the window, the rollback margin and one ubatch."""
        need = self.required_n_ctx(n_ubatch, stream=0)
        if self.bounded_cache and n_ctx < need:
            memory = f" + the block at the window's edge {self.memory_edge_cells}" if self.memory_edge_cells else ""
            raise ValueError(
                f"window={self.window} with sinks={self.sinks} and rollback={self.rollback} needs "
                f"n_ctx >= sinks + window + rollback + n_ubatch{memory} = {need}, got n_ctx={n_ctx}: raise n_ctx or "
                "lower the window"
            )

    def required_n_ctx(self, n_ubatch: int, stream: int) -> int:
        """Smallest n_ctx for a stream of `stream` tokens: bounded with a window, the whole stream without
        (or with top-k middle keys)."""
        if self.bounded_cache:
            return self.sinks + self.window + self.rollback + n_ubatch + self.memory_edge_cells
        return stream


@dataclass(frozen=True)
class AttentionConfig:
    """How a model attends over long inputs.

    The default is LM-Infinite: Lambda mask with ``sinks`` = 10 and
    ``window`` = L_pre, distance ceiling ``ceiling`` = L_pre. ``None`` means
    "the model's default", 0 switches a part off; the presets below give the
    ablations of LM-Infinite's Figure 5.

    ``rollback``: with a window, keys stay cached this many tokens after
    leaving it, so llama-cpp-python can reuse a prompt prefix that ends up to
    ``rollback`` tokens before the end of the previous stream; a longer step
    back re-reads the prompt (a window key it needs may be gone).

    ``temperature`` is one number, one per layer, or an (n_layer, n_head)
    array; ``temperature_schedule="log-length"`` multiplies it by
    log L / log max(p + 1, L) with L = ``log_length`` (default L_pre);
    ``temperature_schedule="points"`` multiplies it by the value interpolated
    linearly in log(p + 1) between ``temperature_points`` ((L_1, tau_1), ...),
    held at the end values outside them (a calibration profile, see
    ``from_profile``).

    ``top_k`` > 0 (LM-Infinite's optional component): in layers >=
    ``top_k_layer`` (default 5) each head also attends to the ``top_k`` keys the
    window hides with the largest logits, scored at distance
    ``top_k_distance`` (default C/2, or W/2 without a ceiling). The cache then
    keeps every key, so n_ctx must hold the whole stream. ``top_k_scope``:
    "all" applies it to every query; "question" reads with plain Lambda
    attention and applies it once ``Llama.set_top_k_active(True)`` is called
    (``llama-extrapolate run`` and the passkey task do that where the question
    starts).
    """

    sinks: int = DEFAULT_SINKS
    window: Optional[int] = None
    ceiling: Optional[int] = None
    rollback: int = DEFAULT_ROLLBACK
    temperature: Temperature = 1.0
    temperature_schedule: Optional[str] = None
    log_length: Optional[int] = None
    temperature_points: Optional[Tuple[Tuple[int, Temperature], ...]] = None
    top_k: int = 0
    top_k_layer: Optional[int] = None
    top_k_distance: Optional[int] = None
    top_k_scope: str = "all"
    memory_blocks: int = 0
    memory_block_size: int = DEFAULT_MEMORY_BLOCK
    memory_candidates: Optional[int] = None  # None: MEMORY_CANDIDATES_PER_BLOCK * memory_blocks; 0: the bound selects
    memory_selection: str = "head"

    def __post_init__(self) -> None:
        _check_count("memory_blocks", self.memory_blocks, allow_none=False)
        _check_count("memory_block_size", self.memory_block_size, allow_none=False)
        _check_count("memory_candidates", self.memory_candidates)
        if self.memory_selection not in MEMORY_SELECTIONS:
            raise ValueError(f"memory_selection={self.memory_selection!r}: use 'head' (each KV head selects its "
                             "blocks) or 'layer' (the KV heads of a layer select the same blocks)")
        if self.memory_selection != "head" and self.memory_blocks == 0:
            raise ValueError(f"memory_selection={self.memory_selection!r} with memory_blocks=0: it says how the "
                             "document memory's blocks are selected; set memory_blocks (e.g. 64) or drop it")
        if self.memory_candidates and self.memory_blocks == 0:
            raise ValueError(f"memory_candidates={self.memory_candidates} with memory_blocks=0: the candidates are "
                             "blocks of the document memory; set memory_blocks (e.g. 64) or drop memory_candidates")
        if self.memory_candidates and self.memory_candidates <= self.memory_blocks:
            raise ValueError(f"memory_candidates={self.memory_candidates} <= memory_blocks={self.memory_blocks}: the "
                             f"m selected blocks are chosen among the candidates, so use more (e.g. "
                             f"{MEMORY_CANDIDATES_PER_BLOCK * self.memory_blocks}) or 0 to select by the bound alone")
        if self.memory_blocks > 0:
            if self.top_k == 0:
                raise ValueError(f"memory_blocks={self.memory_blocks} with top_k=0: the memory's blocks are where the "
                                 "top-k middle keys are chosen from; set top_k (e.g. 5) or memory_blocks=0")
            if self.memory_block_size == 0 or self.memory_block_size % 32:
                raise ValueError(f"memory_block_size={self.memory_block_size}: use a multiple of 32 (the "
                                 "quantization block), e.g. 64")
        _check_count("top_k", self.top_k, allow_none=False)
        _check_count("top_k_layer", self.top_k_layer)
        _check_count("top_k_distance", self.top_k_distance)
        if self.top_k > 0 and self.window == 0:
            raise ValueError(f"top_k={self.top_k} with window=0: the middle keys are the ones the window hides; "
                             "set a window (or None for the model's length) or top_k=0")
        if self.top_k_distance == 0:
            raise ValueError("top_k_distance=0: the middle keys need a distance >= 1 (None for the default C/2)")
        if self.top_k_scope not in TOP_K_SCOPES:
            raise ValueError(f"top_k_scope={self.top_k_scope!r}: use 'all' (every query) or 'question' (only after "
                             "Llama.set_top_k_active(True))")
        if self.top_k == 0 and (self.top_k_layer is not None or self.top_k_distance is not None):
            raise ValueError(f"top_k_layer={self.top_k_layer!r} / top_k_distance={self.top_k_distance!r} without "
                             "top_k: set top_k > 0 to use the middle keys")
        _check_count("sinks", self.sinks, allow_none=False)
        _check_count("window", self.window)
        _check_count("ceiling", self.ceiling)
        _check_count("rollback", self.rollback, allow_none=False)
        _check_count("log_length", self.log_length)
        if self.sinks > 0 and self.window == 0:
            raise ValueError(
                f"sinks={self.sinks} with window=0: sink tokens only matter inside a Lambda mask; "
                "set a window (or None for the model's length) or sinks=0"
            )
        if self.temperature_schedule not in (None, "log-length", "points"):
            raise ValueError(
                f"temperature_schedule={self.temperature_schedule!r}: use None, 'log-length' or 'points'"
            )
        if (self.temperature_schedule == "points") != (self.temperature_points is not None):
            raise ValueError(
                "temperature_points and temperature_schedule='points' go together: give both or neither "
                f"(got schedule={self.temperature_schedule!r}, points={self.temperature_points!r})"
            )
        if self.temperature_points is not None:
            pts = tuple(self.temperature_points)
            if not pts:
                raise ValueError("temperature_points is empty: give at least one (length, tau) pair")
            last = 0
            for item in pts:
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise TypeError(f"temperature_points item {item!r} must be a (length, tau) pair")
                length, tau_k = item
                _check_count("temperature_points length", length, allow_none=False)
                if length <= last:
                    raise ValueError(f"temperature_points lengths must increase from 1: {length} after {last}")
                last = length
                t = np.asarray(tau_k, dtype=np.float64)
                if t.ndim > 2 or t.size == 0 or np.any(~np.isfinite(t) | (t <= 0)):
                    raise ValueError(f"temperature_points tau at length {length} is {tau_k!r}: every value must be "
                                     "a finite number > 0 (one, per layer, or per layer and head)")
            object.__setattr__(self, "temperature_points", pts)
        if self.log_length is not None and self.temperature_schedule is None:
            raise ValueError(f"log_length={self.log_length} needs temperature_schedule='log-length'")
        if self.log_length is not None and self.log_length < 2:
            raise ValueError(f"log_length={self.log_length} must be >= 2 (a training length)")
        tau = np.asarray(self.temperature, dtype=np.float64) if not isinstance(self.temperature, str) else None
        if tau is None or tau.dtype == object or tau.ndim > 2 or tau.size == 0:
            raise TypeError(
                f"temperature={self.temperature!r} must be a number, a per-layer list, or an (n_layer, n_head) array"
            )
        bad = ~np.isfinite(tau) | (tau <= 0)
        if np.any(bad):
            raise ValueError(
                f"temperature has invalid value {float(tau[bad].flat[0])!r}: every temperature must be a finite number > 0"
            )

    # --- presets (LM-Infinite Figure 5 ablations) -------------------------------------------
    @classmethod
    def vanilla(cls) -> "AttentionConfig":
        """Plain full attention: every knob off."""
        return cls(sinks=0, window=0, ceiling=0)

    @classmethod
    def window_only(cls, window: Optional[int] = None) -> "AttentionConfig":
        return cls(sinks=0, window=window, ceiling=0)

    @classmethod
    def lambda_only(cls, sinks: int = DEFAULT_SINKS, window: Optional[int] = None) -> "AttentionConfig":
        return cls(sinks=sinks, window=window, ceiling=0)

    @classmethod
    def ceiling_only(cls, ceiling: Optional[int] = None) -> "AttentionConfig":
        return cls(sinks=0, window=0, ceiling=ceiling)

    def with_temperature(self, temperature: Temperature, schedule: Optional[str] = None,
                         log_length: Optional[int] = None,
                         points: Optional[Sequence[Tuple[int, Temperature]]] = None) -> "AttentionConfig":
        return replace(self, temperature=temperature, temperature_schedule=schedule, log_length=log_length,
                       temperature_points=None if points is None else tuple(points))

    @classmethod
    def from_model(cls, info: "ModelInfo", **overrides) -> "AttentionConfig":
        """LM-Infinite with the settings a GGUF carries in its metadata (written in, or via kv_overrides),
        the defaults where it carries none; ``overrides`` win over both."""
        meta = dict(info.attention_metadata)
        fields = {}
        for name in ("sinks", "window", "ceiling", "rollback"):
            if name in meta:
                fields[name] = int(meta[name])
        if "temperature" in meta:
            fields["temperature"] = float(meta["temperature"])
        if int(meta.get("log_length", 0)) > 0:
            fields["temperature_schedule"] = "log-length"
            fields["log_length"] = int(meta["log_length"])
        # full attention (window 0, from the metadata or asked for) has no sinks unless they are asked for too
        if overrides.get("window", fields.get("window")) == 0 and "sinks" not in overrides:
            fields["sinks"] = 0
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_profile(cls, profile, *, model_path=None, length: Optional[int] = None, mode: str = "pmax",
                     granularity: str = "global", **fields) -> "AttentionConfig":
        """Temperatures from a calibration profile (``llama-extrapolate calibrate``).

        With ``length``: the tau the profile gives for inputs of that length (interpolated in log length).
        Without: a schedule tau(p) through the profile's points, so a stream is sharpened as it grows.
        ``model_path`` checks that the profile was made for that model file. Other fields (sinks, window,
        ...) pass through; the default is full attention, which is what the profile was calibrated on.
        """
        from .profile import CalibrationProfile

        if not isinstance(profile, CalibrationProfile):
            profile = CalibrationProfile.load(profile)
        if model_path is not None:
            profile.check_model(model_path)
        fields.setdefault("sinks", 0)
        fields.setdefault("window", 0)
        fields.setdefault("ceiling", 0)
        return cls(**profile.temperature_fields(mode, granularity, length), **fields)

    # --- resolution against a model ---------------------------------------------------------
    def resolve(self, info: "ModelInfo") -> ResolvedAttention:
        """Concrete values for this model; errors name the value and the model's limits."""
        n_layer = int(info.block_count)
        n_head = info.head_count
        if not isinstance(n_head, int):
            raise ValueError(
                f"{info.path}: head count differs between layers ({n_head}); per-layer head counts are not supported"
            )
        l_pre = int(info.context_length)
        window = l_pre if self.window is None else int(self.window)
        ceiling = (window if window > 0 else l_pre) if self.ceiling is None else int(self.ceiling)
        if info.lambda_refusal and (window > 0 or ceiling > 0):
            raise ValueError(f"window={window}, ceiling={ceiling}: this {info.architecture} model (context length "
                             f"{l_pre}) takes no Lambda attention: {info.lambda_refusal}; use "
                             "AttentionConfig.vanilla() (window=0, ceiling=0)")
        if ceiling > 0 and info.position_encoding == "none":
            raise ValueError(
                f"ceiling={ceiling}: {info.architecture} has no position encoding (no RoPE, no ALiBi); use ceiling=0"
            )
        sinks = int(self.sinks) if window > 0 else 0
        rollback = int(self.rollback) if window > 0 else 0
        if sinks > window:
            # accepted, the cache would hold mostly sinks, and a query would attend to more of them than to its
            # own context (run --sinks 100000 --window 10 built a 100,778-cell cache and answered with a loop)
            raise ValueError(f"sinks={sinks} > window={window}: the sinks are a few first tokens every query keeps "
                             "(LM-Infinite uses 10); use sinks <= window, or a larger window")

        tau = np.asarray(self.temperature, dtype=np.float32)
        if tau.ndim == 0:
            tau = np.full((n_layer, n_head), float(tau), dtype=np.float32)
        elif tau.ndim == 1:
            if tau.shape[0] != n_layer:
                raise ValueError(
                    f"temperature has {tau.shape[0]} values; a per-layer temperature needs n_layer={n_layer}"
                )
            tau = np.repeat(tau[:, None], n_head, axis=1)
        elif tau.shape != (n_layer, n_head):
            raise ValueError(
                f"temperature has shape {tau.shape}; a per-head temperature needs (n_layer, n_head)=({n_layer}, {n_head})"
            )
        if n_head == 0 and (np.any(np.asarray(self.temperature) != 1.0) or self.temperature_schedule == "log-length"
                            or self.temperature_points is not None):
            # (the per-head table would be empty and the temperature silently gone)
            raise ValueError(f"temperature={self.temperature!r}: {info.architecture} is a recurrent model (it has no "
                             "attention layers), there is no softmax to divide; use temperature=1 and no schedule")
        swa = tuple(info.swa_layers)
        if info.no_global_attention and (
                np.any(np.asarray(self.temperature) != 1.0) or self.temperature_schedule == "log-length"
                or self.temperature_points is not None):
            # every layer would keep tau = 1 and the temperature be silently gone (patch 0014 refuses it in C)
            raise ValueError(f"temperature={self.temperature!r}: the softmax temperature is not supported with a "
                             "model without a global attention layer (every attention layer is sliding-window), whose "
                             "layers all keep tau = 1; use temperature=1 and no schedule")
        tau = _sliding_layers_at_one(tau, swa, np.ndim(self.temperature) > 0, "temperature")
        log_length = 0
        if self.temperature_schedule == "log-length":
            log_length = l_pre if self.log_length is None else int(self.log_length)
        lengths: Tuple[int, ...] = ()
        points_tau = np.zeros((0, n_layer, n_head), dtype=np.float32)
        if self.temperature_points is not None:
            lengths = tuple(int(L) for L, _ in self.temperature_points)
            points_tau = np.stack([
                _sliding_layers_at_one(_per_unit(t, n_layer, n_head, f"temperature_points tau at length {L}"), swa,
                                       np.ndim(t) > 0, f"temperature_points tau at length {L}")
                for L, t in self.temperature_points])
        top_k, top_k_layer, top_k_distance = int(self.top_k), 0, 0
        if top_k > 0:
            top_k_layer = DEFAULT_TOP_K_LAYER if self.top_k_layer is None else int(self.top_k_layer)
            if top_k_layer >= n_layer:
                raise ValueError(f"top_k_layer={top_k_layer}: {info.path} has {n_layer} layers; use a layer in "
                                 f"0..{n_layer - 1}")
            top_k_distance = (max(1, (ceiling if ceiling > 0 else window) // 2) if self.top_k_distance is None
                              else int(self.top_k_distance))
        resolved = ResolvedAttention(sinks=sinks, window=window, ceiling=ceiling, rollback=rollback,
                                     temperature=np.ascontiguousarray(tau, dtype=np.float32),
                                     log_length=log_length, points_lengths=lengths,
                                     points_tau=np.ascontiguousarray(points_tau, dtype=np.float32),
                                     top_k=top_k, top_k_layer=top_k_layer, top_k_distance=top_k_distance,
                                     top_k_scope=self.top_k_scope, memory_blocks=int(self.memory_blocks),
                                     memory_block_size=int(self.memory_block_size),
                                     memory_candidates=self.resolved_memory_candidates(),
                                     memory_selection=self.memory_selection)
        if resolved.memory and info.position_encoding not in MEMORY_POSITION_ENCODINGS:
            raise ValueError(f"memory_blocks={self.memory_blocks}: {info.architecture} has no RoPE or ALiBi, through "
                             "which the document memory scores its keys at a bounded distance; use memory_blocks=0")
        if resolved.memory and top_k > resolved.memory_cells:
            raise ValueError(f"top_k={top_k} > memory_blocks*memory_block_size={resolved.memory_cells}: the top-k keys "
                             "are chosen among the selected blocks' keys; lower top_k or raise memory_blocks")
        return resolved

    def resolved_memory_candidates(self) -> int:
        if self.memory_blocks == 0:
            return 0
        if self.memory_candidates is None:
            return MEMORY_CANDIDATES_PER_BLOCK * int(self.memory_blocks)
        return int(self.memory_candidates)


def _sliding_layers_at_one(tau: np.ndarray, swa_layers: Tuple[int, ...], per_layer: bool, what: str) -> np.ndarray:
    """tau [n_layer, n_head] with the sliding-window layers at 1, as the library keeps them: those layers never
    attend past their own window, so no length disperses them. One value applies to the global layers; values
    given per layer or head must be 1 on the sliding-window layers (anything else would be dropped)."""
    if not swa_layers:
        return tau
    rows = list(swa_layers)
    if per_layer and not np.all(tau[rows] == 1.0):
        bad = [il for il in rows if not np.all(tau[il] == 1.0)]
        raise ValueError(f"{what}: layers {bad} are sliding-window layers, whose temperature stays 1 (they never "
                         "attend past their own window); give them 1, or one value for the global layers")
    tau = np.array(tau, dtype=np.float32)
    tau[rows] = 1.0
    return tau


def _per_unit(tau: Temperature, n_layer: int, n_head: int, what: str) -> np.ndarray:
    """tau as [n_layer, n_head] from one value, one per layer, or [n_layer, n_head]."""
    t = np.asarray(tau, dtype=np.float32)
    if t.ndim == 0:
        return np.full((n_layer, n_head), float(t), dtype=np.float32)
    if t.ndim == 1 and t.shape[0] == n_layer:
        return np.repeat(t[:, None], n_head, axis=1)
    if t.shape == (n_layer, n_head):
        return t
    raise ValueError(f"{what} has shape {t.shape}: use one value, n_layer={n_layer} values, or "
                     f"(n_layer, n_head)=({n_layer}, {n_head})")
