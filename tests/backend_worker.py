"""Child process for test_backends: one reading on one ggml backend.

ggml picks its Vulkan devices when the library loads (GGML_VK_VISIBLE_DEVICES is read then, and Mesa's lavapipe, a
CPU device, is only used when named there), so each backend's run is a process of its own. Usage:

    python backend_worker.py SPEC.json OUT_PREFIX

SPEC: {"model", "attention" (AttentionConfig fields), "n_gpu_layers", "tokens", "question" (top-k/memory from
there on, or null), "llama" (other Llama keywords), "stats" (read the attention statistics), "stats_reduce" (where
they are reduced, default "auto")}. Writes
OUT_PREFIX.npy (the logits) and OUT_PREFIX.json (the devices of the layers, the memory's selection and the keys
its landmarks average, the statistics).
"""

import contextlib
import json
import sys

import numpy as np


def main(spec_path: str, out: str) -> None:
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness import stats

    spec = json.loads(open(spec_path).read())
    llm = llama_extrapolate.Llama(spec["model"], attention=AttentionConfig(**spec["attention"]),
                                  n_gpu_layers=spec["n_gpu_layers"], logits_all=True, verbose=False,
                                  **spec.get("llama", {}))
    tokens, question = spec["tokens"], spec.get("question")
    facts = {"devices": llm.devices()}
    try:
        with stats.collecting(llm, reduce=spec.get("stats_reduce")) if spec.get("stats") else contextlib.nullcontext():
            if question is None:
                llm.eval(tokens)
            else:
                llm.eval(tokens[:question])
                llm.set_top_k_active(True)
                llm.eval(tokens[question:])
        np.save(out + ".npy", np.asarray(llm.scores[:len(tokens)], dtype=np.float32))
        if llm.attention_resolved.memory:
            n_layer = len(facts["devices"]["layers"])
            facts["selection"] = {il: np.asarray(llm.memory_selection(il)).tolist()
                                  for il in range(llm.attention_resolved.top_k_layer, n_layer)}
            facts["n_landmark"] = llm.memory_info()["n_landmark"]
        if spec.get("stats"):
            read = stats.AttentionStats.read(llm)
            facts["stats"] = {k: np.asarray(getattr(read, k)).tolist() for k in stats.FIELDS + ("mass",)}
            facts["stats_on_graph"] = stats.reduced_on_graph(llm).tolist()
    finally:
        llm.close()
    with open(out + ".json", "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
