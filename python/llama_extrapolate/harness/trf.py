"""Receptive fields of relative positional encodings (Qin et al., "Exploring Transformer Extrapolation").

An RPE adds r(t) to the logit of the key at distance t from the query. Its weights b_t = exp(r(t)), t = 0, 1, ...
bound how much attention a key at distance t can receive (Eq. 17-18), so the series tells what the encoding lets a
model attend to:

* Theorem 0.4: if B = sum_t b_t converges, attention with that RPE has the length-extrapolation property;
* Eq. 22: the theoretical receptive field TRF(eps) = min j with sum_{t >= j} b_t < B * eps, the window that holds
  all but eps of the bound;
* Theorem 0.5: if alpha_t / alpha <= beta_t / beta for large t, then TRF_alpha(eps) <= TRF_beta(eps) for small eps;
* the empirical receptive field ERF(eps) is the same window read off attention mass measured on a model
  (``llama_extrapolate.harness.stats`` accumulates it by distance inside llama.cpp).

Series are indexed by distance t >= 0 (the paper's b_n with n = t + 1 for Type 1 and Type 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

LogWeight = Callable[[np.ndarray], np.ndarray]

# The numerical test sums the first N_TERMS terms exactly and checks the decay on a geometric grid up to
# N_TERMS * 2**GRID_OCTAVES: far enough that an exponent drifting toward 1 (a divergent 1/(t ln t)) shows.
N_TERMS = 1 << 22
GRID_OCTAVES = 60
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Verdict:
    """Whether sum_t b_t converges, how that was decided, and what is known of its sum B."""

    converges: Optional[bool]  # None: the numerical test could not decide
    method: str  # "analytic" or "numerical"
    reason: str
    B: Optional[float] = None  # the sum when it is known (exactly or as the midpoint of B_bounds)
    B_bounds: Optional[Tuple[float, float]] = None

    def to_dict(self) -> dict:
        return {"converges": self.converges, "method": self.method, "reason": self.reason, "B": self.B,
                "B_bounds": list(self.B_bounds) if self.B_bounds else None}


@dataclass(frozen=True)
class RPE:
    """A relative positional encoding as the series of its exponentials."""

    name: str
    log_weight: LogWeight  # ln b_t for float distances t >= 0
    analytic: Optional[Verdict] = None  # known convergence (and sum), else the numerical test decides
    support: Optional[int] = None  # b_t = 0 for t >= support (a mask)
    params: Dict[str, float] = field(default_factory=dict)

    def weights(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        with np.errstate(over="ignore", under="ignore", divide="ignore"):
            w = np.exp(self.log_weight(t))
        if self.support is not None:
            w = np.where(t < self.support, w, 0.0)
        return w

    def verdict(self) -> Verdict:
        return self.analytic if self.analytic is not None else numerical_verdict(self)


def _positive(name: str, value: float, fix: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a finite number > 0 ({fix})")
    return value


# --- the encodings ----------------------------------------------------------------------------------------


def alibi_slopes(n_head: int, max_bias: float = 8.0) -> np.ndarray:
    """ALiBi's head slopes: a geometric sequence from the nearest power of two of the head count, the remaining
    heads interleaved from the next power (the scheme llama.cpp applies with the model's ``max_alibi_bias``)."""
    if not isinstance(n_head, (int, np.integer)) or n_head < 1:
        raise ValueError(f"n_head={n_head!r}: ALiBi needs a whole number of heads >= 1")
    _positive("max_bias", max_bias, "ALiBi's default is 8")
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)])


def alibi(slope: float) -> RPE:
    """r(t) = -m t. b_t = e^{-mt}: a geometric series, B = 1 / (1 - e^{-m})."""
    m = _positive("slope", slope, "ALiBi slopes are > 0; see alibi_slopes(n_head)")
    B = 1.0 / -math.expm1(-m)
    return RPE(f"ALiBi m={m:.4g}", lambda t: -m * t,
               Verdict(True, "analytic", "geometric series with ratio e^{-m} < 1", B, (B, B)), params={"slope": m})


def kerple_log(r1: float = 3.0, r2: float = 0.5) -> RPE:
    """Kerple (logarithmic): r(t) = -r1 ln(1 + r2 t), so b_t = (1 + r2 t)^{-r1}."""
    r1 = _positive("r1", r1, "Kerple's parameters are > 0")
    r2 = _positive("r2", r2, "Kerple's parameters are > 0")
    conv = r1 > 1.0
    reason = (f"b_t ~ (r2 t)^-{r1:g}: a p-series with p = r1 {'> 1' if conv else '<= 1'} "
              f"({'converges' if conv else 'diverges'} by comparison)")
    return RPE(f"Kerple log r1={r1:g} r2={r2:g}", lambda t: -r1 * np.log1p(r2 * t),
               Verdict(conv, "analytic", reason), params={"r1": r1, "r2": r2})


def kerple_power(r1: float = 1.0, r2: float = 0.5) -> RPE:
    """Kerple (power): r(t) = -r1 t^{r2}, 0 < r2 <= 2."""
    r1 = _positive("r1", r1, "Kerple's parameters are > 0")
    r2 = _positive("r2", r2, "Kerple (power) takes 0 < r2 <= 2")
    if r2 > 2:
        raise ValueError(f"r2={r2!r}: Kerple (power) takes 0 < r2 <= 2")
    reason = "e^{-r1 t^r2} <= t^-2 once r1 t^r2 >= 2 ln t, which holds for large t when r2 > 0: converges"
    return RPE(f"Kerple power r1={r1:g} r2={r2:g}", lambda t: -r1 * np.power(t, r2),
               Verdict(True, "analytic", reason), params={"r1": r1, "r2": r2})


def sandwich(dim: int = 128, lam: float = 1.0) -> RPE:
    """Sandwich: the inner product of sinusoidal position embeddings, (lam/d) sum_k cos(t / 10000^{2k/d}),
    shifted so that r(0) = 0 (a constant shift scales every b_t alike: no change to the verdict or to TRF)."""
    if not isinstance(dim, (int, np.integer)) or dim < 2 or dim % 2:
        raise ValueError(f"dim={dim!r}: Sandwich needs an even embedding dimension >= 2")
    lam = _positive("lam", lam, "the Sandwich scale is > 0")
    freq = 1.0 / 10000.0 ** (2.0 * np.arange(1, dim // 2 + 1) / dim)

    def log_weight(t):
        t = np.asarray(t, dtype=np.float64)
        return (lam / dim) * (np.cos(np.multiply.outer(t, freq)) - 1.0).sum(axis=-1)

    reason = (f"each of the d/2 cosines moves r(t) by at most 2 lam/d, so r(t) >= -lam and b_t >= e^-{lam:g}: "
              "the terms do not vanish, the series diverges")
    return RPE(f"Sandwich d={dim} lam={lam:g}", log_weight, Verdict(False, "analytic", reason),
               params={"dim": dim, "lam": lam})


def t5_bucket(t: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's causal relative-position bucket: exact below num_buckets/2, then log-spaced up to max_distance,
    where every farther distance shares the last bucket."""
    t = np.asarray(t, dtype=np.float64)
    exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        log_part = exact + np.log(np.maximum(t, 1.0) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    bucket = np.where(t < exact, t, np.minimum(np.floor(log_part), num_buckets - 1))
    return bucket.astype(np.int64)


def t5(bias: Sequence[float], max_distance: int = 128) -> RPE:
    """T5 buckets: r(t) = bias[bucket(t)] with learned bias values (one per bucket, e.g. one head's)."""
    bias = np.asarray(bias, dtype=np.float64)
    if bias.ndim != 1 or len(bias) < 4 or len(bias) % 2:
        raise ValueError(f"bias has shape {bias.shape}: T5 takes an even number (>= 4) of bucket values")
    if np.isnan(bias).any() or np.isposinf(bias).any():
        raise ValueError("bias: T5 bucket values must be finite or -inf (a masked bucket)")
    n = len(bias)
    if not isinstance(max_distance, (int, np.integer)) or max_distance <= n // 2:
        raise ValueError(f"max_distance={max_distance!r}: must be an integer above num_buckets/2 = {n // 2}")
    last = bias[-1]
    if np.isfinite(last):
        verdict = Verdict(False, "analytic", f"every distance >= {max_distance} shares the last bucket, so "
                          f"b_t = e^{last:.4g} for all large t: the terms do not vanish, the series diverges")
    else:
        support_t = int(np.argmax(t5_bucket(np.arange(max_distance + 1), n, max_distance) == n - 1))
        verdict = Verdict(True, "analytic", f"the last bucket is masked: b_t = 0 from t = {support_t}")
    return RPE(f"T5 {n} buckets", lambda t: bias[t5_bucket(t, n, max_distance)], verdict,
               params={"num_buckets": n, "max_distance": max_distance})


def type1() -> RPE:
    """The paper's Type 1: b_n = 1/n^2, n = t + 1. B = pi^2/6."""
    B = math.pi ** 2 / 6
    return RPE("Type 1 (1/n^2)", lambda t: -2.0 * np.log1p(t),
               Verdict(True, "analytic", "p-series with p = 2", B, (B, B)))


def type2() -> RPE:
    """The paper's Type 2: b_n = exp(-ln^2 n), n = t + 1."""
    return RPE("Type 2 (exp(-ln^2 n))", lambda t: -np.log1p(t) ** 2,
               Verdict(True, "analytic", "e^{-ln^2 n} = n^{-ln n} <= n^-2 once ln n >= 2: converges by comparison"))


def harmonic() -> RPE:
    """b_n = 1/n, n = t + 1: concentrates on neighbours yet diverges (the paper's necessity check)."""
    return RPE("1/n", lambda t: -np.log1p(t), Verdict(False, "analytic", "the harmonic series diverges"))


def n_log_n() -> RPE:
    """b_n = 1/(n ln n), n = t + 2 (the first term with ln n > 0)."""
    return RPE("1/(n ln n)", lambda t: -np.log(t + 2.0) - np.log(np.log(t + 2.0)),
               Verdict(False, "analytic", "integral test: the integral of 1/(x ln x) is ln ln x, unbounded"))


def lambda_mask(sinks: int, window: int) -> RPE:
    """LM-Infinite's Lambda-mask as a series over the keys a query sees: the window's W keys (distances 0..W-1)
    then the S sink keys. The sinks sit at absolute positions (their distance grows with the query), so the
    mask is not Toeplitz; counted by key it has finite support S + W, which bounds its TRF."""
    for name, v in (("sinks", sinks), ("window", window)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}={v!r}: must be a whole number >= 0")
    if sinks + window < 1:
        raise ValueError("sinks=0, window=0: the Lambda-mask needs at least one key")
    n = int(sinks + window)
    return RPE(f"Lambda S={sinks} W={window}", lambda t: np.zeros_like(np.asarray(t, dtype=np.float64)),
               Verdict(True, "analytic", f"finite support: {n} keys with weight 1", float(n), (float(n), float(n))),
               support=n, params={"sinks": int(sinks), "window": int(window)})


def custom(name: str, log_weight: LogWeight) -> RPE:
    """Any RPE given as ln b_t (vectorised over float distances); its verdict comes from the numerical test."""
    if not callable(log_weight):
        raise ValueError(f"log_weight={log_weight!r}: pass a function of the distance array returning ln b_t")
    return RPE(name, log_weight)


# --- convergence, sums and TRF -------------------------------------------------------------------------------


def _partial_sums(rpe: RPE, n: int) -> np.ndarray:
    """S_j = sum_{t < j} b_t for j = 1..n (float64, chunked)."""
    out = np.empty(n, dtype=np.float64)
    acc = 0.0
    for s in range(0, n, _CHUNK):
        w = rpe.weights(np.arange(s, min(n, s + _CHUNK), dtype=np.float64))
        c = np.cumsum(w) + acc
        out[s:s + len(w)] = c
        acc = float(c[-1])
    return out


def numerical_verdict(rpe: RPE, n_terms: int = N_TERMS, octaves: int = GRID_OCTAVES) -> Verdict:
    """Sum the first n_terms exactly, then read the local decay exponent p(t) = -d ln b / d ln t on a geometric
    grid from n_terms to n_terms * 2**octaves. p >= p_min > 1 and not falling: b_t <= b_N (t/N)^-p_min beyond N,
    so the tail is at most b_N (1 + N/(p_min - 1)) (integral comparison). p <= 1 at the far end: b_t >= c/t there,
    diverges by comparison with the harmonic series. Otherwise (p > 1 but falling toward 1) undecided."""
    S = float(_partial_sums(rpe, n_terms)[-1])
    grid = float(n_terms) * 2.0 ** np.arange(octaves + 1)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        lb = np.asarray(rpe.log_weight(grid), dtype=np.float64)
    if rpe.support is not None:
        lb = np.where(grid < rpe.support, lb, -np.inf)
    if np.isnan(lb).any() or np.isposinf(lb).any():
        return Verdict(None, "numerical", f"ln b_t is not finite on the grid from t = {n_terms}")
    if not math.isfinite(S):
        return Verdict(False, "numerical", f"the first {n_terms} terms already sum to {S}")
    if np.isneginf(lb[0]):
        # b vanishes (underflow or support) from N on: the tail is below the smallest double times the grid reach
        return Verdict(True, "numerical", f"b_t underflows to 0 from t = {n_terms} on", S, (S, S))
    finite = np.isfinite(lb)
    stop = int(np.argmin(finite)) if not finite.all() else len(lb)
    p = -(np.diff(lb[:stop])) / math.log(2.0)
    if stop < len(lb):  # underflows further out: steeper than any power from there
        p = np.append(p, np.inf)
    far = p[-min(8, len(p)):]
    if np.all(far <= 1.0 + 1e-9):
        return Verdict(False, "numerical", f"local decay exponent <= 1 on [{grid[len(p) - len(far)]:.3g}, "
                       f"{grid[min(stop, len(grid) - 1)]:.3g}]: b_t >= c/t there, diverges like the harmonic series")
    p_min = float(np.min(p))
    falling = bool(np.any(np.diff(p[np.isfinite(p)]) < -1e-6))
    if p_min > 1.0 and not falling:
        bN = math.exp(lb[0])
        tail = bN * (1.0 + n_terms / (p_min - 1.0))
        return Verdict(True, "numerical",
                       f"local decay exponent >= {p_min:.4g} and not falling on [{grid[0]:.3g}, {grid[-1]:.3g}]: "
                       f"the tail beyond t = {n_terms} is at most {tail:.3g}", S + tail / 2, (S, S + tail))
    return Verdict(None, "numerical", f"local decay exponent {p_min:.4g}..{float(np.max(p[np.isfinite(p)])):.4g} "
                   f"{'falls' if falling else 'is <= 1 in places'} on [{grid[0]:.3g}, {grid[-1]:.3g}]: "
                   "no comparison settles it")


def _sum_bounds(rpe: RPE, v: Verdict, n: int) -> Tuple[float, float, np.ndarray]:
    sums = _partial_sums(rpe, n)
    if v.B_bounds is not None:
        lo, hi = v.B_bounds
        return max(lo, float(sums[-1])), hi, sums
    if v.converges:  # analytic convergence without a closed form: bound the tail numerically
        nv = numerical_verdict(rpe, n)
        if nv.converges and nv.B_bounds is not None:
            return nv.B_bounds[0], nv.B_bounds[1], sums
        raise ValueError(f"{rpe.name}: converges ({v.reason}) but the tail beyond {n} terms could not be bounded "
                         f"numerically ({nv.reason}); give the sum in closed form")
    raise ValueError(f"{rpe.name}: the series does not converge ({v.reason}), so it has no finite receptive field")


def _checked_eps(eps: Sequence[float]) -> List[float]:
    out = [float(e) for e in eps]
    for e in out:
        if not (0.0 < e < 1.0):
            raise ValueError(f"eps={e!r}: the receptive field is defined for 0 < eps < 1")
    return out


def trf(rpe: RPE, eps: Sequence[float], n_terms: int = N_TERMS) -> List[dict]:
    """TRF(eps) = min j with sum_{t >= j} b_t < B eps (Eq. 22), for each eps. When B is only bracketed, the
    window is bracketed too: ``lo`` uses the smallest possible B, ``hi`` the largest (``trf`` is ``hi``)."""
    eps = _checked_eps(eps)
    n = int(rpe.support) if rpe.support is not None else n_terms
    return _trf_rows(rpe, eps, *_sum_bounds(rpe, rpe.verdict(), n))


def _trf_rows(rpe: RPE, eps: List[float], B_lo: float, B_hi: float, sums: np.ndarray) -> List[dict]:
    """TRF(eps) from the partial sums and the bracket on B (see ``trf``)."""
    n = len(sums)
    out = []
    for e in eps:
        # sum_{t>=j} b_t = B - S_j < B eps  <=>  S_j > B (1 - eps); j counts terms, S_j = sums[j-1]
        def first(B):
            j = int(np.searchsorted(sums, B * (1.0 - e), side="right")) + 1
            return j if j <= n else None
        lo, hi = first(B_lo), first(B_hi)
        out.append({"eps": e, "trf": hi, "lo": lo, "hi": hi})
        if hi is None:
            raise ValueError(f"{rpe.name}: TRF({e:g}) lies beyond the {n} terms summed; use a larger eps")
    return out


def compare(alpha: RPE, beta: RPE, n_terms: int = N_TERMS, octaves: int = GRID_OCTAVES) -> dict:
    """Theorem 0.5: find t0 beyond which alpha_t / alpha <= beta_t / beta on the grid (all integers up to
    n_terms, then geometric to n_terms * 2**octaves); then TRF_alpha(eps) <= TRF_beta(eps) for every
    eps <= eps0 = (sum_{t >= t0} beta_t) / beta."""
    va, vb = alpha.verdict(), beta.verdict()
    if not (va.converges and vb.converges):
        raise ValueError(f"Theorem 0.5 needs two convergent series: {alpha.name}: {va.reason}; {beta.name}: {vb.reason}")
    _, A, _ = _sum_bounds(alpha, va, n_terms)  # the largest A and smallest B make the check conservative
    Bb, _, sums_b = _sum_bounds(beta, vb, n_terms)
    t = np.concatenate([np.arange(n_terms, dtype=np.float64), n_terms * 2.0 ** np.arange(1, octaves + 1)])
    with np.errstate(divide="ignore", under="ignore"):
        la = np.log(alpha.weights(t)) - math.log(A)
        lbeta = np.log(beta.weights(t)) - math.log(Bb)
    ok = la <= lbeta + 1e-12
    if not ok[-1]:
        return {"holds": False, "t0": None, "eps0": None,
                "reason": f"alpha_t/alpha > beta_t/beta at t = {t[-1]:.3g}: the condition fails for large t"}
    bad = np.nonzero(~ok)[0]
    t0 = int(t[bad[-1] + 1]) if len(bad) else 0
    if t0 >= n_terms:
        return {"holds": True, "t0": t0, "eps0": None,
                "reason": f"holds from t = {t0}, beyond the {n_terms} terms summed: eps0 not computed"}
    eps0 = (Bb - (float(sums_b[t0 - 1]) if t0 > 0 else 0.0)) / Bb
    return {"holds": True, "t0": t0, "eps0": eps0,
            "reason": f"alpha_t/alpha <= beta_t/beta for t >= {t0}: TRF_alpha(eps) <= TRF_beta(eps) for eps <= {eps0:.3g}"}


# --- empirical receptive field ----------------------------------------------------------------------------


def erf_from_mass(bin_lower: np.ndarray, mass: np.ndarray, eps: Sequence[float]) -> List[dict]:
    """ERF(eps) = min window j whose distances 0..j-1 hold more than 1 - eps of the attention mass. Mass is
    binned by distance, so the window is bracketed: the bin where the cumulative mass passes 1 - eps gives
    lo = its first distance + 1 and hi = its last distance + 1 (equal for the exact bins at short distance)."""
    bin_lower = np.asarray(bin_lower, dtype=np.int64)
    mass = np.asarray(mass, dtype=np.float64)
    if mass.shape != bin_lower.shape:
        raise ValueError(f"mass has shape {mass.shape}, bin_lower {bin_lower.shape}: one mass per bin")
    total = mass.sum()
    if not total > 0:
        raise ValueError("mass sums to 0: no attention was collected (enable statistics and run some tokens)")
    cum = np.cumsum(mass / total)
    out = []
    for e in _checked_eps(eps):
        k = min(int(np.searchsorted(cum, 1.0 - e, side="right")), len(cum) - 1)
        lo = int(bin_lower[k]) + 1
        hi = int(bin_lower[k + 1]) if k + 1 < len(bin_lower) else None
        out.append({"eps": e, "lo": lo, "hi": hi})
    return out


def erf_by_layer(bin_lower, by_layer, eps: Sequence[float]) -> dict:
    """ERF for every layer and for the mass of all layers together."""
    by_layer = np.asarray(by_layer, dtype=np.float64)
    return {"overall": erf_from_mass(bin_lower, by_layer.mean(axis=0), eps),
            "by_layer": [erf_from_mass(bin_lower, m, eps) for m in by_layer]}


def measure_erf(llm, tokens: Sequence[int], eps: Sequence[float], n_batch: int = 512, desc: str = "erf") -> dict:
    """Read tokens once with statistics on and return the mass by distance and the ERF per layer."""
    from .. import native
    from ..session import Session

    from . import stats

    tokens = [int(t) for t in tokens]
    if len(tokens) < 2:
        raise ValueError(f"tokens: {len(tokens)} given, the ERF needs at least 2")
    llm.reset()
    native.clear_memory(llm.ctx)
    with stats.collecting(llm):
        Session(llm, n_batch=n_batch).read(tokens, progress=True, desc=desc, leave=False)
    st = stats.AttentionStats.read(llm)
    by_layer = np.stack([st.mass_by_distance(layer=i) for i in range(st.count.shape[0])])
    return {"tokens": len(tokens), "bin_lower": st.bin_lower.tolist(), "mass_by_layer": by_layer.tolist(),
            **erf_by_layer(st.bin_lower, by_layer, eps)}


ERF_CONFIGS = ("vanilla", "lambda")


def measure_erf_configs(model: str, tokens: Sequence[int], names: Sequence[str], eps: Sequence[float], *,
                        n_batch: int = 512, threads: Optional[int] = None, window: Optional[int] = None,
                        sinks: Optional[int] = None) -> Dict[str, dict]:
    """The ERF of ``model`` under each named configuration (vanilla, lambda), each read with the cache and the
    window the evaluations use for a stream of this length (``evaluate.setup_for``)."""
    from .evaluate import setup_for
    from ..llama import Llama, thread_counts
    from ..model_info import read_model_info

    bad = [n for n in names if n not in ERF_CONFIGS]
    if bad or not names:
        raise ValueError(f"configs {bad or list(names)!r}: the ERF is measured for {', '.join(ERF_CONFIGS)}")
    info = read_model_info(model)
    out = {}
    for name in names:
        st = setup_for(name, info, len(tokens), n_batch, window=window, sinks=sinks)
        llm = Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                    verbose=False, **thread_counts(threads))
        try:
            out[name] = {"setup": st.describe(), **measure_erf(llm, tokens, eps, n_batch, desc=f"erf {name}")}
        finally:
            llm.close()
    return out


# --- the standard set, plots ---------------------------------------------------------------------------------


def standard_rpes(n_head: int = 8, max_bias: float = 8.0, sinks: int = 4, window: int = 8192) -> List[RPE]:
    """The encodings of the paper's Figure 6 plus its divergent examples, T5 and the Lambda-mask. ALiBi gives its
    first and last head; T5 uses a made-up monotone bias (learned values vary by model: pass them to t5())."""
    slopes = alibi_slopes(n_head, max_bias)
    return [alibi(slopes[0]), alibi(slopes[-1]), kerple_log(), kerple_power(), sandwich(),
            t5(-0.25 * np.arange(32), 128), type1(), type2(), harmonic(), n_log_n(), lambda_mask(sinks, window)]


def report(rpes: Sequence[RPE], eps: Sequence[float], n_terms: int = N_TERMS) -> dict:
    out = {}
    for r in rpes:
        v = r.verdict()
        entry = {"params": r.params, "verdict": v.to_dict(), "B": None, "trf": None}
        if v.converges:
            n = int(r.support) if r.support is not None else n_terms
            lo, hi, sums = _sum_bounds(r, v, n)  # summed once for B and every TRF(eps)
            entry["B"] = [lo, hi]
            entry["trf"] = _trf_rows(r, _checked_eps(eps), lo, hi, sums)
        out[r.name] = entry
    return out
