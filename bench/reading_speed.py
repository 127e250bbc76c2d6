"""Reading a long document with the document memory against the model's own speed on a 512-token prompt.

The rule `run`'s window is chosen by (RULER issue, rule (b)): reading the document with the memory takes at most
1.5x the time the model takes per token on a 512-token prompt, i.e. reads at >= 2/3 of that speed.

  prompt   the model with every knob off reads 512 tokens of the essays from an empty cache (n_ctx 1024, one batch),
           --repeats times after one untimed warm-up; the median tokens/s
  reading  for each --windows W, a fresh Llama reads --tokens tokens of the essays the way `run` reads a document
           (Λ with window W, the memory of --config, n_batch tokens at a time), timed as a whole: tokens/s and
           its ratio to the prompt speed of the same run

Both run in one process, one after the other, on a quiet machine (nothing else timed). Each window's entry is
replaced in bench/results/reading_speed.json (one entry per model, window and configuration) as it ends.

    python bench/reading_speed.py --model qwen2.5-coder-0.5b --tokens 131072 --windows 1024,4096 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "reading_speed.json"
PROMPT_TOKENS = 512
RULE = 2 / 3  # reading speed over the 512-token prompt speed that rule (b) asks for
DEFAULT_MEMORY = "lambda+memory:m=64:c=1024"  # run's default memory (m = 64, c = 16 m), with the model's default store


def essay_tokens(model: str, n: int) -> list:
    """The first n tokens of the essays, cycled past their end as the soak's (performance.py's essay_tokens), by a
    vocabulary-only load of the model."""
    sys.path.insert(0, str(HERE))
    from performance import essay_tokens as cycled

    from llama_extrapolate import native

    vocab = native.load_tokenizer(model)
    try:
        return cycled(vocab, n)
    finally:
        vocab.close()


def prompt_speed(model: str, tokens: list, repeats: int, threads: int) -> dict:
    """tokens/s of the model with every knob off on one 512-token prompt from an empty cache (median of repeats)."""
    import llama_extrapolate as le
    from llama_extrapolate.llama import thread_counts

    llm = le.Llama(model, attention=le.AttentionConfig.vanilla(), n_ctx=2 * PROMPT_TOKENS, n_batch=PROMPT_TOKENS,
                   n_ubatch=PROMPT_TOKENS, verbose=False, **thread_counts(threads))
    rates = []
    try:
        for i in range(repeats + 1):
            llm.reset()
            start = time.perf_counter()
            llm.eval(tokens[:PROMPT_TOKENS])
            if i:  # the first is the warm-up
                rates.append(PROMPT_TOKENS / (time.perf_counter() - start))
    finally:
        llm.close()
    return {"tokens": PROMPT_TOKENS, "tok_s": statistics.median(rates), "runs": rates}


def reading_speed(model: str, info, tokens: list, config: str, window: int, n_batch: int, threads: int) -> dict:
    import llama_extrapolate as le
    from llama_extrapolate.harness.evaluate import setup_for
    from llama_extrapolate.llama import thread_counts
    from tqdm import tqdm

    setup = setup_for(config, info, len(tokens), n_batch, window=window)
    llm = le.Llama(model, attention=setup.attention, n_ctx=setup.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                   verbose=False, **setup.llama_kwargs(), **thread_counts(threads))
    try:
        start = time.perf_counter()
        with tqdm(total=len(tokens), unit="tok", desc=f"W={window}") as bar:
            for at in range(0, len(tokens), n_batch):
                llm.eval(tokens[at:at + n_batch])
                bar.update(len(tokens[at:at + n_batch]))
        seconds = time.perf_counter() - start
        resolved = llm.attention_resolved
    finally:
        llm.close()
    return {"window": resolved.window, "sinks": resolved.sinks, "config": config, "tokens": len(tokens),
            "n_batch": n_batch, "seconds": seconds, "tok_s": len(tokens) / seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file or registry model name (default: the default model)")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--windows", default="1024", help="comma-separated windows W")
    ap.add_argument("--config", help="the memory's configuration name (bench/memory.py's; default: run's, m = 64, "
                    "c = 1024 and the store run takes for the model)")
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=4, help="timed 512-token prompts (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    if args.tokens < PROMPT_TOKENS or any(w < 1 for w in windows):
        raise SystemExit(f"--tokens {args.tokens} must be >= {PROMPT_TOKENS} and every window >= 1")

    import llama_extrapolate as le
    from llama_extrapolate.jsonfile import one_writer, write_json_atomic
    from llama_extrapolate.options import model_path

    model = model_path(args.model)
    info = le.read_model_info(model)
    tokens = essay_tokens(model, args.tokens)
    if args.config is None:
        from llama_extrapolate.options import memory_type_for

        args.config = f"{DEFAULT_MEMORY}:{memory_type_for(info)}"
    prompt = prompt_speed(model, tokens, args.repeats, args.threads)
    print(f"{Path(model).name}: {prompt['tok_s']:.0f} tok/s on a {PROMPT_TOKENS}-token prompt", file=sys.stderr)
    out = Path(args.out)
    for window in windows:
        run = reading_speed(model, info, tokens, args.config, window, args.n_batch, args.threads)
        run.update(model=Path(model).name, threads=args.threads, prompt=prompt,
                   ratio=run["tok_s"] / prompt["tok_s"], machine=f"{platform.machine()}, {args.threads} threads")
        print(f"W={window}: {run['tok_s']:.0f} tok/s, {run['ratio']:.2f} of the prompt speed "
              f"({'meets' if run['ratio'] >= RULE else 'misses'} 2/3)", file=sys.stderr)
        key = (run["model"], run["window"], run["config"])
        with one_writer(out):
            runs = json.loads(out.read_text())["runs"] if out.exists() else []
            runs = [r for r in runs if (r["model"], r["window"], r["config"]) != key] + [run]
            write_json_atomic(out, {"rule": RULE, "runs": sorted(runs, key=lambda r: (r["model"], r["window"]))},
                              indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
