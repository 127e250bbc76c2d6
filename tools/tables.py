"""Every table of README.md and docs/results.md, printed from the committed JSON: bench/results/ (the
benchmarks), studies/memory/ (the document-memory study's runs) and checks/ (upstream test suites on the patched tree).

The documents paste these tables verbatim, each under a comment naming it (``<!-- tools/tables.py NAME -->``),
and tests/test_bench_tables.py checks that they still match, so the docs cannot drift from the data.
Reads JSON only (json + numpy): no llama.cpp, no model; runs in well under a second.

    python tools/tables.py all              # every table, each under its marker
    python tools/tables.py nll passkey      # areas or single tables (see --list)
    python tools/tables.py --list

The helpers the bench scripts share with these tables live here (``range_mean`` for ``bench/long_eval.py``,
``rate_before`` for ``bench/pytorch_route.py``), since this module needs nothing but json and numpy; the
scripts' own quick-look tables print runs in progress, these print what is committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"  # what bench/*.py measure
STUDY = ROOT / "studies" / "memory"  # the document-memory study's runs (JSON lines)
CHECKS = ROOT / "checks"  # build and upstream-test outcomes of the patched tree
MIB = 2 ** 20
DASH = "—"


def load(name: str, results: Path = RESULTS) -> dict:
    return json.loads((results / name).read_text())


def md(header: List[str], rows: List[List[str]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def f(x: Optional[float], digits: int) -> str:
    return DASH if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def k(tokens: int) -> str:
    return f"{tokens // 1024}k"


# --- NLL: ablation over 32k (bench/lambda_ablation.py) and the long run to 64k (bench/long_eval.py nll) --------

ABLATION_ROWS = (  # JSON key, label (S, W, C filled in from the JSON)
    ("lambda+ceiling", "Λ + ceiling (S = {sinks}, W = C = {window})"),
    ("window-only", "window only (S = 0, W = {window})"),
    ("lambda-only", "Λ without ceiling (S = {sinks}, W = {window})"),
    ("ceiling-only", "ceiling without Λ (C = {ceiling}, full attention)"),
    ("vanilla", "vanilla (full attention)"),
)


def table_ablation(r: Path) -> str:
    d = load("lambda_ablation.json", r)
    rows = []
    for key, label in ABLATION_ROWS:
        c = d["configs"][key]
        s = c["summary"]
        rows.append([label.format(**c["attention"]), f(s["nll_4k_8k"], 3), f(s["nll_16k_32k"], 3),
                     f(s["ratio_16k_32k_over_4k_8k"], 3), f(c["tokens_per_second"], 1), c["n_ctx"]])
    return md(["configuration", "NLL 4k–8k", "NLL 16k–32k", "ratio to 4k–8k", "tok/s", "KV cells (n_ctx)"], rows)


NLL_RANGES = ((4096, 8192), (8192, 16384), (16384, 32768), (32768, 65536))


def range_mean(buckets: List[dict], lo: int, hi: int) -> Optional[float]:
    """Token-weighted mean NLL of the buckets inside target positions lo+1..hi; None unless they cover them.

    A bucket holds target positions start..end (inclusive); a stream of n tokens has targets 1..n-1, so the
    last range may lack its final position."""
    inside = [b for b in buckets if b["start"] > lo and b["end"] <= hi]
    w = np.array([b["end"] - b["start"] + 1 for b in inside], dtype=float)
    if not inside or w.sum() < hi - lo - 1:
        return None
    return float(np.dot(w, [b["nll"] for b in inside]) / w.sum())


def nll_label(name: str) -> str:
    if name.startswith("profile="):
        return f"profile (`{name[len('profile='):]}`)"
    return name


def table_nll_64k(r: Path) -> str:
    d = load("nll_essays.json", r)
    rows = []
    for name, e in d["configs"].items():
        cells = [f(range_mean(e["buckets"], lo, hi), 3) for lo, hi in NLL_RANGES]
        if e.get("complete"):
            speed, rss = f(e["tokens_per_second"], 1), f(e["peak_rss_bytes"] / MIB, 0)
        else:
            speed, rss = f"(stopped at {e.get('tokens_done', 0)})", DASH
        rows.append([nll_label(name)] + cells + [speed, rss, e["config"]["n_ctx"]])
    head = [f"NLL {k(lo)}–{k(hi)}" for lo, hi in NLL_RANGES]
    return md(["configuration"] + head + ["tok/s", "peak RSS MiB", "KV cells (n_ctx)"], rows)


MODEL_NLL_RANGES = ((0, 4096),) + NLL_RANGES


def table_nll_models(r: Path) -> str:
    """NLL by position on the registry models (``llama-extrapolate nll --model NAME``, bench/results/nll_<model>.json):
    each model's own training length decides where its full attention leaves what it was trained on."""
    rows = []
    for path in sorted(r.glob("nll_*.json")):
        if path.name == "nll_essays.json":
            continue
        d = json.loads(path.read_text())
        for name, e in d["configs"].items():
            cells = [f(range_mean(e["buckets"], lo, hi), 3) for lo, hi in MODEL_NLL_RANGES]
            c = e["config"]
            if name == "context-shift":
                setting = f"n_ctx = {c['n_ctx']}"
            elif c["window"] == 0 or name == "vanilla":
                setting = "full attention"
            else:  # None: the model's training length
                setting = f"S = {c['sinks']}, W = {c['window'] or 'the training length'}"
            speed = f(e["tokens_per_second"], 1) if e.get("complete") else f"(stopped at {e.get('tokens_done', 0)})"
            rows.append([Path(d["model"]).stem, f"{nll_label(name)} ({setting})"] + cells + [speed, e.get("threads", d["threads"])])
    head = [f"NLL {k(lo)}–{k(hi)}" for lo, hi in MODEL_NLL_RANGES]
    return md(["model", "configuration"] + head + ["tok/s", "threads"], rows)


# --- passkey (bench/long_eval.py passkey) ------------------------------------------------------------------------

PASSKEY_LABELS = {"vanilla": "vanilla", "lambda": "Λ + ceiling", "context-shift": "context shift"}


def keys_found(trials: List[dict], labels: Dict[str, str]) -> str:
    """Keys found / trials per configuration (rows, in order of appearance) and length (columns)."""
    found: Dict[str, Dict[int, List[bool]]] = {}
    for t in trials:
        found.setdefault(t["config"], {}).setdefault(t["length"], []).append(bool(t["correct"]))
    lengths = sorted({L for by in found.values() for L in by})
    rows = [[labels.get(name, name)] + [f"{sum(by[L])}/{len(by[L])}" if L in by else DASH for L in lengths]
            for name, by in found.items()]
    return md(["configuration"] + [k(L) for L in lengths], rows)


def table_passkey(r: Path) -> str:
    return keys_found(load("passkey.json", r)["trials"], PASSKEY_LABELS)


# --- speed and memory (bench/performance.py) --------------------------------------------------------------------

def table_stream(r: Path) -> str:
    d = load("performance.json", r)
    lam = {m["tokens"]: m for m in d["stream_lambda"]["marks"]}
    van = {m["tokens"]: m for m in d["stream_vanilla"]["marks"]}
    rows = []
    for t in sorted(set(lam) | set(van)):
        a, v = lam.get(t), van.get(t)
        rows.append([k(t),
                     f(a["prefill_tok_s"], 1) if a else DASH, f(a["decode_tok_s"], 1) if a else DASH,
                     f(a["paired_decode"]["median_ratio"], 3) if a and "paired_decode" in a else DASH,
                     f(a["peak_rss_bytes"] / MIB, 0) if a else DASH,
                     f(v["prefill_tok_s"], 1) if v else DASH, f(v["decode_tok_s"], 1) if v else DASH,
                     f(v["peak_rss_bytes"] / MIB, 0) if v else DASH])
    return md(["tokens read", "Λ prefill tok/s", "Λ decode tok/s", "Λ decode, paired with 8k", "Λ peak RSS MiB",
               "vanilla prefill tok/s", "vanilla decode tok/s", "vanilla peak RSS MiB"], rows)


KNOBS_OFF_ROWS = (
    ("knobs_off_1thread", "1 thread, all 16 patches"),
    ("knobs_off_1thread_before_0015", "1 thread, before patch 0015"),
    ("knobs_off", "2 threads"),
)


def table_knobs_off(r: Path) -> str:
    d = load("performance.json", r)

    def ratio(s: dict) -> str:
        return f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f})"

    rows = []
    for key, label in KNOBS_OFF_ROWS:
        sec = d[key]
        s = sec["summary"]
        rows.append([f"{label} (`{key}`)", sec["repeats"], ratio(s["patched_over_upstream_prefill"]),
                     ratio(s["patched_over_upstream_decode"]), ratio(s["stats_overhead_prefill"])])
    return md(["run (section)", "rounds", "prefill, ours / upstream", "decode, ours / upstream",
               "statistics on / off (prefill)"], rows)


def table_prefill_dip(r: Path) -> str:
    d = load("performance.json", r)
    secs = ("prefill_dip_d0", "prefill_dip_d64", "prefill_dip_d0_0015")
    blocks = [{b["end"]: b["tok_s"] for b in d[s]["blocks"]} for s in secs]
    ends = sorted(set().union(*blocks))
    rows = [[f"{(e - 1024) // 1024}k–{k(e)}"] + [f(b.get(e), 1) if e in b else DASH for b in blocks] for e in ends]
    rows.append(["whole stream, seconds"] + [f(d[s]["total_s"], 0) for s in secs])
    return md(["tokens", "before 0015, `--decode 0` tok/s", "before 0015, `--decode 64` tok/s",
               "with 0015, `--decode 0` tok/s"], rows)


def table_soak(r: Path) -> str:
    sec = load("performance.json", r)["soak"]
    marks = sorted(sec["marks"], key=lambda m: m["tokens"])
    size, buckets = sec["bucket"], sec["buckets"]
    rows, prev = [], None
    for m in marks:
        t = m["tokens"]
        nll = DASH
        if prev is not None:
            part = buckets[prev // size:t // size]
            if len(part) == (t - prev) // size:
                nll = f"{float(np.mean(part)):.2f} ({k(prev)}–{k(t)})"
        rows.append([f"{t:,}", f(m["rss_bytes"] / MIB, 1), f(m["peak_rss_bytes"] / MIB, 1),
                     f(m["peak_rss_bytes"] / marks[1]["peak_rss_bytes"], 5), nll])
        prev = t
    return md(["tokens read", "RSS MiB", "peak RSS MiB", "peak / peak at 16k", "mean NLL since the last mark"],
              rows)


# --- top-k middle keys (bench/top_k.py) -------------------------------------------------------------------------

def _topk_found(d: dict) -> Dict[str, Dict[int, Dict[float, bool]]]:
    out: Dict[str, Dict[int, Dict[float, bool]]] = {}
    for t in d["passkey"]["trials"]:
        for name, a in t["answers"].items():
            out.setdefault(name, {}).setdefault(t["length"], {})[float(t["depth"])] = bool(a["correct"])
    return out


def table_topk_passkey(r: Path) -> str:
    """One mark per depth (✓ found, · missed) per setting and length, as ``bench/top_k.py table``."""
    found = _topk_found(load("top_k.json", r))
    lengths = sorted({L for by in found.values() for L in by})
    rows = []
    for name, by in found.items():
        cells = ["".join("✓" if ok else "·" for _, ok in sorted(by.get(L, {}).items())) for L in lengths]
        flat = [ok for ds in by.values() for ok in ds.values()]
        rows.append([name] + cells + [f"{np.mean(flat):.2f}"])
    return md(["setting"] + [k(L) for L in lengths] + ["all"], rows)


TOPK_SUMMARY = ("lambda (no top-k)", "top-k k=5 h0=5 D=C/2", "D=1024")


def table_topk_summary(r: Path) -> str:
    """Keys found per length for plain Λ, LM-Infinite's top-k setting and the best one."""
    d = load("top_k.json", r)
    found, settings = _topk_found(d), d["passkey"]["settings"]
    lengths = sorted({L for by in found.values() for L in by})
    rows = []
    for name in TOPK_SUMMARY:
        by, st = found[name], settings[name]
        label = ("Λ, no top-k" if not st["k"] else
                 f"top-k k = {st['k']}, h0 = {st['h0']}, D = {st['D']}" + (" (C/2)" if "C/2" in name else ""))
        rows.append([label] + [f"{sum(by[L].values())}/{len(by[L])}" for L in lengths])
    return md(["setting (passkey, keys found)"] + [k(L) for L in lengths], rows)


def table_topk_cost(r: Path) -> str:
    modes = load("top_k.json", r)["cost"]["modes"]
    rows = []
    for name, m in modes.items():
        last = list(m["prefill_tok_s_per_2048_block"].values())[-1]
        rows.append([name, f(m["prefill_tok_s"], 1), f(last, 1), f(m["decode_tok_s_best_of_3"], 1),
                     f(m["peak_rss_bytes"] / MIB, 0), m["n_ctx"]])
    return md(["mode", "prefill tok/s (mean)", "last 2048-token block", "decode tok/s after", "peak RSS MiB",
               "n_ctx"], rows)


# --- calibration (bench/calibration.py) -------------------------------------------------------------------------

def table_calibration_stats(r: Path) -> str:
    t1 = load("calibration.json", r)["table1"]
    tr = load("calibration.json", r)["setup"]["training_length"]
    rows = []
    for L, s in sorted(t1.items(), key=lambda kv: int(kv[0])):
        label = f"{L} (L_tr)" if int(L) == tr else L
        rows.append([label, f"{s['pmax_all']:.3f} ({s['pmax_tail']:.3f})",
                     f"{s['entropy_all']:.2f} ({s['entropy_tail']:.2f})"])
    return md(["L", "max probability Pmax", "entropy H"], rows)


def table_calibration_tau(r: Path) -> str:
    """Algorithm 1's τ by statistic and search, against the log-length rule."""
    d = load("calibration.json", r)
    alg, ll = d["algorithm1"], d["log_length"]
    lengths = sorted({int(L) for m in alg.values() for L in m["grid"]})
    rows = []
    for mode, label in (("pmax", "Pmax"), ("entropy", "entropy")):
        a = alg[mode]
        for L in lengths:
            g = a["grid"].get(str(L))
            c = a["continuous"].get(str(L))
            pl = a["per_layer"].get(str(L))
            rows.append([label, L, f"{g['tau']:.1f}" if g else DASH,
                         f"{c['tau']:.4f} ({c['passes']} passes)" if c else DASH,
                         f"{min(pl['tau']):.2f}–{max(pl['tau']):.2f}" if pl else DASH, f"{ll[str(L)]:.4f}"])
    grid = sorted({float(t) for m in alg.values() for g in m["grid"].values() for t in g["curve"]}, reverse=True)
    head = "grid {" + ", ".join(f"{t:.1f}" for t in grid) + "}"
    return md(["statistic", "L", head, "continuous", "per layer (min–max)", "log L_tr / log L"], rows)


def table_calibration_nll(r: Path) -> str:
    d = load("calibration.json", r)
    full, n32 = d["nll_full_attention"], d["nll_32k"]
    rows = [
        ["τ = 1", f(full["tau=1"]["nll_8192_16384"], 3), f(n32["full, tau=1"]["nll_16k_32k"], 3)],
        ["log-length τ", f"{full['log-length']['nll_8192_16384']:.3f} (τ = {full['log-length']['tau']:.4f})",
         f"{n32['full, log-length schedule']['nll_16k_32k']:.3f} (schedule log 8192 / log p)"],
        ["Algorithm 1, Pmax",
         f"{full['pmax (continuous)']['nll_8192_16384']:.3f} (τ = {full['pmax (continuous)']['tau']:.4f})",
         f"{n32['full, pmax schedule']['nll_16k_32k']:.3f} (schedule through "
         + ", ".join(k(p[0]) for p in n32["full, pmax schedule"]["points"][1:]) + " points)"],
        ["Algorithm 1, entropy",
         f"{full['entropy (continuous)']['nll_8192_16384']:.3f} (τ = {full['entropy (continuous)']['tau']:.4f})",
         f(n32["full, entropy schedule"]["nll_16k_32k"], 3)],
        ["**Λ + ceiling (S = 10, W = C = 8192)**", "",
         f"**{n32['Lambda+ceiling, tau=1']['nll_16k_32k']:.3f}** (τ = 1), "
         f"{n32['Lambda+ceiling, pmax schedule']['nll_16k_32k']:.3f} (Pmax schedule)"],
    ]
    return md(["full attention", "NLL 8k–16k (16k tokens)", "NLL 16k–32k (32k tokens)"], rows)


# --- receptive fields (llama-extrapolate trf, bench/receptive_field.py) -----------------------------------------

def table_trf(r: Path) -> str:
    d = load("receptive_field.json", r)
    eps = d["eps"]
    rows = []
    for name, e in d["trf"].items():
        v = e["verdict"]
        B = e.get("B")
        b = DASH if not B else (f"{B[0]:.4g}" if np.isclose(B[0], B[1], rtol=1e-9) else f"{B[0]:.4g}–{B[1]:.4g}")
        trf = {x["eps"]: x["trf"] for x in (e.get("trf") or [])}
        rows.append([name, "converges" if v["converges"] else "diverges", b]
                    + [str(trf[x]) if x in trf else DASH for x in eps])
    return md(["RPE", "Σ exp(RPE)", "B"] + [f"TRF({x:g})" for x in eps], rows)


ERF_EPS = 0.1


def table_erf(r: Path) -> str:
    """ERF(0.1) per layer group: the range of the bins (tokens) that hold it, and the sinks' share under Λ."""
    d = load("receptive_field.json", r)
    runs = list(d["erf"].items())
    n_layer = len(runs[0][1]["by_layer"])
    groups = ((0, 11), (12, n_layer - 1))
    rows = []
    for name, e in runs:
        rows.append([f"{name}: overall", _erf_range([e["overall"]]), DASH])
        for lo, hi in groups:
            layers = e["by_layer"][lo:hi + 1]
            mass = e["mass_beyond_8192_by_layer"][lo:hi + 1]
            share = "0" if max(mass) == 0 else "< 0.01" if max(mass) < 0.005 else f"{min(mass):.2f}–{max(mass):.2f}"
            rows.append([f"{name}: layers {lo}–{hi}", _erf_range(layers), share])
    return md(["run", f"ERF({ERF_EPS:g}) in tokens", "attention mass beyond 8192 tokens"], rows)


def _erf_range(layers: List[List[dict]]) -> str:
    cells = [[x for x in layer if x["eps"] == ERF_EPS][0] for layer in layers]
    return f"{min(c['lo'] for c in cells):,}–{max(c['hi'] for c in cells):,}"


# --- PyTorch route (bench/pytorch_route.py) ---------------------------------------------------------------------

def rate_before(blocks: List[dict], end: int, span: int = 8192) -> Optional[float]:
    """Tokens/s over the span tokens before ``end`` (as bench/pytorch_route.py)."""
    inside = [b for b in blocks if end - span < b["end"] <= end]
    if not inside or inside[-1]["end"] != end:
        return None
    return sum(b["tokens"] for b in inside) / sum(b["tokens"] / b["tok_s"] for b in inside)


PYTORCH_LABELS = {"llama-extrapolate": "llama-extrapolate", "torch": "PyTorch (transformers)"}


def table_pytorch(r: Path) -> str:
    d = load("pytorch_route.json", r)
    rows = []
    for name, x in d["routes"].items():
        rows.append([PYTORCH_LABELS.get(name, name), f(x["load_s"], 1), f(rate_before(x["blocks"], 16384), 1),
                     f(rate_before(x["blocks"], 32768), 1), f(x["mean_nll"], 4), f(x["peak_rss_bytes"] / MIB, 0)])
    s = d["summary"]
    rows.append(["ratio / largest block difference", "", f"{s['tok_s_ratio_16384']:.2f}×",
                 f"{s['tok_s_ratio_32768']:.2f}×", f"{s['max_abs_block_nll_diff']:.3f} nats", ""])
    return md(["route", "load s", "tok/s over 8k–16k", "tok/s over 24k–32k", f"mean NLL ({k(d['tokens'])} tokens)",
               "peak RSS MiB"], rows)


# --- llama.cpp's own tests (tools/upstream.py tests) ------------------------------------------------------------

def table_upstream(r: Path) -> str:
    """The pass list of both trees; the test count is the JSON's (it counts the build of `test-chat` as one)."""
    d = load("upstream_tests.json", CHECKS)
    rows = []
    for tree in ("patched", "unpatched"):
        t = d[tree]
        others = sorted(f"`{n}` {v['status']}" for n, v in t.items() if v["status"] != "passed")
        ops = t.get("test-backend-ops test -b CPU", {}).get("tests_passed") or DASH
        rows.append([tree, f"{d['passed_' + tree]}/{d['tests']}", ops.replace(" tests passed", ""),
                     t.get("test-alloc", {}).get("status", DASH), "; ".join(others)])
    rows.append(["same pass list", "yes" if d["same_pass_list"] else "no", "", "",
                 "; ".join(map(str, d["differences"])) or "no differences"])
    return md(["tree", "passed", "`test-backend-ops test -b CPU`", "`test-alloc`", "not passed"], rows)


# --- document memory (bench/memory.py) ----------------------------------------------------------------------

def _load_names():
    """The package's names.py loaded alone, by path: the names and labels are the package's, and this script still
    runs without the package installed or its library loaded (importing llama_extrapolate loads libllama)."""
    import importlib.util

    path = ROOT / "python" / "llama_extrapolate" / "names.py"
    spec = importlib.util.spec_from_file_location("_tables_names", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their class's module up there
    spec.loader.exec_module(module)
    return module


NAMES = _load_names()


class MemoryLabels(dict):
    """The row names of the memory benchmarks: a baseline by its description, a stored memory name
    "lambda+memory:m=N[:c=C][:passages][:layer]" by NamedConfig's label (results without ":c=" are from before the
    candidates: the bound alone selected)."""

    def get(self, name, default=None):
        if name.startswith(NAMES.MEMORY_CONFIG + ":m="):
            return NAMES.NamedConfig.parse(name, stored=True).label()
        return super().get(name, default)


MEMORY_LABELS = MemoryLabels(NAMES.LABELS)


def table_memory_passkey(r: Path) -> str:
    """Keys found by configuration and length (all depths and trials)."""
    return keys_found(load("memory_passkey.json", r)["trials"], MEMORY_LABELS)


def table_memory_needle(r: Path) -> str:
    """Needles found (a magic number in the essays, RULER-style) by configuration and length."""
    return keys_found(load("memory_needle.json", r)["trials"], MEMORY_LABELS)


def table_memory_qwen(r: Path) -> str:
    """Pass keys found on Qwen2.5-Coder-0.5B (trained to 32k, so full attention is the reference)."""
    return keys_found(load("memory_passkey_qwen2.5-coder-0.5b.json", r)["trials"], MEMORY_LABELS)


def table_memory_needle_qwen(r: Path) -> str:
    """Needles found on Qwen2.5-Coder-0.5B (full attention is the reference up to its 32k training length)."""
    return keys_found(load("memory_needle_qwen2.5-coder-0.5b.json", r)["trials"], MEMORY_LABELS)


def table_memory_needle_multi_qwen(r: Path) -> str:
    """Needles found on Qwen2.5-Coder-0.5B among distractors (needle-multi: other numbers for other words)."""
    return keys_found(load("memory_needle-multi_qwen2.5-coder-0.5b.json", r)["trials"], MEMORY_LABELS)


def table_memory_needle_blocks(r: Path) -> str:
    """The needle asked from the same reading with m blocks per KV head (studies/memory/needle_top_k.py, one
    JSON line per answer): needles found per depth over the trials, and in all."""
    rows_in = [json.loads(line) for line in (STUDY / "memory_needle_blocks.jsonl").read_text().splitlines() if line]
    depths = sorted({x["depth"] for x in rows_in})
    rows = []
    models = list(dict.fromkeys(x["model"] for x in rows_in))  # in the order they were run
    for model, length, m in sorted({(x["model"], x["length"], x["memory_blocks"]) for x in rows_in},
                                   key=lambda g: (models.index(g[0]), g[1], g[2])):
        mine = [x for x in rows_in if (x["model"], x["length"], x["memory_blocks"]) == (model, length, m)]
        cells = []
        for d in depths:
            at = [x["found"] for x in mine if x["depth"] == d]
            cells.append(f"{sum(at)}/{len(at)}" if at else DASH)
        rows.append([model.removesuffix(".gguf"), k(length), m, *cells, f"{sum(x['found'] for x in mine)}/{len(mine)}"])
    return md(["model", "length", "m (blocks per KV head)"] + [f"depth {d:g}" for d in depths] + ["found"], rows)


def table_memory_needle_selection(r: Path) -> str:
    """Whether the question selects the needle's block (studies/memory/needle_selection.py, one JSON line per
    prompt, m and c): the (layer, KV head) pairs holding it after the question and over the answer's steps; c the
    candidates the exact q.k reranks (0: the bound selects; lines from before the earlier series' patch 0026 have none)."""
    rows_in = [json.loads(line) for line in (STUDY / "memory_needle_selection.jsonl").read_text().splitlines() if line]
    rows = []
    for x in sorted(rows_in, key=lambda x: (x["length"], x["depth"], x["trial"], x["m"], x.get("candidates", 0))):
        steps = x["selected_per_step"]
        answer = " ".join(x["answer"].split())
        rows.append([k(x["length"]), f"{x['depth']:g}", x["m"], x.get("candidates", 0) or DASH,
                     f"{steps[0]} of {x['n_pairs']}",
                     f"{min(steps[1:])}–{max(steps[1:])}" if len(steps) > 1 else DASH,
                     f'"{answer}"' + (" (found)" if x["found"] else "")])
    return md(["length", "depth", "m", "candidates", "pairs selecting the needle's block (question)", "(answer steps)",
               "answer"],
              rows)


def table_memory_first_stage(r: Path) -> str:
    """Which first stage keeps the needle's block among the candidates (studies/memory/first_stage.py, one JSON line
    per prompt and method): of the (layer, KV head) pairs whose exact top m holds the needle's block, in how many the
    method's best c hold it, and the share of the exact top m its best c hold."""
    rows_in = [json.loads(line) for line in (STUDY / "first_stage.jsonl").read_text().splitlines() if line]
    rows = []
    for x in rows_in:
        cs = sorted(x["needle_kept"], key=int)
        rows.append([k(x["length"]), f"{x['depth']:g}", x["n_blocks"], x["method"],
                     *(f"{x['needle_kept'][c]} of {x['pairs_needle_in_exact_top_m']}" for c in cs),
                     " / ".join(f"{x['top_m_recall'][c]:.2f}" for c in cs)])
    cs = sorted(rows_in[0]["needle_kept"], key=int) if rows_in else []
    return md(["length", "depth", "blocks", "first stage", *(f"needle kept, best {c}" for c in cs),
               f"exact top m held, best {' / '.join(cs)}"], rows)


def table_memory_rss_phases(r: Path) -> str:
    """What the memory's peak RSS is made of (studies/memory/rss_phases.py, one JSON line per run): the peak
    (VmHWM) after the reading, after the question and after the answer, and the resident memory after the question
    (anonymous + file-backed); "store_read" says how the graph read the store (runs that record none mapped it)."""
    rows = []
    for line in (STUDY / "memory_rss_phases.jsonl").read_text().splitlines():
        if not line:
            continue
        x = json.loads(line)
        p = x["phases"]
        c = x.get("memory_candidates")
        rows.append([k(x["tokens"]), x["window"], x["memory_blocks"], DASH if c is None else c,
                     x.get("store_read", "mapped"), f(p["read"]["VmHWM"], 0), f(p["question"]["VmHWM"], 0),
                     f"{p['question']['RssAnon']:,.0f} + {p['question']['RssFile']:,.0f}",
                     f(p["answer"][-1]["VmHWM"], 0), len(p["answer"]), f(x["memory"]["bytes_on_disk"] / MIB, 0)])
    return md(["tokens", "W", "m", "candidates", "store read", "peak after reading MiB", "peak after the question",
               "after the question: anon + file", "peak after the answer", "answer tokens", "store MiB"], rows)


def table_memory_cost(r: Path) -> str:
    """Reading speed, question time, answer speed, cache, peak RSS and disk of essay streams, bounded Λ vs the
    memory, with the memory's ratios to the bounded stream (reading speed, peak RSS); answer speed where measured."""
    d = load("memory_cost.json", r)
    rows = []
    for run in d["runs"]:
        for name, e in run["configs"].items():
            mem = e.get("memory")
            label = MEMORY_LABELS.get(name, name) + (" (an earlier run's)" if e.get("measured_earlier") else "")
            rows.append([f"{k(run['tokens'])}, W = {run['window']}", run["threads"], label,
                         f(e["read_tok_s"], 1), f(e["question_s"], 3),
                         f(e["answer_tok_s"], 1) if "answer_tok_s" in e else DASH, e["n_ctx"],
                         f(e["peak_rss_bytes"] / MIB, 0),
                         f(e["disk_bytes_per_token"], 0) if mem else DASH,
                         f(mem["bytes_in_ram"] / MIB, 1) if mem else DASH,
                         f"{run['read_speed_ratio']:.2f}× / {run['peak_rss_ratio']:.2f}×" if mem else DASH])
    return md(["tokens", "threads", "configuration", "read tok/s", "question s", "answer tok/s", "KV cells",
               "peak RSS MiB", "disk bytes/token",
               "memory RAM MiB", "speed / RSS vs Λ"], rows)


def table_memory_step(r: Path) -> str:
    """What the candidates' rerank costs a question and an answer step, by the number of candidates c and the patch
    the library was built to (bench/memory.py step: the memory opened for a long document, a short reading)."""
    d = load("memory_step.json", r)
    runs = d["runs"]
    cs = sorted({e["candidates"] for run in runs for e in run["configs"].values()})
    rows = []
    for run in sorted(runs, key=lambda run: (run.get("question_tokens", 14), run["window"], run["build"])):
        by_c = {e["candidates"]: e for e in run["configs"].values()}
        rows.append([run["build"], f"{k(run['capacity'])}, W = {run['window']}, m = {run['memory_blocks']}, "
                                   f"{k(run['tokens'])} read, {run.get('question_tokens', 14)}-token question"]
                    + [f"{by_c[c]['question_s']:.2f} s / {by_c[c]['answer_step_ms']:.0f} ms" if c in by_c else DASH
                       for c in cs])
    return md(["built to", "memory opened for"] + [f"c = {c}" if c else "bound only" for c in cs], rows)


def table_memory_scale(r: Path) -> str:
    """The document memory on a model with Llama-2-7B's KV shapes (bench/kv_shapes.py, bench/scale.py): reading,
    first answer token after a short and a 128-token question, an answer token's time and the bytes it reads from
    the store, the memory's RAM and the peak RSS, by configuration (":hold": the answer holds the question's blocks)."""
    d = load("scale.json", r)

    def first_token(q: dict) -> str:
        # asked several times (bench/scale.py --repeat): the median, and the range the disk's speed gave
        times = q.get("first_token_s_repeats")
        return f"{q['first_token_s']:.2f} s" + (f" ({min(times):.1f}–{max(times):.1f})" if times else "")

    rows = []
    for run in d["runs"]:
        short, long_ = run["short_question"], run["long_question"]
        note = f" ({run['note']})" if run.get("note") else ""
        note += " (questions on the kept reading)" if run.get("reading_reused") else ""
        note += " (asked with the reading of c = 1024)" if run.get("read_with") else ""
        read = f"{k(run['tokens'])} read" + (f", memory for {k(run['capacity'])}" if run.get("capacity") else "")
        rows.append([f"{run['config']}{note}", f"{run['shape']}, {read}, W = {run['window']}, {run['threads']} threads",
                     f"{run['read_tok_s']:.0f}",
                     f"{first_token(short)} / {first_token(long_)}",
                     f"{short['answer_step_mean_s']:.3f} s",
                     f"{short['question_read_bytes'] / 1e9:.2f} GB",
                     f"{short['answer_rchar_per_token'] / 1e6:,.0f} MB",
                     f"{run['memory_ram_bytes'] / 1e9:.2f} GB" if "memory_ram_bytes" in run else DASH,
                     f"{run['peak_rss_bytes'] / 1e9:.2f} GB"])
    return md(["configuration", "model and stream", "reading tok/s",
               f"first token ({d['runs'][0]['short_question']['question_tokens']}- / 128-token question)",
               "answer step", "disk read by the short question", "store read per answer token", "memory RAM",
               "peak RSS"], rows)


def table_memory_scale_types(r: Path) -> str:
    """The memory's RAM by the types it keeps (bench/results/scale_types.json: bench/scale.py's entries of one
    configuration, each run by a build that kept the landmarks and the held region in other types): the memory's
    RAM, the peak RSS against issue 56's target (the weights + 2 GB + the cache), the first answer token and an
    answer step."""
    rows = []
    for run in load("scale_types.json", r)["runs"]:
        t, short, long_ = run["types"], run["short_question"], run["long_question"]
        target = run["model_bytes"] + 2e9 + run["kv_cache_bytes"]
        rows.append([run["build"], f"{t['landmarks']} / {t['held_keys']} / {t['held_values']}",
                     f"{run['memory_ram_bytes'] / 1e9:.2f} GB",
                     f"{run['peak_rss_bytes'] / 1e9:.2f} GB (target {target / 1e9:.2f} GB)",
                     f"{short['first_token_s']:.2f} s / {long_['first_token_s']:.2f} s",
                     f"{short['answer_step_mean_s']:.3f} s"])
    first = load("scale_types.json", r)["runs"][0]
    return md(["build", "landmarks / held keys / held values", "memory RAM", "peak RSS",
               f"first token ({first['short_question']['question_tokens']}- / 128-token question)", "answer step"],
              rows)


def table_memory_resume(r: Path) -> str:
    """A reading killed after a checkpoint and run again (bench/resume.py): where the checkpoint was, what it cost,
    what the rerun read, and whether its answer is the one of a reading that never stopped."""
    rows = []
    for run in load("resume.json", r)["runs"]:
        killed, resumed, final = run["killed"], run["resumed"], run["final_state"]
        ckpt = killed["checkpoint"]
        rows.append([f"{run['shape']}, {k(run['tokens'])} tokens, W = {run['window']}, {run['threads']} threads",
                     f"{run['uninterrupted']['wall_s']:.0f} s",
                     f"every {run['checkpoint_every_s']:g} s; killed at {killed['killed_at_s']:.0f} s",
                     f"{ckpt['tokens']:,}: {ckpt['bytes'] / 1e9:.2f} GB in {ckpt['write_s']:.1f} s",
                     f"{final['bytes'] / 1e9:.2f} GB in {final['write_s']:.1f} s",
                     f"{run['store_bytes'] / 1e9:.2f} GB",
                     f"{resumed['wall_s']:.0f} s",
                     "yes" if run["same_answer"] else "**no**"])
    return md(["model and document", "uninterrupted run", "checkpoints", "checkpoint at the kill (tokens: state)",
               "state after the document", "store (referenced, not copied)", "rerun after the kill",
               "same answer"], rows)


SHAPE_LABELS = {  # bench/kv_shapes.py's shapes as the README names the models whose KV cache they copy
    "llama-2-7b": "Llama-2-7B (32 layers, 32 KV heads × 128)",
    "llama-3-8b": "Llama-3-8B (32 layers, 8 KV heads × 128)",
    "llama-3-70b": "a 70B (80 layers, 8 KV heads × 128)",
}


# the stores run and serve use (options.memory_type_for): q4_0 for the wide models (the shape models' rows), q8_0
# where a token's q8_0 store is small (every registry model's)
DEFAULT_STORE_SUFFIX = ":q4_0"
SMALL_STORE_SUFFIX = ":q8_0"


# run's and serve's memory as the shape models' readings name it: the blocks selected by landmarks of 16 keys alone,
# the q4_0 store, the answer holding the question's blocks; before, the landmarks proposed 128 candidates that the
# keys reranked, and before the landmarks the bound proposed 1,024, which older rows measured (RULER's rows name the
# same memories without the hold)
MEMORY_DEFAULT = "lambda+memory:m=64:c=0" + DEFAULT_STORE_SUFFIX + ":lm=16"
MEMORY_RERANK_DEFAULT = "lambda+memory:m=64:c=128" + DEFAULT_STORE_SUFFIX + ":lm=16"
MEMORY_BOUND_DEFAULT = "lambda+memory:m=64:c=1024" + DEFAULT_STORE_SUFFIX
SCALE_DEFAULT = MEMORY_DEFAULT + ":hold"
SCALE_RERANK_DEFAULT = MEMORY_RERANK_DEFAULT + ":hold"
SCALE_BOUND_DEFAULT = MEMORY_BOUND_DEFAULT + ":hold"
RERANK_NOTE = "128 of the landmarks' candidates reranked: the default before the landmarks alone"
BOUND_NOTE = "ranked by the bound, 1,024 candidates: the default before the landmarks"
LAYOUT_2_NOTE = "store layout 2: the values rounded twice"


def layout_2(results: List[dict]) -> bool:
    """Memory results measured before the store's record layout 3 (names.MEMORY_STORE_LAYOUT: "store_layout" absent
    or older), whose values were stored as the keys are and rounded again across the cells at the question."""
    return any(x.get("store_layout", 2) < NAMES.MEMORY_STORE_LAYOUT for x in results)


# what README's lines call each default a row was measured with
MEMORY_DEFAULT_NAMES = {MEMORY_DEFAULT: "the default, landmarks alone",
                        MEMORY_RERANK_DEFAULT: "landmarks and 128 candidates, the default before",
                        MEMORY_BOUND_DEFAULT: "the bound's 1,024 candidates, the default before the landmarks"}


def scale_readings(r: Path) -> List[dict]:
    """The shape models' real readings as run and serve answer them: the ":hold" runs of scale.json on a memory
    opened for what was read (not the short readings into a memory opened for more, ``capacity``), one per shape
    and length: today's default's (SCALE_DEFAULT, also where it asked a reading made for several configurations),
    else the landmarks' former 128 candidates (likewise), else the bound's former default with the q4_0 store, else
    with the q8_0 store, which its note then names."""
    ladder = (SCALE_DEFAULT, SCALE_RERANK_DEFAULT, SCALE_BOUND_DEFAULT)

    def rank(x: dict) -> int:
        return ladder.index(x["config"]) if x["config"] in ladder else len(ladder)

    runs = [x for x in load("scale.json", r)["runs"] if x["config"].endswith(":hold") and not x.get("capacity")
            and (x["config"] in ladder[:2] or not x.get("read_with"))]
    best = {}
    for x in runs:
        key = (x["shape"], x["tokens"])
        if key not in best or rank(x) < rank(best[key]):
            best[key] = x
    out = []
    for x in best.values():
        notes = [x.get("note"), RERANK_NOTE if rank(x) == 1 else BOUND_NOTE if rank(x) > 1 else None,
                 "the q8_0 store, before q4_0 became the default" if rank(x) == 3 else None,
                 LAYOUT_2_NOTE if layout_2([x]) else None]
        out.append({**x, "note": "; ".join(n for n in notes if n)} if any(notes) else x)
    return out


def table_sizing(r: Path) -> str:
    """What a document of N tokens costs a user's model beyond its weights, from the shape models' readings with
    the run and serve defaults (bench/scale.py, ":hold" configurations on a memory opened for what is read): the
    store on disk, the RAM of the memory and of the cache, the reading's attention and memory time in core-seconds
    per 1k tokens, and the answer latency (the shape model's weights are small: its times are the attention's and
    the memory's, to which the user's model adds its weights' time)."""
    runs = scale_readings(r)
    order = list(SHAPE_LABELS)
    rows = []
    for run in sorted(runs, key=lambda x: (order.index(x["shape"]), x["tokens"])):
        short, long_ = run["short_question"], run["long_question"]
        rows.append([SHAPE_LABELS[run["shape"]], k(run["tokens"]) + (f" ({run['note']})" if run.get("note") else ""),
                     f"{run['memory']['bytes_on_disk'] / 1e9:.1f} GB",
                     f"{run['memory_ram_bytes'] / 1e9:.2f} GB + {run['kv_cache_bytes'] / 1e9:.2f} GB",
                     f"{1000 * run['threads'] / run['read_tok_s']:.0f} s",
                     f"{short['first_token_s']:.1f} s / {long_['first_token_s']:.1f} s",
                     f"{short['answer_step_mean_s']:.2f} s"])
    q = runs[0]["short_question"]["question_tokens"] if runs else 0
    return md(["model's KV cache", "document", "store on disk", "RAM: memory + cache",
               "reading: core-seconds per 1k tokens", f"first answer token ({q}- / 128-token question)",
               "per answer token"], rows)


def table_server_ttft(r: Path) -> str:
    """`llama-extrapolate serve`: time to the first answer token, a long document's first question and a second
    question on the same document (the stream reused)."""
    d = load("server_ttft.json", r)
    rows = []
    for q in d["questions"]:
        rows.append(["first" if q["question"] == 1 else "second, same document", f"{q['tokens']:,}", f"{q['read']:,}",
                     f"{q['reused']:,}", f"{q['first_token_s']:,.2f} s", f"{q['answer_s']:,.1f} s"])
    return md(["question", "prompt tokens", "read", "reused", "first token", "whole answer"], rows)


# --- README's status table ----------------------------------------------------------------------------------------

RESULTS_MD = "docs/results.md"


def _found(trials: List[dict], config: str, length: int) -> str:
    hits = [bool(t["correct"]) for t in trials if t["config"] == config and t["length"] == length]
    return f"{sum(hits)}/{len(hits)}" if hits else DASH


def _nll_range(d: dict, config: str, lo: int, hi: int) -> float:
    return range_mean(d["configs"][config]["buckets"], lo, hi)


RULER_ORDER = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa_1", "qa_2")


def table_ruler(r: Path) -> str:
    """RULER by model, length and configuration: each task's score (percent, mean over its samples), their mean,
    the reading's tokens per second and the first answer token's seconds (means over the trials)."""
    rows, tasks = [], []
    files = sorted(r.glob("ruler-*.json"))
    for path in files:
        d = json.loads(path.read_text())
        tasks += [t for t in RULER_ORDER if t in d["scores"] and t not in tasks]
    for path in files:
        d = json.loads(path.read_text())
        by = {}
        for t in d["trials"]:
            by.setdefault((int(t["length"]), t["config"]), []).append(t)
        for (length, config), trials in sorted(by.items()):
            per_task = {task: [t["score"] for t in trials if t["task"] == task] for task in tasks}
            cells = [f(np.mean(v), 0) if v else DASH for v in per_task.values()]
            done = [np.mean(v) for v in per_task.values() if v]
            rate = [t["read_tokens_per_second"] for t in trials if "read_tokens_per_second" in t]
            rows.append([d["model"].removesuffix(".gguf") + (" (chat)" if d.get("chat") else ""), k(length),
                         f"`{config}`", *cells, f(np.mean(done), 1), f(np.mean(rate), 0) if rate else DASH,
                         f(np.mean([t["first_token_seconds"] for t in trials]), 2),
                         str(min(len(v) for v in per_task.values() if v))])
    return md(["model", "length", "configuration", *tasks, "mean", "reading tok/s", "first token s", "samples"],
              rows)


def model_qa_runs(r: Path) -> List[tuple]:
    """(QA mean, model, qa_1 and qa_2 scores, trials) of each default-model candidate (bench/results/model_qa/: RULER's
    QA with full attention at one length), best first."""
    runs = []
    for path in sorted((r / "model_qa").glob("ruler-*.json")):
        d = json.loads(path.read_text())
        per_task = {task: [t["score"] for t in d["trials"] if t["task"] == task] for task in ("qa_1", "qa_2")}
        runs.append((float(np.mean([np.mean(v) for v in per_task.values()])), d["model"].removesuffix(".gguf"),
                     per_task, d["trials"]))
    return sorted(runs, key=lambda run: -run[0])


def table_model_qa(r: Path) -> str:
    """The default-model candidates on RULER's QA with the paragraphs in view: each task's score, their mean,
    reading tok/s and answer seconds (means over the trials)."""
    rows = [[model, k(int(trials[0]["length"])), *[f(np.mean(v), 0) + f" ({len(v)})" for v in per_task.values()],
             f(mean, 1), f(np.mean([t["read_tokens_per_second"] for t in trials]), 0),
             f(np.mean([t["answer_seconds"] for t in trials]), 1)]
            for mean, model, per_task, trials in model_qa_runs(r)]
    return md(["model", "length", "qa_1 (samples)", "qa_2 (samples)", "mean", "reading tok/s", "answer s"], rows)


def table_reading_speed(r: Path) -> str:
    """Reading a document with the memory against the model's own 512-token prompt speed (bench/reading_speed.py):
    rule (b) of `run`'s window asks for a ratio of at least 2/3."""
    d = load("reading_speed.json", r)
    rows = [[run["model"].removesuffix(".gguf"), str(run["window"]), run["config"], k(run["tokens"]),
             f(run["tok_s"], 0), f(run["prompt"]["tok_s"], 0), f(run["ratio"], 2),
             "yes" if run["ratio"] >= d["rule"] else "no"] for run in d["runs"]]
    return md(["model", "window", "memory", "read", "reading tok/s", "512-token prompt tok/s", "ratio",
               "≥ 2/3"], rows)


def size(n: Optional[float]) -> str:
    """Bytes as KB, MB or GB (decimal), three figures."""
    if n is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def rpc_config(name: str, servers: int) -> str:
    """Where the KV cache is: on the servers with Λ (llama.cpp offloads it with the layers), on the client with
    the memory (which reads its blocks from it)."""
    store = next((f", {t} store" for t in ("q4_0", "q8_0", "f16", "f32") if f":{t}" in name), "")
    if not servers:
        return "Λ" if name == "lambda" else f"memory (hold{store})"
    return "Λ, cache on the servers" if name == "lambda" else f"memory (hold{store}), cache on the client"


def table_rpc(r: Path) -> str:
    """The layers over local RPC servers against all local (bench/rpc.py): speeds (the servers share the client's
    2 cores), the bytes the loopback carried per token read and per answer token, the weights sent at load, the
    servers' RAM growth and the client's peak RSS."""
    d = load("rpc.json", r)
    rows = []
    for e in d["cells"]:
        growth = [p - b for p, b in zip(e["server_peak_rss_bytes"], e["server_base_rss_bytes"])]
        rows.append([e["model"], str(e["n_embd"]), k(e["tokens"]), str(e["servers"] or "local"),
                     rpc_config(e["config"], e["servers"]),
                     f(e["read_tok_s"], 0), f(e["first_token_s"], 2), f(e["answer_step_s"], 3),
                     size(e["bytes_per_read_token"]) if e["servers"] else DASH,
                     size(e["bytes_per_answer_token"]) if e["servers"] else DASH,
                     size(e["bytes_load"]) if e["servers"] else DASH,
                     size(max(growth)) if growth else DASH, size(e["client_peak_rss_bytes"])])
    return md(["model", "residual width", "read", "servers", "configuration", "reading tok/s", "first token s",
               "answer s/token", "network per read token", "per answer token", "at load", "server RAM growth (max)",
               "client peak RSS"], rows)


def table_rpc_70b(r: Path) -> str:
    """Llama-3-70B (q4_0) over 2-4 machines (bench/rpc.py's projection): each server's weights and RAM beyond them,
    the client's disk and memory RAM for a 128k-token document, and the network per token, fitted on the shape
    model at two residual widths and taken at 8192 (a token's time on a 1 Gbit/s link beside it)."""
    p = load("rpc.json", r)["projection_70b"]
    rows = []
    for row in p["rows"]:
        per_read = row["bytes_per_read_token"]
        memory = row["config"] != "lambda"
        rows.append([str(row["servers"]), rpc_config(row["config"], row["servers"]), size(row["weights_per_server_bytes"]),
                     size(row["server_ram_beyond_weights_bytes"]),
                     size(row.get("client_disk_bytes")) if memory else DASH,
                     size(row.get("client_memory_ram_bytes")) if memory else DASH,
                     size(per_read), size(row["bytes_per_answer_token"]),
                     f(per_read * 8 / 1e9 * 1e3, 1) if per_read is not None else DASH])
    return md(["machines", "configuration", "weights per machine", "server RAM beyond weights",
               f"client disk ({k(p['document_tokens'])} document)", "client memory RAM", "network per read token",
               "per answer token", "ms per read token at 1 Gbit/s"], rows)


RULER_FAMILIES = (("needles", "niah_"), ("aggregation", ("vt", "cwe")), ("QA", "qa_"))


FOUR_BIT_SINCE = "2026-12-06"  # patch 0012: a q4_0 store's landmarks and held values in Q4_0 (Q8_0 before)


def ruler_status(r: Path, link) -> str:
    """README's RULER line: at each length run, each task family's score (mean over its tasks) under the memory's
    default (landmarks of 16 keys alone, q4_0; at lengths it was not run at, the newest former default that was,
    said so), full attention and Λ alone."""
    d = load("ruler-qwen2.5-coder-0.5b.json", r)
    scores: Dict[tuple, List[float]] = {}  # (length, config, task) -> the samples' scores
    for t in d["trials"]:
        scores.setdefault((int(t["length"]), t["config"], t["task"]), []).append(t["score"])
    lengths = sorted({L for L, _, _ in scores})
    ladder = list(MEMORY_DEFAULT_NAMES)
    memory = {L: next((m for m in ladder if any(l == L and c == m for l, c, _ in scores)), MEMORY_BOUND_DEFAULT)
              for L in lengths}

    def family_mean(length: int, config: str, match) -> str:
        means = [np.mean(v) for (L, c, task), v in scores.items() if L == length and c == config and (
            task.startswith(match) if isinstance(match, str) else task in match)]
        return f(np.mean(means), 0) if means else DASH

    def at_length(length: int) -> str:
        names = (memory[length], "vanilla", "lambda")
        return f"{k(length)}: " + ", ".join(f"{family} {' / '.join(family_mean(length, c, match) for c in names)}"
                                            for family, match in RULER_FAMILIES)

    at = [at_length(length) for length in lengths]
    samples = min(len(v) for (L, c, _), v in scores.items() if c == memory[L])
    full_cwe = [x for (_, c, task), v in scores.items() if c == "vanilla" and task == "cwe" for x in v]
    caveat = "; the model finds no common words with full attention either" if full_cwe and max(full_cwe) == 0 else ""
    where = {m: [k(L) for L in lengths if memory[L] == m] for m in ladder}
    which = "; ".join(MEMORY_DEFAULT_NAMES[m] + (f", at {' and '.join(ks)}" if len(ks) < len(lengths) else "")
                      for m, ks in where.items() if ks)
    # a q4_0 store's landmarks and held values are 4-bit since FOUR_BIT_SINCE; trials before it (undated) had Q8_0
    four_bit = any(t.get("date", "") >= FOUR_BIT_SINCE for t in d["trials"] if t["config"] in memory.values())
    store = "q4_0 store" + ("" if four_bit else f", its landmarks and held values in Q8_0 as before {FOUR_BIT_SINCE}")
    if layout_2([t for t in d["trials"] if t["config"] in memory.values()]):
        store += ", " + LAYOUT_2_NOTE
    return (f"memory ({store}; {which}) / full attention / Λ alone, " + link("; ".join(at), "ruler")
            + f" ({samples} samples a task{caveat})")


def model_qa_status(r: Path, link) -> str:
    """README's line on the model to bring: each candidate's RULER QA mean (qa_1 and qa_2) with the paragraphs in
    view, best first, and the best one's reading speed."""
    runs = model_qa_runs(r)
    mean, model, per_task, trials = runs[0]
    return (f"{model}: RULER's QA at {k(int(trials[0]['length']))} with the paragraphs in view "
            + link(f(mean, 0), "the-model-to-bring") + ", " + ", ".join(f"{m} {f(x, 0)}" for x, m, *_ in runs[1:])
            + f" ({min(len(v) for v in per_task.values())} questions a task; full attention); it reads at "
            + f"{f(np.mean([t['read_tokens_per_second'] for t in trials]), 0)} tok/s on 2 cores")


def table_status(r: Path) -> str:
    """README's status table: one line a capability; every figure computed here from the JSON and linked to the
    section of docs/results.md that holds its table (a figure measured with other settings than today's defaults
    says so)."""
    def link(text: str, anchor: str) -> str:
        return f"[{text}]({RESULTS_MD}#{anchor})"

    qwen = load("memory_needle_qwen2.5-coder-0.5b.json", r)["trials"]
    needle = load("memory_needle.json", r)["trials"]
    passkey = load("memory_passkey.json", r)["trials"]
    # run's and serve's memory on these models (the q8_0 store: a name without a type): the landmarks alone, the
    # answer holding the question's blocks where that was run (else each answer token selecting anew: marked), the
    # store's layout 3 where that was run (else marked); then the landmarks' 128 candidates and the bound's 1,024
    # candidates, the defaults before
    alone, rerank = "lambda+memory:m=64:c=0:lm=16", "lambda+memory:m=64:c=128:lm=16"
    smol_alone, smol_rerank = "lambda+memory:m=64:c=0:q8_0:lm=16", "lambda+memory:m=64:c=128:q8_0:lm=16"
    marks = {"†": "each answer token selecting its blocks anew, where run and serve hold the question's",
             "‡": LAYOUT_2_NOTE}
    used_marks = set()

    def found(trials: List[dict], config: str, length: int) -> str:
        held = any(t["config"] == config + ":hold" and t["length"] == length for t in trials)
        config = config + ":hold" if held else config
        used = [t for t in trials if t["config"] == config and t["length"] == length]
        mark = ("" if held else "†") + ("‡" if layout_2(used) else "")
        used_marks.update(mark)
        return _found(trials, config, length) + (mark if used else "")

    cells = [(qwen, 16384), (qwen, 32768), (qwen, 65536), (passkey, 16384), (passkey, 32768)]
    same = (all(_found(t, alone, L) == _found(t, rerank, L) == _found(t, rerank + ":hold", L) for t, L in cells)
            and _found(needle, smol_alone, 32768) == _found(needle, smol_rerank, 32768))
    before = ("128 candidates reranked (the default before) found as many asked alike, the answer holding the "
              "question's blocks too" if same else f"128 candidates reranked (the default before, the answer holding "
              f"the question's blocks): Qwen {', '.join(_found(qwen, rerank + ':hold', L) for L in (16384, 32768, 65536))}"
              f" at 16k / 32k / 64k, SmolLM2 {_found(needle, smol_rerank, 32768)}, pass keys "
              f"{_found(passkey, rerank + ':hold', 16384)} / {_found(passkey, rerank + ':hold', 32768)}")
    default = "lambda+memory:m=64:c=1024"
    q4, q8 = default + DEFAULT_STORE_SUFFIX, default + SMALL_STORE_SUFFIX
    memory = ("ranked by landmarks of 16 keys alone (the default): Qwen2.5-Coder-0.5B finds the needle "
              + link(f"{found(qwen, alone, 32768)} at 32k", "document-memory")
              + f" ({found(qwen, alone, 16384)} at 16k, {found(qwen, alone, 65536)} at 64k), SmolLM2 "
              f"{found(needle, smol_alone, 32768)} at 32k, SmolLM2's pass keys {found(passkey, alone, 16384)} at 16k "
              f"and {found(passkey, alone, 32768)} at 32k ("
              + "; ".join(f"{m} {marks[m]}" for m in marks if m in used_marks)
              + f"); {before}; ranked by the bound, 1,024 candidates (the "
              "default before the landmarks), "
              "with the q8_0 store Qwen finds the needle "
              + link(f"{_found(qwen, default, 131072)} at 128k", "document-memory")
              + f" ({_found(qwen, default, 32768)} at 32k, {_found(qwen, default, 65536)} at 64k; q4_0 "
              f"{_found(qwen, q4, 65536)} at 64k), SmolLM2 "
              + link(f"{_found(needle, q8, 32768)} at 32k", "document-memory")
              + f" (q4_0 {_found(needle, q4, 32768)}); SmolLM2's pass keys {_found(passkey, q4, 32768)} at 32k with "
              "q4_0 (the miss at depth 1 is the model's), "
              + link(f"{_found(passkey, 'lambda+memory:m=16', 131072)} at 128k", "document-memory")
              + " with 16 blocks, bound only")

    cost = load("memory_cost.json", r)["runs"]
    run = [x for x in cost if x["tokens"] == 131072 and x["window"] == 8192 and default in x["configs"]][-1]
    e = run["configs"][default]
    memory_cost = ("at 128k: peak RSS " + link(f"{run['peak_rss_ratio']:.2f}×", "document-memory")
                   + f" the bounded stream, first answer token {e['question_s']:.1f} s, "
                   f"{e['answer_tok_s']:.1f} tokens/s, {e['disk_bytes_per_token'] / 1000:.1f} KB/token on disk "
                   "(the q8_0 store)")

    scale = scale_readings(r)
    big = max(scale, key=lambda x: x["tokens"])
    bq, lq = big["short_question"], big["long_question"]
    at_7b = (f"{k(big['tokens'])} tokens read at " + link(f"{big['read_tok_s']:.0f} tok/s", "at-llama-2-7bs-kv-shapes")
             + f", {big['disk_bytes_per_token'] / 1000:.0f} KB/token on disk; first answer token "
             f"{bq['first_token_s']:.1f} s after the {bq['question_tokens']}-token question ({lq['first_token_s']:.1f} s"
             f" after 128), then {bq['answer_step_mean_s']:.2f} s a token; memory RAM "
             f"{big['memory_ram_bytes'] / 1e9:.2f} GB, peak RSS {big['peak_rss_bytes'] / 1e9:.2f} GB"
             + (f" ({big['note']})" if big.get("note") else ""))
    # the same document with the default before (the landmarks' 128 candidates, on the same reading), else the
    # bound's 1,024 candidates, the default before the landmarks
    same_doc = [x for x in load("scale.json", r)["runs"] if (x["shape"], x["tokens"]) == (big["shape"], big["tokens"])
                and not x.get("capacity")]
    before = next(([x for x in same_doc if x["config"] == c][-1] for c in (SCALE_RERANK_DEFAULT, SCALE_BOUND_DEFAULT)
                   if any(x["config"] == c for x in same_doc)), None)
    if big["config"] == SCALE_DEFAULT and before:
        name = ("128 of the landmarks' candidates reranked" if before["config"] == SCALE_RERANK_DEFAULT
                else "the bound's 1,024 candidates")
        at_7b += (f"; {name} (the default before): {before['short_question']['first_token_s']:.1f} s / "
                  f"{before['long_question']['first_token_s']:.1f} s"
                  + ("" if before.get("read_with") == big.get("read_with") and big.get("read_with")
                     else f", read at {before['read_tok_s']:.0f} tok/s"))

    nll = load("nll_essays.json", r)
    lo, hi = _nll_range(nll, "lambda", 4096, 8192), _nll_range(nll, "lambda", 32768, 65536)
    stable = ("SmolLM2 (trained to 8k): NLL " + link(f"{lo:.3f} at 4k–8k, {hi:.3f} at 32k–64k",
                                                      "nll-to-64k-tokens")
              + f" (full attention {_nll_range(nll, 'vanilla', 32768, 65536):.3f})")

    perf = load("performance.json", r)
    lam = sorted(perf["stream_lambda"]["marks"], key=lambda m: m["tokens"])
    van = {m["tokens"]: m for m in perf["stream_vanilla"]["marks"]}
    prefill = [m["prefill_tok_s"] for m in lam]
    torch = load("pytorch_route.json", r)["summary"]
    ratios = sorted([torch["tok_s_ratio_16384"], torch["tok_s_ratio_32768"]])
    speed = ("prefill " + link(f"{min(prefill):.0f}–{max(prefill):.0f} tok/s", "speed-and-memory")
             + f" from {k(lam[0]['tokens'])} to {k(lam[-1]['tokens'])}, decode after {k(lam[-1]['tokens'])} "
             f"{lam[-1]['paired_decode']['median_ratio']:.2f}× after 8k; "
             f"{lam[2]['prefill_tok_s'] / van[lam[2]['tokens']]['prefill_tok_s']:.1f}× full attention at "
             f"{k(lam[2]['tokens'])}; " + link(f"{ratios[0]:.2f}–{ratios[1]:.2f}×", "pytorch-route")
             + " a PyTorch implementation")

    soak = sorted(perf["soak"]["marks"], key=lambda m: m["tokens"])
    bounded = (f"KV cache of S + W + rollback + n_ubatch cells; peak RSS after {soak[-1]['tokens']:,} tokens "
               + link(f"{soak[-1]['peak_rss_bytes'] / soak[1]['peak_rss_bytes']:.4f}×", "speed-and-memory")
               + f" the peak after {k(soak[1]['tokens'])}")

    off = perf["knobs_off_1thread"]["summary"]
    knobs_off = ("logits bit-identical to llama-cpp-python's library; prefill "
                 + link(f"{off['patched_over_upstream_prefill']['median']:.3f}×", "speed-and-memory")
                 + f", decode {off['patched_over_upstream_decode']['median']:.3f}× its speed (1 thread, median)")

    ttft = load("server_ttft.json", r)
    second = [q for q in ttft["questions"] if q["question"] != 1][-1]
    blocks = ttft["memory"].split("(")[-1].split(" of ")[0]
    server = ("llama-cpp-python's server on the patched library; a second question on a "
              f"{second['tokens']:,}-token document: first token in "
              + link(f"{second['first_token_s']:.2f} s", "server") + f" (measured with {blocks})")

    up = load("upstream_tests.json", CHECKS)
    upstream = ("same pass list as unpatched: " + link(f"{up['passed_patched']}/{up['tests']}", "llamacpps-own-tests")
                + " on both trees" if up["same_pass_list"] else "pass lists differ: see "
                + link("the list", "llamacpps-own-tests"))

    ruler = ruler_status(r, link)

    rows = [
        ["Questions about any part of a long document (document memory, on by default)", memory],
        ["RULER (Qwen2.5-Coder-0.5B, chat; W = 1024)", ruler],
        ["The model to bring for a book (`--model qwen2.5-coder-1.5b`, `pip install '.[book]'`)",
         model_qa_status(r, link)],
        ["Memory cost of the document memory (the bound's 1,024 candidates, the default before the landmarks; "
         "W = 8192)", memory_cost],
        ["The document memory at Llama-2-7B's KV shapes (32 layers of 32 × 128; W = 1024, 2 cores)", at_7b],
        ["Stable NLL past the training length (Λ mask + distance ceiling)", stable],
        ["Bounded memory", bounded],
        ["Speed (SmolLM2-135M, 2 cores)", speed],
        ["Drop-in `llama_cpp.Llama` (chat, completion, states, `LlamaCache`)", "works, prompts far beyond `n_ctx`"
         " included; flash attention with the Λ mask, temperature and ceiling (C ≥ W)"],
        ["OpenAI-compatible server (`serve`)", server],
        ["Model families", "Llama 1–3, Qwen2/2.5, Phi-3, SmolLM2/3, MPT (ALiBi), LFM2: every knob exact; Gemma 2/3,"
         " gpt-oss: the global layers; what a model cannot take is refused with the reason"
         " ([compatibility](docs/compatibility.md))"],
        ["Everything off", knobs_off],
        ["Softmax temperature, calibration (`calibrate`)", "work; the temperature does not lower NLL on SmolLM2 ("
         + link("calibration", "calibration") + ")"],
        ["GPU", "Vulkan runs every knob (the memory with the KV cache in host memory), shown on Mesa's"
         " lavapipe; CUDA compiles, not run"
         " ([GPU](docs/gpu.md))"],
        ["llama.cpp's own tests on the patched library", upstream],
    ]
    return md(["capability", "works / limits"], rows)


# --- registry ---------------------------------------------------------------------------------------------------

TABLES: Dict[str, Callable[[Path], str]] = {
    "ablation": table_ablation,
    "nll-64k": table_nll_64k,
    "nll-models": table_nll_models,
    "passkey": table_passkey,
    "stream": table_stream,
    "knobs-off": table_knobs_off,
    "prefill-dip": table_prefill_dip,
    "soak": table_soak,
    "topk-summary": table_topk_summary,
    "topk-passkey": table_topk_passkey,
    "topk-cost": table_topk_cost,
    "calibration-stats": table_calibration_stats,
    "calibration-tau": table_calibration_tau,
    "calibration-nll": table_calibration_nll,
    "trf": table_trf,
    "erf": table_erf,
    "pytorch": table_pytorch,
    "upstream": table_upstream,
    "memory-passkey": table_memory_passkey,
    "memory-needle": table_memory_needle,
    "memory-qwen": table_memory_qwen,
    "memory-needle-qwen": table_memory_needle_qwen,
    "memory-needle-multi-qwen": table_memory_needle_multi_qwen,
    "memory-needle-blocks": table_memory_needle_blocks,
    "memory-needle-selection": table_memory_needle_selection,
    "memory-first-stage": table_memory_first_stage,
    "memory-rss-phases": table_memory_rss_phases,
    "memory-cost": table_memory_cost,
    "memory-step": table_memory_step,
    "memory-scale": table_memory_scale,
    "memory-scale-types": table_memory_scale_types,
    "memory-resume": table_memory_resume,
    "sizing": table_sizing,
    "server-ttft": table_server_ttft,
    "ruler": table_ruler,
    "model-qa": table_model_qa,
    "reading-speed": table_reading_speed,
    "rpc": table_rpc,
    "rpc-70b": table_rpc_70b,
    "status": table_status,
}

AREAS: Dict[str, List[str]] = {
    "nll": ["ablation", "nll-64k", "nll-models"],
    "speed": ["stream", "knobs-off", "prefill-dip", "soak"],
    "top-k": ["topk-summary", "topk-passkey", "topk-cost"],
    "calibration": ["calibration-stats", "calibration-tau", "calibration-nll"],
    "receptive-fields": ["trf", "erf"],
    "memory": ["memory-passkey", "memory-needle", "memory-qwen", "memory-needle-qwen", "memory-needle-multi-qwen",
               "memory-needle-blocks", "memory-needle-selection", "memory-first-stage", "memory-rss-phases", "memory-cost", "memory-step",
               "memory-scale", "memory-scale-types", "memory-resume"],
    "server": ["server-ttft"],
    "ruler": ["ruler", "model-qa", "reading-speed"],
    "rpc": ["rpc", "rpc-70b"],
    "readme": ["status", "sizing"],
}


def marker(name: str) -> str:
    """The comment that precedes the table in the documents."""
    return f"<!-- tools/tables.py {name} -->"


def render(name: str, results: Path = RESULTS) -> str:
    return TABLES[name](results)


def expand(names: List[str]) -> List[str]:
    out: List[str] = []
    for n in names:
        if n == "all":
            out += list(TABLES)
        elif n in AREAS:
            out += AREAS[n]
        elif n in TABLES:
            out.append(n)
        else:
            raise SystemExit(f"unknown table {n!r}: choose from all, {', '.join(AREAS)}, {', '.join(TABLES)}")
    return list(dict.fromkeys(out))


UPDATED_DOCS = (ROOT / "README.md", ROOT / "docs" / "results.md")


def update_doc(doc: Path, results: Path, names=None) -> None:
    """Each table after a marker replaced by what this script prints now (the table is the marker's following run
    of lines that start with "|"); only those in ``names`` when given, so that a partial result file of another
    table (a run still going) stays out of the docs."""
    lines = doc.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        out.append(lines[i])
        name = lines[i].removeprefix("<!-- tools/tables.py ").removesuffix(" -->")
        i += 1
        if lines[i - 1].startswith("<!-- tools/tables.py ") and name in TABLES and (names is None or name in names):
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            out.extend(render(name, results).split("\n"))
    text = "\n".join(out)
    if text != doc.read_text():
        doc.write_text(text)
        print(f"updated {doc.relative_to(ROOT)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", default=["all"], help="tables or areas (default: all)")
    p.add_argument("--list", action="store_true", help="list the areas and tables")
    p.add_argument("--results", default=str(RESULTS), help="directory of the benchmarks' JSON (default: bench/results); the memory study's runs are read "
                        "from studies/memory and llama.cpp's test outcomes from checks")
    p.add_argument("--update", action="store_true",
                   help="rewrite the marked tables of README.md and docs/ in place (after new results): those named, "
                        "or all")
    args = p.parse_args(argv)
    if args.update:
        for doc in UPDATED_DOCS:
            update_doc(doc, Path(args.results), set(expand(args.names)))
        return 0
    if args.list:
        for area, names in AREAS.items():
            print(f"{area}: {' '.join(names)}")
        print("tables: " + " ".join(TABLES))
        return 0
    names = expand(args.names)
    for i, n in enumerate(names):
        if i:
            print()
        print(marker(n))
        print(render(n, Path(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
