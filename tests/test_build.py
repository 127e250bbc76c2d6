"""The build step that fetches and patches llama.cpp: a broken patch fails with its name.

These configure a tiny CMake project that uses cmake/LlamaCppSource.cmake on a
fake llama.cpp tree, so they take seconds, not a full build.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
Description: test patch that applies
---
--- a/include/llama.h
+++ b/include/llama.h
@@ -1,2 +1,3 @@
 // llama.h
+// patched
 int x;
"""

BROKEN = """\
Description: test patch that does not apply
---
--- a/include/llama.h
+++ b/include/llama.h
@@ -1,2 +1,3 @@
 // a line that is not there
+// patched
 int y;
"""


def cmake() -> str:
    exe = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    if not Path(exe).exists():
        pytest.skip("cmake is not installed")
    return exe


def configure(tmp_path: Path, patches: dict, source: Path) -> subprocess.CompletedProcess:
    project = tmp_path / "project"
    (project / "patches").mkdir(parents=True)
    for name, text in patches.items():
        (project / "patches" / name).write_text(text)
    (project / "CMakeLists.txt").write_text(f"""
cmake_minimum_required(VERSION 3.21)
project(t NONE)
include("{(REPO / 'cmake' / 'LlamaCppSource.cmake').as_posix()}")
file(GLOB P "${{CMAKE_CURRENT_SOURCE_DIR}}/patches/*.patch")
list(SORT P)
llama_extrapolate_patched_source(DIR NAMES PATCHES ${{P}})
file(READ "${{DIR}}/include/llama.h" H)
message(STATUS "PATCHED-HEADER:${{H}}")
message(STATUS "PATCH-NAMES:${{NAMES}}")
""")
    proc = subprocess.run([cmake(), "-S", str(project), "-B", str(project / "build"),
                           f"-DLLAMA_EXTRAPOLATE_SOURCE={source}"],
                          capture_output=True, text=True, timeout=120)
    proc.errors = " ".join(proc.stderr.split())  # CMake wraps and indents long messages
    return proc


@pytest.fixture
def fake_tree(tmp_path):
    tree = tmp_path / "llama.cpp"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("// llama.h\nint x;\n")
    return tree


def test_patches_apply_in_order_to_a_copy(tmp_path, fake_tree):
    proc = configure(tmp_path, {"0001-good.patch": GOOD}, fake_tree)
    assert proc.returncode == 0, proc.stderr
    assert "PATCHED-HEADER:// llama.h\n// patched\nint x;" in proc.stdout
    assert "PATCH-NAMES:0001-good.patch" in proc.stdout
    # the user's tree is never modified
    assert (fake_tree / "include" / "llama.h").read_text() == "// llama.h\nint x;\n"


def test_broken_patch_fails_naming_the_patch(tmp_path, fake_tree):
    proc = configure(tmp_path, {"0001-good.patch": GOOD, "0002-broken.patch": BROKEN}, fake_tree)
    assert proc.returncode != 0
    assert "patch 0002-broken.patch does not apply" in proc.errors


def test_tarball_with_wrong_hash_is_refused(tmp_path):
    fake = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    fake.write_bytes(b"not the sdist")
    proc = configure(tmp_path, {}, fake)
    assert proc.returncode != 0
    assert "sha256" in proc.errors and str(fake) in proc.errors


def test_missing_source_override_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    proc = configure(tmp_path, {}, missing)
    assert proc.returncode != 0
    assert f"LLAMA_EXTRAPOLATE_SOURCE={missing} does not exist" in proc.errors
