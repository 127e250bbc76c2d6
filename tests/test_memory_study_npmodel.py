"""The document-memory study's numpy model (studies/memory/npmodel.py) is self-consistent: reading a prefix and
then extending it gives the logits of reading everything at once, with full attention and with the Λ mask
(S=4, W=16, C=16 and C=8), on the first 6 layers of the default model."""

import sys
from pathlib import Path

import numpy as np
import pytest

STUDY = Path(__file__).resolve().parent.parent / "studies" / "memory"


@pytest.fixture(scope="module")
def npmodel():
    import llama_extrapolate

    sys.path.insert(0, str(STUDY))
    try:
        from npmodel import NPModel
    finally:
        sys.path.remove(str(STUDY))
    return NPModel(str(llama_extrapolate.default_model_path()), n_layer=6)


@pytest.mark.parametrize("S,W,C", [(0, 0, 0), (4, 16, 16), (4, 16, 8)])
def test_read_then_extend_equals_one_read(npmodel, S, W, C):
    toks = list(np.random.default_rng(0).integers(100, 40000, 60))
    h, _ = npmodel.read(toks, S, W, C, chunk=7)
    _, cache = npmodel.read(toks[:50], S, W, C, chunk=7)
    h3 = npmodel.extend(toks[50:], 50, cache, S, W, C)
    assert np.abs(npmodel.logits(h[50:]) - npmodel.logits(h3)).max() < 1e-3
