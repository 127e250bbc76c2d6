"""The layers split across llama.cpp RPC servers: speed against all local, the bytes that cross, RAM per machine.

Each cell starts ``--servers`` RPC servers on 127.0.0.1 (``llama-extrapolate rpc-server``, each a "machine"), loads
a model with every layer on them (llama.cpp splits the layers by the servers' free memory; 0 servers: all local),
reads the essays' first N tokens, asks a 14-token question and times 16 answer tokens, in a process of its own (the
RPC devices, once registered, stay for the process). Measured:

- reading tokens/s, the first answer token's seconds, an answer token's seconds;
- the bytes that cross: what the loopback interface carried over a phase (/proc/net/dev, headers included; nothing
  else on the machine is to use the loopback meanwhile). ggml-rpc sends nothing from server to server: a tensor
  that moves between two servers goes through the client;
- each server's resident memory before the model (the Python process serving) and at its peak, and the client's.

On one 2-core machine the servers and the client take turns on the same cores: the speeds say what the protocol
costs on a loopback, not what more machines would gain. The bytes and the RAM are what they would be on machines.

A shape model (bench/kv_shapes.py) has a big model's layers, KV heads and head dimension, so the attention's
traffic (with the document memory the KV cache stays on the client, so each layer's queries, keys and values
come to it and its attention output goes back) is that model's; its residual stream is narrow (``--n-embd``,
default 256), so the traffic that grows with the residual stream is measured at two widths and extrapolated to the
real one in the 70B table (``project``, written into the results: ``tools/tables.py rpc-70b``).

    python bench/rpc.py --shape llama-3-70b --tokens 1024 --servers 0,2,3,4 --configs lambda,memory:hold
    python bench/rpc.py --shape llama-3-70b --tokens 1024 --servers 2 --configs memory:hold --n-embd 512
    python bench/rpc.py --model default --tokens 4096 --servers 0,2 --configs lambda,memory:hold
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ANSWER_TOKENS = 16
SHORT_QUESTION = "\nWhat is the first sentence of the text above?"
HOLD_SUFFIX = ":hold"
TABLE_TOKENS = 131072  # the 70B table's document (the memory's disk and RAM)

# Llama-3-70B as published (its config): what the table's weights and residual traffic are computed from
LLAMA_3_70B = {"n_layer": 80, "n_embd": 8192, "n_ff": 28672, "n_head": 64, "n_head_kv": 8, "head_dim": 128,
               "n_vocab": 128256}
Q4_0_BITS = 4.5  # 18 bytes per 32 weights


def llama_3_70b_params() -> int:
    a = LLAMA_3_70B
    q, kv = a["n_head"] * a["head_dim"], a["n_head_kv"] * a["head_dim"]
    per_layer = a["n_embd"] * (2 * q + 2 * kv) + 3 * a["n_embd"] * a["n_ff"] + 2 * a["n_embd"]
    return a["n_layer"] * per_layer + 2 * a["n_vocab"] * a["n_embd"] + a["n_embd"]


def loopback_bytes() -> int:
    """Bytes the loopback interface has carried (/proc/net/dev, lo's transmitted bytes: every packet between this
    process and a server on 127.0.0.1, with its TCP/IP headers, as a network would carry it). ggml-rpc talks
    through send/recv, which /proc/PID/io does not count."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    raise SystemExit("no loopback interface in /proc/net/dev: the bytes that cross cannot be counted here")


def proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def model_for(args) -> tuple:
    """(path, label) of the cell's model: the default model or a shape model at --n-embd."""
    from llama_extrapolate.default_model import default_model_path

    if args.model == "default":
        path = default_model_path()
        return str(path), Path(path).stem + " (default)"
    sys.path.insert(0, str(HERE))
    import kv_shapes

    path = kv_shapes.cached(args.shape, args.n_embd)
    return str(path), args.shape


def run_cell(args, n_servers: int, config: str) -> dict:
    """One (servers, configuration) in this process."""
    import llama_extrapolate as le
    from llama_extrapolate import native, rpc
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.harness.evaluate import memory_config_name, setup_for
    from llama_extrapolate.names import NamedConfig
    from llama_extrapolate.options import memory_type_for
    from llama_extrapolate.resources import peak_rss_bytes, peak_rss_reset
    from llama_extrapolate.session import Session

    hold = config.endswith(HOLD_SUFFIX)
    base = config[:-len(HOLD_SUFFIX)] if hold else config
    name = "lambda" if base == "lambda" else memory_config_name("lambda+memory" + base[len("memory"):])
    model, label = model_for(args)
    info = le.read_model_info(model)
    vocab = native.load_tokenizer(model)
    tokens = vocab.tokenize(paul_graham_essays().encode("utf-8"), add_bos=True)[:args.tokens]
    question = vocab.tokenize(SHORT_QUESTION.encode("utf-8"), add_bos=False)
    vocab.close()
    if len(tokens) < args.tokens:
        raise SystemExit(f"--tokens {args.tokens}: the essays have only {len(tokens)} tokens")
    n_total = len(tokens) + len(question) + ANSWER_TOKENS + 1
    st = setup_for(name, info, n_total, args.n_batch, window=args.window)
    kwargs = st.llama_kwargs()
    if st.attention.memory_blocks and NamedConfig.parse(name).memory_type is None:
        # a memory named without its store's type stores as run and serve would for this model (by its size), not
        # in the named configurations' q8_0
        kwargs["memory_type"] = memory_type_for(info)
    store = None
    if st.attention.memory_blocks:
        # opened for --capacity tokens (default the table's document): the summaries' RAM and the store's
        # reservation are those of that length'
        store = os.path.join(tempfile.gettempdir(), f"rpc-bench-{os.getpid()}.kvstore")
        kwargs.update(memory_path=store, memory_capacity=max(args.capacity, n_total))

    logs = Path(tempfile.mkdtemp(prefix="rpc-bench-"))
    servers = [rpc.start_local(logs / f"server{i}.log", args.threads) for i in range(n_servers)]
    pids = [proc.pid for proc, _ in servers]
    try:
        server_base = [proc_status(pid, "VmRSS") for pid in pids]
        io0 = loopback_bytes()
        if servers:
            kwargs["rpc_servers"] = ",".join(str(e) for _, e in servers)
        peak_rss_reset()
        t0 = time.perf_counter()
        llm = le.Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_batch,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **kwargs)
        load_s = time.perf_counter() - t0
        try:
            devices = llm.devices()
            placement = {d: devices["layers"].count(d) for d in dict.fromkeys(devices["layers"])}
            io1 = loopback_bytes()
            session = Session(llm)
            read = session.read(tokens, progress=True, desc=f"{label} {n_servers} servers {config}")
            io2 = loopback_bytes()
            if st.top_k_question:
                llm.set_top_k_active(True)
            with session.ask(question, hold=hold) as asked:
                io3 = loopback_bytes()
                steps = [step.seconds for step in asked.answer(ANSWER_TOKENS)]
                io4 = loopback_bytes()
            entry = {
                "model": label, "n_embd": info.embedding_length, "n_layer": info.block_count, "tokens": len(tokens),
                "servers": n_servers, "config": name + (HOLD_SUFFIX if hold else ""), "window": args.window,
                "threads": args.threads, "placement": placement, "output_device": devices["output"],
                "load_s": load_s, "read_s": read.seconds, "read_tok_s": read.tokens_per_second,
                "first_token_s": asked.seconds, "first_token": asked.token,
                "answer_step_s": sum(steps) / len(steps),
                # (all local: nothing crosses; the loopback's count would be other processes')
                "bytes_load": (io1 - io0) if servers else None,
                "bytes_per_read_token": (io2 - io1) / len(tokens) if servers else None,
                "bytes_question": (io3 - io2) if servers else None,
                "bytes_per_answer_token": (io4 - io3) / ANSWER_TOKENS if servers else None,
                "server_base_rss_bytes": server_base,
                "server_peak_rss_bytes": [proc_status(pid, "VmHWM") for pid in pids],
                "client_peak_rss_bytes": peak_rss_bytes(),
                "model_bytes": Path(model).stat().st_size,
                "n_ctx": st.n_ctx,
            }
            if st.attention.memory_blocks:
                mi = llm.memory_info()
                entry.update(memory_type=kwargs["memory_type"],
                             memory_capacity=kwargs["memory_capacity"], memory_ram_bytes=mi["bytes_in_ram"],
                             memory_disk_bytes_at_capacity=llm.memory_disk_bytes(kwargs["memory_capacity"]))
        finally:
            llm.close()
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)
        if store and os.path.exists(store):
            os.unlink(store)
    entry["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    entry["date"] = time.strftime("%Y-%m-%d %H:%M")
    return entry


def key(e: dict) -> tuple:
    return (e["model"], e["n_embd"], e["tokens"], e["servers"], e["config"])


def project(entries: list) -> dict:
    """The 70B table: Llama-3-70B's layers over 2-4 machines, from the shape model's cells at two residual widths.

    The traffic a token makes is a + b * n_embd (the attention's queries, keys, values and outputs are a, fixed by
    the KV shapes; the residual stream between servers and the client is b * n_embd): fitted per (servers, config)
    on the widths measured, then taken at 8192. Weights per machine: the published shape's parameters at q4_0 over
    the machines; a server's RAM beyond its weights is the measured growth of its resident memory less its share
    of the shape model's file."""
    weights = llama_3_70b_params() * Q4_0_BITS / 8
    rows = []
    by = {}
    # the longest reading measured (cells of other lengths are not mixed in a fit)
    max_tokens = max((e["tokens"] for e in entries if e["model"] == "llama-3-70b"), default=0)
    for e in entries:
        if e["model"] == "llama-3-70b" and e["servers"] > 0 and e["tokens"] == max_tokens:
            by.setdefault((e["servers"], e["config"]), []).append(e)
    for (n, config), cells in sorted(by.items()):
        widths = sorted({c["n_embd"] for c in cells})
        row = {"servers": n, "config": config, "widths_measured": widths,
               "weights_per_server_bytes": weights / n}
        base = min(cells, key=lambda c: c["n_embd"])
        growth = [peak - b0 for peak, b0 in zip(base["server_peak_rss_bytes"], base["server_base_rss_bytes"])]
        row["server_ram_beyond_weights_bytes"] = max(growth) - base["model_bytes"] / n
        row["client_peak_rss_bytes"] = base["client_peak_rss_bytes"]
        if "memory_disk_bytes_at_capacity" in base:
            row.update(memory_tokens=base["memory_capacity"], client_disk_bytes=base["memory_disk_bytes_at_capacity"],
                       client_memory_ram_bytes=base["memory_ram_bytes"])
        for what in ("bytes_per_read_token", "bytes_per_answer_token"):
            if len(widths) >= 2:
                lo = min(cells, key=lambda c: c["n_embd"])
                hi = max(cells, key=lambda c: c["n_embd"])
                slope = (hi[what] - lo[what]) / (hi["n_embd"] - lo["n_embd"])
                row[what] = lo[what] + slope * (LLAMA_3_70B["n_embd"] - lo["n_embd"])
                row[what + "_per_embd"] = slope
            else:
                row[what] = None
            row[what + "_measured"] = {c["n_embd"]: c[what] for c in cells}
        rows.append(row)
    return {"model": "llama-3-70b", "params": llama_3_70b_params(), "weights_q4_0_bytes": weights,
            "document_tokens": TABLE_TOKENS, "rows": rows}


def save(path: Path, entry: dict) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    cells = [e for e in data.get("cells", []) if key(e) != key(entry)] + [entry]
    cells.sort(key=key)
    data["cells"] = cells
    data["projection_70b"] = project(cells)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["shape", "default"], default="shape",
                    help="a shape model (--shape, --n-embd) or the default model")
    ap.add_argument("--shape", default="llama-3-70b", help="a shape of bench/kv_shapes.py")
    ap.add_argument("--n-embd", type=int, default=256, help="the shape model's residual stream")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--servers", default="0,2", help="server counts, one cell each (0: all layers local)")
    ap.add_argument("--configs", default="lambda,memory:hold",
                    help="lambda, memory[:m=N:c=C][:hold] (as bench/scale.py)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--n-batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="the client's threads and each server's")
    ap.add_argument("--capacity", type=int, default=TABLE_TOKENS,
                    help="tokens the memory is opened for: its RAM and disk at that document length")
    ap.add_argument("--out", default=str(RESULTS / "rpc.json"))
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # "servers/config": run one cell here and print its JSON
    args = ap.parse_args(argv)
    try:
        counts = [int(s) for s in args.servers.split(",")]
    except ValueError:
        ap.error(f"--servers {args.servers!r}: give counts such as 0,2,4")
    if any(n < 0 or n > 8 for n in counts):
        ap.error(f"--servers {args.servers!r}: each count between 0 and 8")
    if args.cell:
        n, config = args.cell.split("/", 1)
        print("CELL " + json.dumps(run_cell(args, int(n), config)))
        return 0
    out = Path(args.out)
    for config in args.configs.split(","):
        for n in counts:
            cmd = [sys.executable, __file__, "--cell", f"{n}/{config}"] + [
                a for a in (argv if argv is not None else sys.argv[1:])]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            sys.stdout.write("".join(l + "\n" for l in proc.stdout.splitlines() if not l.startswith("CELL ")))
            if proc.returncode != 0:
                raise SystemExit(f"cell {n} servers, {config}: exit {proc.returncode}")
            entry = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("CELL "))[5:])
            save(out, entry)
            print(json.dumps({k: v for k, v in entry.items() if not k.startswith("server_")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
