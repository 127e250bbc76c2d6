"""Every figure the package draws, in one module.

matplotlib is an optional, slow import that the scoring code never needs: keeping the drawing here means a
run without plots never imports it, and the backend choice (Agg: files only, no display on a server) is made
once.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from ..names import PROFILE_CONFIG_PREFIX, NamedConfig
from .tasks import accuracy_table
from .trf import RPE, trf


PLOTS_EXTRA = "llama-extrapolate[eval]"


class PlotsUnavailableError(RuntimeError):
    """matplotlib, which only the evaluation's figures need, is not installed (``pip install llama-extrapolate``
    leaves it out so that ``run`` and ``serve`` do not carry it)."""


def require_matplotlib() -> None:
    """Refuse now, before an evaluation spends its hours, if its figures could not be drawn at the end."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlotsUnavailableError(f"the evaluation's figures need matplotlib, which is not installed: "
                                    f"pip install '{PLOTS_EXTRA}'")


def pyplot():
    """matplotlib.pyplot on the Agg backend (figures go to files; there may be no display)."""
    try:
        import matplotlib
    except ImportError:
        require_matplotlib()
        raise

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_nll(results: dict, path, title: Optional[str] = None) -> None:
    """One NLL-by-position curve per configuration (like LM-Infinite's Figures 3 and 5)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, entry in results.get("configs", {}).items():
        b = entry.get("buckets") or []
        if b:
            # a profile by its file name (enough to tell the curve apart), another configuration by its name
            label = NamedConfig.parse(name).label() if name.startswith(PROFILE_CONFIG_PREFIX) else name
            ax.plot([x["end"] for x in b], [x["nll"] for x in b], marker=".", label=label)
    ax.set_xlabel("token position")
    ax.set_ylabel(f"NLL (mean over {results.get('bucket', '?')}-token buckets)")
    ax.set_title(title or f"{results.get('model', '')}: {results.get('text', '')}")
    ax.grid(alpha=0.3)
    # outside the axes: the curves fill the whole plot at long lengths
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accuracy(results: dict, path, max_cols: int = 4, *, acc: Optional[dict] = None,
                  rows: str = "depth", row_order: Optional[Sequence[str]] = None) -> None:
    """One heatmap per configuration: accuracy by length (columns) and depth (rows; ``acc`` {config: {length:
    {row: value}}} with ``rows`` another name, e.g. RULER's tasks in ``row_order``). Every panel has the same
    columns (the lengths any configuration ran; blank where this one did not), so that the configurations read
    against each other down a column; at most ``max_cols`` panels a row, titles wrapped at the options."""
    plt = pyplot()

    acc = acc or results.get("accuracy") or accuracy_table(results.get("trials", []))
    names = list(acc)
    if not names:
        return
    lengths = sorted({L for name in names for L in acc[name]}, key=int)
    present = {d for name in names for L in acc[name] for d in acc[name][L]}
    depths = ([d for d in row_order if d in present] + sorted(present - set(row_order)) if row_order is not None
              else sorted(present, key=float))
    cols = min(len(names), max_cols)
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(1.0 + 0.75 * len(lengths) * cols, 3.4 * rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        grid = np.array([[acc[name].get(L, {}).get(d, np.nan) for L in lengths] for d in depths])
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [f"{int(L) // 1024}k" if int(L) >= 1024 else L for L in lengths])
        ax.set_yticks(range(len(depths)), depths)
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(rows)
        # "lambda+memory:m=64:c=1024:layer" -> "lambda+memory" over "m=64 c=1024 layer"
        head, _, opts = name.partition(":")
        ax.set_title(head + ("\n" + opts.replace(":", " ") if opts else ""), fontsize=9)
    fig.suptitle(f"{results.get('task', '')}: {results.get('model', '')}".strip(": "), fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="accuracy" if rows == "depth" else "score / 100")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_trf(rpes: Sequence[RPE], path, eps_range=(1e-4, 0.3), n_points: int = 40) -> None:
    """The paper's Figure 6 (TRF against eps, each curve divided by its largest value) and Figure 7 (exp(RPE)
    heatmaps, b_{i-j} for key j <= query i) in one PNG."""
    plt = pyplot()

    eps = np.geomspace(eps_range[0], eps_range[1], n_points)
    n = len(rpes)
    cols = min(n, 6)
    rows = 1 + (n + cols - 1) // cols
    fig = plt.figure(figsize=(3.2 * cols, 3.0 * rows))
    ax = fig.add_subplot(rows, 1, 1)
    colors = plt.get_cmap("tab20").colors
    for k, r in enumerate(rpes):
        v = r.verdict()
        color = colors[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20]
        if not v.converges:
            ax.plot([], [], ls=":", color=color, label=f"{r.name} (diverges)")
            continue
        vals = np.array([x["trf"] for x in trf(r, eps)], dtype=np.float64)
        ax.plot(eps, vals / vals.max(), color=color, ls="-" if k % 2 == 0 else "--", label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("eps")
    ax.set_ylabel("TRF(eps) / max")
    ax.set_title("theoretical receptive field (normalised)")
    ax.legend(fontsize=6, ncol=2)
    size = 64
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    for k, r in enumerate(rpes):
        a = fig.add_subplot(rows, cols, cols + k + 1)
        d = (i - j).astype(np.float64)
        w = np.where(d >= 0, r.weights(np.maximum(d, 0)), np.nan)
        with np.errstate(divide="ignore"):
            a.imshow(np.log10(np.maximum(w, 1e-12)), cmap="viridis", vmin=-6, vmax=max(0.0, float(np.nanmax(np.log10(np.maximum(w, 1e-12))))))
        a.set_title(r.name, fontsize=7)
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle("exp(RPE) heatmaps: log10 b_(i-j), query i (rows), key j (columns)", fontsize=8, y=0.02)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_erf(results: Dict[str, dict], path, eps: float = 0.1) -> None:
    """ERF(eps) by layer (bracket as an error bar) and the cumulative attention mass by distance, per run."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, r in results.items():
        bl = np.asarray(r["bin_lower"], dtype=np.float64)
        layers = r["by_layer"]
        k = [min(range(len(x)), key=lambda q: abs(x[q]["eps"] - eps)) for x in layers]
        lo = np.array([x[q]["lo"] for x, q in zip(layers, k)], dtype=np.float64)
        hi = np.array([x[q]["hi"] if x[q]["hi"] is not None else x[q]["lo"] for x, q in zip(layers, k)],
                      dtype=np.float64)
        mid = np.sqrt(lo * hi)
        axes[0].errorbar(np.arange(len(mid)), mid, yerr=[mid - lo, hi - mid], fmt="o-", ms=3, capsize=2, label=name)
        mass = np.asarray(r["mass_by_layer"], dtype=np.float64).mean(axis=0)
        cum = np.cumsum(mass / mass.sum())
        upper = np.append(bl[1:], bl[-1] * 1.25)
        last = int(np.nonzero(mass > 0)[0].max()) + 1 if np.any(mass > 0) else len(mass)
        axes[1].step(upper[:last], cum[:last], where="post", label=name)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel(f"ERF(eps={eps:g}) (tokens)")
    axes[0].legend(fontsize=7)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("distance (tokens)")
    axes[1].set_ylabel("attention mass within distance (all layers)")
    axes[1].set_xlim(1, None)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
