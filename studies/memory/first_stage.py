"""Which cheap first stage keeps the needle's block among the candidates the exact rerank reads?

At Llama-2-7B's shapes the question's time is the rerank's: the keys of 1,024 candidate blocks per KV head read from
the store and multiplied by every query (8.3 s for a 14-token question at 128k). The rerank stays exact; this study
asks which first stage, held in RAM and scoring every block, lets it read far fewer candidates (128 instead of 1,024)
without losing the blocks the exact scan of every block would select. On the benchmark's needle prompts (seed 0,
trial 0) the numpy model (npmodel.py) reads the document with Λ (S = 10, W = C = 1024) and asks the question with
LM-Infinite's top-5 keys over every middle key (the exhaustive selection, so that later layers' queries see the
needle as they do when the memory finds it), keeping each layer's unrotated keys and the question's queries
(`collect`). `analyze` then scores every block of 64 tokens behind the question's window, per layer >= 5 and KV head,
with the queries rotated to D = C/2 as the memory does:

  exact            max over the block's keys and the question's queries of q.k (the rerank of every block)
  box              Quest's bound over the key channels (today's first stage)
  box-principal    the same along the principal axes of the document's first 256 keys (memory_axes="principal")
  lowrank{r}       each key's coordinates on the first r principal axes, the other axes at the block's center:
                   q_r.k_r + q_rest.center_rest, max over the block's keys (a score, not a bound)
  lowrank{r}q4     the same with the r coordinates in 4 bits within the block's range on each axis (r/2 bytes a key)
  landmark{n}      the mean of each n consecutive keys (ShadowKV's landmarks), max over the block's n-groups
  landmark{n}q4    the same landmarks rounded to ggml's Q4_0 (blocks of 32 channels, one scale each, 4.5 bits a
                   channel: half the RAM of the Q8_0 the memory keeps them in today)

and reports, over the (layer, KV head) pairs whose exact top-m (m = 64) holds a needle block, in how many the needle
block is within the first stage's best c (c = 64, 128, 256, 512), and how much of the exact top-m set the first
stage's best c holds. One JSON line per prompt and method.

    python studies/memory/first_stage.py collect --lengths 16384,32768 --depths 0,0.25,0.5,0.75
    python studies/memory/first_stage.py analyze --lengths 16384,32768 -o studies/memory/first_stage.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

S, W, C = 10, 1024, 1024  # the needle benchmark's Λ: sinks, window, ceiling
D = C // 2                # the memory's scoring distance
H0 = 5                    # the first layer that reads the memory
B, M = 64, 64             # block size, blocks selected
K_TOP = 5
N_AXES_KEYS = 256         # the library takes the principal axes from at most 4*hd first keys
CS = (64, 128, 256, 512)
METHODS = ("box", "box-principal", "lowrank8", "lowrank16", "lowrank32", "lowrank16q4", "lowrank32q4",
           "landmark8", "landmark16", "landmark16q4", "landmark32", "landmark32q4")


def prompt_for(length: int, depth: float):
    import llama_extrapolate
    from llama_extrapolate.harness import tasks
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.native import load_tokenizer

    path = str(llama_extrapolate.default_model_path())
    vocab = load_tokenizer(path)
    tok = lambda t, bos: vocab.tokenize(t.encode(), add_bos=bos)  # noqa: E731
    p = tasks.needle_prompt(tok, paul_graham_essays(), length, depth, tasks.trial_rng(0, length, depth, 0))
    digits = tok(p.key, False)
    needle = []
    for kt in (digits, digits[1:]):  # a leading-space token may differ
        starts = [i for i in range(p.question_start - len(kt)) if p.tokens[i:i + len(kt)] == kt]
        if starts:
            needle = list(range(starts[-1], starts[-1] + len(kt)))
            break
    return path, p, needle


def collect(args) -> None:
    from npmodel import NPModel

    out = Path(args.keys)
    out.mkdir(parents=True, exist_ok=True)
    model = None
    for length in args.lengths:
        for depth in args.depths:
            f = out / f"needle_{length}_{depth}.npz"
            if f.exists():
                continue
            path, p, needle = prompt_for(length, depth)
            model = model or NPModel(path)
            r = model.n_head // model.n_kv
            qs = p.question_start
            t0 = time.time()
            _, cache = model.read(p.tokens[:qs], S, W, C, chunk=256)
            t_read = time.time() - t0
            captured = {}

            def exhaustive(li, q0, pos):
                if li < H0:
                    return None
                out_g = []
                lim = (pos - W + 1)[None, :, None]
                for g in range(model.n_kv):
                    qD = model.rot(q0[:, g * r:(g + 1) * r], np.full(len(pos), D))
                    hi = pos[-1] - W + 1
                    s = np.einsum("qrd,jd->rqj", qD, cache[li]["K0"][S:hi, g])
                    s = np.where(np.arange(S, hi)[None, None, :] < lim, s, -np.inf)
                    out_g.append((np.argsort(-s, axis=-1, kind="stable")[..., :K_TOP] + S, D))
                return out_g

            def capture(li, q0, pos):
                captured[li] = q0.copy()

            h = model.extend(p.tokens[qs:], qs, cache, S, W, C, middle=exhaustive, capture=capture)
            first = int(model.logits(h[-1:])[0].argmax())
            np.savez(f, K0=np.stack([c["K0"][:qs] for c in cache[H0:]]).astype(np.float16),
                     Q0=np.stack([captured[li] for li in range(H0, model.n_layer)]),
                     meta=json.dumps({"length": length, "depth": depth, "question_start": qs, "needle": needle,
                                      "key": p.key, "first_answer_token": first, "inv_freq": model.inv_freq.tolist(),
                                      "n_head": model.n_head, "n_kv": model.n_kv, "read_s": round(t_read, 1)}))
            print(f"{f.name}: read {qs} tokens in {t_read:.0f} s", flush=True)


def rot(x: np.ndarray, d: int, inv_freq: np.ndarray) -> np.ndarray:
    """x [..., hd] rotated by RoPE at distance d (normal mode: pairs 2i, 2i+1)."""
    ang = d * inv_freq
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    y = np.empty_like(x)
    y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    y[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return y


def principal_axes(keys: np.ndarray) -> np.ndarray:
    """Rows: the principal axes of keys [n, hd], the largest variance first."""
    w, v = np.linalg.eigh(np.cov(keys.astype(np.float64), rowvar=False))
    return v[:, ::-1].T.astype(np.float32)


def q4_0_rounded(x: np.ndarray) -> np.ndarray:
    """x [..., hd] as Q4_0 holds it: per 32 channels the signed value of largest magnitude sets the scale d = v/-8,
    each channel rounded to one of the 16 steps (q - 8)*d, q in 0..15."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    idx = np.abs(blocks).argmax(-1)[..., None]
    d = np.take_along_axis(blocks, idx, -1) / -8
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.floor(blocks * inv + 8.5), 0, 15)
    return ((q - 8) * d).reshape(x.shape).astype(np.float32)


def block_scores(method: str, q: np.ndarray, k: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """Scores [n_blocks] of the blocks of keys k [n_blocks, B, hd] for the queries q [nq, hd]."""
    if method == "exact":
        return np.einsum("qd,btd->bqt", q, k, optimize=True).max(axis=(1, 2))
    if method.startswith("landmark"):
        spec = method[len("landmark"):]
        n = int(spec.removesuffix("q4"))
        lm = k.reshape(k.shape[0], B // n, n, -1).mean(2)
        if spec.endswith("q4"):
            lm = q4_0_rounded(lm)
        return np.einsum("qd,btd->bqt", q, lm, optimize=True).max(axis=(1, 2))
    if method.startswith("box"):
        if method == "box-principal":
            k, q = k @ axes.T, q @ axes.T
        lo, hi = k.min(1), k.max(1)  # [n_blocks, hd]
        c, rad = (hi + lo) / 2, (hi - lo) / 2
        return (q @ c.T + np.abs(q) @ rad.T).max(0)
    # lowrank{r}[q4]
    spec = method[len("lowrank"):]
    r = int(spec.rstrip("q4")) if spec.endswith("q4") else int(spec)
    x, qa = k @ axes.T, q @ axes.T  # coordinates along the axes
    lo, hi = x.min(1), x.max(1)
    rest = qa[:, r:] @ ((hi + lo) / 2)[:, r:].T  # [nq, n_blocks]
    xr = x[..., :r]
    if spec.endswith("q4"):
        step = (hi - lo)[:, None, :r] / 15
        codes = np.round((xr - lo[:, None, :r]) / np.where(step > 0, step, 1))
        xr = lo[:, None, :r] + codes * step
    top = np.einsum("qr,btr->bqt", qa[:, :r], xr, optimize=True).max(2)  # [n_blocks, nq]
    return (top + rest.T).max(1)


def analyze(args) -> None:
    rows = []
    for length in args.lengths:
        for f in sorted(Path(args.keys).glob(f"needle_{length}_*.npz")):
            z = np.load(f)
            meta = json.loads(str(z["meta"]))
            inv_freq = np.asarray(meta["inv_freq"])
            K0, Q0 = z["K0"].astype(np.float32), z["Q0"]
            n_kv, r = meta["n_kv"], meta["n_head"] // meta["n_kv"]
            qs = meta["question_start"]
            n_blocks = (qs - W + 1 - S) // B  # the blocks wholly behind the first question token's window
            needle_blocks = sorted({(t - S) // B for t in meta["needle"]} & set(range(n_blocks)))
            stats = {m: {"pairs": 0, "kept": {c: 0 for c in CS}, "topm_recall": {c: 0.0 for c in CS}} for m in METHODS}
            pairs_needle, t0 = 0, time.time()
            for li in range(K0.shape[0]):
                for g in range(n_kv):
                    k = K0[li, S:S + n_blocks * B, g].reshape(n_blocks, B, -1)
                    q = rot(Q0[li, :, g * r:(g + 1) * r].reshape(-1, Q0.shape[-1]), D, inv_freq)
                    axes = principal_axes(K0[li, S:S + N_AXES_KEYS, g])
                    exact = block_scores("exact", q, k, axes)
                    top_m = np.argsort(-exact, kind="stable")[:M]
                    hit = [b for b in needle_blocks if b in set(top_m.tolist())]
                    pairs_needle += bool(hit)
                    for m in METHODS:
                        order = np.argsort(-block_scores(m, q, k, axes), kind="stable")
                        rank = {int(b): i for i, b in enumerate(order)}
                        st = stats[m]
                        for c in CS:
                            st["topm_recall"][c] += len(set(order[:c].tolist()) & set(top_m.tolist())) / M
                        if hit:
                            st["pairs"] += 1
                            best = min(rank[b] for b in hit)
                            for c in CS:
                                st["kept"][c] += best < c
            n_pairs = K0.shape[0] * n_kv
            for m in METHODS:
                st = stats[m]
                rows.append({"length": length, "depth": meta["depth"], "method": m, "n_blocks": n_blocks,
                             "pairs": n_pairs, "pairs_needle_in_exact_top_m": pairs_needle,
                             "needle_kept": {str(c): st["kept"][c] for c in CS},
                             "top_m_recall": {str(c): round(st["topm_recall"][c] / n_pairs, 3) for c in CS}})
                print(json.dumps(rows[-1]), flush=True)
            print(f"{f.name}: {time.time() - t0:.0f} s", file=sys.stderr)
    with open(args.output, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("collect", "analyze"))
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[16384])
    ap.add_argument("--depths", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.25, 0.5, 0.75])
    ap.add_argument("--keys", default="/tmp/first-stage-keys", help="where collect leaves the keys and queries")
    ap.add_argument("-o", "--output", default=str(HERE / "first_stage.jsonl"))
    args = ap.parse_args(argv)
    (collect if args.step == "collect" else analyze)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
