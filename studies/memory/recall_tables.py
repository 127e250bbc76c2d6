"""Markdown tables of the block-recall study from recall_4096.json (usage: python recall_tables.py [JSON])."""
import json, sys
r = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "recall_4096.json"))
R = r["recall"]
kinds = ["oracle", "quest", "mean", "infllm1", "infllm4", "repmass1", "repmass4", "repnorm1", "repnorm4", "random"]
for metric in ["key_recall", "mass_recall", "needle_all", "needle_matters"]:
    print(f"\n{metric} (chunk selection, max over the question's queries and the group's heads)\n")
    print("| summary | " + " | ".join(f"B{B} m{m}" for B in (32, 64, 128) for m in (4, 8, 16)) + " |")
    print("|---|" + "---|" * 9)
    for k in kinds:
        vals = []
        for B in (32, 64, 128):
            for m in (4, 8, 16):
                v = R[f"B{B}"][k]["chunk"][f"m{m}"].get(metric)
                vals.append("–" if v is None else f"{v:.2f}")
        print(f"| {k} | " + " | ".join(vals) + " |")
print("\nB64 m8 by mode (key / mass / needle_all / needle_matters)\n")
print("| summary | chunk (max) | chunk_mean | last token |\n|---|---|---|---|")
for k in ["quest", "mean", "infllm4", "repmass4", "repnorm4"]:
    cells = []
    for mode in ["chunk", "chunk_mean", "last"]:
        d = R["B64"][k][mode]["m8"]
        cells.append(" / ".join("–" if d.get(x) is None else f"{d[x]:.2f}" for x in ["key_recall", "mass_recall", "needle_all", "needle_matters"]))
    print(f"| {k} | " + " | ".join(cells) + " |")
d = R["B64"]["infllm4"]["infllm_layer"]["m8"]
print("| infllm4, InfLLM's per-layer rule | " + " / ".join("–" if d.get(x) is None else f"{d[x]:.2f}" for x in ["key_recall", "mass_recall", "needle_all", "needle_matters"]) + " | | |")
print("\nn_needle_matters (B64 quest chunk m8):", R["B64"]["quest"]["chunk"]["m8"]["n_needle_matters"])
print("matters by layer:", r["matters_count_by_layer"])
print("quest B64 m8 needle by layer:", r["needle_by_layer_chunk"]["B64"]["quest"]["m8"])
