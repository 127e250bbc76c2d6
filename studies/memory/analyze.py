"""Recall of block selection against exhaustive distance-bounded scoring, on the real keys saved by collect.py.

For every prompt, layer >= h0 and KV head g: the question's queries (captured from the Λ + exhaustive top-5
answer; all question tokens x the 3 query heads of the group) are rotated to D and scored against every
unrotated middle key [S, qs - W + 1).  Truth: each (query, head)'s top-5 keys, and its softmax over the middle.
A selection of m blocks is scored by
  key recall   fraction of the true top-5 keys inside the selected blocks
  mass recall  softmax mass of the middle inside the selected blocks
  needle       the block(s) holding the key's digits are selected
    needle_all      over all (layer >= h0, KV head) with the needle in the middle
    needle_matters  over the (layer, KV head) where exhaustive top-5 of the last question token holds a digit
Modes: chunk = one selection for the whole question chunk (max over queries and heads of the group);
       chunk_mean = same with the mean; last = the last question token alone (max over its 3 heads);
       infllm_layer (infllm4 only) = InfLLM's rule: one selection per layer shared by all KV heads, the chunk's
       mean query dotted with the averaged representative keys, summed over heads.
usage: python analyze.py OUT.json NPZ...
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

import blocks as BL

BS = [32, 64, 128]
MS = [2, 4, 8, 16]
HD = 64
BASE = 1e5
INV = BASE ** (-np.arange(0, HD, 2) / HD)


def rotD(x, D):
    ang = D * INV
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    y = np.empty_like(x)
    y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    y[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return y


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def main():
    out_path, files = sys.argv[1], sys.argv[2:]
    acc = defaultdict(lambda: defaultdict(list))  # (B, kind, mode, m) -> metric -> list
    per_layer = defaultdict(lambda: defaultdict(list))  # (B, kind, m, layer) -> needle sel list (chunk mode)
    matters_layers = defaultdict(int)
    prompts = []
    for f in files:
        z = np.load(f)
        meta = json.loads(str(z["meta"]))
        K0, RM, Q0 = z["K0"], z["recv_mass"], z["Q0"]
        L, n, G, hd = K0.shape
        H = Q0.shape[2]
        r = H // G
        S, W, D, h0 = meta["S"], meta["W"], meta["D"], meta["h0"]
        qs = meta["question_start"]
        hi = qs - W + 1
        needle = np.array([p for p in meta["needle_pos"] if S <= p < hi], int)
        prompts.append({"file": f.split("/")[-1], "middle": [S, hi], "needle_in_middle": len(needle) > 0})
        nq = Q0.shape[1]
        for li in range(h0, L):
            qD_all = rotD(Q0[li].astype(np.float32), D)  # [nq, H, hd]
            lay_sel = {}
            for B in BS:  # InfLLM's per-layer rule
                bl = BL.blocks(S, hi, B)
                vec = [BL.summarize(K0[li, :, g], RM[li, :, g], bl, "infllm4")[:, 0] for g in range(G)]
                qbar = qD_all.mean(0)  # [H, hd]
                sc = sum(vec[h // r] @ qbar[h] for h in range(H))
                lay_sel[B] = {m: np.argsort(-sc, kind="stable")[:min(m, len(bl))] for m in MS}
            for g in range(G):
                K = K0[li, S:hi, g].astype(np.float32)
                qD = qD_all[:, g * r:(g + 1) * r].reshape(-1, hd)  # rows: query-major, head-minor
                s = qD @ K.T / np.sqrt(hd)
                top5 = np.argsort(-s, axis=1, kind="stable")[:, :5]
                P = softmax(s)
                last_rows = np.arange((nq - 1) * r, nq * r)
                nd_mid = needle - S
                matters = len(nd_mid) > 0 and bool(np.isin(top5[last_rows], nd_mid).any())
                if matters:
                    matters_layers[li] += 1
                for B in BS:
                    bl = BL.blocks(S, hi, B)
                    nb = len(bl)
                    bid = np.arange(hi - S) // B
                    M = np.zeros((len(qD), nb), np.float32)
                    np.add.at(M.T, bid, P.T)
                    tb = bid[top5]  # [rows, 5] block of each true top key
                    nblk = np.unique(bid[nd_mid]) if len(nd_mid) else np.array([], int)

                    def record(key, sel, rows):
                        ins = np.zeros(nb, bool)
                        ins[sel] = True
                        d = acc[key]
                        d["key_recall"].append(float(ins[tb[rows]].mean()))
                        d["mass_recall"].append(float(M[rows][:, ins].sum(1).mean()))
                        if len(nblk):
                            hit = float(ins[nblk].any())
                            d["needle_all"].append(hit)
                            if matters:
                                d["needle_matters"].append(hit)
                        return ins

                    allrows = np.arange(len(qD))
                    for m in MS:
                        mm = min(m, nb)
                        record((B, "oracle", "chunk", m), np.argsort(-M.sum(0), kind="stable")[:mm], allrows)
                        record((B, "random", "chunk", m),
                               np.random.default_rng([li, g, B, m]).choice(nb, mm, replace=False), allrows)
                        record((B, "infllm4", "infllm_layer", m), lay_sel[B][m], allrows)
                    for kind in BL.SUMMARIES:
                        summ = BL.summarize(K0[li, :, g], RM[li, :, g], bl, kind)
                        sc = BL.block_scores(qD, summ, kind)
                        cmax, cmean, clast = sc.max(0), sc.mean(0), sc[last_rows].max(0)
                        for m in MS:
                            mm = min(m, nb)
                            ins = record((B, kind, "chunk", m), np.argsort(-cmax, kind="stable")[:mm], allrows)
                            if len(nblk):
                                per_layer[(B, kind, m)][li].append(float(ins[nblk].any()))
                            record((B, kind, "chunk_mean", m), np.argsort(-cmean, kind="stable")[:mm], allrows)
                            record((B, kind, "last", m), np.argsort(-clast, kind="stable")[:mm], last_rows)
        print("done", f, flush=True)
    res = {"settings": {"B": BS, "m": MS, "files": prompts,
                        "note": "means over prompts x layers >= h0 x KV heads; needle_* are hit rates"},
           "matters_count_by_layer": {str(k): v for k, v in sorted(matters_layers.items())},
           "recall": {}, "needle_by_layer_chunk": {}}
    for (B, kind, mode, m), d in sorted(acc.items(), key=lambda x: str(x[0])):
        res["recall"].setdefault(f"B{B}", {}).setdefault(kind, {}).setdefault(mode, {})[f"m{m}"] = {
            k: (round(float(np.mean(v)), 4) if v else None) for k, v in d.items()} | {
            "n_needle_matters": len(d.get("needle_matters", []))}
    for (B, kind, m), d in per_layer.items():
        res["needle_by_layer_chunk"].setdefault(f"B{B}", {}).setdefault(kind, {})[f"m{m}"] = {
            str(li): round(float(np.mean(v)), 3) for li, v in sorted(d.items())}
    json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
