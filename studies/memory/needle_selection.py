"""Does the question select the needle's block? By length and m, on the memory benchmark's needle prompts.

Each prompt (the seeds of needle_top_k.py) is read with the memory (W = 1024, question scope), asked with the
top-5 keys and answered greedily; after the question and after every answer step each (layer >= h0, KV head)
pair's selection (``Llama.memory_selection``) is searched for the block(s) holding the needle's digits. One JSON
line per prompt and m: the answer, how many pairs selected a needle block at each step, and the needle block's
rank in each selecting pair's (score-ordered) selection for the question.

    python studies/memory/needle_selection.py --lengths 8192,16384,32768 --depths 0 --ms 64,256 --cs 0
    python studies/memory/needle_selection.py --lengths 16384,32768 --depths 0 --ms 64 --cs 256
    python studies/memory/needle_selection.py --task needle-multi --model qwen2.5-coder-0.5b --lengths 16384 \
        --depths 0.5,0.75 --ms 64 --cs 1024

--task needle-multi: the prompts of the multi-key needle (the benchmark's, trial for trial), whose distractor lines
say the same words for other magic words; each row also gives the distractors' blocks, how many pairs select one
at each step and their best rank per pair for the question, beside the needle's.
--cs: the candidates the exact q.k reranks (0: the bound selects the m blocks).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from llama_extrapolate.harness import tasks
from llama_extrapolate.cli import _model_path
from llama_extrapolate.harness.corpora import paul_graham_essays
from llama_extrapolate.harness.evaluate import MEMORY_CONFIG, setup_for
from llama_extrapolate.llama import Llama
from llama_extrapolate.model_info import read_model_info
from llama_extrapolate.native import load_tokenizer

WINDOW, N_NEW = 1024, 10
RESULTS = Path(__file__).resolve().parent  # the study's runs sit beside its scripts


def needle_blocks(prompt: tasks.Prompt, key_tokens, sinks: int, block: int):
    """The token span of the needle's digits (its last occurrence before the question) and the blocks holding it."""
    for kt in (key_tokens, key_tokens[1:]):  # a leading-space token may differ
        starts = [i for i in range(prompt.question_start - len(kt)) if prompt.tokens[i:i + len(kt)] == kt]
        if starts:
            span = (starts[-1], starts[-1] + len(kt))
            return span, sorted({(t - sinks) // block for t in range(*span)})
    return None, []


def distractor_numbers(prompt: tasks.Prompt, detokenize) -> list:
    """The numbers of the needle lines other than the one asked (the multi-key needle's distractors)."""
    text = detokenize(prompt.tokens[:prompt.question_start])
    lines = re.findall(tasks.NEEDLE_LINE.strip().format(word=r"(\S+)", key=r"(\d+)").replace(".", r"\."), text)
    return [key for _, key in lines if key != prompt.key]


def selected(llm: Llama, layers, blocks):
    """Per (layer, KV head): the ranks of the needle's blocks in its selection (empty if none was selected)."""
    out = {}
    for il in layers:
        sel = llm.memory_selection(il)
        for g in range(sel.shape[0]):
            out[f"{il}.{g}"] = [int(np.flatnonzero(sel[g] == b)[0]) for b in blocks if (sel[g] == b).any()]
    return out


def how_selected(steps) -> tuple:
    """Of ``selected`` after each step: how many pairs selected one of the blocks at each step, and each selecting
    pair's best rank for the question (the first step)."""
    return ([sum(1 for v in s.values() if v) for s in steps], sorted(min(v) for v in steps[0].values() if v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--task", choices=["needle", "needle-multi"], default="needle")
    ap.add_argument("--lengths", default="8192")
    ap.add_argument("--depths", default="0")
    ap.add_argument("--ms", default="64", help="comma-separated m (blocks each KV head selects)")
    ap.add_argument("--cs", default="0", help="comma-separated candidates c (0 = the bound selects)")
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--top-k-layer", type=int, help="h0, the first layer that reads the memory (default: the "
                    "benchmark's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--output", default=str(RESULTS / "memory_needle_selection.jsonl"))
    args = ap.parse_args(argv)

    model = _model_path(args)
    info = read_model_info(model)
    vocab = load_tokenizer(model)
    tok = lambda t, bos: vocab.tokenize(t.encode(), add_bos=bos)  # noqa: E731
    haystack = paul_graham_essays()
    for length in (int(x) for x in args.lengths.split(",")):
        for depth in (float(x) for x in args.depths.split(",")):
            distractors = tasks.NEEDLE_DISTRACTORS if args.task == "needle-multi" else 0
            prompt = tasks.needle_prompt(tok, haystack, length, depth, tasks.trial_rng(0, length, depth, args.trial),
                                         distractors)
            others = distractor_numbers(prompt, lambda ids: vocab.detokenize(ids).decode(errors="replace"))
            if len(others) != distractors:
                raise SystemExit(f"found {len(others)} distractor lines in the prompt, expected {distractors}")
            for m, c in ((int(m), int(c)) for m in args.ms.split(",") for c in args.cs.split(",")):
                setup = setup_for(f"{MEMORY_CONFIG}:m={m}:c={c}", info, len(prompt.tokens) + 16, 512, window=WINDOW)
                att = setup.attention
                if args.top_k_layer is not None:
                    att = replace(att, top_k_layer=args.top_k_layer)
                span, blocks = needle_blocks(prompt, tok(prompt.key, False), att.sinks, att.memory_block_size)
                other_blocks = sorted({b for k in others
                                       for b in needle_blocks(prompt, tok(k, False), att.sinks,
                                                              att.memory_block_size)[1]} - set(blocks))
                layers = range(att.top_k_layer, info.block_count)
                llm = Llama(model, attention=att, n_ctx=setup.n_ctx, n_batch=512, n_ubatch=512,
                            n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **setup.llama_kwargs())
                stream = tasks.Stream(llm, 512, None)
                try:
                    t0 = time.perf_counter()
                    stream.read_document(prompt.tokens[:prompt.question_start])
                    read_s = time.perf_counter() - t0
                    llm.set_top_k(args.top_k)
                    llm.set_top_k_active(True)
                    asked = stream.session.ask(prompt.tokens[prompt.question_start:])
                    steps, answer = [selected(llm, layers, blocks)], []
                    other_steps = [selected(llm, layers, other_blocks)]
                    # each answer token is decoded, and the selection of its decode read, before the next is chosen
                    token, following = asked.token, asked.answer(N_NEW)
                    for _ in range(N_NEW):
                        if token == llm.token_eos():
                            break
                        answer.append(token)
                        token = next(following).token
                        steps.append(selected(llm, layers, blocks))
                        other_steps.append(selected(llm, layers, other_blocks))
                    text = llm.detokenize(answer).decode(errors="replace").strip()
                finally:
                    stream.close()
                    llm.close()
                per_step, ranks = how_selected(steps)
                row = dict(length=length, depth=depth, trial=args.trial, m=m, candidates=c, top_k=args.top_k,
                           top_k_layer=att.top_k_layer,
                           key=prompt.key,
                           answer=text, found=tasks.first_number(text) == prompt.key, span=span,
                           needle_blocks=blocks, n_pairs=len(steps[0]), read_s=round(read_s),
                           selected_per_step=per_step, question_ranks=ranks)
                if args.task == "needle-multi":
                    per_step, ranks = how_selected(other_steps)
                    row.update(task=args.task, distractor_keys=others, distractor_blocks=other_blocks,
                               distractor_selected_per_step=per_step, distractor_question_ranks=ranks)
                print(json.dumps(row), flush=True)
                with open(args.output, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
