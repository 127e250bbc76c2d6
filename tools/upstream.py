"""Build llama.cpp's own tools and tests from the tree `pip install .` patched, or from the same sdist unpatched.

`pip install .` keeps its build directory (build/<wheel tag>/), which holds the llama-cpp-python sdist it
downloaded and the llama.cpp tree with patches/ applied (_deps/llama.cpp). This script configures a separate
CMake build of that tree with llama.cpp's tools and tests switched on and builds only the targets asked for, so
the pip build stays as it is. With --unpatched it extracts vendor/llama.cpp from the same sdist instead: the
reference for "the same pass list as the unpatched tree".

    python tools/upstream.py build llama-perplexity            # prints the path of each binary
    python tools/upstream.py build --unpatched test-backend-ops
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent

# llama.cpp options: tools and tests on; nothing that needs a network or extra libraries
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_CURL=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=ON"]


def pip_build_dir() -> Path:
    """The build directory of the last `pip install .` from this clone (the one whose tree is newest)."""
    found = sorted((p for p in (ROOT / "build").glob("*/_deps/llama.cpp.stamp")), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no patched llama.cpp under {ROOT / 'build'}: run `pip install .` from {ROOT} first")
    return found[-1].parent.parent


def patched_tree() -> Path:
    return pip_build_dir() / "_deps" / "llama.cpp"


def unpatched_tree() -> Path:
    """vendor/llama.cpp of the sdist pip downloaded, extracted once beside the patched tree."""
    deps = pip_build_dir() / "_deps"
    dest = deps / "llama.cpp-unpatched"
    if (dest / "CMakeLists.txt").is_file():
        return dest
    sdists = sorted(deps.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise FileNotFoundError(f"no llama_cpp_python sdist in {deps}: run `pip install .` again")
    tmp = deps / "llama.cpp-unpatched.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdists[-1]) as tar:
        prefix = None
        members = []
        for m in tar.getmembers():
            parts = m.name.split("/")
            if len(parts) > 3 and parts[1:3] == ["vendor", "llama.cpp"]:
                prefix = "/".join(parts[:3])
                members.append(m)
        if not members:
            raise ValueError(f"{sdists[-1]} holds no vendor/llama.cpp")
        for m in members:
            m.name = m.name[len(prefix) + 1:]
        kwargs = {"filter": "data"} if sys.version_info >= (3, 12) else {}
        tar.extractall(tmp, members=members, **kwargs)
    tmp.rename(dest)
    return dest


def build(targets: Sequence[str], unpatched: bool = False, jobs: int = 0, quiet: bool = False) -> Dict[str, Path]:
    """Configure (once) and build the targets; returns target -> binary path."""
    src = unpatched_tree() if unpatched else patched_tree()
    bdir = ROOT / "build" / ("upstream-unpatched" if unpatched else "upstream-patched")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise FileNotFoundError("cmake is not on PATH: `pip install cmake ninja`")
    out = None if not quiet else subprocess.DEVNULL
    if not (bdir / "CMakeCache.txt").is_file():
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run([cmake, "-S", str(src), "-B", str(bdir), *gen, *CMAKE_OPTIONS], check=True, stdout=out)
    cmd = [cmake, "--build", str(bdir), "--target", *targets]
    cmd += ["-j", str(jobs or os.cpu_count() or 2)]
    subprocess.run(cmd, check=True, stdout=out)
    paths = {}
    for t in targets:
        p = bdir / "bin" / t
        if not p.is_file():
            raise FileNotFoundError(f"built {t} but {p} is missing")
        paths[t] = p
    return paths


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("targets", nargs="+")
    b.add_argument("--unpatched", action="store_true")
    b.add_argument("--jobs", "-j", type=int, default=0)
    args = ap.parse_args(argv)
    for t, p in build(args.targets, args.unpatched, args.jobs).items():
        print(f"{t}\t{p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
