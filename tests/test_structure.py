"""The package's layering: only ``native`` (with ``_library`` loading the library and ``logs`` installing its
log callback) calls across the C boundary, so raw pointers, batches and the decode loop live in one place."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "llama_extrapolate"
ALLOWED = {"native.py", "_library.py", "logs.py"}
# a pybind11 call, or a llama-cpp-python ctypes binding (llama_cpp.llama_cache is a Python module, not one)
C_CALL = re.compile(r"\b_core\.\w+|\bllama_cpp\.llama_(?!cache\b)\w+")


def c_calls(files: Iterable[Path]) -> List[str]:
    """``file:line: text`` of every C call outside the allowed modules."""
    hits = []
    for path in sorted(files):
        if path.name in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if C_CALL.search(line):
                hits.append(f"{path.name}:{number}: {line.strip()}")
    return hits


def test_only_native_calls_the_library():
    hits = c_calls(PACKAGE.glob("*.py"))
    assert not hits, "C calls outside native.py (move them there):\n" + "\n".join(hits)


def test_the_check_sees_both_kinds_of_call(tmp_path):
    (tmp_path / "a.py").write_text("x = llama_cpp.llama_n_ctx(ctx)\ny = llama_cpp.llama_cache.BaseLlamaCache\n")
    (tmp_path / "b.py").write_text("from . import _core\n_core.stats_reset(ctx)\n")
    (tmp_path / "native.py").write_text("llama_cpp.llama_decode(ctx, batch)\n")
    assert c_calls(tmp_path.glob("*.py")) == ["a.py:1: x = llama_cpp.llama_n_ctx(ctx)",
                                              "b.py:2: _core.stats_reset(ctx)"]
