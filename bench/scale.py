"""The document memory at the user's model size: a shape model's reading, store, RAM and answer latency.

A shape model (bench/kv_shapes.py: Llama-2-7B's, Llama-3-8B's or a 70B's layers, KV heads and head dimension,
small projections) reads the essays' first N tokens with the bounded Λ cache, then with the document memory;
after each reading it is asked a 14-token question and, after that question's answer, a 128-token one. Measured:

- reading speed (tokens/s), disk bytes per token of the store, the memory's RAM (block summaries, and the kept region of a hold), the KV cache's
  bytes, the peak RSS of the process;
- time to the first answer token after each question and the time of each answer token;
- bytes the answer steps read: ``rchar`` of /proc/self/io (what the process asked of the kernel: the store's
  preads, page cache or not) and ``read_bytes`` (what reached the disk).

The laptop case is a store larger than the page cache can keep: before each question the store's pages are
dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)`` on the store file), so the question's and
the first answer steps' reads go to the disk as they would there. Each (shape, tokens, configuration) is an entry
of ``bench/results/scale.json``; a run replaces its own entry.

    python bench/scale.py --shape llama-2-7b --tokens 32768 [--configs lambda,memory] [--threads 2] \
        [--reading-dir DIR [--repeat 3]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ANSWER_TOKENS = 16
SHORT_QUESTION = "\nWhat is the first sentence of the text above?"  # 14 tokens with the default vocabulary
LONG_QUESTION_TOKENS = 128
HOLD_SUFFIX = ":hold"  # a configuration whose answer holds the blocks its question selected


def proc_io() -> dict:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def drop_page_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def shape_model(shape: str) -> str:
    sys.path.insert(0, str(HERE))
    import kv_shapes

    return str(kv_shapes.cached(shape))


def ask(session, question, store: str | None, hold: bool = False) -> dict:
    """The question, then ANSWER_TOKENS greedy answer tokens, each timed, with the store's reads counted. ``hold``:
    the question keeps the blocks it selects and the answer attends to them (Session.ask's hold)."""
    if store:
        drop_page_cache(store)
    io0 = proc_io()
    with session.ask(question, hold=hold) as asked:
        io1 = proc_io()
        steps = [step.seconds for step in asked.answer(ANSWER_TOKENS)]
        io2 = proc_io()
    return {"question_tokens": len(question), "first_token": asked.token, "first_token_s": asked.seconds,
            "question_rchar": io1["rchar"] - io0["rchar"], "question_read_bytes": io1["read_bytes"] - io0["read_bytes"],
            "answer_step_s": steps, "answer_step_mean_s": sum(steps) / len(steps),
            "answer_rchar_per_token": (io2["rchar"] - io1["rchar"]) / ANSWER_TOKENS,
            "answer_read_bytes_per_token": (io2["read_bytes"] - io1["read_bytes"]) / ANSWER_TOKENS}


def run(args) -> None:
    import llama_extrapolate as le
    from llama_extrapolate import native
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from dataclasses import replace

    from llama_extrapolate.config import MEMORY_CANDIDATES_PER_BLOCK
    from llama_extrapolate.harness.evaluate import memory_config_name, setup_for
    from llama_extrapolate.names import MEMORY_STORE_LAYOUT, NamedConfig
    from llama_extrapolate.reader import load_document_state, save_document_state
    from llama_extrapolate.resources import peak_rss_bytes, peak_rss_reset
    from llama_extrapolate.session import Session

    sys.path.insert(0, str(HERE))
    from kv_shapes import SHAPES
    from memory import replace_run

    model = shape_model(args.shape)
    shape = SHAPES[args.shape]
    info = le.read_model_info(model)
    vocab = native.load_tokenizer(model)
    tokens = vocab.tokenize(paul_graham_essays().encode("utf-8"), add_bos=True)
    if len(tokens) < args.tokens + LONG_QUESTION_TOKENS:
        raise SystemExit(f"--tokens {args.tokens}: the essays have only {len(tokens)} tokens")
    short_q = vocab.tokenize(SHORT_QUESTION.encode("utf-8"), add_bos=False)
    vocab.close()
    text, long_q = tokens[:args.tokens], tokens[args.tokens:args.tokens + LONG_QUESTION_TOKENS]
    path = Path(args.out)
    for config in args.configs.split(","):
        hold = config.endswith(HOLD_SUFFIX)
        config = config[:-len(HOLD_SUFFIX)] if hold else config
        name = "lambda" if config == "lambda" else memory_config_name("lambda+memory" + config[len("memory"):])
        n_total = len(text) + len(short_q) + len(long_q) + 2 * (ANSWER_TOKENS + 1)
        # a memory asked with fewer candidates or its last tokens (c below the default, ':last=T') reads as the
        # default's reading does, which it reuses: those are set at the question (Llama.set_memory_question)
        reader, question = name, None
        if name != "lambda":
            named = NamedConfig.parse(name)
            c_read = max(named.memory_candidates, MEMORY_CANDIDATES_PER_BLOCK * named.memory_blocks)
            reader = replace(named, memory_candidates=c_read, select_tokens=0).name
            question = (named.memory_candidates, named.select_tokens) if reader != name else None
        st = setup_for(reader, info, n_total, args.n_batch, window=args.window)
        kwargs = st.llama_kwargs()
        store = None
        # a kept reading (--reading-dir): the state after the document and the store it references, reused by a
        # later run of the same shape, length and configuration, which then measures the questions only
        kept = Path(args.reading_dir) / f"{args.shape}-{len(text)}-w{args.window}-t{args.threads}-{reader}" \
            if args.reading_dir else None
        reuse = kept is not None and (kept / "reading.json").is_file()
        if st.attention.memory_blocks:
            if kept is not None:
                kept.mkdir(parents=True, exist_ok=True)
                store = str(kept / "store.kvstore")
                kwargs.update(memory_keep=True, memory_reopen=reuse)
            else:
                store = os.path.join(args.store_dir, f"scale-{args.shape}-{os.getpid()}.kvstore")
            kwargs["memory_path"] = store
            if args.capacity:
                # the summaries are sized for the capacity (their RAM is the capacity's); the bound and the rerank
                # score the blocks the reading wrote (rounded up to m), so the steps cost what the reading holds
                if args.capacity < n_total:
                    raise SystemExit(f"--capacity {args.capacity} is below the {n_total} tokens read and asked")
                kwargs["memory_capacity"] = args.capacity
        peak_rss_reset()
        llm = le.Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **kwargs)
        try:
            session = Session(llm)
            if reuse:
                reading = json.loads((kept / "reading.json").read_text())
                if load_document_state(llm, kept / "reading.state", text) != len(text):
                    raise SystemExit(f"{kept}: the kept reading does not load (another build's state?): remove it")
            else:
                reading = {"read_s": session.read(text, progress=True, desc=f"{args.shape} {name} reading").seconds,
                           "peak_rss_bytes": peak_rss_bytes(), "date": time.strftime("%Y-%m-%d %H:%M")}
                if kept is not None:
                    save_document_state(llm, kept / "reading.state")
                    (kept / "reading.json").write_text(json.dumps(reading))
                # the questions are timed on a quiet disk: the reading's writes (the store, the state) written out
                # first (asked right after a 128k reading without this, a short question took 15.8 s, then 4.0 s
                # and 3.3 s)
                os.sync()
            if st.top_k_question:
                llm.set_top_k_active(True)
            if question is not None:
                llm.set_memory_question(*question)
            read_s = reading["read_s"]
            entry = {"shape": args.shape, "tokens": len(text), "window": args.window, "threads": args.threads,
                     "config": name + (HOLD_SUFFIX if hold else ""),
                     "capacity": (args.capacity or None) if st.attention.memory_blocks else None,
                     "read_s": read_s, "read_tok_s": len(text) / read_s, "n_ctx": st.n_ctx,
                     "kv_cache_bytes": st.n_ctx * shape.n_layer * shape.kv_values_per_layer() * 2 * 2}
            if st.attention.memory_blocks:
                entry["store_layout"] = MEMORY_STORE_LAYOUT
            if reuse:
                entry["reading_reused"] = reading["date"]
            if reader != name:
                entry["read_with"] = reader
            # each repetition asks both questions on the reading as it was kept (the state reloaded, the store's
            # pages dropped again): the disk's speed varies between runs, so the entry takes the median repetition
            asked = {"short_question": [], "long_question": []}
            for rep in range(args.repeat):
                if rep and load_document_state(llm, kept / "reading.state", text) != len(text):
                    raise SystemExit(f"{kept}: the kept reading does not load again for repetition {rep + 1}")
                asked["short_question"].append(ask(session, short_q, store, hold))
                asked["long_question"].append(ask(session, long_q, store, hold))
            for q, runs in asked.items():
                entry[q] = sorted(runs, key=lambda r: r["first_token_s"])[(len(runs) - 1) // 2]
                if len(runs) > 1:
                    entry[q].update(first_token_s_repeats=[r["first_token_s"] for r in runs],
                                    first_tokens_repeats=[r["first_token"] for r in runs])
            if st.attention.memory_blocks:
                mi = llm.memory_info()
                entry.update(memory=mi, disk_bytes_per_token=mi["bytes_on_disk"] / len(text),
                             memory_ram_bytes=mi["bytes_in_ram"])
            # the reading's peak too when it was another process's
            entry["peak_rss_bytes"] = max(peak_rss_bytes(), reading["peak_rss_bytes"])
            entry["model_bytes"] = Path(model).stat().st_size
        finally:
            llm.close()
            if store and kept is None and os.path.exists(store):
                os.unlink(store)
        entry["machine"] = {"cpu": platform.processor() or platform.machine(), "threads": args.threads}
        print(json.dumps({k: v for k, v in entry.items() if k not in ("memory",)}, default=str)[:2000])
        replace_run(path, entry, lambda r: (r["shape"], r["tokens"], r["window"], r["threads"], r["config"],
                                            r.get("capacity") or 0), sort=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-2-7b", help="a shape of bench/kv_shapes.py")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--configs", default="lambda,memory",
                    help="lambda, memory (the library's default m and c), memory:m=N:c=C[:last=T][:passages]; a "
                         "memory configuration ending in :hold answers from the blocks its question kept; one with "
                         "fewer candidates than the default or :last=T reads (and reuses) the default's reading and "
                         "sets its question's selection before asking")
    ap.add_argument("--capacity", type=int, default=0,
                    help="tokens the memory is opened for (default: what is read): the summaries' RAM at that length")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "scale.json"), help="the results file (entries replaced by key)")
    ap.add_argument("--reading-dir", default="",
                    help="keep each reading (its state and store) here and reuse it in a later run of the same "
                         "shape, length and configuration: the questions are measured again, the reading is not")
    ap.add_argument("--repeat", type=int, default=1,
                    help="ask the questions this many times on the kept reading (needs --reading-dir) and record the "
                         "median first answer token, with every repetition's")
    ap.add_argument("--store-dir", default=tempfile.gettempdir(), help="where the store file is written")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.repeat > 1 and not args.reading_dir):
        ap.error(f"--repeat {args.repeat}: at least 1, and more than 1 asks again on a kept reading: give "
                 "--reading-dir DIR too")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
