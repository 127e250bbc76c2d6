"""Speed and memory of reading long streams on the default model: prefill flat in length, decode
after a long stream close to decode after a short one, peak RSS bounded.

  stream     One stream of --tokens tokens of Paul Graham's essays read the way `run` reads a document
             (llama_extrapolate.Llama.eval, n_batch tokens at a time, logits of the last token only).
             Prefill tokens/s is measured over each block of --block tokens; at each mark (8k, 16k, ...)
             the stream stops to decode --decode tokens greedily one at a time (decode tokens/s after that
             context, the best of three tries), rolls them back and reads on. Resident memory (current
             and peak) at each mark. With --paired-decode P a second context is parked after the first mark
             and each later mark also decodes in P bursts alternating with it: the median ratio is decode after
             that context over decode after the first mark, measured side by side.
             --config lambda (S = 10, W = C = L_pre) or vanilla (full attention, a cache for the whole stream).
  knobs-off  The patched library with every knob off against llama-cpp-python's own library built from the
             same llama.cpp commit: the same llama_cpp.Llama code in fresh subprocesses, prefill of --prefill
             tokens and --decode decoded tokens each; also the patched library collecting attention
             statistics (the calibration's overhead). Each round runs the three back to back (the order
             alternates); the summary is the median over rounds of the ratio within a round, per wall-clock
             second and per CPU second of the process (--threads 1: no barrier spinning, the steadier figure).
  exact      Lambda + ceiling over the first --tokens tokens of the ablation bench, compared bucket by bucket
             with its committed NLL (measured before the earlier series' patch 0011 changed how the ceiling is computed).
  soak       A stream of --tokens (cycling the essays) through a small window: peak RSS at each mark against
             the peak after 16k tokens, and the NLL by bucket (is anything lost).
  flash      Lambda + ceiling (S = 10, W = C = L_pre) with and without flash attention (patch 0008's flash path), the contexts of
             --configs reading the same stream in alternating batches (flash-noceiling / plain-noceiling: the Lambda
             mask alone, to tell flash attention's own cost from the ceiling's copies). Speeds are tokens per CPU
             second of the process (with --threads 1, the work alone on a shared machine): prefill per block, and
             at each mark decode of --decode tokens in --paired-decode alternating rounds (medians); the largest
             logit difference of flash and plain, and llama.cpp's compute buffer of each (flash attention does not
             materialize the n_kv x n_ubatch scores).
  stats      The attention statistics' overhead: one context reads --tokens tokens from an empty cache with the
             statistics off, reduced by the CPU op and by ggml ops in the graph (patch 0010), in rounds that
             alternate the order, after --warmup untimed rounds (a backend may build kernels on first use);
             tokens per CPU second and per wall second, the overhead the median over rounds.
  plot       bench/results/performance.png from the JSON.

Each mode writes its section of bench/results/performance.json as it goes (a stream after every mark).
Ratios that a target compares are taken within one run, since the machine is shared and noisy.

    python bench/performance.py stream --config lambda --tokens 131072 --paired-decode 6
    python bench/performance.py stream --config vanilla --tokens 32768
    python bench/performance.py knobs-off
    python bench/performance.py knobs-off --threads 1 --repeats 7 --key knobs_off_1thread
    python bench/performance.py soak --tokens 1048576 --window 512
    python bench/performance.py flash --tokens 16384 --threads 1 --configs flash,plain,flash-noceiling,plain-noceiling
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = RESULTS / "performance.json"
MARKS = (8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)


def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def machine() -> dict:
    """The CPU a figure was measured on: speed ratios moved 2-4x between two hosts of the same name."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def save_section(path: Path, key: str, value) -> None:
    data = load_results(path)
    host = machine()
    if isinstance(value, dict):
        value = {**value, "machine": host}
    data[key] = value
    data["machine"] = host
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def rss_bytes() -> tuple:
    """Current and peak resident memory of this process (Linux /proc; 0 elsewhere)."""
    cur = peak = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return cur, peak


def essay_tokens(llm, n: int) -> list:
    """The first n tokens of the essays; past their end the essays start again (for the soak)."""
    from llama_extrapolate.harness.corpora import paul_graham_essays

    text = paul_graham_essays()
    toks = llm.tokenize(text.encode("utf-8"), add_bos=True)
    out = list(toks)
    while len(out) < n:
        out.extend(toks[1:])
    return out[:n]


def attention_for(name: str, window: int, sinks: int):
    from llama_extrapolate import AttentionConfig

    if name == "lambda":
        return AttentionConfig(sinks=sinks, window=window, ceiling=window)
    if name == "vanilla":
        return AttentionConfig.vanilla()
    raise SystemExit(f"--config {name!r}: use lambda or vanilla")


def synchronize(llm) -> None:
    """Wait for the backend: llama_decode returns once a GPU backend has the work queued (lavapipe then computes
    it on its own threads), so a timer stopped without this charges the work to whatever is timed next."""
    import llama_cpp

    llama_cpp.llama_synchronize(llm.ctx)


def decode_speed(llm, n: int, repeats: int = 3) -> float:
    """Greedy decode of n tokens one at a time after the current stream, rolled back afterwards; the best of
    `repeats` tries (a burst of other load on a shared machine only ever slows a try down)."""
    from llama_extrapolate.session import Session

    session = Session(llm)
    start, first = llm.n_tokens, session.next_token()
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in session.steps(first, n):
            pass
        best = max(best, n / (time.perf_counter() - t0))
        llm.n_tokens = start  # the next eval removes the decoded tokens (within the rollback margin)
    return best


def paired_decode(llm, ref, n: int, pairs: int) -> dict:
    """Decode bursts of n tokens alternating between the stream and the reference context (the order alternates
    too): one ratio stream/reference per pair, and their median. Decode on this VM moves between ~22 and ~33
    tokens/s for seconds at a time with the same work (same perf profile), which best-of-3 at separate moments
    cannot tell from a real change."""
    stream_ts, ref_ts = [], []
    for i in range(pairs):
        first, second = (llm, ref) if i % 2 == 0 else (ref, llm)
        a = decode_speed(first, n, repeats=1)
        b = decode_speed(second, n, repeats=1)
        s, r = (a, b) if first is llm else (b, a)
        stream_ts.append(s)
        ref_ts.append(r)
    ratios = [s / r for s, r in zip(stream_ts, ref_ts)]
    return {"stream_tok_s": stream_ts, "reference_tok_s": ref_ts, "ratios": ratios,
            "median_ratio": float(np.median(ratios))}


def run_stream(args) -> None:
    from tqdm import tqdm

    import llama_extrapolate as le

    model = str(le.default_model_path())
    info = le.read_model_info(model)
    l_pre = int(info.context_length)
    window = args.window or l_pre
    cfg = attention_for(args.config, window, args.sinks)
    if args.paired_decode < 0 or (args.paired_decode and args.decode <= 0):
        raise SystemExit(f"--paired-decode {args.paired_decode} --decode {args.decode}: use a number of pairs >= 1 "
                         "(0 = off) and --decode >= 1 (the tokens of each burst)")
    if args.config == "lambda" and args.decode > cfg.rollback:
        raise SystemExit(f"--decode {args.decode}: the decoded tokens are rolled back, and the bounded cache keeps "
                         f"only rollback={cfg.rollback} tokens behind the window; use --decode {cfg.rollback} or fewer")
    n_batch = args.n_batch
    if args.config == "vanilla":
        n_ctx = args.tokens + n_batch + args.decode
    else:
        n_ctx = cfg.resolve(info).required_n_ctx(n_batch, stream=args.tokens)
    llm = le.Llama(model, attention=cfg, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=args.threads,
                   n_threads_batch=args.threads, n_gpu_layers=args.n_gpu_layers, verbose=False)
    tokens = essay_tokens(llm, args.tokens)
    marks = [m for m in MARKS if m <= args.tokens]
    key = args.key or f"stream_{args.config}"
    result = {"config": args.config, "window": window if args.config == "lambda" else None, "sinks": args.sinks,
              "n_ctx": n_ctx, "n_batch": n_batch, "threads": args.threads, "tokens": args.tokens,
              "n_gpu_layers": args.n_gpu_layers,
              "block": args.block, "blocks": [], "marks": []}
    ref = None
    if args.paired_decode:
        # a second context parked after the first mark: decode bursts alternate between it and the stream, so
        # a slow phase of the shared machine falls on both sides of each ratio
        ref = le.Llama(model, attention=cfg, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                       n_threads=args.threads, n_threads_batch=args.threads, n_gpu_layers=args.n_gpu_layers,
                       verbose=False)
        ref.reset()
        for s in tqdm(range(0, marks[0], n_batch), desc=f"reference context ({marks[0]} tokens)", unit="batch"):
            ref.eval(tokens[s:s + n_batch])
        result["paired_reference_tokens"] = marks[0]
    llm.reset()
    block_t0, block_n = time.perf_counter(), 0
    bar = tqdm(total=len(tokens), desc=f"{args.config} stream", unit="tok")
    t_start = time.perf_counter()
    for s in range(0, len(tokens), n_batch):
        chunk = tokens[s:s + n_batch]
        llm.eval(chunk)
        bar.update(len(chunk))
        block_n += len(chunk)
        done = s + len(chunk)
        if block_n >= args.block:
            synchronize(llm)
            now = time.perf_counter()
            result["blocks"].append({"end": done, "tokens": block_n, "tok_s": block_n / (now - block_t0)})
            block_n = 0
        if done in marks:
            cur, peak = rss_bytes()
            entry = {"tokens": done, "prefill_tok_s": result["blocks"][-1]["tok_s"],
                     "elapsed_s": time.perf_counter() - t_start, "rss_bytes": cur, "peak_rss_bytes": peak}
            if args.decode:
                entry["decode_tok_s"] = decode_speed(llm, args.decode)
            if ref is not None:
                entry["paired_decode"] = paired_decode(llm, ref, args.decode, args.paired_decode)
            result["marks"].append(entry)
            save_section(Path(args.out), key, result)
            bar.write(json.dumps(entry))
        if block_n == 0:
            block_t0 = time.perf_counter()
    bar.close()
    result["total_s"] = time.perf_counter() - t_start
    save_section(Path(args.out), key, result)


# --- flash attention: the same Lambda + ceiling stream with and without it --------------------------------------

def llama_with_log(make):
    """make() with llama.cpp's log (it writes to fd 2) captured: the Llama and the log's text."""
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            llm = make()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return llm, log.read()


def compute_buffer_mib(log: str) -> float:
    """The compute buffers llama.cpp reserved for the context, summed over backends (its log line)."""
    import re

    sizes = [float(m) for m in re.findall(r"compute buffer size =\s*([0-9.]+) MiB", log)]
    if not sizes:
        raise SystemExit("flash: llama.cpp's log has no 'compute buffer size' line to read the buffers from")
    return sum(sizes)


FLASH_CONFIGS = {"flash": (True, True), "plain": (False, True), "flash-noceiling": (True, False),
                 "plain-noceiling": (False, False)}  # name: (flash_attn, ceiling = W)


def decode_cpu(llm, n: int) -> float:
    """Greedy decode of n tokens after the current stream, rolled back: tokens per CPU second of this process (with
    one thread, the work alone: another process on the machine does not count, as it does in wall-clock time)."""
    from llama_extrapolate.session import Session

    session = Session(llm)
    start = llm.n_tokens
    steps = session.steps(session.next_token(), n)
    c0 = time.process_time()
    for _ in steps:
        pass
    spent = time.process_time() - c0
    llm.n_tokens = start
    return n / spent


def run_flash(args) -> None:
    from tqdm import tqdm

    import llama_extrapolate as le
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.native import last_logits
    import llama_cpp._logger

    names = args.configs.split(",")
    unknown = [n for n in names if n not in FLASH_CONFIGS]
    if unknown or "flash" not in names or "plain" not in names:
        raise SystemExit(f"--configs {args.configs}: list flash and plain, and any of {', '.join(FLASH_CONFIGS)}")
    model = str(le.default_model_path())
    info = le.read_model_info(model)
    window = args.window or int(info.context_length)
    if args.decode < 1 or args.paired_decode < 1:
        raise SystemExit(f"--decode {args.decode} --paired-decode {args.paired_decode}: decode at least one token "
                         "per burst, in at least one round")
    n_batch = args.n_batch
    llms, buffers = {}, {}
    for name in names:
        flash, ceiling = FLASH_CONFIGS[name]
        cfg = AttentionConfig(sinks=args.sinks, window=window, ceiling=window if ceiling else 0)
        if args.decode > cfg.rollback:
            raise SystemExit(f"--decode {args.decode}: the decoded tokens are rolled back within rollback="
                             f"{cfg.rollback}; use fewer")
        n_ctx = cfg.resolve(info).required_n_ctx(n_batch, stream=args.tokens)
        llm, log = llama_with_log(lambda: le.Llama(
            model, attention=cfg, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=args.threads,
            n_threads_batch=args.threads, n_gpu_layers=args.n_gpu_layers, flash_attn=flash, verbose=True))
        llms[name], buffers[name] = llm, compute_buffer_mib(log)
        llama_cpp._logger.set_verbose(False)  # the log was for the buffers: quiet while reading
        llm.reset()
    tokens = essay_tokens(llms["flash"], args.tokens)
    marks = [m for m in MARKS if m <= args.tokens]
    key = args.key or "flash_ceiling"
    result = {"window": window, "ceiling": window, "sinks": args.sinks, "n_batch": n_batch, "threads": args.threads,
              "tokens": args.tokens, "block": args.block, "configs": names, "compute_buffer_mib": buffers,
              "blocks": [], "marks": []}
    # tokens per CPU second of the process: with --threads 1 the work alone, whatever else the machine runs
    spent = dict.fromkeys(names, 0.0)
    block_n = 0
    bar = tqdm(total=len(tokens), desc=" / ".join(names), unit="tok")
    for i, s in enumerate(range(0, len(tokens), n_batch)):
        chunk = tokens[s:s + n_batch]
        for name in (names if i % 2 == 0 else names[::-1]):
            c0 = time.process_time()
            llms[name].eval(chunk)
            synchronize(llms[name])
            spent[name] += time.process_time() - c0
        bar.update(len(chunk))
        block_n += len(chunk)
        done = s + len(chunk)
        if block_n >= args.block:
            result["blocks"].append({"end": done, "tokens": block_n,
                                     "cpu_tok_s": {name: block_n / t for name, t in spent.items()}})
            spent, block_n = dict.fromkeys(names, 0.0), 0
        if done in marks:
            last = {name: last_logits(llm.ctx, llm.n_vocab()).astype(np.float64) for name, llm in llms.items()}
            decode = {name: [] for name in names}
            for r in range(args.paired_decode):
                for name in (names if r % 2 == 0 else names[::-1]):
                    decode[name].append(decode_cpu(llms[name], args.decode))
            prefill = result["blocks"][-1]["cpu_tok_s"]
            entry = {"tokens": done, "prefill_cpu_tok_s": prefill,
                     "decode_cpu_tok_s": {name: float(np.median(v)) for name, v in decode.items()},
                     "decode_rounds": decode,
                     # flash against plain, with the ceiling and (where both ran) without it
                     "max_logit_diff": {f: float(np.abs(last[f] - last[p]).max()) for f, p in
                                        (("flash", "plain"), ("flash-noceiling", "plain-noceiling"))
                                        if f in last and p in last},
                     "same_next_token": bool(np.argmax(last["flash"]) == np.argmax(last["plain"]))}
            entry["prefill_ratio"] = prefill["flash"] / prefill["plain"]
            entry["decode_ratio"] = entry["decode_cpu_tok_s"]["flash"] / entry["decode_cpu_tok_s"]["plain"]
            result["marks"].append(entry)
            save_section(Path(args.out), key, result)
            bar.write(json.dumps({k: v for k, v in entry.items() if k != "decode_rounds"}))
    bar.close()
    save_section(Path(args.out), key, result)


# --- attention statistics: what collecting them costs, reduced by the CPU op or by ggml ops in the graph -------

STATS_VARIANTS = ("off", "host", "graph")


def run_stats(args) -> None:
    """One context reads the same tokens from an empty cache with the statistics off, reduced by the CPU op
    ("host": for offloaded layers ggml's scheduler copies each layer's logits, mask and softmax to the host) and by
    ggml ops on the layer's backend ("graph", patch 0010), in turn, rounds alternating the order; tokens per CPU
    second of the process (all its threads, a software Vulkan driver's included) and per wall second."""
    from tqdm import tqdm

    import llama_extrapolate as le
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats
    import llama_cpp._logger

    model = str(le.default_model_path())
    info = le.read_model_info(model)
    window = args.window or int(info.context_length)
    cfg = AttentionConfig(sinks=args.sinks, window=window, ceiling=window)
    n_ctx = cfg.resolve(info).required_n_ctx(args.n_batch, stream=args.tokens)
    llm, _ = llama_with_log(lambda: le.Llama(
        model, attention=cfg, n_ctx=n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch, n_threads=args.threads,
        n_threads_batch=args.threads, n_gpu_layers=args.n_gpu_layers, verbose=True))
    llama_cpp._logger.set_verbose(False)
    tokens = essay_tokens(llm, args.tokens)
    runs = {v: [] for v in STATS_VARIANTS}
    warmup = {v: [] for v in STATS_VARIANTS}
    on_graph = {}
    rounds = args.warmup + args.repeats
    with tqdm(total=rounds * len(STATS_VARIANTS), desc="statistics", unit="run") as bar:
        for r in range(rounds):
            # the first rounds are not counted: a backend may build its kernels on first use (ggml-vulkan compiles
            # each pipeline the first time a graph needs it, and lavapipe compiles it to machine code with LLVM)
            timed = runs if r >= args.warmup else warmup
            for v in (STATS_VARIANTS if r % 2 == 0 else STATS_VARIANTS[::-1]):
                llm.reset()
                if v != "off":
                    stats.set_reduce(llm, v)
                    stats.enable(llm, True)
                    stats.reset(llm)
                c0, t0 = time.process_time(), time.perf_counter()
                llm.eval(tokens)
                synchronize(llm)
                c1, t1 = time.process_time(), time.perf_counter()
                if v != "off":
                    on_graph[v] = stats.reduced_on_graph(llm).tolist()
                    rows = stats.AttentionStats.read(llm).rows
                    stats.enable(llm, False)
                    if rows != len(tokens):
                        raise SystemExit(f"{v}: the statistics counted {rows} rows of {len(tokens)} tokens")
                timed[v].append({"cpu_tok_s": len(tokens) / (c1 - c0), "wall_tok_s": len(tokens) / (t1 - t0)})
                bar.update(1)
    devices = llm.devices()
    llm.close()

    def overhead(v: str, field: str) -> dict:
        # per round: the variant's time over the time without statistics, less 1
        r = np.array([b[field] / a[field] - 1.0 for a, b in zip(runs[v], runs["off"])])
        return {"median": float(np.median(r)), "min": float(r.min()), "max": float(r.max())}

    summary = {f"{v}_{field}": overhead(v, field) for v in ("host", "graph") for field in ("cpu_tok_s", "wall_tok_s")}
    key = args.key or "stats_overhead"
    save_section(Path(args.out), key, {"tokens": len(tokens), "window": window, "n_batch": args.n_batch,
                                       "threads": args.threads, "n_gpu_layers": args.n_gpu_layers,
                                       "devices": devices, "reduced_on_graph": on_graph,
                                       "repeats": args.repeats, "warmup_rounds": args.warmup, "warmup": warmup,
                                       "runs": runs, "overhead": summary})
    print(json.dumps(summary, indent=1))


# --- knobs off: the same llama_cpp code on both libraries, in fresh processes ------------------------------

WORKER = r"""
import json, sys, time
import numpy as np
variant, model, n_prefill, n_decode, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if variant != "upstream":
    import llama_extrapolate
    from llama_extrapolate.harness import stats
import llama_cpp
llm = llama_cpp.Llama(model, n_ctx=n_prefill + n_decode + 64, n_batch=512, n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
if variant == "patched+stats":
    stats.enable(llm, True)
text = open(sys.argv[6], encoding="utf-8").read()
toks = llm.tokenize(text.encode("utf-8"), add_bos=True)[:n_prefill]
llm.eval(toks[:512]); llm.reset()                       # warm-up: pages in the weights, builds the graphs
c0 = time.process_time(); t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter(); c1 = time.process_time()
n_vocab = llm.n_vocab()
for _ in range(n_decode):
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
    llm.eval([int(np.argmax(logits))])
t2 = time.perf_counter(); c2 = time.process_time()
print(json.dumps({"library": llama_cpp.llama_cpp._lib._name, "prefill_tok_s": len(toks) / (t1 - t0),
                  "decode_tok_s": n_decode / (t2 - t1),
                  "prefill_cpu_tok_s": len(toks) / (c1 - c0), "decode_cpu_tok_s": n_decode / (c2 - c1)}))
"""


def run_knobs_off(args) -> None:
    import tempfile

    from tqdm import tqdm

    import llama_extrapolate as le
    from llama_extrapolate.harness.corpora import paul_graham_essays

    if args.decode <= 0 or args.repeats <= 0:
        raise SystemExit(f"--decode {args.decode} --repeats {args.repeats}: knobs-off needs at least one decoded "
                         "token and one round (its ratios divide by the decode speed)")
    model = str(le.default_model_path())
    variants = ["upstream", "patched", "patched+stats"]
    runs = {v: [] for v in variants}
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(paul_graham_essays()[:200_000])
        text_path = f.name
    try:
        with tqdm(total=args.repeats * len(variants), desc="knobs-off", unit="run") as bar:
            for r in range(args.repeats):
                # alternate the order so drift on the shared machine falls on both sides
                for v in (variants if r % 2 == 0 else variants[::-1]):
                    out = subprocess.run([sys.executable, "-c", WORKER, v, model, str(args.prefill), str(args.decode),
                                          str(args.threads), text_path], capture_output=True, text=True, env=env)
                    if out.returncode != 0:
                        raise SystemExit(f"worker {v} failed:\n{out.stderr[-2000:]}")
                    runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
                    bar.update(1)
    finally:
        os.unlink(text_path)

    def ratios(num: str, den: str, field: str) -> dict:
        # one ratio per round (the two runs of a round are back to back), so slow drift of the machine cancels
        r = np.array([a[field] / b[field] for a, b in zip(runs[num], runs[den])])
        return {"median": float(np.median(r)), "min": float(r.min()), "max": float(r.max())}

    summary = {
        "patched_over_upstream_prefill": ratios("patched", "upstream", "prefill_tok_s"),
        "patched_over_upstream_decode": ratios("patched", "upstream", "decode_tok_s"),
        "stats_overhead_prefill": ratios("patched", "patched+stats", "prefill_tok_s"),
        # per CPU second of the process (all its threads): leaves out the time it waited for a CPU; with one
        # thread there is no barrier spinning in it either, so it is the steadier measure of the work
        "patched_over_upstream_prefill_cpu": ratios("patched", "upstream", "prefill_cpu_tok_s"),
        "patched_over_upstream_decode_cpu": ratios("patched", "upstream", "decode_cpu_tok_s"),
        "stats_overhead_prefill_cpu": ratios("patched", "patched+stats", "prefill_cpu_tok_s"),
    }
    key = args.key or "knobs_off"
    save_section(Path(args.out), key, {"prefill_tokens": args.prefill, "decode_tokens": args.decode,
                                       "threads": args.threads, "repeats": args.repeats, "runs": runs,
                                       "libraries": {v: runs[v][0]["library"] for v in variants},
                                       "summary": summary})
    print(json.dumps(summary, indent=1))


def run_exact(args) -> None:
    """Patch 0011 changed how the ceiling is computed, not what: the Lambda + ceiling NLL per bucket against the
    ablation bench's (bench/results/lambda_ablation.json, measured before 0011). Buckets before any key is past
    the ceiling must be equal; after, an f16 cache's kernels may round differently (the difference is recorded)."""
    import tempfile

    committed = json.loads((RESULTS / "lambda_ablation.json").read_text())
    ref = committed["configs"]["lambda+ceiling"]["buckets"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ablation.json"
        subprocess.run([sys.executable, str(HERE / "lambda_ablation.py"), "--tokens", str(args.tokens),
                        "--configs", "lambda+ceiling", "--bucket", str(committed["bucket"]), "--out", str(out)],
                       check=True)
        new = json.loads(out.read_text())["configs"]["lambda+ceiling"]
    pairs = [(a["nll"], b["nll"]) for a, b in zip(ref, new["buckets"]) if a["end"] == b["end"]]
    diff = [abs(a - b) for a, b in pairs]
    result = {"tokens": args.tokens, "buckets": len(pairs), "bucket": committed["bucket"],
              "n_ctx_now": new["n_ctx"], "n_ctx_committed": committed["configs"]["lambda+ceiling"]["n_ctx"],
              "nll_diff_by_bucket": [b - a for a, b in pairs], "max_abs_nll_diff": max(diff),
              "tokens_per_second_now": new["tokens_per_second"],
              "tokens_per_second_committed": committed["configs"]["lambda+ceiling"]["tokens_per_second"]}
    save_section(Path(args.out), "exactness_vs_ablation", result)
    print(json.dumps(result, indent=1))


# --- soak ----------------------------------------------------------------------------------------------------

def run_soak(args) -> None:
    from llama_extrapolate import AttentionConfig
    import llama_extrapolate as le
    from llama_extrapolate.harness.evaluate import streaming_nll

    if args.tokens < 16384:
        raise SystemExit(f"--tokens {args.tokens}: the soak compares against the peak after 16384 tokens; "
                         "use --tokens 16384 or more")
    if args.window <= 0:
        raise SystemExit(f"--window {args.window}: the soak needs a Lambda window, e.g. --window 1024")
    model = str(le.default_model_path())
    info = le.read_model_info(model)
    cfg = AttentionConfig(sinks=args.sinks, window=args.window, ceiling=args.window, rollback=0)
    n_batch = args.n_batch
    n_ctx = cfg.resolve(info).required_n_ctx(n_batch, stream=args.tokens)
    llm = le.Llama(model, attention=cfg, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=args.threads,
                   n_threads_batch=args.threads, n_gpu_layers=args.n_gpu_layers, verbose=False)
    tokens = essay_tokens(llm, args.tokens)
    marks = [m for m in MARKS if m <= args.tokens]
    result = {"window": args.window, "sinks": args.sinks, "n_ctx": n_ctx, "tokens": args.tokens, "marks": [],
              "bucket": args.bucket}
    t0 = time.perf_counter()

    def on_chunk(nll: np.ndarray, done: int) -> None:
        if done in marks:
            cur, peak = rss_bytes()
            part = nll[:done - 1]
            result["marks"].append({"tokens": done, "rss_bytes": cur, "peak_rss_bytes": peak,
                                    "elapsed_s": time.perf_counter() - t0,
                                    "nll_last_bucket": float(np.mean(part[-args.bucket:]))})
            result["buckets"] = [float(np.mean(part[i:i + args.bucket])) for i in range(0, len(part), args.bucket)]
            save_section(Path(args.out), "soak", result)

    res = streaming_nll(llm, tokens, n_batch=n_batch, desc="soak", on_chunk=on_chunk)
    result["nll_nan"] = int(np.isnan(res.nll).sum())
    result["nll_scored"] = int(len(res.nll))  # every token after the first has a score: nothing skipped
    result["total_s"] = res.seconds
    ref = next(m for m in result["marks"] if m["tokens"] == 16384)
    result["peak_rss_over_16k"] = result["marks"][-1]["peak_rss_bytes"] / ref["peak_rss_bytes"]
    save_section(Path(args.out), "soak", result)
    print(json.dumps({k: result[k] for k in ("peak_rss_over_16k", "nll_nan", "total_s")}))


# --- summary ---------------------------------------------------------------------------------------------------

def prefill_at(sec: dict, end: int, span: int = 8192) -> float:
    """Prefill tokens/s over the span tokens before `end` (several blocks: one block is too noisy here)."""
    blocks = [b for b in sec["blocks"] if end - span < b["end"] <= end]
    if not blocks or blocks[-1]["end"] != end:
        return float("nan")
    return sum(b["tokens"] for b in blocks) / sum(b["tokens"] / b["tok_s"] for b in blocks)


# the sections `stream --config lambda|vanilla` write by default: the targets are read from these two
CURRENT_STREAMS = ("stream_lambda", "stream_vanilla")


def summarize(data: dict) -> dict:
    """The speed and memory ratios from the recorded streams: each ratio within one stream, or two streams of one run."""
    out = {}
    lam, van = (data.get(k) for k in CURRENT_STREAMS)
    if lam:
        marks = {m["tokens"]: m for m in lam["marks"]}
        out["lambda_prefill_tok_s"] = {str(m): prefill_at(lam, m) for m in marks if m >= 16384}
        out["lambda_decode_tok_s"] = {str(m): marks[m]["decode_tok_s"] for m in marks if "decode_tok_s" in marks[m]}
        last = max(marks)
        if 16384 in marks and last > 16384:
            out["lambda_prefill_last_over_16k"] = prefill_at(lam, last) / prefill_at(lam, 16384)
        if 8192 in marks and last > 8192:
            out["lambda_decode_last_over_8k"] = marks[last]["decode_tok_s"] / marks[8192]["decode_tok_s"]
            out["lambda_rss_last_over_16k"] = marks[last]["peak_rss_bytes"] / marks[16384]["peak_rss_bytes"]
        paired = {str(m): marks[m]["paired_decode"]["median_ratio"] for m in marks if "paired_decode" in marks[m]}
        if paired:
            out["lambda_decode_paired_over_reference"] = paired
            out["paired_reference_tokens"] = lam.get("paired_reference_tokens")
    if lam and van:
        for m in (16384, 32768):
            if any(b["end"] == m for b in van["blocks"]):
                out[f"lambda_over_vanilla_prefill_{m}"] = prefill_at(lam, m, 2048) / prefill_at(van, m, 2048)
    if data.get("soak", {}).get("marks"):
        out["soak"] = soak_summary(data["soak"])
    return out


def soak_summary(sec: dict) -> dict:
    """Target 3 from the soak: memory after N tokens over memory after 16k, and the mean NLL between marks.

    The NLL is reported between consecutive marks (16k-32k, 32k-64k, ...) rather than as one number, so a
    slow drift (something lost as the cache turns over) shows as a trend, not as noise in a mean.
    """
    marks = {m["tokens"]: m for m in sec["marks"]}
    last = max(marks)
    ref = marks.get(16384)
    out = {"tokens_read": last, "complete": "total_s" in sec and last == sec["tokens"]}
    if ref and last > 16384:
        out["peak_rss_last_over_16k"] = marks[last]["peak_rss_bytes"] / ref["peak_rss_bytes"]
        out["rss_last_over_16k"] = marks[last]["rss_bytes"] / ref["rss_bytes"]
    buckets, size = sec.get("buckets", []), sec["bucket"]
    ranges = {}
    bounds = sorted(marks)
    for lo, hi in zip(bounds, bounds[1:]):
        part = buckets[lo // size:hi // size]
        if len(part) == (hi - lo) // size:
            ranges[f"{lo}-{hi}"] = float(np.mean(part))
    out["nll_by_range"] = ranges
    if ranges:
        vals = list(ranges.values())
        out["nll_range_spread"] = max(vals) - min(vals)
    for k in ("nll_nan", "nll_scored"):
        if k in sec:
            out[k] = sec[k]
    return out


# --- plot ----------------------------------------------------------------------------------------------------

def run_plot(args) -> None:
    from llama_extrapolate.harness.plots import pyplot

    plt = pyplot()

    data = load_results(Path(args.out))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
    for key, sec in sorted(data.items()):
        if not key.startswith("stream_"):
            continue
        # the current build's streams stand out; earlier runs (kept for comparison) stay faint
        style = {} if key in CURRENT_STREAMS else {"lw": 0.8, "alpha": 0.45, "ms": 3}
        blocks = sec["blocks"]
        a.plot([x["end"] for x in blocks], [x["tok_s"] for x in blocks], label=key[len("stream_"):], **style)
        marks = [m for m in sec["marks"] if "decode_tok_s" in m]
        b.plot([m["tokens"] for m in marks], [m["decode_tok_s"] for m in marks], "o-", label=key[len("stream_"):],
               **style)
        paired = [m for m in sec["marks"] if "paired_decode" in m]
        if paired:
            c.plot([m["tokens"] for m in paired], [m["paired_decode"]["median_ratio"] for m in paired], "o-",
                   label=f"{key[len('stream_'):]} (median)", **style)
            for m in paired:
                c.scatter([m["tokens"]] * len(m["paired_decode"]["ratios"]), m["paired_decode"]["ratios"], s=8,
                          color="grey", alpha=0.5)
    c.axhline(0.9, color="red", lw=0.8, ls="--", label="target 0.9")
    for ax, title in ((a, "prefill tokens/s (per block)"), (b, "decode tokens/s after the context"),
                      (c, "decode after N / after 8k, side by side")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens read")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M Q4_1, 2 threads")
    fig.tight_layout()
    fig.savefig(Path(args.out).with_suffix(".png"), dpi=110)
    print(f"wrote {Path(args.out).with_suffix('.png')}")
    if data.get("soak", {}).get("buckets"):
        plot_soak(data["soak"], Path(args.out).with_name("soak.png"))
    summary = summarize(data)
    save_section(Path(args.out), "summary", summary)
    print(json.dumps(summary, indent=1))


def plot_soak(sec: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    size = sec["bucket"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
    nll = sec["buckets"]
    a.plot([(i + 1) * size for i in range(len(nll))], nll, lw=0.8)
    a.set_xlabel("tokens read")
    a.set_ylabel(f"mean NLL per {size} tokens")
    a.set_title(f"NLL along the stream (S = {sec['sinks']}, W = C = {sec['window']})")
    marks = sec["marks"]
    xs = [m["tokens"] for m in marks]
    b.plot(xs, [m["peak_rss_bytes"] / 2**20 for m in marks], "o-", label="peak RSS")
    b.plot(xs, [m["rss_bytes"] / 2**20 for m in marks], "s-", label="RSS at the mark")
    b.set_xscale("log", base=2)
    b.set_ylim(bottom=0)
    b.set_xlabel("tokens read")
    b.set_ylabel("MiB")
    b.set_title("resident memory")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{sec['tokens']}-token soak, SmolLM2-135M Q4_1, n_ctx {sec['n_ctx']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["stream", "knobs-off", "exact", "soak", "flash", "stats", "plot"])
    ap.add_argument("--config", default="lambda")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--window", type=int, default=0, help="Lambda window (default: the model's L_pre)")
    ap.add_argument("--sinks", type=int, default=10)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--block", type=int, default=2048, help="prefill tokens/s is measured per block")
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded per try at each mark (best of 3)")
    ap.add_argument("--paired-decode", type=int, default=0, metavar="PAIRS",
                    help="stream: also decode in PAIRS alternating bursts against a second context parked after the "
                         "first mark (decode after N over decode after 8k, measured side by side)")
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1,
                    help="stats: untimed rounds of every variant first (kernels a backend builds on first use)")
    ap.add_argument("--bucket", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0,
                    help="stream, soak, flash: layers offloaded to a GPU backend (-1: all), in a GPU build")
    ap.add_argument("--key", default="", help="name of the stream's (or knobs-off run's) section in the JSON")
    ap.add_argument("--configs", default="flash,plain",
                    help="flash: the contexts read side by side (" + ", ".join(FLASH_CONFIGS) + ")")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    {"stream": run_stream, "knobs-off": run_knobs_off, "exact": run_exact, "soak": run_soak, "flash": run_flash, "stats": run_stats,
     "plot": run_plot}[args.mode](args)


if __name__ == "__main__":
    main()
