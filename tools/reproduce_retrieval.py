#!/usr/bin/env python3
"""Rerun committed retrieval trials on the installed build and compare the answers, trial by trial.

After a change that must not move the logits (a refolded patch series, a refactoring), the needle and passkey
answers of bench/results must come out the same. This reruns the trials of one configuration at one length (the
depths given, trial 0) into a scratch file with the settings of the committed file (seed, window, threads,
batch) and writes, per trial, the committed and the new answer:

    python tools/reproduce_retrieval.py --results bench/results/memory_needle_qwen2.5-coder-0.5b.json \\
        --model qwen2.5-coder-0.5b --config lambda+memory:m=64:c=1024 --length 8192 -o check.json

Exit status 1 when an answer differs or a trial is missing from the committed file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, required=True, help="a committed retrieval results file")
    ap.add_argument("--model", help="registry model name or GGUF path (default: the default model)")
    ap.add_argument("--config", required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("-o", "--output", type=Path, required=True, help="the comparison, JSON")
    args = ap.parse_args(argv)

    from llama_extrapolate.harness import tasks
    from llama_extrapolate.default_model import default_model_path
    from llama_extrapolate.registry_models import model_path

    committed = json.loads(args.results.read_text())
    machine = committed.get("machine", {})
    model = model_path(args.model) if args.model else str(default_model_path())
    depths = [float(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        res = tasks.run_retrieval(model, committed["task"], [args.config], [args.length], depths, 1,
                                  committed["seed"], Path(tmp) / "rerun.json", n_batch=args.n_batch,
                                  threads=machine.get("threads"), window=machine.get("window"),
                                  n_new=committed.get("n_new", 10))
    old = {(t["config"], t["length"], t["depth"], t["trial"]): t for t in committed["trials"]}
    rows = []
    for t in res["trials"]:
        o = old.get((t["config"], t["length"], t["depth"], t["trial"]))
        rows.append({"depth": t["depth"], "committed": o and o["answer"], "new": t["answer"],
                     "same": bool(o) and o["answer"] == t["answer"], "correct": t["correct"]})
    out = {"results": str(args.results), "task": committed["task"], "model": Path(model).name,
           "config": args.config, "length": args.length, "threads": machine.get("threads"),
           "window": machine.get("window"), "trials": rows, "same": sum(r["same"] for r in rows),
           "of": len(rows)}
    args.output.write_text(json.dumps(out, indent=1))
    for r in rows:
        print(f"depth {r['depth']}: committed {r['committed']!r}, new {r['new']!r}: {'same' if r['same'] else 'DIFFERENT'}")
    return 0 if out["same"] == out["of"] else 1


if __name__ == "__main__":
    sys.exit(main())
