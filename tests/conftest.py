import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def clean_env(**extra):
    """Environment for a child Python without LLAMA_CPP_LIB_PATH (so llama_cpp uses its own library)."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    env.update(extra)
    return env


def run_python(code: str, *args: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=clean_env() if env is None else env,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def default_model():
    import llama_extrapolate

    return llama_extrapolate.default_model_path()


@pytest.fixture(scope="session")
def small_llm(default_model):
    import llama_extrapolate  # noqa: F401  (must precede llama_cpp)
    from llama_cpp import Llama

    llm = Llama(model_path=str(default_model), n_ctx=512, n_batch=128, n_threads=2, verbose=False)
    yield llm
    llm.close()
