"""The long NLL and passkey benchmarks on the default model, through the same commands a user runs.

``nll``: ``llama-extrapolate nll`` over the first --tokens (65536) tokens of Paul Graham's essays for every
configuration: Lambda + ceiling, vanilla, llama.cpp's context shift, window only, Lambda without ceiling,
ceiling only, log-length temperature, and a calibration profile when --profile names one (made by
``profile`` mode). Results: ``bench/results/nll_essays.{json,png}``.

``passkey``: ``llama-extrapolate passkey`` at 4k, 8k, 16k, 32k tokens x 5 depths for vanilla, Lambda +
ceiling and the context shift. Results: ``bench/results/passkey.{json,png}``.

``profile``: ``llama-extrapolate calibrate`` (Algorithm 1, max probability, one tau per length) on the
essays, written to ``bench/results/smollm2.profile.json`` for the profile baseline.

Every command writes its JSON as it goes and resumes when rerun, so each mode can be run in pieces
(a configuration or a length at a time: --configs, --lengths) and finished later; ``table`` prints what
is there as markdown and says what is missing.

    python bench/long_eval.py nll [--configs lambda,vanilla,...] [--tokens 65536]
    python bench/long_eval.py passkey [--lengths 4096,8192] [--configs vanilla,lambda,context-shift]
    python bench/long_eval.py profile [--lengths 16384,32768]
    python bench/long_eval.py table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from tables import range_mean  # noqa: E402  (one definition: tools/tables.py prints the documents' tables with it too)
RESULTS = HERE / "results"
NLL = RESULTS / "nll_essays.json"
PASSKEY = RESULTS / "passkey.json"
PROFILE = Path("bench/results/smollm2.profile.json")  # relative to the repository: it names a config

NLL_CONFIGS = ("lambda", "vanilla", "context-shift", "window-only", "lambda-only", "ceiling-only", "log-length")
PASSKEY_CONFIGS = ("vanilla", "lambda", "context-shift")
PASSKEY_LENGTHS = (4096, 8192, 16384, 32768)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# position ranges of the NLL table: inside the training length, then each doubling past it
RANGES = ((4096, 8192), (8192, 16384), (16384, 32768), (32768, 65536))


def nll_configs(names: Optional[str], profile: Path) -> List[str]:
    """The configurations to score: the named ones, or all of them (with the profile when it exists)."""
    if names:
        return [n.strip() for n in names.split(",") if n.strip()]
    out = list(NLL_CONFIGS)
    if profile.exists():
        out.append(f"profile={profile}")
    return out


def _cli(argv: List[str]) -> int:
    from llama_extrapolate.cli import main

    print("llama-extrapolate " + " ".join(argv), file=sys.stderr)
    return main(argv)


def run_nll(args) -> int:
    configs = nll_configs(args.configs, Path(args.profile))
    return _cli(["nll", "--corpus", "pg-essays", "--tokens", str(args.tokens), "--configs", ",".join(configs),
                 "--threads", str(args.threads), "-o", str(NLL)])


def run_passkey(args) -> int:
    return _cli(["passkey", "--lengths", args.lengths or ",".join(map(str, PASSKEY_LENGTHS)),
                 "--depths", ",".join(map(str, DEPTHS)), "--trials", str(args.trials),
                 "--configs", args.configs or ",".join(PASSKEY_CONFIGS), "--threads", str(args.threads),
                 "-o", str(PASSKEY)])


def run_profile(args) -> int:
    return _cli(["calibrate", "--corpus", "pg-essays", "--lengths", args.lengths or "16384,32768",
                 "--mode", "pmax", "--granularity", "global", "--threads", str(args.threads),
                 "-o", str(args.profile)])


def nll_table(results: dict) -> str:
    configs = results.get("configs", {})
    if not configs:
        return ""
    head = "| configuration | " + " | ".join(f"NLL {lo // 1024}k–{hi // 1024}k" for lo, hi in RANGES)
    out = [head + " | tok/s | peak RSS MiB | KV cells |", "|---" * (len(RANGES) + 4) + "|"]
    for name, e in configs.items():
        cells = []
        for lo, hi in RANGES:
            m = range_mean(e.get("buckets") or [], lo, hi)
            cells.append("–" if m is None else f"{m:.3f}")
        if e.get("complete"):
            speed, rss = f"{e['tokens_per_second']:.1f}", f"{e['peak_rss_bytes'] / 2**20:.0f}"
        else:
            speed, rss = f"(stopped at {e.get('tokens_done', 0)})", "–"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {speed} | {rss} | {e['config']['n_ctx']} |")
    return "\n".join(out)


def passkey_table(results: dict) -> str:
    acc = results.get("accuracy", {})
    if not acc:
        return ""
    lengths = sorted({int(L) for a in acc.values() for L in a})
    out = ["| configuration | " + " | ".join(f"{L // 1024}k" for L in lengths) + " |",
           "|---" * (len(lengths) + 1) + "|"]
    for name, a in acc.items():
        cells = []
        for L in lengths:
            ds = a.get(str(L))
            cells.append("–" if not ds else f"{np.mean(list(ds.values())):.2f} ({len(ds)} depths)")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def missing(nll: dict, passkey: dict, tokens: int, profile: Path) -> List[str]:
    """The configurations and lengths the benchmark covers that the results do not hold yet."""
    out = []
    for name in nll_configs(None, profile):
        e = nll.get("configs", {}).get(name)
        if e is None or not e.get("complete") or nll.get("tokens", 0) < tokens:
            out.append(f"nll {name}")
    if not profile.exists():
        out.append("nll profile (run the profile mode)")
    have = {(t["config"], t["length"], t["depth"]) for t in passkey.get("trials", [])}
    for c in PASSKEY_CONFIGS:
        for L in PASSKEY_LENGTHS:
            n = sum((c, L, d) in have for d in DEPTHS)
            if n < len(DEPTHS):
                out.append(f"passkey {c} {L}: {n}/{len(DEPTHS)} depths")
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def run_table(args) -> int:
    nll, pk = load(NLL), load(PASSKEY)
    print(nll_table(nll))
    print()
    print(passkey_table(pk))
    todo = missing(nll, pk, args.tokens, Path(args.profile))
    if todo:
        print("\nnot run yet: " + "; ".join(todo))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["nll", "passkey", "profile", "table"])
    p.add_argument("--configs", help="comma-separated (default: every configuration of the mode)")
    p.add_argument("--lengths", help="passkey: input lengths; profile: extrapolation lengths")
    p.add_argument("--tokens", type=int, default=65536, help="nll: tokens to score")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", default=str(PROFILE), help="calibration profile of the profile baseline")
    args = p.parse_args(argv)
    os.chdir(HERE.parent)  # the profile's path is part of its configuration name in the JSON
    return {"nll": run_nll, "passkey": run_passkey, "profile": run_profile, "table": run_table}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
