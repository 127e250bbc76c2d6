"""Block summaries of unrotated keys and block selection at a bounded distance (the study's model of the document
memory's selection).

Keys K0 are unrotated (as patch 0014 stores them).  A query q is rotated to the distance D
(qD = rot(q, D)), so qD . k0 is exactly the logit LM-Infinite gives a middle key (times 1/sqrt(hd)).

Summaries per block of B keys (one KV head):
  quest         per-channel min and max; score = sum_c max(qD_c * min_c, qD_c * max_c)  (an upper bound of qD.k)
  mean          the mean key; score = qD . mean
  infllm{k}     InfLLM: the k keys that received the most attention (softmax mass from the queries of the
                local window while they were in it), averaged into one vector; score = qD . vec
  repmass{k}    the same k keys kept apart; score = max_r qD . rep_r
  repnorm{k}    the k keys of largest norm kept apart; score = max_r qD . rep_r
Aggregation over a query chunk and the query heads of a KV group: max (default) or mean.
"""
from __future__ import annotations

import numpy as np

SUMMARIES = ["quest", "mean", "infllm1", "infllm2", "infllm4", "repmass1", "repmass2", "repmass4",
             "repnorm1", "repnorm2", "repnorm4"]


def blocks(lo: int, hi: int, B: int):
    """Block boundaries over the middle [lo, hi): full blocks plus a partial tail."""
    starts = np.arange(lo, hi, B)
    return [(int(a), int(min(a + B, hi))) for a in starts]


def summarize(K0g: np.ndarray, recv: np.ndarray, bl, kind: str):
    """K0g [n, hd] keys of one KV head, recv [n] attention received; returns an array per block."""
    out = []
    for a, b in bl:
        k = K0g[a:b].astype(np.float32)
        if kind == "quest":
            out.append(np.stack([k.min(0), k.max(0)]))
        elif kind == "mean":
            out.append(k.mean(0)[None])
        else:
            n = int(kind[-1])
            n = min(n, len(k))
            if kind.startswith("repnorm"):
                sel = np.argsort(-np.linalg.norm(k, axis=1), kind="stable")[:n]
            else:
                sel = np.argsort(-recv[a:b], kind="stable")[:n]
            reps = k[sel]
            if kind.startswith("infllm"):
                out.append(reps.mean(0)[None])
            else:
                if len(reps) < int(kind[-1]):  # pad by repeating (max is unchanged)
                    reps = np.concatenate([reps, np.repeat(reps[:1], int(kind[-1]) - len(reps), 0)])
                out.append(reps)
    return np.stack(out)  # [nb, r, hd] (quest: [nb, 2, hd])


def block_scores(qD: np.ndarray, summ: np.ndarray, kind: str):
    """qD [nQ, hd] -> scores [nQ, nb]."""
    if kind == "quest":
        lo, hi = summ[:, 0], summ[:, 1]
        return np.maximum(qD[:, None, :] * lo[None], qD[:, None, :] * hi[None]).sum(-1)
    return np.einsum("qd,brd->qbr", qD, summ).max(-1)


def select(qD: np.ndarray, summ: np.ndarray, kind: str, m: int, agg: str = "max"):
    """Top-m blocks for a set of query vectors (a chunk's queries x the heads of the group)."""
    sc = block_scores(qD, summ, kind)
    s = sc.max(0) if agg == "max" else sc.mean(0)
    m = min(m, len(s))
    return np.argsort(-s, kind="stable")[:m]
