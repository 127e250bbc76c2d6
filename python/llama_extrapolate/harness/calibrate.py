"""Softmax-temperature calibration: attention alignment's Algorithm 1, and more.

Chi, Fan & Rudnicky (attention alignment, section 4): past the training length
L_tr more keys compete for one unit of attention, so the softmax flattens. A
temperature tau < 1 sharpens it again; Algorithm 1 picks the tau whose mean
maximum probability (mode "pmax") or mean entropy (mode "entropy") over all
layers, heads and queries at L_ex equals the value at L_tr with tau = 1.

A decoder sees its prefix causally, so one pass over L tokens yields the
statistic at every length up to L: the readings taken on the way (statistics
are sums, see ``stats``) are the statistics of the shorter inputs. The paper's
statistic averages over *all* queries of the input ("all"); a query near
position L is the one that sees L keys, so the queries of the last block
before L ("tail") give the sharper length signal and are what Propositions
1-2 describe.

Beyond the paper: a continuous search (the statistic is monotone in tau, so a
bracketed regula falsi finds it to any tolerance), per-layer and per-(layer,
head) temperatures (interpolated per unit from uniform-tau passes, then
corrected with passes at the per-unit values), Propositions 1-2 from the
measured logit spread, and the log-length baseline tau = log L_tr / log L_ex.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import native
from . import stats as _stats
from .stats import AttentionStats

PAPER_GRID = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0, 0.95, ..., 0.5
MODES = ("pmax", "entropy")
GRANULARITIES = ("global", "layer", "head")
QUERIES = ("all", "tail")

TauValue = Union[float, np.ndarray]


def tau_key(tau: TauValue) -> Tuple[float, ...]:
    """A hashable key for a temperature (scalar or table), rounded so that a value read back from JSON finds
    the pass measured with it."""
    return tuple(np.round(np.atleast_1d(np.asarray(tau, dtype=np.float64)).ravel(), 6))


@dataclass
class Measurement:
    """One pass over the text at one temperature: cumulative statistics at each checkpoint length."""

    tau: TauValue
    at: Dict[int, AttentionStats]  # L -> statistics of the queries at positions < L
    seconds: float
    nll: Optional[np.ndarray] = None  # nll[i] = -log p(token i+1 | tokens <= i), when asked for

    def covers(self, checkpoints: Sequence[int]) -> bool:
        return all(c in self.at for c in checkpoints)


def save_passes(path, cache: Dict[Tuple[float, ...], Measurement], meta: dict) -> None:
    """Write the passes measured so far (atomically), so an interrupted calibration resumes without them."""
    from pathlib import Path

    from ..jsonfile import write_json_atomic

    path = Path(path)
    data = {"format": "llama-extrapolate/calibration-passes/1", "meta": meta,
            "passes": [{"tau": np.asarray(m.tau, dtype=np.float64).tolist(), "seconds": m.seconds,
                        "at": {str(L): st.to_dict() for L, st in m.at.items()},
                        "nll": None if m.nll is None else [None if not np.isfinite(x) else float(x) for x in m.nll]}
                       for m in cache.values()]}
    write_json_atomic(path, data)


def load_passes(path, meta: dict) -> Dict[Tuple[float, ...], Measurement]:
    """The passes of an earlier run on the same model, tokens and settings ({} when there are none or they
    belong to another run)."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    if data.get("format") != "llama-extrapolate/calibration-passes/1" or data.get("meta") != meta:
        return {}
    out = {}
    for p in data["passes"]:
        tau = np.asarray(p["tau"], dtype=np.float64)
        tau = float(tau) if tau.ndim == 0 else tau
        nll = None if p["nll"] is None else np.array([np.nan if x is None else x for x in p["nll"]])
        m = Measurement(tau=tau, at={int(L): AttentionStats.from_dict(d) for L, d in p["at"].items()},
                        seconds=float(p["seconds"]), nll=nll)
        out[tau_key(tau)] = m
    return out


def _decode_to(stream: native.Stream, tokens: np.ndarray, start: int, stop: int, bar,
               nll: Optional[np.ndarray] = None) -> None:
    """Decode tokens[start:stop] (scoring each one's next token into ``nll`` when given)."""
    from .evaluate import score_chunk

    for offset, n in stream.chunks(tokens[start:stop], logits="all" if nll is not None else "last"):
        if nll is not None:
            score_chunk(stream.ctx, tokens, start + offset, n, stream.llm.n_vocab(), nll)
        if bar is not None:
            bar.update(n)


def measure(llm, tokens: Sequence[int], checkpoints: Sequence[int], tau: TauValue = 1.0, *,
            n_batch: Optional[int] = None, progress: bool = True, desc: str = "calibrate",
            with_nll: bool = False) -> Measurement:
    """Decode ``tokens`` from position 0 at temperature ``tau`` and read the statistics at each checkpoint.

    ``with_nll`` also scores every token (the same pass gives the perplexity at this temperature).
    """
    import time

    tokens = np.asarray(tokens, dtype=np.int32)
    points = sorted({int(c) for c in checkpoints})
    if not points or points[0] < 1 or points[-1] > len(tokens):
        raise ValueError(f"checkpoints {points} must lie in 1..{len(tokens)} (the number of tokens)")
    n_batch = llm.n_batch if n_batch is None else int(n_batch)
    llm.set_temperature(tau)
    stream = native.Stream(llm, n_batch, full_hint=f"calibration reads {len(tokens)} tokens with full attention, "
                                                   "so n_ctx must be >= that")
    stream.reset()
    bar = None
    if progress:
        from tqdm import tqdm

        label = f"{desc} tau={float(np.mean(tau)):.3f}" + ("" if np.ndim(tau) == 0 else " (per unit)")
        bar = tqdm(total=points[-1], desc=label, unit="tok", leave=False)
    at: Dict[int, AttentionStats] = {}
    nll = np.full(points[-1] - 1, np.nan) if with_nll else None
    t0 = time.perf_counter()
    try:
        with _stats.collecting(llm):
            pos = 0
            for c in points:
                _decode_to(stream, tokens, pos, c, bar, nll)
                pos = c
                at[c] = AttentionStats.read(llm)
    finally:
        if bar is not None:
            bar.close()
        stream.reset()
        stream.close()
    return Measurement(tau=tau, at=at, seconds=time.perf_counter() - t0, nll=nll)


def statistic_of(s: AttentionStats, mode: str, granularity: str = "global"):
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use 'pmax' or 'entropy'")
    return s.mean(mode, granularity)


def _crossing(taus: np.ndarray, values: np.ndarray, target: float) -> Tuple[float, bool]:
    """tau where the piecewise-linear curve values(taus) meets target; (nearest end, False) if it never does."""
    order = np.argsort(taus)
    t, v = taus[order], values[order] - target
    for i in range(len(t) - 1):
        if v[i] == 0:
            return float(t[i]), True
        if v[i] * v[i + 1] < 0:
            return float(t[i] - v[i] * (t[i + 1] - t[i]) / (v[i + 1] - v[i])), True
    if v[-1] == 0:
        return float(t[-1]), True
    return float(t[np.argmin(np.abs(v))]), False


@dataclass
class Calibrator:
    """Algorithm 1 and its extensions for one model and one text.

    ``llm`` is a ``llama_extrapolate.Llama`` with full attention (no window) and n_ctx >= the longest
    length; every pass reads the text from position 0 to the longest length once and serves all lengths.
    """

    llm: object
    tokens: Sequence[int]
    training_length: int
    lengths: Sequence[int]
    queries: str = "all"
    tail: Optional[int] = None  # default min(256, L_tr // 2)
    n_batch: Optional[int] = None
    progress: bool = True
    with_nll: bool = False
    on_measure: Optional[Callable[[Measurement], None]] = None
    cache: Dict[Tuple[float, ...], Measurement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int32)
        self.lengths = sorted({int(x) for x in self.lengths})
        if self.queries not in QUERIES:
            raise ValueError(f"queries={self.queries!r}: use 'all' (the paper) or 'tail'")
        if not isinstance(self.training_length, (int, np.integer)) or self.training_length < 2:
            raise ValueError(f"training_length={self.training_length!r} must be a whole number >= 2")
        if not self.lengths:
            raise ValueError("lengths is empty: give at least one extrapolation length L_ex")
        bad = [x for x in self.lengths if x <= self.training_length]
        if bad:
            raise ValueError(f"extrapolation length {bad[0]} must be > training_length={self.training_length}")
        if self.lengths[-1] > len(self.tokens):
            raise ValueError(f"length {self.lengths[-1]} needs {self.lengths[-1]} tokens of text, the text has "
                             f"{len(self.tokens)}: use a longer text or shorter lengths")
        if self.tail is None:
            self.tail = max(1, min(256, self.training_length // 2))
        if not isinstance(self.tail, (int, np.integer)) or not 1 <= self.tail <= self.training_length:
            raise ValueError(f"tail={self.tail} must be in 1..training_length={self.training_length}")
        n_ctx = self.llm.context_params.n_ctx
        if n_ctx < self.lengths[-1]:
            raise ValueError(f"n_ctx={n_ctx} is below the longest length {self.lengths[-1]}: calibration reads the "
                             "text with full attention, so load the model with n_ctx >= that length")
        if self.llm.attention_resolved.window > 0:
            raise ValueError(f"the model was loaded with window={self.llm.attention_resolved.window}: Algorithm 1 "
                             "calibrates full attention; load it with AttentionConfig.vanilla()")

    # --- passes ------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> List[int]:
        ends = [self.training_length, *self.lengths]
        pts = set(ends)
        for L in ends:
            pts.add(L - self.tail)
        return sorted(p for p in pts if p >= 1)

    def measure(self, tau: TauValue) -> Measurement:
        key = tau_key(tau)
        if key not in self.cache or not self.cache[key].covers(self.checkpoints):
            m = measure(self.llm, self.tokens, self.checkpoints, tau, n_batch=self.n_batch, progress=self.progress,
                        with_nll=self.with_nll)
            self.cache[key] = m
            if self.on_measure is not None:
                self.on_measure(m)
        return self.cache[key]

    def stats_at(self, m: Measurement, length: int, queries: Optional[str] = None) -> AttentionStats:
        queries = queries or self.queries
        if queries == "all":
            return m.at[length]
        return m.at[length] - m.at[length - self.tail]

    def value(self, tau: TauValue, length: int, mode: str, granularity: str = "global"):
        return statistic_of(self.stats_at(self.measure(tau), length), mode, granularity)

    def target(self, mode: str, granularity: str = "global"):
        """S_tr(1): the statistic at the training length with tau = 1."""
        return self.value(1.0, self.training_length, mode, granularity)

    # --- Algorithm 1 -----------------------------------------------------------------------------
    def grid(self, mode: str, grid: Sequence[float] = PAPER_GRID) -> Dict[int, dict]:
        """The paper's search: tau_ex on the grid with S_ex(tau_ex) closest to S_tr(1), per length."""
        target = self.target(mode)
        curve = {t: [self.value(t, L, mode) for L in self.lengths] for t in grid}
        out = {}
        for i, L in enumerate(self.lengths):
            best = min(grid, key=lambda t: abs(curve[t][i] - target))
            out[L] = {"tau": float(best), "target": target, "value": curve[best][i],
                      "curve": {str(t): curve[t][i] for t in grid}}
        return out

    def continuous(self, mode: str, length: int, tol: float = 2e-3, lo: float = 0.5, hi: float = 1.0,
                   max_passes: int = 12) -> dict:
        """tau with S(tau, L_ex) = S_tr(1) to within ``tol`` in tau, by bracketed regula falsi (Illinois)."""
        target = self.target(mode)

        def f(t: float) -> float:
            return self.value(t, length, mode) - target

        # the tightest bracket the passes made so far give, else the ends of [lo, hi]
        seen = {k[0]: f(k[0]) for k in list(self.cache) if len(k) == 1 and self.cache[k].covers(self.checkpoints)}
        sign_hi = np.sign(f(hi))
        up = [t for t, v in seen.items() if np.sign(v) == sign_hi]
        down = [t for t, v in seen.items() if np.sign(v) == -sign_hi]
        if up:
            hi = min(up)
        if down:
            lo = max(down)
        f_hi, f_lo = f(hi), f(lo)
        while f_lo * f_hi > 0 and lo > 0.15:
            lo = max(0.1, lo - 0.2)
            f_lo = f(lo)
        if f_lo * f_hi > 0:
            raise RuntimeError(f"{mode} at L_ex={length} does not reach its training value {target:.4f} for tau in "
                               f"[{lo}, {hi}] (S={f_lo + target:.4f}..{f_hi + target:.4f}): the statistic is not "
                               "aligned by a temperature on this text")
        evaluated = {lo: f_lo, hi: f_hi}
        side = 0
        passes = 0
        while hi - lo > tol and passes < max_passes:
            t = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
            t = round(min(max(t, lo + tol / 4), hi - tol / 4), 4)
            ft = f(t)
            evaluated[t] = ft
            passes += 1
            if ft == 0:
                lo = hi = t
                break
            if ft * f_hi > 0:
                hi, f_hi = t, ft
                if side == 1:
                    f_lo /= 2
                side = 1
            else:
                lo, f_lo = t, ft
                if side == -1:
                    f_hi /= 2
                side = -1
        # report a measured tau (its pass also holds the NLL): the one nearest the target in the final bracket
        best = min((t for t in evaluated if lo <= t <= hi), key=lambda t: abs(evaluated[t]))
        return {"tau": float(best), "bracket": [float(lo), float(hi)], "target": target,
                "value": float(evaluated[best] + target), "passes": len(evaluated)}

    def per_unit(self, mode: str, length: int, granularity: str, refine: int = 1,
                 uniform: Optional[Sequence[float]] = None, verify: bool = True) -> dict:
        """tau per layer [n_layer] or per (layer, head) [n_layer, n_head] aligning each unit's own statistic.

        Each unit's statistic is interpolated from uniform-tau passes (``uniform``, default the taus measured
        so far), then ``refine`` passes at the per-unit values correct each unit by its own slope; ``verify``
        measures the result once more (the error it reports is then measured, not interpolated).
        """
        if granularity not in ("layer", "head"):
            raise ValueError(f"granularity={granularity!r}: per-unit search is 'layer' or 'head'")
        target = np.asarray(self.target(mode, granularity))
        taus = sorted(set(uniform) if uniform is not None else
                      {k[0] for k in self.cache if len(k) == 1})
        if len(taus) < 2:
            raise ValueError("per-unit search needs uniform passes at two or more temperatures first (run grid "
                             "or continuous, or pass uniform=[...])")
        taus_a = np.asarray(taus)
        curves = np.stack([np.asarray(self.value(t, length, mode, granularity)) for t in taus])  # [n_tau, *unit]
        tau = np.empty(target.shape)
        bracketed = np.empty(target.shape, dtype=bool)
        for idx in np.ndindex(target.shape):
            tau[idx], bracketed[idx] = _crossing(taus_a, curves[(slice(None),) + idx], float(target[idx]))
        history = []
        # correcting passes: Newton steps on each unit's own statistic, the slope from the uniform curve at
        # first, then secant through this unit's last two passes
        slope = np.empty(target.shape)
        for idx in np.ndindex(target.shape):
            slope[idx] = np.interp(tau[idx], taus_a, np.gradient(curves[(slice(None),) + idx], taus_a))
        prev = None
        for _ in range(refine):
            got = np.asarray(self.value(tau, length, mode, granularity))
            history.append(float(np.abs(got - target).mean()))
            if prev is not None:
                d_tau, d_got = tau - prev[0], got - prev[1]
                ok = np.abs(d_tau) > 1e-7
                slope = np.where(ok & (np.abs(d_got) > 0), d_got / np.where(ok, d_tau, 1), slope)
            prev = (tau.copy(), got)
            step = np.where(np.abs(slope) > 1e-12, (target - got) / np.where(slope == 0, 1, slope), 0.0)
            tau = np.clip(tau + np.clip(step, -0.2, 0.2), 0.1, 2.0)
        if verify:
            got = np.asarray(self.value(tau, length, mode, granularity))
            history.append(float(np.abs(got - target).mean()))
        return {"tau": tau, "bracketed": bracketed, "mean_abs_error": history}


# --- closed forms ----------------------------------------------------------------------------
def log_length_tau(training_length: int, length: int) -> float:
    """The length-only baseline (Yao et al.; Su): tau = log L_tr / log L_ex."""
    return math.log(training_length) / math.log(max(length, training_length))


def proposition1(l_tr: float, l_ex: float, p_tr: float, sigma_tr: float, sigma_ex: float) -> Optional[float]:
    """Maximum-probability alignment in closed form: the larger root of A tau^2 - B tau + C = 0.

    A = log L_ex + log P_tr, B = log L_tr + log P_tr + sigma_tr^2 / 2, C = sigma_ex^2 / 2 (Assumptions 1-2:
    Gaussian logits, same largest logit); None when the quadratic has no real root.
    """
    a = math.log(l_ex) + math.log(p_tr)
    b = math.log(l_tr) + math.log(p_tr) + sigma_tr ** 2 / 2
    c = sigma_ex ** 2 / 2
    if a == 0:
        return c / b if b else None
    disc = b * b - 4 * a * c
    if disc < 0:
        return None
    roots = [(b + math.sqrt(disc)) / (2 * a), (b - math.sqrt(disc)) / (2 * a)]
    positive = [r for r in roots if r > 0]
    return max(positive) if positive else None


def proposition2(l_tr: float, l_ex: float, sigma_tr: float, sigma_ex: float) -> float:
    """Entropy alignment in closed form (Assumption 1): tau = sigma_ex / sqrt(sigma_tr^2 + 2 log(L_ex / L_tr))."""
    return sigma_ex / math.sqrt(sigma_tr ** 2 + 2 * math.log(l_ex / l_tr))


def propositions(tail_stats: Dict[int, AttentionStats], training_length: int, layer: int = 0) -> Dict[int, dict]:
    """Propositions 1-2 at each length from the tau = 1 statistics of the queries that see ~L keys.

    As in the paper's section 7: layer 0, P_tr and sigma_tr at the training length, sigma_ex at each length;
    L is the mean number of keys those queries saw.
    """
    tr = tail_stats[training_length]
    keys = lambda s: float(s.n_keys[layer].sum() / s.count[layer].sum())  # noqa: E731
    p_tr = float(tr.pmax[layer].sum() / tr.count[layer].sum())
    s_tr, l_tr = tr.sigma(layer), keys(tr)
    out = {}
    for L, s in sorted(tail_stats.items()):
        s_ex, l_ex = s.sigma(layer), keys(s)
        out[L] = {"keys": l_ex, "sigma": s_ex,
                  "proposition1": proposition1(l_tr, l_ex, p_tr, s_tr, s_ex),
                  "proposition2": proposition2(l_tr, l_ex, s_tr, s_ex)}
    return out


def calibrate_model(model: str, text: str, text_name: str, out, *, training_length: Optional[int] = None,
                    lengths: Optional[Sequence[int]] = None, modes: Sequence[str] = MODES,
                    granularities: Sequence[str] = ("global",), search: str = "continuous", queries: str = "all",
                    tail: Optional[int] = None, tol: float = 2e-3, refine: int = 1, n_batch: int = 512,
                    threads: Optional[int] = None, progress: bool = True):
    """Calibrate ``model`` on ``text`` and return its profile (``llama-extrapolate calibrate``; the caller saves it).

    The passes are kept beside ``out`` (``<out>.passes``) after each measurement, so an interrupted run
    resumes where it stopped; they are kept only for the same model file, tokens and settings.
    """
    import hashlib
    import sys
    from pathlib import Path

    from ..config import AttentionConfig
    from ..llama import Llama, thread_counts
    from ..model_info import read_model_info
    from ..profile import CalibrationProfile, file_sha256

    info = read_model_info(model)
    l_tr = int(training_length) if training_length is not None else int(info.context_length)
    if l_tr < 2:
        raise ValueError(f"training_length {l_tr} must be >= 2")
    lengths = [int(x) for x in lengths] if lengths else [2 * l_tr, 4 * l_tr]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"mode {bad or modes!r}: use {', '.join(MODES)}")
    bad = [g for g in granularities if g not in GRANULARITIES]
    if bad or not granularities:
        raise ValueError(f"granularity {','.join(granularities)!r}: use global, layer, head (comma-separated)")
    if search not in ("continuous", "grid"):
        raise ValueError(f"search {search!r}: use 'continuous' or 'grid'")
    out = Path(out)
    n_max = max(lengths)
    llm = Llama(model, attention=AttentionConfig.vanilla(), n_ctx=n_max + 64, n_batch=n_batch, n_ubatch=n_batch,
                verbose=False, **thread_counts(threads))
    try:
        tokens = llm.tokenize(text[: 16 * n_max].encode("utf-8"), add_bos=True)
        if len(tokens) < n_max:
            raise ValueError(f"the text {text_name} has {len(tokens)} tokens, fewer than the longest length {n_max}: "
                             "use a longer text or shorter lengths")
        tokens = tokens[:n_max]
        passes_path = out.with_name(out.name + ".passes")
        c = Calibrator(llm, tokens, l_tr, lengths, queries=queries, tail=tail, n_batch=n_batch, progress=progress)
        model_sha = file_sha256(model)
        run_meta = {"model_sha256": model_sha,
                    "tokens_sha256": hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest(),
                    "training_length": l_tr, "queries": queries, "tail": c.tail, "checkpoints": c.checkpoints}
        c.cache.update(load_passes(passes_path, run_meta))
        if c.cache and progress:
            print(f"resuming with {len(c.cache)} passes from {passes_path}", file=sys.stderr)
        c.on_measure = lambda m: save_passes(passes_path, c.cache, run_meta)
        prof = CalibrationProfile(model_name=Path(model).name, model_sha256=model_sha, training_length=l_tr,
                                  text=text_name, queries=queries)
        for mode in modes:
            if "global" in granularities or search == "grid":
                if search == "grid":
                    for L, r in c.grid(mode, PAPER_GRID).items():
                        prof.add(mode, "global", "grid", L, r["tau"], target=r["target"], value=r["value"])
                else:
                    for L in lengths:
                        r = c.continuous(mode, L, tol=tol)
                        prof.add(mode, "global", "continuous", L, r["tau"], target=r["target"], value=r["value"],
                                 bracket=r["bracket"])
            for g in granularities:
                if g == "global":
                    continue
                for L in lengths:
                    r = c.per_unit(mode, L, g, refine=refine)
                    prof.add(mode, g, "refined", L, r["tau"], mean_abs_error=r["mean_abs_error"])
        tails = {L: c.stats_at(c.measure(1.0), L, "tail") for L in [l_tr, *lengths]}
        prof.extra = {"log_length": {str(L): log_length_tau(l_tr, L) for L in lengths},
                      "propositions": {str(L): v for L, v in propositions(tails, l_tr).items()},
                      "statistic_at_training_length": {m: c.target(m) for m in MODES},
                      "passes": len(c.cache), "tokens": n_max}
    finally:
        llm.close()
    return prof
