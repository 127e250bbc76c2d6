"""Read passkey / needle prompts with the numpy model (Λ: S sinks, window W, ceiling C), then answer the
question under several middle-key policies (question scope), and save the real keys and question queries
for the block-summary recall study (analyze.py).

usage: nice -n 10 python collect.py TASK LENGTH DEPTH[,DEPTH...] [--trials N] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time

import numpy as np

import llama_extrapolate  # before llama_cpp: the patched library
import llama_cpp
from llama_extrapolate.harness.corpora import paul_graham_essays
from llama_extrapolate.harness.tasks import needle_prompt, passkey_prompt, trial_rng

import blocks as BL
from npmodel import NPModel

S, W, C = 10, 1024, 1024  # sinks, window, ceiling (W = C = 1024 so that a 4k prompt has a 3k-token middle)
D = C // 2  # top_k_distance default: C/2
H0 = 5  # top_k_layer default
K_TOP = 5  # LM-Infinite's k
E2E_B, E2E_M = 64, 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("task")
    ap.add_argument("length", type=int)
    ap.add_argument("depths")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--out", default="/tmp/memory-study-keys")
    ap.add_argument("--vanilla", action="store_true", help="also answer with full attention (reference)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    path = str(llama_extrapolate.default_model_path())
    vocab = llama_cpp.Llama(path, n_ctx=64, vocab_only=True, verbose=False)

    def tok(text, bos):
        return vocab.tokenize(text.encode("utf-8"), add_bos=bos)

    def detok(ids):
        return vocab.detokenize([int(i) for i in ids]).decode("utf-8", errors="replace")

    hay = paul_graham_essays() if a.task == "needle" else ""
    model = NPModel(path)
    r = model.n_head // model.n_kv
    results_path = f"e2e_{a.task}_{a.length}.json"
    results = json.load(open(results_path)) if os.path.exists(results_path) else {"trials": []}
    for depth in [float(x) for x in a.depths.split(",")]:
        for trial in range(a.trials):
            rng = trial_rng(a.seed, a.length, depth, trial)
            pr = (passkey_prompt(tok, a.length, depth, rng) if a.task == "passkey"
                  else needle_prompt(tok, hay, a.length, depth, rng))
            toks, qs = pr.tokens, pr.question_start
            digits = tok(pr.key, False)
            need = [i for i in range(qs - len(digits) + 1) if toks[i:i + len(digits)] == digits]
            needle_pos = sorted({i + j for i in need for j in range(len(digits))})
            t0 = time.time()
            _, cache = model.read(toks[:qs], S, W, C, chunk=256, rep_window=W)
            t_read = time.time() - t0
            mid_hi = qs - W + 1  # middle of the first question token: [S, mid_hi)
            n_new = len(pr.key) + 2
            trial_res = {"task": a.task, "length": len(toks), "depth": depth, "trial": trial, "key": pr.key,
                         "question_start": qs, "needle_pos": needle_pos, "read_s": round(t_read, 1),
                         "policies": {}}
            captured = {}

            def cap(li, q0, pos):
                if len(pos) > 1:
                    captured[li] = q0.copy()

            def exhaustive(li, q0, pos):
                if li < H0:
                    return None
                out = []
                for g in range(model.n_kv):
                    qD = model.rot(q0[:, g * r:(g + 1) * r], np.full(len(pos), D))  # [nq, r, hd]
                    hi = pos[-1] - W + 1
                    s = np.einsum("qrd,jd->rqj", qD, cache[li]["K0"][S:hi, g])
                    # a query sees middle keys j < p - W + 1 only: mask later ones for earlier queries
                    lim = (pos - W + 1)[None, :, None]
                    s2 = np.where(np.arange(S, hi)[None, None, :] < lim, s, -np.inf)
                    idx = np.argsort(-s2, axis=-1, kind="stable")[..., :K_TOP] + S
                    out.append((idx, D))
                return out

            summ_cache = {}

            def blockpol(kind, B, m, inner_topk):
                def f(li, q0, pos):
                    if li < H0:
                        return None
                    hi = pos[0] - W + 1
                    bl = BL.blocks(S, hi, B)
                    out = []
                    for g in range(model.n_kv):
                        key = (li, g, kind, B, hi)
                        if key not in summ_cache:
                            summ_cache[key] = BL.summarize(cache[li]["K0"][:, g], cache[li]["recv_mass"][:, g],
                                                           bl, kind)
                        qD = model.rot(q0[:, g * r:(g + 1) * r], np.full(len(pos), D)).reshape(-1, model.hd)
                        sel = BL.select(qD, summ_cache[key], kind, m)
                        idx = np.concatenate([np.arange(*bl[b]) for b in sorted(sel)])
                        if inner_topk:
                            qq = qD.reshape(len(pos), r, model.hd)
                            s = np.einsum("qrd,jd->rqj", qq, cache[li]["K0"][idx, g])
                            idx = idx[np.argsort(-s, axis=-1, kind="stable")[..., :K_TOP]]
                        out.append((idx, D))
                    return out
                return f

            policies = {"lambda": None, "topk5": exhaustive}
            for kind in ["quest", "infllm4", "repmass4", "mean"]:
                policies[f"{kind}_B{E2E_B}_m{E2E_M}_all"] = blockpol(kind, E2E_B, E2E_M, False)
                policies[f"{kind}_B{E2E_B}_m{E2E_M}_top5"] = blockpol(kind, E2E_B, E2E_M, True)
            for name, mid in policies.items():
                t1 = time.time()
                out_ids = []
                h = model.extend(toks[qs:], qs, cache, S, W, C, middle=mid,
                                 capture=cap if name == "topk5" else None)
                nxt = int(model.logits(h[-1:])[0].argmax())
                for step in range(n_new - 1):
                    out_ids.append(nxt)
                    h = model.extend([nxt], len(toks) + step, cache, S, W, C, middle=mid)
                    nxt = int(model.logits(h[-1:])[0].argmax())
                out_ids.append(nxt)
                NPModel.truncate(cache, qs)
                text = detok(out_ids)
                mnum = re.search(r"\d+", text)
                trial_res["policies"][name] = {"answer": text, "correct": bool(mnum and mnum.group(0) == pr.key),
                                               "s": round(time.time() - t1, 1)}
                print(a.task, len(toks), depth, trial, name, repr(text), trial_res["policies"][name]["correct"],
                      flush=True)
            if a.vanilla:
                t1 = time.time()
                hv, vcache = model.read(toks, 0, 0, 0, chunk=256)
                nxt = int(model.logits(hv[-1:])[0].argmax())
                out_ids = []
                for step in range(n_new - 1):
                    out_ids.append(nxt)
                    hv = model.extend([nxt], len(toks) + step, vcache, 0, 0, 0)
                    nxt = int(model.logits(hv[-1:])[0].argmax())
                out_ids.append(nxt)
                del vcache
                text = detok(out_ids)
                mnum = re.search(r"\d+", text)
                trial_res["policies"]["vanilla"] = {"answer": text, "correct": bool(mnum and mnum.group(0) == pr.key),
                                                    "s": round(time.time() - t1, 1)}
                print("vanilla", repr(text), trial_res["policies"]["vanilla"]["correct"], flush=True)
            # save keys + queries for analyze.py
            np.savez(os.path.join(a.out, f"{a.task}_{a.length}_{depth}_{trial}.npz"),
                     K0=np.stack([c["K0"][:qs] for c in cache]).astype(np.float16),
                     recv_mass=np.stack([c["recv_mass"][:qs] for c in cache]),
                     recv_logit=np.stack([c["recv_logit"][:qs] for c in cache]),
                     Q0=np.stack([captured[li] for li in range(model.n_layer)]),
                     meta=json.dumps({"question_start": qs, "needle_pos": needle_pos, "S": S, "W": W, "C": C, "D": D,
                                      "h0": H0, "k": K_TOP, "task": a.task, "depth": depth, "trial": trial,
                                      "length": len(toks)}))
            results["trials"] = [t for t in results["trials"] if not (t["depth"] == depth and t["trial"] == trial)]
            results["trials"].append(trial_res)
            results["settings"] = {"S": S, "W": W, "C": C, "D": D, "h0": H0, "k": K_TOP, "B": E2E_B, "m": E2E_M,
                                   "model": os.path.basename(path), "numpy_forward": "float32, dequantized weights"}
            json.dump(results, open(results_path, "w"), indent=1)


if __name__ == "__main__":
    main()
