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
        if path.name in ALLOWED and path.parent.name != "harness":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if C_CALL.search(line):
                hits.append(f"{path.name}:{number}: {line.strip()}")
    return hits


def test_only_native_calls_the_library():
    hits = c_calls(PACKAGE.rglob("*.py"))  # the harness subpackage included
    assert not hits, "C calls outside native.py (move them there):\n" + "\n".join(hits)


def test_the_check_sees_both_kinds_of_call(tmp_path):
    (tmp_path / "a.py").write_text("x = llama_cpp.llama_n_ctx(ctx)\ny = llama_cpp.llama_cache.BaseLlamaCache\n")
    (tmp_path / "b.py").write_text("from . import _core\n_core.stats_reset(ctx)\n")
    (tmp_path / "native.py").write_text("llama_cpp.llama_decode(ctx, batch)\n")
    assert c_calls(tmp_path.glob("*.py")) == ["a.py:1: x = llama_cpp.llama_n_ctx(ctx)",
                                              "b.py:2: _core.stats_reset(ctx)"]


def test_no_module_imports_the_cli():
    """The CLI is the top layer: it imports the options, the server and the harness, and none of them imports it
    (the server once did, through a fake argparse Namespace, making the package's one import circle)."""
    pattern = re.compile(r"^\s*(from\s+(\.|llama_extrapolate)\s+import\s+.*\bcli\b|from\s+(\.|llama_extrapolate\.)cli\b"
                         r"|import\s+llama_extrapolate\.cli\b)", re.M)
    hits = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
            if p.name not in ("cli.py", "__main__.py") and pattern.search(p.read_text())]
    assert not hits, f"modules importing the CLI: {hits}"


def test_run_and_serve_do_not_import_the_harness():
    """``run``, ``serve`` and ``Llama`` work from ``pip install llama-extrapolate`` alone: none of their modules
    imports the evaluation harness (or matplotlib) at import time."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['matplotlib'] = None; import llama_extrapolate, llama_extrapolate.cli, "
            "llama_extrapolate.reader, llama_extrapolate.options; "
            "print(sorted(m for m in sys.modules if m.startswith('llama_extrapolate.harness')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
