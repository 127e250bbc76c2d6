"""A numpy forward pass of a llama-arch GGUF (SmolLM2-135M) for the document-memory study.

Weights are dequantized with gguf.quants.dequantize (float32).  RoPE is llama.cpp's "normal"
mode (adjacent pairs 2i, 2i+1), as the GGUF q/k weights are permuted for it.  Activations are
float32 (llama.cpp quantizes activations to Q8 for the Q4_1 matmuls, hence small differences).

Attention modes for reading:
  vanilla            full causal attention
  lambda(S, W, C)    LM-Infinite: sinks j < S and the W most recent keys, distance ceiling C
                     (a key at distance d >= C is scored at distance C)
The document is read once; per layer the unrotated keys K0 [n, n_kv, hd] and the values V are kept,
so that the question can be re-run cheaply under several middle-key policies (question scope).
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class NPModel:
    def __init__(self, path: str, n_layer: int | None = None):
        r = GGUFReader(path)
        f = r.fields

        def val(k):
            return f[k].contents()

        a = val("general.architecture")
        self.n_layer = int(val(f"{a}.block_count")) if n_layer is None else n_layer
        self.n_embd = int(val(f"{a}.embedding_length"))
        self.n_head = int(val(f"{a}.attention.head_count"))
        self.n_kv = int(val(f"{a}.attention.head_count_kv"))
        self.hd = self.n_embd // self.n_head
        self.eps = float(val(f"{a}.attention.layer_norm_rms_epsilon"))
        self.base = float(val(f"{a}.rope.freq_base"))
        t = {x.name: x for x in r.tensors}

        def W(name):
            x = t[name]
            return np.ascontiguousarray(dequantize(x.data, x.tensor_type).astype(np.float32))

        self.emb = W("token_embd.weight")  # [vocab, n_embd]
        self.out = W("output.weight") if "output.weight" in t else self.emb
        self.out_norm = W("output_norm.weight")
        self.L = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            self.L.append({k: W(p + k + ".weight") for k in
                           ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                            "ffn_gate", "ffn_up", "ffn_down")})
        self.inv_freq = self.base ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)

    # ---- helpers ----
    emulate = False  # emulate llama.cpp rounding: Q8 activations into quantized matmuls, f16 K/V cache

    def mm(self, x, w):
        if self.emulate:
            sh = x.shape
            xb = x.reshape(-1, sh[-1] // 32, 32)
            d = np.abs(xb).max(-1, keepdims=True) / 127.0
            d = d.astype(np.float16).astype(np.float32)
            q = np.round(xb / np.where(d == 0, 1, d))
            x = (q * d).reshape(sh)
        return x @ w.T

    def f16(self, x):
        return x.astype(np.float16).astype(np.float32) if self.emulate else x

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rot(self, x, pos):
        """Rotate x [..., n, H, hd] by positions pos [n] (normal mode: pairs 2i, 2i+1)."""
        pos = np.asarray(pos, dtype=np.float64)
        ang = pos[:, None] * self.inv_freq[None, :]  # [n, hd/2]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
        return y

    def logits(self, h):
        return self.mm(self.rms(h, self.out_norm), self.out)

    # ---- document read ----
    def read(self, tokens, sinks=0, window=0, ceiling=0, chunk=256, rep_window=0, keep_layers=None,
             callback=None):
        """Forward over `tokens` (vanilla if window == 0, else Λ with ceiling).  Returns the final hidden
        states and a per-layer cache: K0 (unrotated keys), V, and per key the attention it received
        ('recv_mass': softmax mass summed over the query heads of its group and the queries that saw it
        within `rep_window` tokens; 'recv_logit': mean raw logit of those queries, InfLLM's
        representative score)."""
        n = len(tokens)
        H, G, hd = self.n_head, self.n_kv, self.hd
        r = H // G
        pos = np.arange(n)
        x = self.emb[np.asarray(tokens)]
        cache = []
        scale = 1.0 / np.sqrt(hd)
        for li in range(self.n_layer):
            P = self.L[li]
            hN = self.rms(x, P["attn_norm"])
            q0 = self.mm(hN, P["attn_q"]).reshape(n, H, hd)
            k0 = self.mm(hN, P["attn_k"]).reshape(n, G, hd)
            v = self.mm(hN, P["attn_v"]).reshape(n, G, hd)
            q = self.rot(q0, pos)
            k = self.f16(self.rot(k0, pos))
            v = self.f16(v)
            qC = self.rot(q0, np.full(n, ceiling)) if (window and ceiling) else None
            att = np.zeros((n, H, hd), np.float32)
            recv_mass = np.zeros((n, G), np.float32)
            recv_logit = np.zeros((n, G), np.float32)
            recv_cnt = np.zeros((n,), np.float32)
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                qi = np.arange(a, b)
                lo = 0 if not window else max(0, a - window + 1)
                kj = np.arange(lo, b)
                # window/causal part
                d = qi[:, None] - kj[None, :]
                m = d >= 0
                if window:
                    m &= d < window
                for g in range(G):
                    hs = slice(g * r, (g + 1) * r)
                    s = np.einsum("ihd,jd->hij", q[a:b, hs], k[lo:b, g]) * scale  # [r, c, nk]
                    s = np.where(m[None], s, -np.inf)
                    parts = [s]
                    if window and sinks:
                        ns = min(sinks, lo)  # sinks not already in the window span
                        if ns > 0:
                            sj = np.arange(ns)
                            ds = qi[:, None] - sj[None, :]
                            ss = np.einsum("ihd,jd->hij", q[a:b, hs], k[:ns, g]) * scale
                            if ceiling:
                                ssC = np.einsum("ihd,jd->hij", qC[a:b, hs], k0[:ns, g]) * scale
                                ss = np.where((ds >= ceiling)[None], ssC, ss)
                            parts = [ss, s]
                    S_ = np.concatenate(parts, axis=-1)
                    mx = S_.max(-1, keepdims=True)
                    e = np.exp(S_ - mx)
                    pr = e / e.sum(-1, keepdims=True)
                    vv = v[lo:b, g] if len(parts) == 1 else np.concatenate([v[:ns, g], v[lo:b, g]], 0)
                    att[a:b, hs] = np.einsum("hij,jd->ihd", pr, vv)
                    if rep_window:
                        pw = pr[..., -s.shape[-1]:]
                        mm = m & (d < rep_window)
                        recv_mass[lo:b, g] += np.where(mm[None], pw, 0).sum((0, 1))
                        recv_logit[lo:b, g] += np.where(mm[None], s, 0).sum((0, 1)) / r
                if rep_window:
                    mm = (d >= 0) & (d < rep_window)
                    if window:
                        mm &= d < window
                    recv_cnt[lo:b] += mm.sum(0)
            x = x + self.mm(att.reshape(n, H * hd), P["attn_output"])
            hF = self.rms(x, P["ffn_norm"])
            g_ = self.mm(hF, P["ffn_gate"])
            u = self.mm(hF, P["ffn_up"])
            x = x + self.mm((g_ / (1 + np.exp(-g_))) * u, P["ffn_down"])
            c = {"K0": k0, "Kr": k, "V": v}
            if rep_window:
                c["recv_mass"] = recv_mass
                c["recv_logit"] = recv_logit / np.maximum(recv_cnt, 1)[:, None]
            cache.append(c)
            if callback:
                callback(li)
        return x, cache

    # ---- question / decode over a read document ----
    def extend(self, tokens, start, cache, sinks, window, ceiling, middle=None, capture=None):
        """Forward `tokens` at positions start.. over `cache` (appended in place), Λ attention (S, W, C)
        (vanilla if window == 0) plus, in layers where middle(li, q0, pos) returns a list per KV head g of
        (idx, D), extra middle keys scored at distance D (rot(q, D) . unrotated key, LM-Infinite's rule).
        idx is [m] (same keys for every query and head of the group) or [r, nq, m] (per query head and
        query).  capture(li, q0, pos) sees the unrotated queries [nq, H, hd]."""
        H, G, hd = self.n_head, self.n_kv, self.hd
        r = H // G
        nq = len(tokens)
        pos = np.arange(start, start + nq)
        x = self.emb[np.asarray(tokens)]
        scale = 1.0 / np.sqrt(hd)
        for li in range(self.n_layer):
            P = self.L[li]
            hN = self.rms(x, P["attn_norm"])
            q0 = self.mm(hN, P["attn_q"]).reshape(nq, H, hd)
            k0n = self.mm(hN, P["attn_k"]).reshape(nq, G, hd)
            vn = self.f16(self.mm(hN, P["attn_v"]).reshape(nq, G, hd))
            c = cache[li]
            c["K0"] = np.concatenate([c["K0"], k0n], 0)
            c["Kr"] = np.concatenate([c["Kr"], self.f16(self.rot(k0n, pos))], 0)
            c["V"] = np.concatenate([c["V"], vn], 0)
            K0, Kr, V = c["K0"], c["Kr"], c["V"]
            if capture:
                capture(li, q0, pos)
            mid = middle(li, q0, pos) if middle else None
            q = self.rot(q0, pos)
            qC = self.rot(q0, np.full(nq, ceiling)) if ceiling else None
            att = np.zeros((nq, H, hd), np.float32)
            for ii, p in enumerate(pos):
                lo = max(0, p - window + 1) if window else 0
                for g in range(G):
                    hs = slice(g * r, (g + 1) * r)
                    s = q[ii, hs] @ Kr[lo:p + 1, g].T * scale  # [r, nw]
                    vv = [V[lo:p + 1, g]]
                    ss = [s]
                    if window and sinks and lo > 0:
                        ns = min(sinks, lo)
                        dS = p - np.arange(ns)
                        sk = q[ii, hs] @ Kr[:ns, g].T * scale
                        if ceiling:
                            skC = qC[ii, hs] @ K0[:ns, g].T * scale
                            sk = np.where((dS >= ceiling)[None], skC, sk)
                        ss.insert(0, sk)
                        vv.insert(0, V[:ns, g])
                    S_ = np.concatenate(ss, -1)
                    VV = np.concatenate(vv, 0)
                    if mid is not None and mid[g] is not None:
                        idx, D = mid[g]
                        idx = np.asarray(idx)
                        qD = self.rot(q0[ii:ii + 1, hs], [D])[0]  # [r, hd]
                        if idx.ndim == 1:
                            idx = idx[(idx >= (sinks if window else 0)) & (idx < lo)]
                            sm = qD @ K0[idx, g].T * scale  # [r, m]
                            S_ = np.concatenate([S_, sm], -1)
                            VV = np.concatenate([VV, V[idx, g]], 0)
                            e = np.exp(S_ - S_.max(-1, keepdims=True))
                            att[ii, hs] = (e / e.sum(-1, keepdims=True)) @ VV
                            continue
                        for hh in range(r):
                            ix = idx[hh, ii]
                            ix = ix[(ix >= sinks) & (ix < lo)]
                            sm = K0[ix, g] @ qD[hh] * scale
                            s2 = np.concatenate([S_[hh], sm])
                            e = np.exp(s2 - s2.max())
                            att[ii, g * r + hh] = (e / e.sum()) @ np.concatenate([VV, V[ix, g]], 0)
                        continue
                    e = np.exp(S_ - S_.max(-1, keepdims=True))
                    att[ii, hs] = (e / e.sum(-1, keepdims=True)) @ VV
            x = x + self.mm(att.reshape(nq, H * hd), P["attn_output"])
            hF = self.rms(x, P["ffn_norm"])
            g_ = self.mm(hF, P["ffn_gate"])
            u = self.mm(hF, P["ffn_up"])
            x = x + self.mm((g_ / (1 + np.exp(-g_))) * u, P["ffn_down"])
        return x

    @staticmethod
    def truncate(cache, n):
        for c in cache:
            c["K0"] = c["K0"][:n]
            c["Kr"] = c["Kr"][:n]
            c["V"] = c["V"][:n]
