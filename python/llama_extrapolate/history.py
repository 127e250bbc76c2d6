"""Token ids of an unbounded stream, by absolute index, keeping only the most recent ones.

llama-cpp-python keeps every token id of the stream in ``Llama.input_ids`` and
indexes it by absolute position (``input_ids[n_past:n_past + n] = batch``,
``input_ids[:n_tokens]``, ``input_ids[i]``). With a Lambda window the stream
is unbounded, so this keeps at most ``capacity`` ids (the most recent; it grows
on demand and drops the oldest half when full) and answers those index
patterns for them: slices are clipped to what is kept, a read of a dropped id
is an IndexError.

The default capacity is large (4M ids, 16 MiB at most) because llama-cpp-python
reuses a cached prompt prefix only if it can compare the prompt with the
stream from its first token: a multi-turn chat over a long document continues
its stream, and re-reading the document for every turn would be slow.
"""

from __future__ import annotations

import numpy as np


DEFAULT_CAPACITY = 1 << 22


class TokenHistory:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2:
            raise ValueError(f"capacity={capacity} must be >= 2")
        self._buf = np.zeros(min(capacity, 4096), dtype=np.intc)
        self.capacity = capacity
        self.start = 0  # absolute index of _buf[0]
        self.end = 0  # absolute index one past the last kept id

    @property
    def dtype(self):
        return self._buf.dtype

    def __len__(self) -> int:
        return self.end - self.start

    def _span(self, key: slice) -> tuple:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("TokenHistory supports integer indices and contiguous slices")
        a = 0 if key.start is None else key.start
        b = self.end if key.stop is None else key.stop
        if a < 0 or b < 0:
            raise IndexError("TokenHistory takes absolute, non-negative positions")
        return a, b

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            if not self.start <= key < self.end:
                raise IndexError(f"token {key} is not kept (kept: {self.start}..{self.end - 1})")
            return self._buf[key - self.start]
        a, b = self._span(key)
        a, b = max(a, self.start), min(b, self.end)
        return self._buf[a - self.start:max(a, b) - self.start]

    def __setitem__(self, key, values) -> None:
        a, b = self._span(key)
        values = np.asarray(values, dtype=np.intc).reshape(-1)
        if b - a != len(values):
            raise ValueError(f"cannot write {len(values)} ids into positions {a}..{b - 1}")
        if a < self.start or a > self.end:
            raise IndexError(f"write at {a} outside the kept range {self.start}..{self.end}")
        self.end = a  # a write truncates what followed (the stream was rolled back)
        if len(values) >= self.capacity:
            values = values[-self.capacity:]
            self.start = self.end = b - len(values)
        need = (self.end - self.start) + len(values)
        if need > self.capacity:
            # full: keep the most recent half (at least room for the new ids)
            keep = min(self.capacity // 2, self.capacity - len(values))
            self._buf[:keep] = self._buf[self.end - self.start - keep:self.end - self.start]
            self.start = self.end - keep
            need = keep + len(values)
        if need > len(self._buf):
            grown = np.zeros(min(self.capacity, max(need, 2 * len(self._buf))), dtype=np.intc)
            grown[: self.end - self.start] = self._buf[: self.end - self.start]
            self._buf = grown
        self._buf[self.end - self.start:self.end - self.start + len(values)] = values
        self.end += len(values)

    def reset(self) -> None:
        self.start = self.end = 0

    def copy(self) -> np.ndarray:
        return self._buf[: self.end - self.start].copy()

    def tolist(self) -> list:
        """The ids from position 0, for llama-cpp-python's prefix matching (a LlamaCache item); once the oldest
        ids were dropped no prefix can be compared from 0, so the answer is empty: no match, the prompt is read."""
        return self._buf[: self.end - self.start].tolist() if self.start == 0 else []
