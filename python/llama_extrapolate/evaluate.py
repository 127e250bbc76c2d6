"""Streaming negative log-likelihood: the per-token loss of a long text, chunk by chunk.

A 32k-token text has 32k x n_vocab logits (6 GB for a 49k vocabulary), so the
logits of each decoded chunk are reduced to one NLL per token right away and
never kept, unlike ``llama_cpp.Llama(logits_all=True)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import llama_cpp
import numpy as np


@dataclass
class NLLResult:
    nll: np.ndarray  # nll[i] = -log p(tokens[i + 1] | tokens[: i + 1])
    seconds: float

    def bucketize(self, size: int) -> List[dict]:
        """Mean NLL and perplexity per block of `size` target positions (position = index of the target token)."""
        if size <= 0:
            raise ValueError(f"bucket size={size} must be > 0")
        out = []
        for start in range(0, len(self.nll), size):
            part = self.nll[start:start + size]
            mean = float(part.mean())
            out.append({"start": start + 1, "end": start + len(part), "nll": mean, "ppl": float(np.exp(mean))})
        return out


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    rows = logits.astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
    return lse - rows[np.arange(len(targets)), targets]


def streaming_nll(llm: llama_cpp.Llama, tokens: Sequence[int], *, n_batch: Optional[int] = None,
                  progress: bool = True, desc: str = "nll") -> NLLResult:
    """NLL of every token of `tokens` after the first, decoding `n_batch` tokens at a time from position 0."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.ndim != 1 or len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to score, got {len(tokens)}")
    n_vocab = llm.n_vocab()
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise ValueError(f"token ids must be in [0, {n_vocab}), got {tokens.min()}..{tokens.max()}")
    n_batch = llm.n_batch if n_batch is None else int(n_batch)
    if n_batch <= 0 or n_batch > llm.n_batch:
        raise ValueError(f"n_batch={n_batch} must be in 1..{llm.n_batch} (the context's n_batch)")

    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    nll = np.empty(len(tokens) - 1, dtype=np.float64)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tokens), desc=desc, unit="tok")
    t0 = time.perf_counter()
    try:
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start:start + n_batch]
            n = len(chunk)
            batch.n_tokens = n
            for i in range(n):
                batch.token[i] = int(chunk[i])
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            rc = llama_cpp.llama_decode(llm.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} at token {start} (the KV cache is full or the "
                                   "decode was aborted): raise n_ctx or use a Lambda window")
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(n, n_vocab))
            targets = tokens[start + 1:start + n + 1]
            nll[start:start + len(targets)] = _log_softmax_at(logits[: len(targets)], targets)
            if bar is not None:
                bar.update(n)
    finally:
        llama_cpp.llama_batch_free(batch)
        if bar is not None:
            bar.close()
    return NLLResult(nll=nll, seconds=time.perf_counter() - t0)
