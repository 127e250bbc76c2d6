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
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .modelinfo import ModelInfo

DEFAULT_SINKS = 10
# a chat turn's re-tokenized tail differs from the generated tokens by a few tokens; 256 covers it
DEFAULT_ROLLBACK = 256

Temperature = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]


def _check_count(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be a whole number of tokens (or None for the default)")
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

    @property
    def lambda_mask(self) -> bool:
        return self.window > 0

    @property
    def temperature_on(self) -> bool:
        return self.log_length > 0 or bool(np.any(self.temperature != 1.0))

    def kv_overrides(self, architecture: str) -> dict:
        """GGUF metadata overrides (llama-cpp-python's kv_overrides, llama.cpp's --override-kv)."""
        a = f"{architecture}.attention"
        out = {
            f"{a}.lambda.sink_count": int(self.sinks),
            f"{a}.lambda.window": int(self.window),
            f"{a}.lambda.ceiling": int(self.ceiling),
            f"{a}.lambda.rollback": int(self.rollback),
            f"{a}.softmax_temperature.log_length": int(self.log_length),
        }
        uniform = self.temperature.flat[0]
        if np.all(self.temperature == uniform):
            out[f"{a}.softmax_temperature"] = float(uniform)
        return out

    def check_context(self, n_ctx: int, n_ubatch: int) -> None:
        """The cache must hold the sinks, the window, the rollback margin and one ubatch."""
        need = self.required_n_ctx(n_ubatch, stream=0)
        if self.window > 0 and n_ctx < need:
            raise ValueError(
                f"window={self.window} with sinks={self.sinks} and rollback={self.rollback} needs "
                f"n_ctx >= sinks + window + rollback + n_ubatch = {need}, got n_ctx={n_ctx}: raise n_ctx or "
                "lower the window"
            )

    def required_n_ctx(self, n_ubatch: int, stream: int) -> int:
        """Smallest n_ctx for a stream of `stream` tokens: bounded with a window, the whole stream without."""
        if self.window > 0:
            return self.sinks + self.window + self.rollback + n_ubatch
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
    log L / log max(p + 1, L) with L = ``log_length`` (default L_pre).
    """

    sinks: int = DEFAULT_SINKS
    window: Optional[int] = None
    ceiling: Optional[int] = None
    rollback: int = DEFAULT_ROLLBACK
    temperature: Temperature = 1.0
    temperature_schedule: Optional[str] = None
    log_length: Optional[int] = None

    def __post_init__(self) -> None:
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
        if self.temperature_schedule not in (None, "log-length"):
            raise ValueError(
                f"temperature_schedule={self.temperature_schedule!r}: use None or 'log-length'"
            )
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
                         log_length: Optional[int] = None) -> "AttentionConfig":
        return replace(self, temperature=temperature, temperature_schedule=schedule, log_length=log_length)

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
        if ceiling > 0 and info.position_encoding == "none":
            raise ValueError(
                f"ceiling={ceiling}: {info.architecture} has no position encoding (no RoPE, no ALiBi); use ceiling=0"
            )
        sinks = int(self.sinks) if window > 0 else 0
        rollback = int(self.rollback) if window > 0 else 0

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
        log_length = 0
        if self.temperature_schedule == "log-length":
            log_length = l_pre if self.log_length is None else int(self.log_length)
        resolved = ResolvedAttention(sinks=sinks, window=window, ceiling=ceiling, rollback=rollback,
                                     temperature=np.ascontiguousarray(tau, dtype=np.float32),
                                     log_length=log_length)
        return resolved
