"""Bytes per token of the block store, RAM of the summaries and of the resident cache (arithmetic, no model run)."""
import json

TYPES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes per element (ggml block layouts)
MODELS = {
    "SmolLM2-135M": {"n_layer": 30, "n_kv": 3, "hd": 64, "n_head": 9, "W": 8192, "h0": 5},
    "Llama-2-7B": {"n_layer": 32, "n_kv": 32, "hd": 128, "n_head": 32, "W": 4096, "h0": 5},
}
S, ROLLBACK, UBATCH = 10, 256, 512
out = {"assumptions": {
    "store": "unrotated K + V of every layer and KV head, all layers (h0 = 0 possible later)",
    "summary_dtype": "f16 (2 bytes per value); q8_0 would be 1.0625",
    "cache_cells": "S + W + rollback + m*B + n_ubatch; per cell K (rotated) + K_unrot (patch 0014) + V",
    "S": S, "rollback": ROLLBACK, "n_ubatch": UBATCH}, "models": {}}
for name, M in MODELS.items():
    L, G, hd = M["n_layer"], M["n_kv"], M["hd"]
    elems = L * 2 * G * hd
    r = {"elements_per_token_KV_all_layers": elems}
    r["store_bytes_per_token"] = {t: elems * b for t, b in TYPES.items()}
    r["store_GB_at_128k"] = {t: round(elems * b * 131072 / 1e9, 2) for t, b in TYPES.items()}
    r["store_GB_at_100k"] = {t: round(elems * b * 100000 / 1e9, 2) for t, b in TYPES.items()}
    Ls = L - M["h0"]  # summaries only for layers >= h0
    summ = {}
    for B in (32, 64, 128):
        for kind, vecs in (("quest(center+radius)", 2), ("mean/infllm(1 vector)", 1), ("rep k=2", 2),
                           ("rep k=4", 4)):
            summ.setdefault(f"B{B}", {})[kind] = round(Ls * G * vecs * hd * 2 / B, 1)
    r["summary_bytes_per_token_f16_layers_ge_h0"] = summ
    r["summary_MB_at_128k_quest"] = {f"B{B}": round(Ls * G * 2 * hd * 2 / B * 131072 / 1e6, 1) for B in (32, 64, 128)}
    cell = {"f16": L * G * hd * 2 * 3, "K,K_unrot q8_0 + V f16": L * G * hd * (2 * 34 / 32 + 2)}
    r["cache_bytes_per_cell"] = cell
    cells = {}
    for m, B in ((8, 64), (16, 64), (16, 128)):
        n = S + M["W"] + ROLLBACK + m * B + UBATCH
        cells[f"W{M['W']}_m{m}_B{B}"] = {"cells": n, **{k: round(v * n / 1e6, 1) for k, v in cell.items()},
                                          "unit": "MB"}
    r["resident_cache"] = cells
    # KQ scores of one ubatch in the graph (F32), the largest compute buffer of the non-flash path
    n = S + M["W"] + ROLLBACK + 8 * 64 + UBATCH
    r["kq_f32_MB_per_ubatch_m8_B64"] = round(M["n_head"] * UBATCH * n * 4 / 1e6, 1)
    out["models"][name] = r
json.dump(out, open("storage.json", "w"), indent=1)
print(json.dumps(out, indent=1))
