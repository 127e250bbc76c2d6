"""A small numpy implementation of the attention of docs/design.md, the oracle for llama.cpp.

It is written from the definition, not from llama.cpp's graph: a query at
position p scores a visible key at position j as if they were
d = min(p - j, C) apart, i.e. (R(d) q) . k with q and k *unrotated*; it
never stores rotated keys, never evicts anything and never re-bases
positions, so each of those llama.cpp mechanisms is checked against
arithmetic that does not share its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from tinymodel import TinyDeepseek2, TinyGemma2, TinyGemma3, TinyGptOss, TinyJamba, TinyLfm2, TinyLlama, TinyMPT


@dataclass
class RefAttention:
    sinks: int = 0  # S: keys j < S stay visible
    window: int = 0  # W: keys with p - j < W are visible; 0 = every past key
    ceiling: int = 0  # C: distances are min(p - j, C); 0 = none
    tau: Union[float, np.ndarray] = 1.0  # scalar, (n_layer,) or (n_layer, n_head)
    log_length: int = 0  # L_tr of tau(p) = log L_tr / log max(p + 1, L_tr); 0 = off
    top_k: int = 0  # each head of a layer >= top_k_layer adds the top_k middle keys (S <= j, p - j >= W)
    top_k_layer: int = 0
    top_k_distance: int = 0  # the distance the middle keys are scored at
    top_k_from: int = 0  # only queries at positions >= top_k_from select middle keys (the question)
    # document memory: layer -> [n_kv, m] blocks each KV head selected (the library's choice), or layer ->
    # {first position of a ubatch: [n_kv, m]} when each ubatch selected its own; the middle keys of a KV head are
    # then the tokens of its blocks (block b: positions sinks + b*memory_block .. + memory_block - 1)
    memory_blocks: Optional[dict] = None
    memory_block: int = 0
    # the keys a query no longer sees in the block at the window's edge (not wholly behind the window of its
    # ubatch's first query, so not selectable) are middle keys too; False: as the library did before they were
    memory_edge: bool = True
    # with top_k >= m*B the blocks are read in the order of the text (the library's rule, None); False: at D
    memory_order: Optional[bool] = None

    def middle(self, p: int, j: np.ndarray) -> np.ndarray:
        return (j <= p) & (j >= self.sinks) & (p - j >= self.window) if self.window > 0 else np.zeros(len(j), bool)

    def selects(self, layer: int, p: int) -> bool:
        return self.top_k > 0 and layer >= self.top_k_layer and p >= self.top_k_from

    def visible(self, p: int, j: np.ndarray) -> np.ndarray:
        causal = j <= p
        if self.window <= 0:
            return causal
        return causal & ((p - j < self.window) | (j < self.sinks))

    def distance(self, p: int, j: np.ndarray) -> np.ndarray:
        d = p - j
        return np.minimum(d, self.ceiling) if self.ceiling > 0 else d

    def temperature(self, layer: int, n_head: int, p: int) -> np.ndarray:
        tau = np.asarray(self.tau, dtype=np.float64)
        if tau.ndim == 0:
            t = np.full(n_head, float(tau))
        elif tau.ndim == 1:
            t = np.full(n_head, tau[layer])
        else:
            t = tau[layer].astype(np.float64)
        if self.log_length > 0:
            t = t * (np.log(self.log_length) / np.log(max(p + 1, self.log_length)))
        return t


# distance bins of the attention statistics: 0..3 exactly, then four per octave
STAT_BIN_LOWER = np.array([0, 1, 2, 3] + [(4 + s) << (o - 2) for o in range(2, 31) for s in range(4)], dtype=np.int64)


class RefStats:
    """Sums of the attention statistics per (layer, head), from the softmax written out in full."""

    def __init__(self, n_layer: int, n_head: int):
        shape = (n_layer, n_head)
        self.count, self.pmax, self.entropy = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.n_keys, self.logit_mean, self.logit_var = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.mass = np.zeros(shape + (len(STAT_BIN_LOWER),))

    def add(self, layer: int, logits: np.ndarray, w: np.ndarray, distances: np.ndarray) -> None:
        """logits and w (H, K) of one query over its visible keys at true distances (K,)."""
        bins = np.searchsorted(STAT_BIN_LOWER, distances, side="right") - 1
        for h in range(logits.shape[0]):
            p = w[h]
            self.count[layer, h] += 1
            self.pmax[layer, h] += p.max()
            self.entropy[layer, h] += -np.sum(p[p > 0] * np.log(p[p > 0]))
            self.n_keys[layer, h] += len(p)
            self.logit_mean[layer, h] += logits[h].mean()
            self.logit_var[layer, h] += logits[h].var()
            np.add.at(self.mass[layer, h], bins, p)


def rope_angles(d: np.ndarray, n_rot: int, base) -> np.ndarray:
    """Angles of the rotated pairs at distances d; ``base``: the frequency base, or the angle per position of
    each pair (n_rot/2 values: a model with frequency factors, TinyLlama.rope_frequencies)."""
    inv_freq = (np.asarray(base, dtype=np.float64) if np.ndim(base) else
                base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
    return np.asarray(d, dtype=np.float64)[..., None] * inv_freq  # (..., n_rot/2)


def rotate(x: np.ndarray, angles: np.ndarray, neox: bool = False) -> np.ndarray:
    """Rotate the last axis of x by angles (broadcast), ggml's NORM (adjacent pairs) or NEOX (halves)."""
    n = angles.shape[-1]
    if neox:
        x0, x1 = x[..., :n], x[..., n:2 * n]
    else:
        x0, x1 = x[..., 0:2 * n:2], x[..., 1:2 * n:2]
    c, s = np.cos(angles), np.sin(angles)
    r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
    out = np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, r0.shape[:-1] + x.shape[-1:])), dtype=np.float64)
    if neox:
        out[..., :n], out[..., n:2 * n] = r0, r1
    else:
        out[..., 0:2 * n:2], out[..., 1:2 * n:2] = r0, r1
    return out


class TopKMargin:
    """The smallest gap between the k-th and the (k+1)-th middle logit the oracle met: a selection llama.cpp
    must reproduce is only well defined when that gap is far above float rounding."""

    def __init__(self):
        self.gap = np.inf
        self.rows = 0  # (query, head) rows that had more than k middle keys

    def add(self, sorted_desc: np.ndarray, k: int) -> None:
        if len(sorted_desc) > k:
            self.gap = min(self.gap, float(sorted_desc[k - 1] - sorted_desc[k]))
            self.rows += 1


def _scores(q_i, kh_keys, d, D, rope_base, neox, alibi_slopes):
    """Logits (H, K) of one query against keys at distances d (before the temperature)."""
    if alibi_slopes is None:
        qd = rotate(q_i[None, :, :], rope_angles(d, D, rope_base)[:, None, :], neox)  # (K, H, D)
        return np.einsum("khd,khd->hk", qd, kh_keys) / np.sqrt(D)
    logits = np.einsum("hd,khd->hk", q_i, kh_keys) / np.sqrt(D)
    return logits - alibi_slopes[:, None] * np.asarray(d, dtype=np.float64)[None, :]


def half_cache(k, v, positions, *, rope_base: float, neox: bool = False, alibi: bool = False):
    """k and v as llama.cpp's f16 KV cache holds them: K rounded to half precision after its rotation to its own
    position (RoPE) and rotated back, V rounded. With this the f16 paths agree with the oracle to ~1e-2 where
    the float64 oracle alone leaves ~3e-2, so their tolerance can sit far below the effects they guard."""
    def half(x):
        return x.astype(np.float16).astype(np.float64)

    if alibi:
        return half(k), half(v)
    angles = rope_angles(np.asarray(positions), k.shape[-1], rope_base)[:, None, :]
    return rotate(half(rotate(k, angles, neox)), -angles, neox), half(v)


def attention(q, k, v, positions, cfg: RefAttention, layer: int, *, rope_base: float,
              neox: bool = False, alibi_slopes: Optional[np.ndarray] = None,
              stats: Optional[RefStats] = None, margin: Optional[TopKMargin] = None,
              f16_cache: bool = False, softcap: float = 0.0,
              sink_logits: Optional[np.ndarray] = None) -> np.ndarray:
    """q (T, H, D), k and v (T, Hkv, D), unrotated; returns (T, H, D). ``softcap`` > 0: the logits are capped,
    cap * tanh(s / cap), and then divided by the temperature (the softmax's input, the paper's definition).
    ``sink_logits`` (H,): a learned logit per head that enters every softmax beside the keys' with no value
    (gpt-oss), taking its share of the weight."""
    T, H, D = q.shape
    if f16_cache:
        k, v = half_cache(k, v, positions, rope_base=rope_base, neox=neox, alibi=alibi_slopes is not None)
    group = H // k.shape[1]
    kh = np.repeat(k, group, axis=1)  # GQA: query head h reads kv head h // group
    vh = np.repeat(v, group, axis=1)
    positions = np.asarray(positions)
    out = np.zeros((T, H, D))
    for i, p in enumerate(positions):
        keys = np.nonzero(cfg.visible(p, positions))[0]
        d = cfg.distance(p, positions[keys])
        tau = cfg.temperature(layer, H, p)[:, None]
        logits = _scores(q[i], kh[keys], d, D, rope_base, neox, alibi_slopes)
        if softcap > 0:
            assert cfg.top_k == 0, "the oracle caps the logits of the window only"
            logits = softcap * np.tanh(logits / softcap)
        logits = logits / tau
        if cfg.memory_blocks is not None and cfg.selects(layer, p):
            out[i] = _memory_heads(q[i], kh, vh, keys, logits, positions, cfg, layer, tau, group, D, rope_base,
                                   neox, alibi_slopes, margin, p)
            continue
        mid = np.nonzero(cfg.middle(p, positions))[0] if cfg.selects(layer, p) else np.zeros(0, int)
        assert sink_logits is None or len(mid) == 0, "the oracle adds sink logits to the window's softmax only"
        if len(mid) == 0:
            top = logits.max(axis=1, keepdims=True)
            if sink_logits is not None:
                top = np.maximum(top, sink_logits[:, None])
            w = np.exp(logits - top)
            w /= w.sum(axis=1, keepdims=True) + (0.0 if sink_logits is None else np.exp(sink_logits[:, None] - top))
            if stats is not None:
                stats.add(layer, logits, w, p - positions[keys])
            out[i] = np.einsum("hk,khd->hd", w, vh[keys])
            continue
        # each head adds its own top_k middle keys, all scored at distance top_k_distance (ties: earlier key)
        d_mid = np.full(len(mid), cfg.top_k_distance)
        mid_logits = _scores(q[i], kh[mid], d_mid, D, rope_base, neox, alibi_slopes) / tau
        for h in range(H):
            order = np.argsort(-mid_logits[h], kind="stable")
            if margin is not None:
                margin.add(mid_logits[h][order], cfg.top_k)
            pick = order[:cfg.top_k]
            lg = np.concatenate([logits[h], mid_logits[h][pick]])
            w = np.exp(lg - lg.max())
            w /= w.sum()
            out[i, h] = w @ np.concatenate([vh[keys, h], vh[mid[pick], h]])
    return out


def _memory_heads(q_i, kh, vh, keys, logits, positions, cfg, layer, tau, group, D, rope_base, neox, alibi_slopes,
                  margin, p):
    """One query with the document memory: each head adds the top_k keys, scored at distance top_k_distance,
    among the tokens of the blocks its KV head selected (for the ubatch of the query at position p)."""
    H = q_i.shape[0]
    out = np.zeros((H, q_i.shape[1]))
    sel = cfg.memory_blocks[layer]
    starts = [cfg.top_k_from]
    if isinstance(sel, dict):
        starts = list(sel)
        sel = sel[max(start for start in sel if start <= p)]
    sel = np.asarray(sel)
    B = cfg.memory_block
    # the keys the query no longer sees in blocks the ubatch could not select (not wholly behind the window of
    # its first query): the block at the window's edge, a middle key of every head
    first = max(start for start in starts if start <= p)
    n_sel = max(0, first - cfg.sinks - cfg.window + 1) // B
    if n_sel == 0:  # no block to select yet: the memory adds nothing
        w = np.exp(logits - logits.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        return np.einsum("hk,khd->hd", w, vh[keys])
    hidden = np.nonzero(cfg.middle(p, positions))[0]
    edge = hidden[(positions[hidden] - cfg.sinks) // B >= n_sel] if cfg.memory_edge else hidden[:0]
    for h in range(H):
        # fewer selectable blocks than m: all of them, the other slots hold none (-1); the passage keeps its m slots
        row = sel[h // group]
        m = len(row)
        blocks = np.sort(row[row >= 0])
        assert len(blocks) == min(m, n_sel), "the selection must hold every selectable block, or m of them"
        toks = (cfg.sinks + blocks[:, None] * B + np.arange(B)[None, :]).ravel()
        mid = np.nonzero(np.isin(positions, toks))[0]
        assert len(mid) == len(toks), "a selected block lies outside the sequence"
        assert not np.isin(mid, edge).any(), "a selected block is not wholly behind the window"
        d_mid = np.full(len(mid) + len(edge), cfg.top_k_distance)
        if (cfg.top_k >= m * B if cfg.memory_order is None else cfg.memory_order) and alibi_slopes is None:
            # every key of the blocks is a middle key: they are read in the order of the text behind D (RoPE), the
            # block ranked r of the m (ascending block index) at D + (m - 1 - r)*B, its token o at + B - 1 - o, so
            # the m blocks read as one passage that ends D tokens before the query (a smaller top_k: all at D).
            # mid is in position order: rank r of the block, o of the token in it
            rank, o = np.divmod(np.arange(len(mid)), B)
            d_mid[:len(mid)] += (m - 1 - rank) * B + (B - 1 - o)
        mid = np.concatenate([mid, edge])
        mid_logits = _scores(q_i, kh[mid], d_mid, D, rope_base, neox, alibi_slopes)[h] / tau[h]
        order = np.argsort(-mid_logits, kind="stable")
        if margin is not None:
            margin.add(mid_logits[order], cfg.top_k)
        pick = order[:cfg.top_k]
        lg = np.concatenate([logits[h], mid_logits[pick]])
        w = np.exp(lg - lg.max())
        w /= w.sum()
        out[h] = w @ np.concatenate([vh[keys, h], vh[mid[pick], h]])
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1 + np.exp(-x))


def silu_ffn(x, w, il, eps):
    """Layer il's feed-forward part of the llama layout: RMS norm, then down(silu(gate) * up)."""
    h = rms_norm(x, w[f"blk.{il}.ffn_norm.weight"], eps)
    g = h @ w[f"blk.{il}.ffn_gate.weight"].T
    u = h @ w[f"blk.{il}.ffn_up.weight"].T
    return (silu(g) * u) @ w[f"blk.{il}.ffn_down.weight"].T


def forward(model: TinyLlama, tokens: Sequence[int], cfg: Optional[RefAttention] = None,
            positions: Optional[Sequence[int]] = None, stats: Optional[RefStats] = None,
            margin: Optional[TopKMargin] = None, f16_cache: bool = False,
            capture: Optional[dict] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny llama model for the whole token sequence (f16_cache: K and V rounded as in
    llama.cpp's default f16 cache, see half_cache; capture: layer -> (q, k, v), q and k before RoPE, filled when given)."""
    cfg = cfg or RefAttention()
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T = len(tokens)
    positions = np.arange(T) if positions is None else np.asarray(positions)
    H, Hkv, D = model.n_head, model.n_head_kv, model.head_dim
    x = w["token_embd.weight"][tokens]
    for il in range(model.n_layer):
        h = rms_norm(x, w[f"blk.{il}.attn_norm.weight"], model.rms_eps)
        q = (h @ w[f"blk.{il}.attn_q.weight"].T).reshape(T, H, D)
        k = (h @ w[f"blk.{il}.attn_k.weight"].T).reshape(T, Hkv, D)
        v = (h @ w[f"blk.{il}.attn_v.weight"].T).reshape(T, Hkv, D)
        if capture is not None:
            capture[il] = (q, k, v)
        # a NoPE layer scores as ALiBi with zero slopes would: q.k at every distance; RoPE scales q and k by the
        # attention factor as it rotates them
        nope = None if model.has_rope(il) else np.zeros(H)
        if nope is None and model.rope_magnitude() != 1.0:
            q, k = q * model.rope_magnitude(), k * model.rope_magnitude()
        # temperature tuning (Llama 4, mistral3): q scaled by a function of its position in the text
        q = q * model.attn_temp_factor(positions)[:, None, None]
        a = attention(q, k, v, positions, cfg, il, rope_base=model.rope_frequencies(), neox=model.neox,
                      alibi_slopes=nope, stats=stats, margin=margin, f16_cache=f16_cache)
        x = x + a.reshape(T, H * D) @ w[f"blk.{il}.attn_output.weight"].T
        x = x + silu_ffn(x, w, il, model.rms_eps)
    x = rms_norm(x, w["output_norm.weight"], model.rms_eps)
    return x @ w["output.weight"].T


def forward_mla(model: TinyDeepseek2, tokens: Sequence[int], cfg: Optional[RefAttention] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny DeepSeek-V2 (multi-head latent attention), written out as the attention it
    means rather than as llama.cpp computes it: each head's key is its own, the latent c_j (normalised) taken up by
    the head's W_k_b next to the shared RoPE part, and its value W_v_b c_j. llama.cpp caches c_j and the RoPE part
    once per token and folds W_k_b into the query and W_v_b after the softmax (the same sums, in another order).
    The RoPE part goes first in each head here, so that ``attention`` rotates it (and the rest as NoPE never)."""
    cfg = cfg or RefAttention()
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T, H, r = len(tokens), model.n_head, model.kv_lora_rank
    dn, dr, dv = model.n_nope, model.n_rot, model.n_v
    assert dv == dn + dr, "attention() returns values of the query's size"
    angles = model.rope_base ** (-np.arange(0, dr, 2, dtype=np.float64) / dr)  # per pair: only dr of dn + dr turn
    positions = np.arange(T)
    x = w["token_embd.weight"][tokens]
    for il in range(model.n_layer):
        h = rms_norm(x, w[f"blk.{il}.attn_norm.weight"], model.rms_eps)
        q = (h @ w[f"blk.{il}.attn_q.weight"].T).reshape(T, H, dn + dr)
        kv = h @ w[f"blk.{il}.attn_kv_a_mqa.weight"].T
        c = rms_norm(kv[:, :r], w[f"blk.{il}.attn_kv_a_norm.weight"], model.rms_eps)  # (T, r)
        k_pe = kv[:, r:]  # (T, dr), one for every head
        k_nope = np.einsum("tr,hrn->thn", c, w[f"blk.{il}.attn_k_b.weight"])  # (T, H, dn)
        v = np.einsum("tr,hvr->thv", c, w[f"blk.{il}.attn_v_b.weight"])  # (T, H, dv)
        q = np.concatenate([q[:, :, dn:], q[:, :, :dn]], axis=2)
        k = np.concatenate([np.repeat(k_pe[:, None, :], H, axis=1), k_nope], axis=2)
        a = attention(q, k, v, positions, cfg, il, rope_base=angles)
        x = x + a.reshape(T, H * dv) @ w[f"blk.{il}.attn_output.weight"].T
        x = x + silu_ffn(x, w, il, model.rms_eps)
    x = rms_norm(x, w["output_norm.weight"], model.rms_eps)
    return x @ w["output.weight"].T


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    # the tanh form, as ggml computes GELU
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward_mpt(model: TinyMPT, tokens: Sequence[int], cfg: Optional[RefAttention] = None,
                stats: Optional[RefStats] = None, margin: Optional[TopKMargin] = None,
                f16_cache: bool = False, capture: Optional[dict] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny MPT-like (ALiBi) model, or a GPT-2 (TinyGpt2: a learned embedding per position,
    biases, no ALiBi) (f16_cache: K and V rounded to half precision; capture: layer -> (q, k, v), filled when given)."""
    cfg = cfg or RefAttention()
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T, H, D, d = len(tokens), model.n_head, model.head_dim, model.n_embd
    positions = np.arange(T)
    slopes = model.alibi_slopes()

    def bias(name):  # MPT has none of these
        return w.get(name, 0.0)

    x = w["token_embd.weight"][tokens]
    if "position_embd.weight" in w:
        x = x + w["position_embd.weight"][positions]
    for il in range(model.n_layer):
        h = layer_norm(x, w[f"blk.{il}.attn_norm.weight"], w[f"blk.{il}.attn_norm.bias"], model.norm_eps)
        qkv = h @ w[f"blk.{il}.attn_qkv.weight"].T + bias(f"blk.{il}.attn_qkv.bias")
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(T, H, D) for i in range(3))
        if capture is not None:
            capture[il] = (q, k, v)
        a = attention(q, k, v, positions, cfg, il, rope_base=0.0, alibi_slopes=slopes, stats=stats, margin=margin,
                      f16_cache=f16_cache)
        x = x + a.reshape(T, d) @ w[f"blk.{il}.attn_output.weight"].T + bias(f"blk.{il}.attn_output.bias")
        h = layer_norm(x, w[f"blk.{il}.ffn_norm.weight"], w[f"blk.{il}.ffn_norm.bias"], model.norm_eps)
        up = h @ w[f"blk.{il}.ffn_up.weight"].T + bias(f"blk.{il}.ffn_up.bias")
        x = x + gelu(up) @ w[f"blk.{il}.ffn_down.weight"].T + bias(f"blk.{il}.ffn_down.bias")
    x = layer_norm(x, w["output_norm.weight"], w["output_norm.bias"], model.norm_eps)
    return x @ w["output.weight"].T


def forward_gemma3(model: Union[TinyGemma3, TinyGemma2], tokens: Sequence[int], cfg: Optional[RefAttention] = None,
                   positions: Optional[Sequence[int]] = None, swa: Optional[RefAttention] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny Gemma 3 (or Gemma 2: no q/k norms, softcapped logits, tied output): cfg is the
    global layers' attention; the sliding-window layers see the last ``sliding_window`` keys (no sinks, no ceiling,
    tau = 1) with their own RoPE base (``swa``: another attention for them, to show what a library that changed them
    would compute)."""
    gemma2 = isinstance(model, TinyGemma2)
    cfg = cfg or RefAttention()
    swa = swa or RefAttention(window=model.sliding_window)
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T = len(tokens)
    positions = np.arange(T) if positions is None else np.asarray(positions)
    H, Hkv, D, eps = model.n_head, model.n_head_kv, model.head_dim, model.rms_eps
    x = w["token_embd.weight"][tokens] * np.sqrt(model.n_embd)
    for il in range(model.n_layer):
        is_swa = model.is_swa(il)
        h = rms_norm(x, w[f"blk.{il}.attn_norm.weight"], eps)
        q = (h @ w[f"blk.{il}.attn_q.weight"].T).reshape(T, H, D)
        k = (h @ w[f"blk.{il}.attn_k.weight"].T).reshape(T, Hkv, D)
        if not gemma2:
            q, k = rms_norm(q, w[f"blk.{il}.attn_q_norm.weight"], eps), rms_norm(k, w[f"blk.{il}.attn_k_norm.weight"], eps)
        v = (h @ w[f"blk.{il}.attn_v.weight"].T).reshape(T, Hkv, D)
        a = attention(q, k, v, positions, swa if is_swa else cfg, il,
                      rope_base=model.rope_base_swa if is_swa else model.rope_base, neox=True,
                      softcap=model.attn_softcap if gemma2 else 0.0)
        x = x + rms_norm(a.reshape(T, H * D) @ w[f"blk.{il}.attn_output.weight"].T,
                         w[f"blk.{il}.post_attention_norm.weight"], eps)
        h = rms_norm(x, w[f"blk.{il}.ffn_norm.weight"], eps)
        f = (gelu(h @ w[f"blk.{il}.ffn_gate.weight"].T) * (h @ w[f"blk.{il}.ffn_up.weight"].T)) @ w[f"blk.{il}.ffn_down.weight"].T
        x = x + rms_norm(f, w[f"blk.{il}.post_ffw_norm.weight"], eps)
    x = rms_norm(x, w["output_norm.weight"], eps)
    if gemma2:
        out = x @ w["token_embd.weight"].T
        return model.final_softcap * np.tanh(out / model.final_softcap)
    return x @ w["output.weight"].T


def forward_gptoss(model: TinyGptOss, tokens: Sequence[int], cfg: Optional[RefAttention] = None,
                   sinks: bool = True) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny gpt-oss: sliding-window layers (the even ones, the last ``sliding_window``
    keys) and global ones (``cfg``) alternating, NEOX RoPE, a learned sink logit per head in every softmax
    (``sinks=False`` leaves them out, to show they matter), a bias on the attention output, then a mixture of experts
    after the post-attention norm: the router (with its bias) picks the top expert (one is used here, weight 1),
    whose gate and up rows (with biases) go through OpenAI's clamped SwiGLU, min(g, 7) * sigmoid(1.702 min(g, 7)) *
    (clip(u, -7, 7) + 1), and its down rows (with a bias)."""
    cfg = cfg or RefAttention()
    swa = RefAttention(window=model.sliding_window)
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T, H, Hkv, D, eps = len(tokens), model.n_head, model.n_head_kv, model.head_dim, 1e-5
    positions = np.arange(T)
    x = w["token_embd.weight"][tokens]
    for il in range(model.n_layer):
        b = f"blk.{il}."
        h = rms_norm(x, w[b + "attn_norm.weight"], eps)
        q = (h @ w[b + "attn_q.weight"].T).reshape(T, H, D)
        k = (h @ w[b + "attn_k.weight"].T).reshape(T, Hkv, D)
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, Hkv, D)
        a = attention(q, k, v, positions, swa if model.is_swa(il) else cfg, il, rope_base=10000.0, neox=True,
                      sink_logits=w[b + "attn_sinks.weight"] if sinks else None)
        x = x + a.reshape(T, H * D) @ w[b + "attn_output.weight"].T + w[b + "attn_output.bias"]
        h = rms_norm(x, w[b + "post_attention_norm.weight"], eps)
        expert = np.argmax(h @ w[b + "ffn_gate_inp.weight"].T + w[b + "ffn_gate_inp.bias"], axis=1)
        for t, e in enumerate(expert):
            g = np.minimum(w[b + "ffn_gate_exps.weight"][e] @ h[t] + w[b + "ffn_gate_exps.bias"][e], 7.0)
            u = np.clip(w[b + "ffn_up_exps.weight"][e] @ h[t] + w[b + "ffn_up_exps.bias"][e], -7.0, 7.0)
            act = g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)
            x[t] = x[t] + w[b + "ffn_down_exps.weight"][e] @ act + w[b + "ffn_down_exps.bias"][e]
    x = rms_norm(x, w["output_norm.weight"], eps)
    return x @ w["output.weight"].T


def _forward_hybrid(model, tokens, mixer, attend, out_norm: str) -> np.ndarray:
    """The layer loop the hybrid families share: RMS norm, then the layer's recurrent mixer ``mixer(h, w, il)`` or
    ``attend(q, k, v, il)`` (q, k, v: the attention projections of the normed input, per head), a residual, then the
    llama layout's SwiGLU FFN; logits through the ``out_norm`` RMS norm and ``output``."""
    w = {name: t.astype(np.float64) for name, t in model.weights.items()}
    tokens = np.asarray(tokens)
    T, H, Hkv, D, eps = len(tokens), model.n_head, model.n_head_kv, model.head_dim, model.rms_eps
    x = w["token_embd.weight"][tokens]
    for il in range(model.n_layer):
        h = rms_norm(x, w[f"blk.{il}.attn_norm.weight"], eps)
        if model.is_recurrent(il):
            x = x + mixer(h, w, il)
        else:
            q, k, v = ((h @ w[f"blk.{il}.attn_{p}.weight"].T).reshape(T, n, D)
                       for p, n in (("q", H), ("k", Hkv), ("v", Hkv)))
            x = x + attend(q, k, v, w, il).reshape(T, H * D) @ w[f"blk.{il}.attn_output.weight"].T
        x = x + silu_ffn(x, w, il, eps)
    return rms_norm(x, w[out_norm], eps) @ w["output.weight"].T


def forward_lfm2(model: TinyLfm2, tokens: Sequence[int], cfg: Optional[RefAttention] = None,
                 margin: Optional[TopKMargin] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny LFM2: the attention layers as in ``forward`` (q and k RMS-normed per head, NEOX
    RoPE); a convolution layer splits in_proj(h) into b, c, x and gives out_proj(c * conv(b * x)), conv causal over
    the last l_cache inputs of each channel. No attention knob reaches those layers: they see every token."""
    cfg = cfg or RefAttention()
    T, L, eps = len(tokens), model.l_cache, model.rms_eps

    def short_conv(h, w, il):
        b, c, u = np.split(h @ w[f"blk.{il}.shortconv.in_proj.weight"].T, 3, axis=1)
        bu = np.concatenate([np.zeros((L - 1, model.n_embd)), b * u])
        kernel = w[f"blk.{il}.shortconv.conv.weight"]  # (d, L): tap L - 1 is the current input
        conv = sum(bu[j:j + T] * kernel[:, j] for j in range(L))
        return (c * conv) @ w[f"blk.{il}.shortconv.out_proj.weight"].T

    def attend(q, k, v, w, il):
        q, k = (rms_norm(t, w[f"blk.{il}.attn_{p}_norm.weight"], eps) for t, p in ((q, "q"), (k, "k")))
        return attention(q, k, v, np.arange(T), cfg, il, rope_base=model.rope_frequencies(), neox=True, margin=margin)

    return _forward_hybrid(model, tokens, short_conv, attend, "token_embd_norm.weight")


def mamba_mixer(h, w, il, eps):
    """Layer il's Mamba-1 selective state-space layer over the normed inputs h (T, n_embd), from a zero state, as the
    Mamba paper defines it: x and the gate z from in_proj; x through a causal depthwise convolution over the last
    d_conv inputs of each channel (plus its bias), then silu; dt, B and C from x_proj (Jamba RMS-norms each when the
    model has the norms); delta = softplus(dt_proj(dt) + bias) per channel; the state h_c (d_state per channel c)
    decays and takes the input, h_c <- exp(delta_c A_c) h_c + delta_c x_c B, and gives y_c = C . h_c; then
    out_proj((y + D x) * silu(z))."""
    b = f"blk.{il}."
    T = len(h)
    x, z = np.split(h @ w[b + "ssm_in.weight"].T, 2, axis=1)  # (T, d_inner) each
    kernel = w[b + "ssm_conv1d.weight"]  # (d_inner, d_conv): tap d_conv - 1 is the current input
    d_conv = kernel.shape[1]
    past = np.concatenate([np.zeros((d_conv - 1, x.shape[1])), x])
    x = silu(sum(past[j:j + T] * kernel[:, j] for j in range(d_conv)) + w[b + "ssm_conv1d.bias"])
    A = w[b + "ssm_a"]  # (d_inner, d_state), negative
    rank = w[b + "ssm_dt.weight"].shape[1]
    dt, B, C = np.split(x @ w[b + "ssm_x.weight"].T, [rank, rank + A.shape[1]], axis=1)
    if b + "ssm_dt_norm.weight" in w:
        dt, B, C = (rms_norm(v, w[b + f"ssm_{name}_norm.weight"], eps) for v, name in ((dt, "dt"), (B, "b"), (C, "c")))
    delta = np.logaddexp(0.0, dt @ w[b + "ssm_dt.weight"].T + w[b + "ssm_dt.bias"])  # softplus, (T, d_inner)
    decay = np.exp(delta[:, :, None] * A)  # (T, d_inner, d_state)
    state = np.zeros_like(A)
    y = np.empty_like(x)
    for t in range(T):
        state = decay[t] * state + (delta[t] * x[t])[:, None] * B[t]
        y[t] = state @ C[t]
    return ((y + w[b + "ssm_d"] * x) * silu(z)) @ w[b + "ssm_out.weight"].T


def forward_jamba(model: TinyJamba, tokens: Sequence[int], cfg: Optional[RefAttention] = None,
                  margin: Optional[TopKMargin] = None, rope_base: Optional[float] = None) -> np.ndarray:
    """Logits (T, n_vocab) of a tiny Jamba: Mamba-1 layers (``mamba_mixer``, which no attention knob reaches: they
    see every token) and attention layers with no position encoding, whose logit is q.k / sqrt(D) at every
    distance: ``attention`` scores them as ALiBi with zero slopes, so the Lambda mask, the temperature and the top-k
    keys act as on the other families (a distance ceiling has nothing to bound). Every layer ends in the llama
    layout's SwiGLU FFN. ``rope_base``: rotate q and k as a llama would instead (not the model: to show that a
    library which rotated them would fail)."""
    cfg = cfg or RefAttention()
    T = len(tokens)

    def attend(q, k, v, w, il):
        return attention(q, k, v, np.arange(T), cfg, il, rope_base=rope_base or 0.0,
                         alibi_slopes=np.zeros(model.n_head) if rope_base is None else None, margin=margin)

    return _forward_hybrid(model, tokens, lambda h, w, il: mamba_mixer(h, w, il, model.rms_eps), attend,
                           "output_norm.weight")
