"""Check the numpy forward against llama.cpp (llama_cpp.Llama, vanilla attention) on a short prompt."""
import json, time, sys
import numpy as np
import llama_extrapolate  # before llama_cpp (patched library)
import llama_cpp
from npmodel import NPModel

path = llama_extrapolate.default_model_path()
text = ("The pass key is 48213. Remember it. The grass is green. The sky is blue. Paul Graham wrote essays "
        "about startups, programming languages and how to do great work. What is the pass key? The pass key is")
llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, logits_all=True, verbose=False, n_threads=2)
toks = llm.tokenize(text.encode(), add_bos=True)
llm.eval(toks)
ref = np.array(llm.scores[: len(toks)], dtype=np.float32)
t0 = time.time()
m = NPModel(str(path))
t1 = time.time()
h, _ = m.read(toks)
mine = m.logits(h)
t2 = time.time()
m.emulate = True
he, _ = m.read(toks)
mine_e = m.logits(he)
de = np.abs(mine_e - ref)
dd = np.abs(mine_e - mine)
per_pos = np.abs(mine - ref).max(1)
emu = {"numpy_vs_numpy_emulated_max_abs": float(dd.max()), "numpy_vs_numpy_emulated_mean_abs": float(dd.mean()),
       "per_position_max_abs_diff_vs_llama": [round(float(v), 3) for v in per_pos],"max_abs_diff": float(de.max()), "mean_abs_diff": float(de.mean()),
       "top1_agree": float((mine_e.argmax(1) == ref.argmax(1)).mean()), "max_abs_diff_last": float(de[-1].max())}
d = np.abs(mine - ref)
res = {"n_tokens": len(toks), "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
       "logit_std": float(ref.std()),
       "top1_agree": float((mine.argmax(1) == ref.argmax(1)).mean()),
       "last_top1_llama": int(ref[-1].argmax()), "last_top1_numpy": int(mine[-1].argmax()),
       "last_top1_text": llm.detokenize([int(ref[-1].argmax())]).decode(errors="replace"),
       "max_abs_diff_last": float(d[-1].max()),
       "with_q8_activation_and_f16_kv_emulation": emu, "load_s": round(t1 - t0, 1), "forward_s": round(t2 - t1, 1)}
print(json.dumps(res, indent=1))
json.dump(res, open("verify.json", "w"), indent=1)
