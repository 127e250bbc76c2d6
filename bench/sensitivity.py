"""How far the default model's next-token distribution moves under perturbations far below float rounding.

One prompt (the first 26,000 characters of the essays and a question, 6,283 tokens of SmolLM2) is read under full
attention and under Lambda (W = 1024), once as it is and once with a softmax temperature of 1 + 1e-6 (the logits
divided by 1.000001), and Lambda once more in a larger cache (its cells laid out otherwise, the same keys seen). The
largest change of a log-probability among the top tokens at the prompt's end is what two runs of the same
attention can differ by when they do not compute bit for bit the same: the weights are 4-bit and each matrix
product rounds its input to 8 bits, so a change in the last bits of an attention output flips some roundings, and
over thousands of tokens read these add up. Two programs on the same library (llama-server and the Python
``Llama``) agree on greedy words only where they compute bit for bit the same (the same batches, cache layout and
re-basing: llama-server skipped the re-basing until the earlier series' patch 0022 and answered a 6k-token prompt otherwise); the tests
compare them on a tiny model, whose logits move by 1e-5 with the layout, and retrieval results are read as rates
over trials, not single answers.

    python bench/sensitivity.py        # about 4 minutes on 2 cores; writes bench/results/sensitivity.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
QUESTION = b"\n\nQuestion: what is the first essay's title? Answer:"


def top_logprobs(attention, n_ctx: int, n_top: int, threads: int) -> dict:
    from llama_extrapolate import Llama, native
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.default_model import default_model_path
    from llama_extrapolate.session import Session

    llm = Llama(str(default_model_path()), attention=attention, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        prompt = llm.tokenize(paul_graham_essays()[:26_000].encode(), add_bos=True) + llm.tokenize(QUESTION,
                                                                                                  add_bos=False)
        Session(llm).read(prompt)
        logits = native.last_logits(llm.ctx, llm.n_vocab()).astype(np.float64)
        logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        return {"tokens": len(prompt), "n_ctx": llm.n_ctx(),
                "logprobs": {int(t): float(logprobs[t]) for t in np.argsort(-logprobs)[:n_top]},
                "all": logprobs}
    finally:
        llm.close()


def main(argv=None) -> int:
    from llama_extrapolate import AttentionConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=5, help="tokens compared (the most likely of the unperturbed run)")
    args = p.parse_args(argv)

    eps = 1e-6
    runs = {
        "vanilla": (AttentionConfig.vanilla(), 8192),
        "vanilla, tau = 1 + 1e-6": (AttentionConfig(sinks=0, window=0, ceiling=0, temperature=1 + eps), 8192),
        "lambda W=1024": (AttentionConfig(sinks=10, window=1024, ceiling=1024), 2048),
        "lambda W=1024, tau = 1 + 1e-6": (AttentionConfig(sinks=10, window=1024, ceiling=1024,
                                                          temperature=1 + eps), 2048),
        "lambda W=1024, cache of 4096 cells": (AttentionConfig(sinks=10, window=1024, ceiling=1024), 4096),
    }
    got = {}
    for name, (attention, n_ctx) in runs.items():
        got[name] = top_logprobs(attention, n_ctx, args.top, args.threads)
        print(name, json.dumps(got[name]["logprobs"]))

    def moved(base: str, other: str) -> float:
        top = list(got[base]["logprobs"])
        return float(np.abs(got[base]["all"][top] - got[other]["all"][top]).max())

    out = {"prompt_tokens": got["vanilla"]["tokens"], "threads": args.threads, "perturbation": eps,
           "runs": {name: {k: v for k, v in r.items() if k != "all"} for name, r in got.items()},
           "largest_change_nats": {
               "vanilla: tau = 1 + 1e-6": moved("vanilla", "vanilla, tau = 1 + 1e-6"),
               "lambda: tau = 1 + 1e-6": moved("lambda W=1024", "lambda W=1024, tau = 1 + 1e-6"),
               "lambda: cache of 4096 cells instead of 2048": moved("lambda W=1024",
                                                                    "lambda W=1024, cache of 4096 cells")}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sensitivity.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["largest_change_nats"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
