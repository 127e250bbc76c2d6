"""The document memory (patch 0012) on the default model: retrieval by length and depth, and its cost.

``retrieval``: the passkey (or the RULER-style needle in essays) at several lengths x 5 depths x N trials,
for the configurations named (``lambda``: LM-Infinite with the bounded cache; ``lambda+memory``: the same
reading, what leaves the window in the block store, the question selecting the library's default m blocks of
64 per KV head (64, among 16m candidates the exact q.k reranks; ``lambda+memory:m=N:c=C`` for others) and the
top-5 keys among them; ``vanilla``, ``context-shift``, ``lambda+top-k`` where they fit). The window is
set well below the model's training length (``--window``, default 1024) so that the lengths reach far past
it on this machine's budget. Each trial is written to ``bench/results/memory_<task>.json`` as it finishes (a
rerun resumes), and ``memory_<task>.png`` is the heatmap.

``cost``: one essay stream read with the bounded Lambda cache, then with the memory (question scope): tokens/s,
peak RSS, bytes on disk per token and in RAM, the time from the end of the reading to the first answer
token and the answer's decode speed over 16 tokens (``bench/results/memory_cost.json``, one entry per length,
window, m and c: a run replaces its own entry).

    python bench/memory.py retrieval [--task passkey] [--lengths 4096,8192,16384] [--trials 2] [--model NAME]
    python bench/memory.py cost [--tokens 16384] [--window 1024] [--memory-blocks 64] [--memory-candidates 256]
    python bench/memory.py step --build 0029 [--capacity 131072] [--candidates 0,256,512,1024]

``step``: the question's and an answer step's time by the number of candidates c, the memory opened for a long
document (``bench/results/memory_step.json``, one entry per build measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ANSWER_TOKENS = 16


def essay_stream(n_tokens: int):
    """The cost runs' stream (the default model, the essays' first n_tokens) and their 14-token question:
    (model path, model info, tokens, question); too few tokens in the essays is refused, not run shorter."""
    import llama_extrapolate as le
    from llama_extrapolate import native
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.default_model import default_model_path

    model = str(default_model_path())
    info = le.read_model_info(model)
    vocab = native.load_tokenizer(model)
    tokens = vocab.tokenize(paul_graham_essays().encode("utf-8"), add_bos=True)[:n_tokens]
    question = vocab.tokenize(b"\nWhat is the first sentence of the text above?", add_bos=False)
    vocab.close()
    if len(tokens) < n_tokens:
        raise SystemExit(f"--tokens {n_tokens}: the essays have only {len(tokens)} tokens")
    return model, info, tokens, question


def replace_run(path: Path, run: dict, key, sort: bool = False) -> None:
    """Put ``run`` in the file's list of runs in place of the one with its key: read and written under the file's
    lock, so that two cost runs ending together each keep the other's entry (each read the file when it ended,
    not when it started)."""
    from llama_extrapolate.jsonfile import one_writer, write_json_atomic

    with one_writer(path):
        runs = json.loads(path.read_text())["runs"] if path.exists() else []
        runs = [r for r in runs if key(r) != key(run)] + [run]
        write_json_atomic(path, {"runs": sorted(runs, key=key) if sort else runs}, indent=1)


def run_retrieval(args) -> None:
    from llama_extrapolate.harness import plots, tasks
    from llama_extrapolate.default_model import default_model_path
    from llama_extrapolate.registry_models import model_path

    model = model_path(args.model) if args.model else str(default_model_path())
    tag = "" if not args.model else "_" + (Path(args.model).stem if args.model.endswith(".gguf") else args.model)
    out = RESULTS / f"memory_{args.task}{tag}.json"
    res = tasks.run_retrieval(model, args.task, args.configs.split(","),
                              [int(x) for x in args.lengths.split(",")], [0.0, 0.25, 0.5, 0.75, 1.0], args.trials,
                              args.seed, out, n_batch=args.n_batch, threads=args.threads, window=args.window)
    res["machine"] = {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                      "window": args.window}
    out.write_text(json.dumps(res, indent=1))
    plots.plot_accuracy(res, out.with_suffix(".png"))
    for name, by_len in res["accuracy"].items():
        row = ", ".join(f"{L}: {sum(d.values()) / len(d):.2f}" for L, d in sorted(by_len.items(), key=lambda x: int(x[0])))
        print(f"{name:16s} {row}")


def run_cost(args) -> None:
    import llama_extrapolate as le
    from llama_extrapolate.harness.evaluate import (MEMORY_CONFIG, MEMORY_PASSAGES_SUFFIX, memory_config_name,
                                            memory_settings_of, setup_for)
    from llama_extrapolate.resources import peak_rss_bytes, peak_rss_reset
    from llama_extrapolate.session import Session

    model, info, tokens, question = essay_stream(args.tokens)
    if args.memory_candidates is not None and not args.memory_blocks:
        raise SystemExit("--memory-candidates needs --memory-blocks (the m they are chosen for)")
    memory_name = memory_config_name(MEMORY_CONFIG + (f":m={args.memory_blocks}" if args.memory_blocks else "")
                                     + (f":c={args.memory_candidates}" if args.memory_candidates is not None else "")
                                     + (MEMORY_PASSAGES_SUFFIX if args.passages else ""))
    settings = memory_settings_of(memory_name)
    out = {"tokens": len(tokens), "window": args.window, "threads": args.threads, "memory_blocks": settings.blocks,
           "memory_candidates": settings.candidates, "configs": {}}
    if settings.passages:
        out["passages"] = True
    if args.n_gpu_layers:
        out["n_gpu_layers"] = args.n_gpu_layers
    path = RESULTS / "memory_cost.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    names = ["lambda", memory_name]
    if args.lambda_from_earlier:
        # the bounded stream alone is unchanged by the memory's patches: its latest measurement at this length,
        # window and thread count (marked as such; speeds of runs made on other days differ by up to 10 %)
        same = [r for r in runs if (r["tokens"], r["window"], r["threads"]) == (len(tokens), args.window, args.threads)]
        if not same:
            raise SystemExit(f"--lambda-from-earlier: no earlier run at {len(tokens)} tokens, W = {args.window}, "
                             f"{args.threads} threads in {path}")
        out["configs"]["lambda"] = dict(same[-1]["configs"]["lambda"], measured_earlier=True)
        names = [memory_name]
    for name in names:
        st = setup_for(name, info, len(tokens) + len(question) + 16, args.n_batch, window=args.window)
        offload = {}
        if args.n_gpu_layers:
            # layers on a GPU; the memory reads its blocks from a KV cache in host memory (docs/gpu.md)
            offload = {"n_gpu_layers": args.n_gpu_layers, **({"offload_kqv": False} if st.attention.memory_blocks else {})}
        peak_rss_reset()
        llm = le.Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **st.llama_kwargs(),
                       **offload)
        try:
            session = Session(llm)
            read_s = session.read(tokens, progress=True, desc=f"{name} reading").seconds
            if st.top_k_question:
                llm.set_top_k_active(True)
            asked = session.ask(question)  # each answer step its own decode: it selects and reads its blocks anew
            to_answer, answer_s = asked.seconds, sum(step.seconds for step in asked.answer(ANSWER_TOKENS))
            entry = {"read_tok_s": len(tokens) / read_s, "question_s": to_answer,
                     "answer_tok_s": ANSWER_TOKENS / answer_s, "n_ctx": st.n_ctx, "peak_rss_bytes": peak_rss_bytes(),
                     "devices": sorted(set(llm.devices()["layers"]))}
            if st.attention.memory_blocks:
                mi = llm.memory_info()
                entry.update(memory=mi, disk_bytes_per_token=mi["bytes_on_disk"] / len(tokens))
            out["configs"][name] = entry
            print(name, json.dumps(entry))
        finally:
            llm.close()
    lam, mem = out["configs"]["lambda"], out["configs"][memory_name]
    out["read_speed_ratio"] = mem["read_tok_s"] / lam["read_tok_s"]
    out["peak_rss_ratio"] = mem["peak_rss_bytes"] / lam["peak_rss_bytes"]
    # one entry per length, window, m, c and question mode (entries from before m was a choice have the default's
    # 16, from before the candidates none)
    def key(run):
        return (run["window"], run["tokens"], run.get("memory_blocks", 16), run.get("memory_candidates", 0),
                run.get("passages", False))

    if args.key:
        # a section of another results file (tools/gpu.sh's one JSON), not an entry of memory_cost.json
        sys.path.insert(0, str(HERE))
        from performance import save_section

        save_section(Path(args.out), args.key, out)
    else:
        replace_run(path, out, key, sort=True)
    print(json.dumps({k: out[k] for k in ("read_speed_ratio", "peak_rss_ratio")}))


def run_step(args) -> None:
    """What the rerank costs a decode step: a short reading with the memory opened for --capacity tokens, then the
    question and ANSWER_TOKENS answer steps, for each c. The builds of memory_step.json scored every block the
    memory could hold, so a step cost what it costs at --capacity tokens; the bound and the rerank now score the
    blocks the reading wrote (rounded up to m): a step costs what the short reading holds, and the cost at a length
    is measured by reading that length (bench/scale.py)."""
    import llama_extrapolate as le
    from llama_extrapolate.harness.evaluate import memory_config_name, setup_for
    from llama_extrapolate.session import Session
    from tqdm import tqdm

    model, info, tokens, question = essay_stream(args.tokens + args.question_tokens)
    if args.question_tokens:
        # a long question: the essays' next tokens (the rerank's products grow with the question's queries)
        tokens, question = tokens[:args.tokens], tokens[args.tokens:]
    m = args.memory_blocks
    out = {"tokens": len(tokens), "window": args.window, "capacity": args.capacity, "threads": args.threads,
           "memory_blocks": m, "build": args.build, "question_tokens": len(question), "configs": {}}
    for c in tqdm([int(x) for x in args.candidates.split(",")], desc="candidates"):
        name = memory_config_name(f"lambda+memory:m={m}:c={c}")
        st = setup_for(name, info, len(tokens) + len(question) + ANSWER_TOKENS, args.n_batch, window=args.window)
        llm = le.Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False, memory_capacity=args.capacity)
        try:
            session = Session(llm)
            session.read(tokens)
            llm.set_top_k_active(True)
            asked = session.ask(question)
            question_s = asked.seconds
            step_s = sum(step.seconds for step in asked.answer(ANSWER_TOKENS)) / ANSWER_TOKENS
        finally:
            llm.close()
        out["configs"][name] = {"candidates": c, "question_s": question_s, "answer_step_ms": 1000 * step_s,
                                "answer_tok_s": 1 / step_s}
        print(name, json.dumps(out["configs"][name]))

    def key(run):
        return (run["build"], run["capacity"], run["window"], run["tokens"], run["memory_blocks"], run["threads"],
                run.get("question_tokens", 14))

    replace_run(RESULTS / "memory_step.json", out, key)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("retrieval")
    r.add_argument("--task", choices=["passkey", "needle", "needle-multi"], default="passkey")
    r.add_argument("--lengths", default="4096,8192,16384")
    r.add_argument("--configs", default="lambda,lambda+memory")
    r.add_argument("--trials", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--window", type=int, default=1024)
    r.add_argument("--n-batch", type=int, default=512)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--model", help="GGUF file or registry model name (qwen2.5-coder-0.5b, gemma3-270m); default: the "
                   "default model. Results go to memory_<task>_<model>.json")
    c = sub.add_parser("cost")
    c.add_argument("--tokens", type=int, default=16384)
    c.add_argument("--window", type=int, default=1024)
    c.add_argument("--n-batch", type=int, default=512)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--memory-blocks", type=int, help="m, the blocks each KV head selects (default: the library's)")
    c.add_argument("--memory-candidates", type=int,
                   help="c, the blocks the bound proposes for the exact rerank (default: the library's 16m; 0: none)")
    c.add_argument("--passages", action="store_true",
                   help="the question reads every key of the selected blocks in the order of the text (top-k = m*B)")
    c.add_argument("--n-gpu-layers", type=int, default=0,
                   help="layers offloaded to a GPU backend (-1: all; the memory's KV cache stays in host memory)")
    c.add_argument("--key", default="",
                   help="write the run as this section of --out (a results file of sections) instead of an entry of "
                        "memory_cost.json")
    c.add_argument("--out", default="", help="the file --key writes to")
    c.add_argument("--lambda-from-earlier", action="store_true",
                   help="take the bounded stream's figures from the latest earlier run at this length, window and "
                        "thread count instead of reading it again (half the time at 128k)")
    t = sub.add_parser("step")
    t.add_argument("--tokens", type=int, default=4096)
    t.add_argument("--window", type=int, default=1024)
    t.add_argument("--capacity", type=int, default=131072, help="tokens the memory is opened for")
    t.add_argument("--memory-blocks", type=int, default=64)
    t.add_argument("--candidates", default="0,256,512,1024", help="the values of c to time")
    t.add_argument("--question-tokens", type=int, default=0,
                   help="ask the essays' next N tokens instead of the 14-token question")
    t.add_argument("--n-batch", type=int, default=512)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--build", required=True, help="what is measured, e.g. the last patch applied (a run replaces the "
                   "entry of its build, capacity, window, tokens, m, threads and question length)")
    args = p.parse_args(argv)
    if args.cmd == "cost" and bool(args.key) != bool(args.out):
        p.error("cost: --key and --out go together (a section of a results file)")
    if args.cmd == "cost" and args.key and args.lambda_from_earlier:
        p.error("cost: --lambda-from-earlier reads memory_cost.json's runs; with --key both streams are read")
    RESULTS.mkdir(exist_ok=True)
    {"retrieval": run_retrieval, "cost": run_cost, "step": run_step}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
