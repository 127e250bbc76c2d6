"""A reading killed and run again: ``run --state``'s checkpoints at a big model's KV shapes.

``llama-extrapolate run --state FILE`` checkpoints its reading every ``--checkpoint-every`` seconds: the cache,
the document memory's block summaries and a reference to its kept store file (the store is not copied). This
reads the essays' first N tokens with a shape model (bench/kv_shapes.py) in three processes of its own:

1. straight through, without a state: the answer, and what a whole reading takes;
2. with ``--state``, killed with SIGKILL (a machine shut down, nothing flushed by the process) ``--kill-after``
   seconds after its first checkpoint, so that the store went on past the checkpoint;
3. the same command again: it goes on from the last checkpoint.

Recorded: the checkpoint's tokens, bytes and write time, the store's bytes, each run's wall time and answer, and
whether the resumed answer is the uninterrupted one. Each (shape, tokens) is an entry of
``bench/results/resume.json``; a run replaces its own entry.

    python bench/resume.py --shape llama-2-7b --tokens 32768 --checkpoint-every 120 --kill-after 60
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUESTION = "What is the first sentence of the text above?"
ANSWER_TOKENS = 8


def document(model: str, n_tokens: int) -> str:
    """The essays' first ``n_tokens`` tokens as text (the shape model reads it with the default model's tokenizer)."""
    from llama_extrapolate import native
    from llama_extrapolate.harness.corpora import paul_graham_essays

    vocab = native.load_tokenizer(model)
    try:
        tokens = vocab.tokenize(paul_graham_essays().encode("utf-8"), add_bos=False)
        if len(tokens) < n_tokens:
            raise SystemExit(f"--tokens {n_tokens}: the essays have only {len(tokens)} tokens")
        return vocab.detokenize(tokens[:n_tokens]).decode("utf-8", errors="ignore")
    finally:
        vocab.close()


def command(model: str, doc: Path, args, extra: list) -> list:
    """run with its defaults but the window (bench/scale.py's W, so that the reading speeds compare)."""
    return [sys.executable, "-m", "llama_extrapolate", "run", "--model", model, "--file", str(doc), "--no-chat",
            "--prompt", QUESTION, "--max-tokens", str(ANSWER_TOKENS), "--threads", str(args.threads),
            "--window", str(args.window), *extra]


def run_to_end(cmd: list) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall_s": time.perf_counter() - t0, "answer": p.stdout, "said": said(p.stderr)}


def said(err: str) -> list:
    """The run's bracketed notes and its state line (the progress bar's redraws left out)."""
    return [line.strip() for line in re.split(r"[\r\n]", err)
            if line.startswith(("[", "document state")) and "tok/s" not in line]


def run_and_kill(cmd: list, state: Path, kill_after: float) -> dict:
    """Start ``cmd``, wait for its first checkpoint, let it read on ``kill_after`` seconds, SIGKILL it."""
    meta = state.with_name(state.name + ".json")
    log = state.with_name("killed.err")
    t0 = time.perf_counter()
    with open(log, "w") as err:  # a file, not a pipe: the progress bar would fill a pipe nobody reads
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        while not meta.exists():
            if p.poll() is not None:
                raise SystemExit(f"the run ended ({p.returncode}) before its first checkpoint: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        first = time.perf_counter() - t0
        time.sleep(kill_after)
        if p.poll() is not None:
            raise SystemExit("the run ended before it was killed: give a larger --tokens or a smaller --kill-after")
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    killed_at = time.perf_counter() - t0
    # read after the kill, as the rerun finds it (a checkpoint written meanwhile replaces the JSON)
    if not meta.exists():
        raise SystemExit("killed while a checkpoint was being written (its JSON not yet there): run again")
    return {"first_checkpoint_s": first, "killed_at_s": killed_at, "checkpoint": json.loads(meta.read_text())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-2-7b", help="a shape of bench/kv_shapes.py")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--checkpoint-every", type=float, default=120.0)
    ap.add_argument("--kill-after", type=float, default=60.0, help="seconds of reading after the first checkpoint")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the document, state and store go")
    ap.add_argument("--out", default=str(RESULTS / "resume.json"))
    args = ap.parse_args(argv)

    sys.path.insert(0, str(HERE))
    from memory import replace_run
    from scale import shape_model

    model = shape_model(args.shape)
    work = Path(args.dir) / f"resume-{args.shape}-{os.getpid()}"
    work.mkdir(parents=True)
    doc = work / "doc.txt"
    doc.write_text(document(model, args.tokens))
    state = work / "doc.state"
    store = work / "doc.state.memory"
    try:
        whole = run_to_end(command(model, doc, args, []))
        print(f"uninterrupted: {whole['wall_s']:.0f} s", file=sys.stderr)
        stateful = ["--state", str(state), "--checkpoint-every", str(args.checkpoint_every)]
        killed = run_and_kill(command(model, doc, args, stateful), state, args.kill_after)
        killed["store_bytes_at_kill"] = store.stat().st_size
        print(f"killed at {killed['killed_at_s']:.0f} s, checkpoint at {killed['checkpoint']['tokens']} tokens",
              file=sys.stderr)
        resumed = run_to_end(command(model, doc, args, stateful))
        final = json.loads(state.with_name(state.name + ".json").read_text())
        entry = {"shape": args.shape, "tokens": args.tokens, "threads": args.threads, "window": args.window,
                 "checkpoint_every_s": args.checkpoint_every, "kill_after_s": args.kill_after,
                 "uninterrupted": whole, "killed": killed, "resumed": resumed,
                 "final_state": {"tokens": final["tokens"], "bytes": final["bytes"], "write_s": final["write_s"]},
                 "store_bytes": store.stat().st_size,
                 "same_answer": resumed["answer"] == whole["answer"],
                 "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads}}
    finally:
        for f in work.iterdir():
            f.unlink()
        work.rmdir()
    print(json.dumps(entry, indent=1)[:3000])
    replace_run(Path(args.out), entry, lambda r: (r["shape"], r["tokens"]), sort=True)
    return 0 if entry["same_answer"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
