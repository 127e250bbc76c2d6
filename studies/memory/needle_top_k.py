"""The needle with the document memory, asked several ways after one reading: which middle keys the question takes.

Each prompt of `llama-extrapolate`'s needle task (the memory benchmark's prompts: same seeds) is read once with the
Λ cache and the memory (question scope), the stream is saved, and the question is asked from that state with each
top_k given: top_k = 5 picks keys one by one among the selected blocks (each at distance D); top_k = m*B (the
most AttentionConfig allows) takes the best m*B of the keys of the m selected blocks and of the block at the
window's edge, and patch 0012 reads the blocks in the order of the text behind D. With ``--memory-blocks`` the
prompt is read once per m given (the region of m*B cells is sized at load). One JSON line per answer, so a run
stopped halfway keeps what it did.

    python studies/memory/needle_top_k.py --model qwen2.5-coder-0.5b --length 8192 --top-k 5,1024 \
        -o studies/memory/needle_top_k.jsonl
    python studies/memory/needle_top_k.py --length 8192 --memory-blocks 16,64 --top-k 5 \
        -o studies/memory/memory_needle_blocks.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from llama_extrapolate.harness import tasks
from llama_extrapolate.cli import _model_path
from llama_extrapolate.harness.corpora import paul_graham_essays
from llama_extrapolate.config import DEFAULT_MEMORY_BLOCKS
from llama_extrapolate.harness.evaluate import MEMORY_CONFIG, setup_for
from llama_extrapolate.llama import Llama
from llama_extrapolate.model_info import read_model_info
from llama_extrapolate.native import load_tokenizer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--top-k", default="5,1024", help="comma-separated top_k values to ask with")
    ap.add_argument("--memory-blocks", default=str(DEFAULT_MEMORY_BLOCKS),
                    help="comma-separated m (blocks each KV head selects) to read with")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)

    model = _model_path(args)
    info = read_model_info(model)
    vocab = load_tokenizer(model)
    haystack = paul_graham_essays()
    out = Path(args.output)
    for depth in (float(d) for d in args.depths.split(",")):
        prompt = tasks.needle_prompt(lambda t, b: vocab.tokenize(t.encode(), add_bos=b), haystack, args.length, depth,
                                     tasks.trial_rng(0, args.length, depth, args.trial), 0)
        for m in (int(x) for x in args.memory_blocks.split(",")):
            ask(model, info, prompt, depth, m, args, out)
    return 0


def ask(model, info, prompt, depth, m, args, out) -> None:
    """Read the prompt's document once with m blocks per KV head, then ask its question with each top_k."""
    setup = setup_for(f"{MEMORY_CONFIG}:m={m}", info, len(prompt.tokens) + 16, 512, window=args.window)
    llm = Llama(model, attention=setup.attention, n_ctx=setup.n_ctx, n_batch=512, n_ubatch=512,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **setup.llama_kwargs())
    stream = tasks.Stream(llm, 512, None)
    try:
        t0 = time.perf_counter()
        stream.read_document(prompt.tokens[:prompt.question_start])
        read_s = time.perf_counter() - t0
        state, n_past = llm.save_state(), stream.context.n_past
        for k in (int(x) for x in args.top_k.split(",")):
            llm.load_state(state)
            stream.context.n_past = n_past
            llm.set_top_k(k)
            t1 = time.perf_counter()
            answer = llm.detokenize(stream.ask(prompt.tokens[prompt.question_start:], 10)).decode(errors="replace")
            row = dict(model=Path(model).name, length=args.length,
                       depth=depth, trial=args.trial, top_k=k, key=prompt.key, answer=answer.strip(),
                       found=tasks.first_number(answer) == prompt.key, read_s=round(read_s, 1),
                       ask_s=round(time.perf_counter() - t1, 2),
                       memory_blocks=m,
                       memory_block_size=setup.attention.memory_block_size, window=args.window)
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    finally:
        stream.close()
        llm.close()


if __name__ == "__main__":
    sys.exit(main())
