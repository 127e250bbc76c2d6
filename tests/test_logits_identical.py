"""With the patches applied and nothing enabled, logits equal the unpatched library's bit for bit."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import clean_env

WORKER = Path(__file__).with_name("logits_worker.py")


def stock_library() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent / "lib" / "libllama.so"


def run_worker(mode, model, out):
    proc = subprocess.run([sys.executable, str(WORKER), mode, str(model), str(out)],
                          capture_output=True, text=True, env=clean_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_patched_logits_equal_stock_logits(default_model, tmp_path):
    import llama_extrapolate

    if not stock_library().exists():
        pytest.skip(f"llama-cpp-python's own library is absent ({stock_library()}): "
                    "it was installed without a bundled libllama, so there is nothing to compare with")
    patched = run_worker("patched", default_model, tmp_path / "patched.npy")
    stock = run_worker("stock", default_model, tmp_path / "stock.npy")

    # each ran on the library it was meant to
    assert Path(patched["library"]).resolve().parent == llama_extrapolate.LIB_DIR
    assert Path(stock["library"]).resolve() == stock_library().resolve()

    a = np.load(tmp_path / "patched.npy")
    b = np.load(tmp_path / "stock.npy")
    assert a.shape == b.shape == (256, 49152)
    assert np.isfinite(a).all()
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (
        f"max |diff| = {np.abs(a - b).max()} over {np.count_nonzero(a != b)} logits")
