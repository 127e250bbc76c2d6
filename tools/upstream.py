"""Build llama.cpp's own tools and tests from the tree `pip install .` patched, or from the same sdist unpatched.

`pip install .` keeps its build directory (build/<wheel tag>/), which holds the llama-cpp-python sdist it
downloaded and the llama.cpp tree with patches/ applied (_deps/llama.cpp). This script configures a separate
CMake build of that tree with llama.cpp's tools and tests switched on and builds only the targets asked for, so
the pip build stays as it is. With --unpatched it extracts vendor/llama.cpp from the same sdist instead: the
reference for "the same pass list as the unpatched tree".

    python tools/upstream.py build llama-perplexity            # prints the path of each binary
    python tools/upstream.py build llama-server                # `llama-extrapolate serve --llama_server` runs it
    python tools/upstream.py build --unpatched test-backend-ops
    python tools/upstream.py tests -o checks/upstream_tests.json   # both trees, pass lists compared
"""

from __future__ import annotations

import argparse
import json
import re
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent

# llama.cpp options: tools (llama-server among them, without its web UI) and tests on; nothing that needs a network
# or extra libraries
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=ON"]
# as in the package's CMakeLists.txt: ggml's AMX kernels segfault on some Sapphire Rapids machines (llama.cpp issue
# 20824), so they are left out; GCC and Clang let an explicit -mno-<isa> win over -march=native whatever the order
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _no_amx_options() -> List[str]:
    """The flags that keep AMX out, where the C compiler is GCC or Clang on x86 and knows them; else none."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return []
    probe = subprocess.run([cc, *NO_AMX_FLAGS.split(), "-E", "-x", "c", os.devnull], capture_output=True)
    if probe.returncode != 0:
        return []
    return [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]


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


def configure(unpatched: bool = False, quiet: bool = False) -> Path:
    """Configure the tree's tools-and-tests build once; returns the build directory."""
    src = unpatched_tree() if unpatched else patched_tree()
    bdir = ROOT / "build" / ("upstream-unpatched" if unpatched else "upstream-patched")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise FileNotFoundError("cmake is not on PATH: `pip install cmake ninja`")
    # configured again each time (a few seconds): a build directory made with other options takes these
    gen = [] if (bdir / "CMakeCache.txt").is_file() or not shutil.which("ninja") else ["-G", "Ninja"]
    subprocess.run([cmake, "-S", str(src), "-B", str(bdir), *gen, *CMAKE_OPTIONS, *_no_amx_options()], check=True,
                   stdout=subprocess.DEVNULL if quiet else None)
    return bdir


def build(targets: Sequence[str], unpatched: bool = False, jobs: int = 0, quiet: bool = False) -> Dict[str, Path]:
    """Configure (once) and build the executables; returns target -> binary path."""
    bdir = configure(unpatched, quiet)
    cmd = [shutil.which("cmake"), "--build", str(bdir), "--target", *targets, "-j", str(jobs or os.cpu_count() or 2)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
    paths = {}
    for t in targets:
        p = bdir / "bin" / t
        if not p.is_file():
            raise FileNotFoundError(f"built {t} but {p} is missing")
        paths[t] = p
    return paths


# ctest tests that need a network or a downloaded model: not run offline
OFFLINE_EXCLUDE = r"download|thread-safety|state-restore-fragmented|tokenizers-ggml-vocabs"


def _test_targets(bdir: Path) -> List[str]:
    """Every test executable the configured tree defines (the phony test-* targets of the Ninja file)."""
    ninja = bdir / "build.ninja"
    if not ninja.is_file():
        raise FileNotFoundError(f"{ninja} is missing: tools/upstream.py configures with Ninja (`pip install ninja`)")
    return sorted(set(re.findall(r"^build (test-[A-Za-z0-9_-]+): phony", ninja.read_text(), re.M)))


def run_tests(unpatched: bool, label: str = "main", jobs: int = 0, timeout: int = 600) -> Dict[str, dict]:
    """Build the offline ctest tests with the label plus test-backend-ops, run them, return name -> result."""
    bdir = configure(unpatched, quiet=True)
    targets = _test_targets(bdir)
    # keep going past targets that do not build in this configuration: they show up as "not built" below, in both
    # trees alike
    subprocess.run([shutil.which("cmake"), "--build", str(bdir), "--target", *targets, "-j",
                    str(jobs or os.cpu_count() or 2), "--", "-k", "0"], stdout=subprocess.DEVNULL)
    not_built = [t for t in targets if not (bdir / "bin" / t).is_file()]
    results: Dict[str, dict] = {}
    run = subprocess.run(["ctest", "--test-dir", str(bdir), "-L", label, "-E", OFFLINE_EXCLUDE,
                          "--timeout", str(timeout), "--output-on-failure"], capture_output=True, text=True)
    # "Passed", "***Failed", "***Timeout", "Subprocess aborted***Exception:" (an assert): every test gets a status
    for m in re.finditer(r"Test\s+#\d+: (\S+) \.+\s*(.*?)\s+([0-9.]+) sec", run.stdout):
        status = re.sub(r"\*+|Exception:?", " ", m.group(2)).strip()
        results[m.group(1)] = {"status": "passed" if status == "Passed" else status.lower(),
                               "seconds": float(m.group(3))}
    for t in not_built:
        results[f"build {t}"] = {"status": "not built"}
    # test-backend-ops: every op of the CPU backend in "grad" mode (gradients against finite differences)
    # and "test" mode (which compares other backends with the CPU: with the CPU alone it compares nothing)
    exe = bdir / "bin" / "test-backend-ops"
    for mode in ("grad", "test"):
        r = subprocess.run([str(exe), mode, "-b", "CPU"], capture_output=True, text=True, timeout=3600)
        tail = (r.stdout + r.stderr).strip().splitlines()[-6:]
        passed = re.search(r"(\d+)/(\d+) tests passed", r.stdout + r.stderr)
        results[f"test-backend-ops {mode} -b CPU"] = {
            "status": "passed" if r.returncode == 0 else "failed", "exit": r.returncode,
            "tests_passed": passed.group(0) if passed else None, "tail": tail}
    return results


def compare_trees(jobs: int = 0, patched: dict = None, unpatched: dict = None) -> dict:
    """Run both trees (or take results already run, e.g. in two processes with `tests --tree`)."""
    patched = run_tests(False, jobs=jobs) if patched is None else patched
    unpatched = run_tests(True, jobs=jobs) if unpatched is None else unpatched
    names = sorted(set(patched) | set(unpatched))
    differ = [n for n in names if patched.get(n, {}).get("status") != unpatched.get(n, {}).get("status")]
    return {"patched": patched, "unpatched": unpatched, "same_pass_list": not differ, "differences": differ,
            "passed_patched": sum(v["status"] == "passed" for v in patched.values()),
            "passed_unpatched": sum(v["status"] == "passed" for v in unpatched.values()), "tests": len(names)}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("targets", nargs="+")
    b.add_argument("--unpatched", action="store_true")
    b.add_argument("--jobs", "-j", type=int, default=0)
    t = sub.add_parser("tests", help="llama.cpp's offline tests on the patched and unpatched trees")
    t.add_argument("--jobs", "-j", type=int, default=0)
    t.add_argument("--output", "-o", default=str(ROOT / "checks" / "upstream_tests.json"))
    t.add_argument("--tree", choices=["both", "patched", "unpatched"], default="both",
                   help="one tree only: writes its results to --output (combine them with `compare`)")
    c = sub.add_parser("compare", help="compare two one-tree result files")
    c.add_argument("patched")
    c.add_argument("unpatched")
    c.add_argument("--output", "-o", default=str(ROOT / "checks" / "upstream_tests.json"))
    args = ap.parse_args(argv)
    if args.cmd == "build":
        for name, p in build(args.targets, args.unpatched, args.jobs).items():
            print(f"{name}\t{p}")
        return 0
    if args.cmd == "tests" and args.tree != "both":
        one = run_tests(args.tree == "unpatched", jobs=args.jobs)
        Path(args.output).write_text(json.dumps(one, indent=1))
        print(f"{args.tree}: {sum(v['status'] == 'passed' for v in one.values())}/{len(one)} passed")
        return 0
    if args.cmd == "compare":
        res = compare_trees(patched=json.loads(Path(args.patched).read_text()),
                            unpatched=json.loads(Path(args.unpatched).read_text()))
    else:
        res = compare_trees(args.jobs)
    Path(args.output).write_text(json.dumps(res, indent=1))
    print(f"{res['tests']} tests; passed: patched {res['passed_patched']}, unpatched {res['passed_unpatched']}; "
          f"same pass list: {res['same_pass_list']} {res['differences'] or ''}")
    return 0 if res["same_pass_list"] else 1


if __name__ == "__main__":
    sys.exit(main())
