"""What the memory's peak RSS is made of: anonymous vs file-backed (the mapped store) resident memory by phase.

An essay stream is read with the memory (question scope), then a question and greedy answer tokens are decoded;
after the reading, the question and every answer token /proc/self/status gives RssAnon, RssFile and the peak
(VmHWM). One JSON object per run, appended to studies/memory/memory_rss_phases.jsonl.

    python studies/memory/rss_phases.py --tokens 65536 --window 8192 --memory-blocks 64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import llama_extrapolate as le
from llama_extrapolate.harness.evaluate import memory_config_name, setup_for
from llama_extrapolate.resources import peak_rss_reset
from llama_extrapolate.session import Session

RESULTS = Path(__file__).resolve().parent  # the study's runs sit beside its scripts
sys.path.insert(0, str(RESULTS.parent.parent / "bench"))
from memory import essay_stream  # noqa: E402  (bench/memory.py: the cost runs' stream and question)
MIB = 1 << 20


def status() -> dict:
    """RssAnon, RssFile and VmHWM of this process, in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile", "VmHWM"):
                out[key] = round(int(line.split()[1]) * 1024 / MIB, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--memory-blocks", type=int, default=64)
    ap.add_argument("--memory-candidates", type=int,
                    help="c, the candidates the exact q.k reranks (default: the library's)")
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--output", default=str(RESULTS / "memory_rss_phases.jsonl"))
    args = ap.parse_args(argv)

    model, info, tokens, question = essay_stream(args.tokens)
    name = memory_config_name(f"lambda+memory:m={args.memory_blocks}"
                              + (f":c={args.memory_candidates}" if args.memory_candidates is not None else ""))
    st = setup_for(name, info, len(tokens) + len(question) + args.answer_tokens + 16, 512, window=args.window)
    peak_rss_reset()
    llm = le.Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=512, n_ubatch=512, n_threads=args.threads, n_threads_batch=args.threads,
                   verbose=False, **st.llama_kwargs())
    try:
        phases = {"loaded": status()}
        session = Session(llm)
        read_s = session.read(tokens, progress=True).seconds
        phases["read"] = status()
        llm.set_top_k_active(True)
        asked = session.ask(question)
        phases["question"] = status()
        phases["answer"] = [status() for _ in asked.answer(args.answer_tokens)]
        row = dict(tokens=len(tokens), window=args.window, memory_blocks=args.memory_blocks,
                   memory_candidates=st.attention.resolve(info).memory_candidates, store_read="pread",
                   threads=args.threads,
                   read_s=round(read_s, 1), memory=llm.memory_info(), phases=phases)
    finally:
        llm.close()
    print(json.dumps(row))
    with open(args.output, "a") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
