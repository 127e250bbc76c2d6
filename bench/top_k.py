"""Top-k middle keys (LM-Infinite section 4, Appendix A.3) on the default model: passkey retrieval and cost.

``passkey``: Mohtashami & Jaggi's passkey at several lengths x 5 depths. Each prompt's document is read
once with the Lambda mask (S = 10, W = C = 8192) into a cache that keeps the middle keys
(``top_k_scope="question"``); then the question is asked again for every setting, rolling the cache back
to the end of the document in between: no top-k (plain LM-Infinite), k = 5 from layer 5 at D = C/2
(the paper's choice), and the ablations of the paper's Tables 5-7 (k, D, h0). One read serves all of
them, so every setting answers exactly the same prompts.

``cost``: tokens/s along an essay stream for each mode: Lambda with its bounded cache; Lambda reading
into a cache that keeps the middle keys (question scope while reading); top-k for every query
(scope "all"); and decode tok/s after the stream with the question-scope keys on. Plus the cache's
bytes per token (analytic: K, unrotated K and V for top-k; K and V per cell of the bounded cache) and
the peak RSS of each run.

Results: ``bench/results/top_k.json`` (written after every trial; a rerun resumes) and ``top_k.png``.

    python bench/top_k.py passkey [--lengths 8192,16384,32768] [--trials 1]
    python bench/top_k.py cost [--tokens 16384]
    python bench/top_k.py plot
    python bench/top_k.py table     # the results as markdown (one mark per depth: ✓ found, · missed)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import llama_extrapolate
from llama_extrapolate import AttentionConfig
from llama_extrapolate.jsonfile import write_json_atomic
from llama_extrapolate.native import load_tokenizer
from llama_extrapolate.resources import peak_rss_bytes, peak_rss_reset
from llama_extrapolate.default_model import default_model_path
from llama_extrapolate.model_info import read_model_info
from llama_extrapolate.harness.tasks import first_number, Stream, passkey_prompt, trial_rng

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "top_k.json"
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
N_NEW = 8
WINDOW = 8192


def settings(l_pre: int, n_layer: int) -> dict:
    """name -> (k, h0, D); k = 0 is plain Lambda attention. The paper's D values are fractions of Llama-2's
    4096 (512..4096); here the same fractions of the default model's C = 8192."""
    d0, h0 = l_pre // 2, 5
    out = {"lambda (no top-k)": (0, 0, 0), "top-k k=5 h0=5 D=C/2": (5, h0, d0)}
    for k in (1, 3, 10, 20):
        out[f"k={k}"] = (k, h0, d0)
    for frac in (0.125, 0.25, 0.75, 1.0):
        out[f"D={int(frac * l_pre)}"] = (5, h0, int(frac * l_pre))
    for h in (0, 4, 6, 8, 16, 24):
        if h < n_layer:
            out[f"h0={h}"] = (5, h, d0)
    return out


def load(path: Path) -> dict:
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass
    return {}


def save(path: Path, results: dict) -> None:
    write_json_atomic(path, results, indent=1)


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}


def run_passkey(args, results: dict) -> None:
    model = default_model_path()
    info = read_model_info(model)
    n_layer, l_pre = int(info.block_count), int(info.context_length)
    table = settings(l_pre, n_layer)
    pk = results.setdefault("passkey", {"trials": []})
    pk.update({"model": Path(model).name, "window": WINDOW, "sinks": 10, "ceiling": WINDOW, "n_new": N_NEW,
               "seed": args.seed, "settings": {k: {"k": v[0], "h0": v[1], "D": v[2]} for k, v in table.items()},
               "method": "each prompt read once with the Lambda mask into a cache that keeps the middle keys, "
                         "then the question asked once per setting (cache rolled back to the document's end)"})
    done = {(t["length"], t["depth"], t["trial"]) for t in pk["trials"]}
    lengths = [int(x) for x in args.lengths.split(",")]

    vocab = load_tokenizer(model)

    def tokenize(text: str, bos: bool):
        return vocab.tokenize(text.encode("utf-8"), add_bos=bos)

    todo = []
    for L in lengths:
        for d in DEPTHS:
            for t in range(args.trials):
                if (L, d, t) not in done:
                    rng = trial_rng(args.seed, L, d, t)
                    todo.append((L, d, t, passkey_prompt(tokenize, L, d, rng)))
    vocab.close()
    if not todo:
        print("passkey: every trial is in the results already")
        return
    n_ctx = max(len(p.tokens) for *_, p in todo) + 64
    cfg = AttentionConfig(sinks=10, window=WINDOW, ceiling=WINDOW, rollback=0, top_k=5, top_k_scope="question")
    llm = llama_extrapolate.Llama(str(model), attention=cfg, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                                  n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    stream = Stream(llm, 512, None)
    from tqdm import tqdm

    try:
        for L, d, t, p in tqdm(todo, desc="passkey", unit="prompt"):
            t0 = time.perf_counter()
            stream.reset()
            llm.set_top_k(0)
            stream.session.read(p.tokens[:p.question_start])
            read_s = time.perf_counter() - t0
            answers = {}
            for name, (k, h0, dist) in table.items():
                stream.context.rollback(p.question_start)
                llm.set_top_k(k, layer=h0, distance=dist)  # k = 0: off
                answer = stream.answer_question(p.tokens[p.question_start:], N_NEW)
                text = llm.detokenize(answer).decode("utf-8", errors="replace")
                answers[name] = {"answer": text.strip(), "correct": first_number(text) == p.key}
            pk["trials"].append({"length": L, "depth": d, "trial": t, "tokens": len(p.tokens), "key": p.key,
                                 "read_seconds": read_s, "seconds": time.perf_counter() - t0, "answers": answers})
            pk["accuracy"] = accuracy(pk["trials"])
            save(RESULTS, results)
    finally:
        stream.close()
        llm.close()


def accuracy(trials) -> dict:
    """{setting: {length: {depth: fraction correct}, "all": fraction}}."""
    acc: dict = {}
    for t in trials:
        for name, a in t["answers"].items():
            acc.setdefault(name, {}).setdefault(str(t["length"]), {}).setdefault(str(t["depth"]), []).append(
                a["correct"])
    out = {}
    for name, by_len in acc.items():
        flat = [c for ds in by_len.values() for cs in ds.values() for c in cs]
        out[name] = {L: {d: float(np.mean(cs)) for d, cs in ds.items()} for L, ds in by_len.items()}
        out[name]["all"] = float(np.mean(flat))
    return out


def run_cost(args, results: dict) -> None:
    from llama_extrapolate.harness.corpora import paul_graham_essays

    model = default_model_path()
    info = read_model_info(model)
    n_layer, n_head_kv = int(info.block_count), int(info.head_count_kv)
    head_dim = int(info.embedding_length) // int(info.head_count)
    n = args.tokens
    vocab = load_tokenizer(model)
    tokens = vocab.tokenize(paul_graham_essays().encode("utf-8"), add_bos=True)[:n + 64]
    vocab.close()
    cost = results.setdefault("cost", {})
    cost.update({"model": Path(model).name, "tokens": n, "threads": args.threads, "machine": machine(),
                 # per token of the document the top-k cache holds K, the unrotated K (0014) and V
                 "kv_bytes_per_token_top_k_f16": 3 * 2 * n_layer * n_head_kv * head_dim,
                 "kv_bytes_per_token_top_k_q8_0_k": (2 * 34 / 32 + 2) * n_layer * n_head_kv * head_dim,
                 "kv_bytes_per_cell_lambda_f16": 2 * 2 * n_layer * n_head_kv * head_dim})
    modes = {
        "lambda (bounded cache)": AttentionConfig(sinks=10, window=WINDOW, ceiling=WINDOW, rollback=0),
        "lambda, middle kept (question scope, reading)":
            AttentionConfig(sinks=10, window=WINDOW, ceiling=WINDOW, rollback=0, top_k=5, top_k_scope="question"),
        "top-k every query (k=5, h0=5)":
            AttentionConfig(sinks=10, window=WINDOW, ceiling=WINDOW, rollback=0, top_k=5, top_k_scope="all"),
    }
    from tqdm import tqdm

    for name, cfg in modes.items():
        if name in cost.get("modes", {}) and not args.force:
            continue
        peak_rss_reset()
        bounded = cfg.top_k == 0
        n_ctx = (10 + WINDOW + 512) if bounded else n + 600
        llm = llama_extrapolate.Llama(str(model), attention=cfg, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                                      n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
        stream = Stream(llm, 512, None)
        marks = {}
        try:
            stream.reset()
            t0 = time.perf_counter()
            block_t = t0
            for s in tqdm(range(0, n, 512), desc=name[:30], unit="ubatch"):
                stream.session.read(tokens[s:s + 512])
                if (s + 512) % 2048 == 0:
                    now = time.perf_counter()
                    marks[s + 512] = 2048 / (now - block_t)
                    block_t = now
            prefill = n / (time.perf_counter() - t0)
            if cfg.top_k and cfg.top_k_scope == "question":
                llm.set_top_k_active(True)
            dec = []
            for _ in range(3):
                stream.context.rollback(n)
                t1 = time.perf_counter()
                stream.answer_question(tokens[n:n + 1], 33)  # 33 decodes: the token, then 32 answer steps
                dec.append(33 / (time.perf_counter() - t1))
        finally:
            stream.close()
            llm.close()
        cost.setdefault("modes", {})[name] = {
            "prefill_tok_s": prefill, "prefill_tok_s_per_2048_block": marks, "decode_tok_s_best_of_3": max(dec),
            "decode_note": "33 tokens after the stream" + (", top-k on" if cfg.top_k else ""),
            "peak_rss_bytes": peak_rss_bytes(), "n_ctx": n_ctx}
        save(RESULTS, results)


def plot(results: dict, path: Path) -> None:
    from llama_extrapolate.harness.plots import pyplot

    plt = pyplot()

    pk = results.get("passkey", {})
    acc = pk.get("accuracy", {})
    if not acc:
        return
    lengths = sorted({int(L) for a in acc.values() for L in a if L != "all"})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ax = axes[0]
    for name in ("lambda (no top-k)", "top-k k=5 h0=5 D=C/2"):
        if name in acc:
            ys = [np.mean(list(acc[name][str(L)].values())) for L in lengths]
            ax.plot(lengths, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("passkey accuracy (mean over depths)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.set_title(f"passkey, {pk.get('model', '')}")
    ax = axes[1]
    names = [n for n in acc if n != "lambda (no top-k)"]
    ax.barh(names, [acc[n]["all"] for n in names])
    ax.set_xlabel("accuracy over all prompts")
    ax.set_xlim(0, 1)
    ax.set_title("ablations (k, D, h0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: dict) -> str:
    """Markdown tables of the results (quick look; the documents' tables come from tools/tables.py)."""
    out = []
    acc = results.get("passkey", {}).get("accuracy", {})
    if acc:
        lengths = sorted({int(L) for a in acc.values() for L in a if L != "all"})
        depths = sorted({float(d) for a in acc.values() for L, ds in a.items() if L != "all" for d in ds})
        out.append("| setting | " + " | ".join(f"{L // 1024}k" for L in lengths) + " | all |")
        out.append("|---" * (len(lengths) + 2) + "|")
        for name, a in acc.items():
            cells = []
            for L in lengths:
                ds = a.get(str(L), {})
                cells.append("".join("✓" if ds.get(str(d)) == 1.0 else ("·" if str(d) in ds else " ")
                                     for d in depths))
            out.append(f"| {name} | " + " | ".join(cells) + f" | {a['all']:.2f} |")
    modes = results.get("cost", {}).get("modes", {})
    if modes:
        out.append("")
        out.append("| mode | prefill tok/s (mean) | last 2048-token block | decode tok/s after | peak RSS MiB |")
        out.append("|---|---|---|---|---|")
        for name, m in modes.items():
            last = list(m["prefill_tok_s_per_2048_block"].values())[-1]
            out.append(f"| {name} | {m['prefill_tok_s']:.1f} | {last:.1f} | {m['decode_tok_s_best_of_3']:.1f} | "
                       f"{m['peak_rss_bytes'] / 2**20:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["passkey", "cost", "plot", "table"])
    p.add_argument("--lengths", default="8192,16384,32768")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    if args.trials < 1:
        raise SystemExit(f"--trials {args.trials} must be >= 1")
    results = load(RESULTS)
    if args.mode == "table":
        print(table(results))
        return 0
    if args.mode == "passkey":
        run_passkey(args, results)
    elif args.mode == "cost":
        if args.tokens < 4096 or args.tokens % 2048:
            raise SystemExit(f"--tokens {args.tokens}: use a multiple of 2048, at least 4096")
        run_cost(args, results)
    plot(results, RESULTS.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
