"""Attention statistics, reduced inside llama.cpp while it decodes (patch 0010).

Calibration (attention alignment's Algorithm 1) needs the mean maximum
probability and entropy of every softmax row; its Propositions 1-2 need the
spread of the logits; the empirical receptive field needs the attention mass
by query-key distance. A 16k-token softmax is 16k x 16k x heads floats per
layer, so the library sums these per (layer, head) as it goes and only the
sums reach Python. Sums subtract, so the statistics of the queries between
two points of a stream are the difference of two readings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Dict, Iterator, Optional

import numpy as np

from .. import native

FIELDS = ("count", "pmax", "entropy", "n_keys", "logit_mean", "logit_var")


def bin_lower() -> np.ndarray:
    """Smallest query-key distance of each distance bin (0..3 exactly, then four bins per octave)."""
    return native.stats_bin_lower()


@dataclass
class AttentionStats:
    """Sums over query rows, per layer and head ([n_layer, n_head]); ``mass`` per distance bin too."""

    count: np.ndarray
    pmax: np.ndarray
    entropy: np.ndarray
    n_keys: np.ndarray
    logit_mean: np.ndarray
    logit_var: np.ndarray
    mass: np.ndarray  # [n_layer, n_head, n_bins]
    bin_lower: np.ndarray  # [n_bins]

    @classmethod
    def read(cls, llm) -> "AttentionStats":
        raw = native.stats_read(llm)
        return cls(**{k: np.array(raw[k]) for k in FIELDS}, mass=np.array(raw["mass"]), bin_lower=bin_lower())

    def __sub__(self, other: "AttentionStats") -> "AttentionStats":
        if self.count.shape != other.count.shape:
            raise ValueError(f"statistics of shapes {self.count.shape} and {other.count.shape} do not subtract")
        return AttentionStats(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                                 for f in fields(self) if f.name != "bin_lower"}, bin_lower=self.bin_lower)

    @property
    def rows(self) -> int:
        """Query rows summed (per layer and head)."""
        return int(self.count[0, 0]) if self.count.size else 0

    def _mean(self, total: np.ndarray, axis) -> np.ndarray:
        n = self.count.sum(axis=axis)
        if np.any(n == 0):
            raise ValueError("no query rows were collected: decode some tokens with statistics enabled first")
        return total.sum(axis=axis) / n

    def mean(self, name: str, granularity: str = "global"):
        """Average of a field over query rows: one number, per layer [n_layer], or per head [n_layer, n_head].

        "global" averages over all layers, heads and queries, as Algorithm 1 does.
        """
        if name not in FIELDS[1:]:
            raise ValueError(f"statistic {name!r}: use one of {', '.join(FIELDS[1:])}")
        total = getattr(self, name)
        if granularity == "global":
            return float(self._mean(total, None))
        if granularity == "layer":
            return self._mean(total, 1)
        if granularity == "head":
            return self._mean(total, ())
        raise ValueError(f"granularity={granularity!r}: use 'global', 'layer' or 'head'")

    def sigma(self, layer: Optional[int] = 0) -> float:
        """Standard deviation of the logits within a row, averaged over rows (one layer, or all for None)."""
        sel = slice(None) if layer is None else slice(layer, layer + 1)
        return float(np.sqrt(self.logit_var[sel].sum() / self.count[sel].sum()))

    def mass_by_distance(self, layer: Optional[int] = None) -> np.ndarray:
        """Attention mass per distance bin, normalised to sum 1 (one layer, or all layers for None)."""
        m = self.mass if layer is None else self.mass[layer:layer + 1]
        total = m.sum(axis=(0, 1))
        s = total.sum()
        if s <= 0:
            raise ValueError("no attention mass was collected: decode some tokens with statistics enabled first")
        return total / s

    def to_dict(self) -> Dict[str, list]:
        return {f.name: np.asarray(getattr(self, f.name)).tolist() for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Dict[str, list]) -> "AttentionStats":
        return cls(**{f.name: np.asarray(d[f.name], dtype=np.int64 if f.name == "bin_lower" else np.float64)
                      for f in fields(cls)})


REDUCE = tuple(native.STATS_REDUCE)


def set_reduce(llm, reduce: str = "auto") -> None:
    """Where the sums are taken. "host": one op on the CPU reads each layer's logits, mask and softmax in host memory
    (one pass over them; for a layer offloaded to a GPU ggml's scheduler copies the three to the host first).
    "graph": ggml ops in the graph reduce them on the backend that runs the layer's attention, and only the sums
    come back (a few passes over the matrices, no copy). "auto" (the default): "graph" for the layers whose
    attention runs off the CPU, "host" for the others."""
    if reduce not in REDUCE:
        raise ValueError(f"reduce={reduce!r}: choose one of {', '.join(REDUCE)}")
    try:
        native.stats_set_reduce(llm, reduce)
    except ValueError as e:
        raise ValueError(f"reduce={reduce!r} cannot be used on this context ({e}): the graph's ops take one "
                         "sequence, and llama_cpp.Llama opens several with embedding=True: load without "
                         "embedding=True, or use reduce='host'") from None


def reduced_on_graph(llm) -> np.ndarray:
    """[n_layer] bool: True where ggml ops in the graph reduce the layer's sums, False where the CPU op does."""
    return native.stats_layer_reduce(llm)


def enable(llm, on: bool = True) -> None:
    """Collect attention statistics while ``llm`` decodes (the graph gains one reduction per layer)."""
    try:
        native.stats_enable(llm, on)
    except ValueError as e:
        why = _model_refusal(llm)
        raise ValueError(
            f"attention statistics cannot be collected on this context ({e})"
            + (f": this model has {why}" if why else "")
            + "; they read the softmax of one unified KV cache: they need flash_attn=False, one KV stream "
            "(n_seq_max=1 or kv_unified), no top-k middle keys, and a model without sliding-window layers, "
            "recurrent layers or a K-only (MLA) cache"
        ) from None


def _model_refusal(llm) -> Optional[str]:
    """What in the model itself keeps the library from collecting statistics, named so that the user does not
    try other settings in vain (the library's status only says "not supported")."""
    info = getattr(llm, "model_info", None)
    if info is None:
        return None
    if info.swa_layers:
        return f"sliding-window layers ({len(info.swa_layers)} of {info.block_count}, cached apart)"
    if info.recurrent_layers:
        return f"recurrent layers ({len(info.recurrent_layers)} of {info.block_count}: its attention layers are " \
               "cached apart from their state)"
    if info.latent_attention:
        return "a K-only (MLA) cache, whose attention path has no statistics"
    return None


def reset(llm) -> None:
    native.stats_reset(llm)


def enabled(llm) -> bool:
    return native.stats_enabled(llm)


@contextlib.contextmanager
def collecting(llm, reduce: Optional[str] = None) -> Iterator[None]:
    """Statistics on and zeroed inside the block, off after it (the sums stay readable); ``reduce``: see
    set_reduce (None keeps the context's choice)."""
    if reduce is not None:
        set_reduce(llm, reduce)
    enable(llm, True)
    reset(llm)
    try:
        yield
    finally:
        enable(llm, False)
