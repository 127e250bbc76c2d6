"""Receptive fields on SmolLM2: TRF of the standard encodings and ERF by layer, vanilla at 8k and Lambda at 32k.

The attention mass by distance comes from bench/calibration.py (statistics collected inside llama.cpp over the
Paul Graham essays: vanilla full attention over the first 8192 tokens; Lambda + ceiling, S = 10, W = C = 8192, over
32768 tokens). This script reads it, computes ERF(eps) per layer and overall, TRF(eps) of ALiBi, Kerple,
Sandwich, T5, Type 1/2, 1/n, 1/(n ln n) and the Lambda-mask, and writes bench/results/receptive_field.{json,png}
plus the TRF figure receptive_field_trf.png.

    python bench/receptive_field.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", default=str(RESULTS / "calibration.json"))
    ap.add_argument("--eps", default="0.5,0.2,0.1,0.05,0.01")
    ap.add_argument("--out", default=str(RESULTS / "receptive_field.json"))
    args = ap.parse_args(argv)

    from llama_extrapolate.harness import plots, trf

    eps = [float(x) for x in args.eps.split(",")]
    cal = json.loads(Path(args.calibration).read_text())
    runs = {"vanilla, 8192 tokens": cal.get("erf_mass_vanilla_8k"),
            "Lambda + ceiling (S=10, W=C=8192), 32768 tokens": cal.get("erf_mass_lambda_32k")}
    missing = [k for k, v in runs.items() if v is None]
    if missing:
        print(f"missing in {args.calibration}: {missing}; run bench/calibration.py first", file=sys.stderr)
        return 1
    erf = {}
    for name, r in runs.items():
        bl, by_layer = np.asarray(r["bin_lower"]), np.asarray(r["by_layer"], dtype=np.float64)
        e = trf.erf_by_layer(bl, by_layer, eps)
        frac = by_layer / by_layer.sum(axis=1, keepdims=True)
        erf[name] = {"bin_lower": r["bin_lower"], "mass_by_layer": r["by_layer"], **e,
                     "mass_beyond_8192_by_layer": frac[:, bl >= 8192].sum(axis=1).tolist(),
                     "note": "with Lambda, keys past W + n_batch are the sinks only (absolute positions)"}
    rpes = trf.standard_rpes(n_head=8, max_bias=8.0, sinks=4, window=8192)
    out = {"eps": eps, "erf": erf, "trf": trf.report(rpes, eps),
           "theorem_0_5": {"Type 2 vs Type 1": trf.compare(trf.type2(), trf.type1())}}
    path = Path(args.out)
    path.write_text(json.dumps(out, indent=1))
    plots.plot_erf(erf, path.with_suffix(".png"), eps=0.1)
    plots.plot_trf(rpes, path.with_name(path.stem + "_trf.png"))
    for name, e in erf.items():
        print(name)
        print("  overall:", ", ".join(f"ERF({x['eps']:g}) in [{x['lo']}, {x['hi']}]" for x in e["overall"]))
        at = [x for x in e["by_layer"]]
        k = eps.index(0.1) if 0.1 in eps else 0
        print("  by layer ERF(0.1) hi:", [x[k]["hi"] for x in at])
    return 0


if __name__ == "__main__":
    sys.exit(main())
