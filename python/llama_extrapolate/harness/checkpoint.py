"""Checkpoints of a long scoring stream, so that an interrupted run goes on from where it stopped.

A 64k-token NLL run with full attention takes an hour on two cores; without a checkpoint an interruption
means starting again from token 0. A checkpoint is the library's own state file (the KV cache, and with
Lambda attention the position re-basing, patch 0007) written by llama.cpp tensor by tensor, so the state
never sits in Python memory (it would show in the peak RSS a run reports), plus a small ``.npz`` with the
scores so far and what they belong to. The ``.npz`` is written last and names the state file's size: a
checkpoint whose two halves do not match is ignored, not half-loaded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..native import clear_memory, read_state_file, write_state_file


@dataclass
class Resumed:
    """Where a stream stopped: tokens decoded, the next position, the scores so far, seconds spent."""

    done: int
    n_past: int
    nll: np.ndarray
    seconds: float


@dataclass
class StreamCheckpoint:
    """Checkpoint files ``<prefix>.state`` and ``<prefix>.npz`` for one stream.

    ``key`` says what the scores belong to (tokens digest, configuration, batch size): a checkpoint with
    another key is not loaded. ``every_seconds`` spaces the writes (a full-attention state at 64k tokens is
    1.5 GB for SmolLM2).
    """

    prefix: Path
    key: dict
    every_seconds: float = 600.0
    _last: float = field(default=0.0, init=False, repr=False)
    resumed_seconds: float = field(default=0.0, init=False)  # seconds the loaded checkpoint had spent

    def __post_init__(self) -> None:
        self.prefix = Path(self.prefix)
        if not self.every_seconds > 0:
            raise ValueError(f"every_seconds={self.every_seconds} must be > 0")
        self._last = time.perf_counter()

    @property
    def state_path(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".state")

    @property
    def meta_path(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".npz")

    def due(self) -> bool:
        return time.perf_counter() - self._last >= self.every_seconds

    def save(self, ctx, done: int, n_past: int, nll: np.ndarray, seconds: float) -> None:
        """After ``done`` tokens were decoded: their logits scored ``nll[:done]`` (each token's next one)."""
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        tmp_state = self.state_path.with_name(self.state_path.name + ".tmp")
        write_state_file(ctx, tmp_state)
        # the old pair stops matching as soon as the new state is in place: drop its metadata first
        self.meta_path.unlink(missing_ok=True)
        os.replace(tmp_state, self.state_path)
        tmp_meta = self.meta_path.with_name(self.meta_path.name + ".tmp.npz")
        np.savez(tmp_meta, nll=nll[:done], done=done, n_past=n_past, seconds=seconds,
                 key=json.dumps(self.key, sort_keys=True), state_bytes=self.state_path.stat().st_size)
        os.replace(tmp_meta, self.meta_path)
        self._last = time.perf_counter()

    def load(self, ctx, n_tokens: int) -> Optional[Resumed]:
        """The stream restored into ``ctx`` (its memory cleared first), or None when there is no matching
        checkpoint."""
        if not (self.meta_path.is_file() and self.state_path.is_file()):
            return None
        with np.load(self.meta_path) as meta:
            if str(meta["key"]) != json.dumps(self.key, sort_keys=True):
                return None
            if int(meta["state_bytes"]) != self.state_path.stat().st_size:
                return None
            done, n_past, seconds = int(meta["done"]), int(meta["n_past"]), float(meta["seconds"])
            scored = np.array(meta["nll"], dtype=np.float64)
        if not 0 < done <= n_tokens or len(scored) != min(done, n_tokens - 1):
            return None
        clear_memory(ctx)
        if read_state_file(ctx, self.state_path, 0) is None:
            raise RuntimeError(f"llama.cpp could not load the checkpoint {self.state_path} (another model or "
                               "context size?): delete it to start the stream again")
        nll = np.full(n_tokens - 1, np.nan, dtype=np.float64)
        nll[: len(scored)] = scored
        self.resumed_seconds = seconds
        return Resumed(done=done, n_past=n_past, nll=nll, seconds=seconds)

    def remove(self) -> None:
        for p in (self.meta_path, self.state_path):
            p.unlink(missing_ok=True)
