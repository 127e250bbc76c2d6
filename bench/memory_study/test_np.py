"""Self-consistency of npmodel: read(prefix) + extend(rest) == read(all), vanilla and Λ (S=4, W=16, C=16)."""
import numpy as np, llama_extrapolate
from npmodel import NPModel
m = NPModel(str(llama_extrapolate.default_model_path()), n_layer=6)
toks = list(np.random.default_rng(0).integers(100, 40000, 60))
for S, W, C in [(0, 0, 0), (4, 16, 16), (4, 16, 8)]:
    h, _ = m.read(toks, S, W, C, chunk=7)
    h2, cache = m.read(toks[:50], S, W, C, chunk=7)
    h3 = m.extend(toks[50:], 50, cache, S, W, C)
    print(S, W, C, np.abs(m.logits(h[50:]) - m.logits(h3)).max())
