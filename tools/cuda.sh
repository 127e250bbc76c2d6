#!/usr/bin/env bash
# The CUDA compile check: compiles the patched llama.cpp with ggml's CUDA backend, through the project's
# own CMakeLists.txt (so patches/ are applied), with the CUDA compiler, headers and libraries that NVIDIA ships on
# PyPI, for one GPU architecture. No GPU, no driver and no system CUDA are needed: a CUDA installed on the machine
# (/usr/local/cuda, an nvcc on PATH) is ignored. It proves that the patched tree builds with -DGGML_CUDA=on, nothing
# more: no kernel runs here. Too slow for CI (hours on two cores); run by hand and commit the result,
# checks/cuda_compile.json (with the end of the build's output in checks/cuda_compile.log).
#
# Its own venv (.venv-cuda) and build directory (build/cuda); the CPU build's are left as they are.
#   - CUDA 13 (pip's nvidia-*-cu12 wheels carry no nvcc, only ptxas), every toolkit wheel at one release, 13.2.86,
#     the last one at which nvcc, crt, nvvm, runtime, nvrtc and cccl share a version number; cuBLAS 13.4.1.3, the
#     cuBLAS patch release for the 13.2 line (cuBLAS numbers its releases on its own).
#   - The wheels carry no unversioned libcudart.so / libcublas.so for the linker and no libcuda.so stub: the first
#     are symlinks made in build/cuda-libs, and GGML_CUDA_NO_VMM=ON keeps the driver library out of the link
#     (ggml then allocates device memory through its legacy pool instead of virtual memory management).
#   - The package is built with --no-deps and CMAKE_ARGS for it alone; its dependencies are installed afterwards
#     without CMAKE_ARGS, so that llama-cpp-python (which pip may compile from its sdist) is not built for CUDA too.
#   - Last, the build is imported without a GPU: once as installed, once with the wheels' lib directory on
#     LD_LIBRARY_PATH. What happens is recorded, whatever it is.
#
#   tools/cuda.sh                                         # from the repository's root
#   CUDA_ARCH=89-real tools/cuda.sh                       # another architecture (default 86-real, RTX 30xx)
#   nice -n 19 env CMAKE_BUILD_PARALLEL_LEVEL=1 tools/cuda.sh > /tmp/cuda-build.log 2>&1   # on a shared machine
set -euo pipefail
cd "$(dirname "$0")/.."

arch="${CUDA_ARCH:-86-real}"
cuda_version="13.2.86"
cublas_version="13.4.1.3"
result="checks/cuda_compile.json"
build_dir="build/cuda"
log="$build_dir/build.log"

python -m venv .venv-cuda && . .venv-cuda/bin/activate
pip install -q "nvidia-cuda-nvcc==$cuda_version" "nvidia-cuda-crt==$cuda_version" "nvidia-nvvm==$cuda_version" \
    "nvidia-cuda-runtime==$cuda_version" "nvidia-cuda-nvrtc==$cuda_version" "nvidia-cuda-cccl==$cuda_version" \
    "nvidia-cublas==$cublas_version"

# The CUDA 13 wheels share one prefix, site-packages/nvidia/cu13, laid out like a toolkit: bin/nvcc (whose
# nvcc.profile finds nvvm/, include/ and lib/ beside it), include/, lib/.
cuda_root="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13"
[ -x "$cuda_root/bin/nvcc" ] || { echo "tools/cuda.sh: no nvcc in $cuda_root/bin" >&2; exit 2; }
links="$PWD/build/cuda-libs"
mkdir -p "$links" "$build_dir"
for lib in cudart cublas cublasLt; do
    ln -sf "$cuda_root/lib/lib$lib.so.13" "$links/lib$lib.so"
done

# Only the pip toolkit: nvcc by CUDACXX and first on PATH, FindCUDAToolkit rooted there, the libraries named.
export CUDACXX="$cuda_root/bin/nvcc" CUDAToolkit_ROOT="$cuda_root" CUDA_PATH="$cuda_root"
export PATH="$cuda_root/bin:$PATH"
unset CUDA_HOME
nvcc_version=$(nvcc --version | sed -n 's/^Cuda compilation tools, //p')
echo "nvcc: $(command -v nvcc), $nvcc_version; architecture $arch"

cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF"
cmake_args="$cmake_args -DCMAKE_CUDA_COMPILER=$CUDACXX -DCUDAToolkit_ROOT=$cuda_root"
cmake_args="$cmake_args -DCUDA_CUDART=$links/libcudart.so -DCUDA_cublas_LIBRARY=$links/libcublas.so"
cmake_args="$cmake_args -DCUDA_cublasLt_LIBRARY=$links/libcublasLt.so"

# the series as the build applies it (patches/ may change while the hour-long build runs)
patches=$(cd patches && ls *.patch | sed 's/\.patch$//' | tr '\n' ' ')
start=$(date +%s)
if CMAKE_ARGS="$cmake_args" pip install -v --no-deps . --config-settings=build-dir="$build_dir" 2>&1 | tee "$log"; then
    build_rc=0
else
    build_rc=$?
fi
seconds=$(( $(date +%s) - start ))
pkg_lib="$(python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/llama_extrapolate/lib"
outcome=failure
if [ "$build_rc" -eq 0 ] && [ -f "$pkg_lib/libggml-cuda.so" ] && [ -f "$pkg_lib/libllama.so" ]; then
    outcome=success
fi
tail -n 50 "$log" > checks/cuda_compile.log

# The import without a GPU, needing the package's dependencies (llama_cpp): installed without CMAKE_ARGS.
load_as_installed="not tried (the build failed)"
load_with_path="not tried (the build failed)"
if [ "$outcome" = success ]; then
    python - > "$build_dir/requirements.txt" <<'EOF'
from importlib.metadata import requires
print("\n".join(r for r in requires("llama-extrapolate") if "extra ==" not in r))
EOF
    env -u CMAKE_ARGS pip install -q -r "$build_dir/requirements.txt"
    probe='import llama_extrapolate, llama_cpp; print("imported; llama_supports_gpu_offload() =", llama_cpp.llama_supports_gpu_offload())'
    load_as_installed=$(cd /tmp && python -c "$probe" 2>&1 | tail -n 3) || true
    load_with_path=$(cd /tmp && LD_LIBRARY_PATH="$cuda_root/lib" python -c "$probe" 2>&1 | tail -n 3) || true
    echo "import as installed: $load_as_installed"
    echo "import with LD_LIBRARY_PATH=$cuda_root/lib: $load_with_path"
fi

OUTCOME="$outcome" SECONDS_TAKEN="$seconds" BUILD_RC="$build_rc" ARCH="$arch" NVCC_VERSION="$nvcc_version" \
CMAKE_ARGS_USED="$cmake_args" CUDA_ROOT="$cuda_root" PKG_LIB="$pkg_lib" BUILD_DIR="$build_dir" LOG="$log" \
LOAD_AS_INSTALLED="$load_as_installed" LOAD_WITH_PATH="$load_with_path" RESULT="$result" PATCHES="$patches" \
python - <<'EOF'
import datetime, glob, json, os, platform, re, subprocess
from importlib.metadata import distributions
from pathlib import Path

env = os.environ
build = Path(env["BUILD_DIR"])
root = env["CUDA_ROOT"]

def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None

pin = re.search(r'"(llama-cpp-python==[^"]+)"', Path("pyproject.toml").read_text()).group(1)
cu_objects = sorted(str(p.relative_to(build)) for p in build.rglob("*.cu.o"))
planned = 0
if (build / "build.ninja").exists():
    planned = len(set(re.findall(r"^build (\S+\.cu\.o):", (build / "build.ninja").read_text(), re.M)))

# the C/C++ sources our patches change or add, and whether each was compiled into this build: an object of its
# own, or (src/models/*.cpp) an #include in one of CMake's unity sources whose object exists
patched = sorted({m for p in sorted(Path("patches").glob("*.patch"))
                  for m in re.findall(r"^\+\+\+ b/(\S+\.(?:c|cpp|cu))$", p.read_text(), re.M)})
unity = "".join(u.read_text() for u in build.rglob("Unity/unity_*.cxx") if Path(f"{u}.o").exists())
compiled, not_built = [], []
for f in patched:
    rel = re.sub(r"^(ggml/src|src)/", "", f)
    # (a source of a subdirectory with a target of its own, ggml-rpc's, compiles in that directory's CMakeFiles)
    own_object = (glob.glob(str(build / "**" / f"*.dir/{rel}.o"), recursive=True)
                  or glob.glob(str(build / "**" / os.path.dirname(f) / "CMakeFiles" / "*.dir" / f"{os.path.basename(f)}.o"),
                               recursive=True))
    in_unity = f'/_deps/llama.cpp/{f}"' in unity
    (compiled if own_object or in_unity else not_built).append(f)

libs = {}
lib_dir = Path(env["PKG_LIB"])
if lib_dir.is_dir():
    for p in sorted(lib_dir.iterdir()):
        libs[p.name] = p.stat().st_size
core = sorted(glob.glob(str(lib_dir.parent / "_core*.so")))
if core:
    libs[Path(core[0]).name] = Path(core[0]).stat().st_size

cache = build / "CMakeCache.txt"
cmake_command = "cmake"
if cache.exists():
    m = re.search(r"^CMAKE_COMMAND:INTERNAL=(.+)$", cache.read_text(), re.M)
    cmake_command = m.group(1) if m else cmake_command

errors = []
if env["OUTCOME"] != "success" and Path(env["LOG"]).exists():
    errors = [l.rstrip() for l in Path(env["LOG"]).read_text(errors="replace").splitlines()
              if re.search(r"\berror\b|FAILED:", l)][:40]

cuda_lib = Path(env["PKG_LIB"]) / "libggml-cuda.so"
needed = []
if cuda_lib.exists():
    needed = re.findall(r"NEEDED\)\s+Shared library: \[(\S+)\]", run("readelf", "-d", str(cuda_lib)) or "")

result = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "outcome": env["OUTCOME"],
    "pip_exit_code": int(env["BUILD_RC"]),
    "seconds": int(env["SECONDS_TAKEN"]),
    "build_parallel_level": env.get("CMAKE_BUILD_PARALLEL_LEVEL", "default"),
    "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
    "cuda_architecture": env["ARCH"],
    "nvcc": env["NVCC_VERSION"],
    "host_compiler": (run("c++", "--version") or "").split("\n")[0],
    "cmake": (run(cmake_command, "--version") or "").split("\n")[0],
    "cmake_args": env["CMAKE_ARGS_USED"].replace(root, "<site-packages>/nvidia/cu13").replace(os.getcwd() + "/", ""),
    "cuda_wheels": {d.metadata["Name"]: d.version for d in distributions() if d.metadata["Name"].startswith("nvidia-")},
    "llama_cpp_python_pin": pin,
    "patches": env["PATCHES"].split(),
    "cuda_objects_compiled": len(cu_objects),
    "cuda_objects_planned": planned,
    "patched_sources_compiled": compiled,
    "patched_sources_not_in_this_build": not_built,
    "libraries": libs,
    "libggml_cuda_needs": needed,
    "import_without_gpu": {"as_installed": env["LOAD_AS_INSTALLED"],
                           "with_LD_LIBRARY_PATH_to_the_cuda_wheels": env["LOAD_WITH_PATH"]},
    "errors": errors,
}
Path(env["RESULT"]).write_text(json.dumps(result, indent=2) + "\n")
EOF

echo "CUDA compile check ($arch, $nvcc_version): $outcome after $seconds s; result in $result"
[ "$outcome" = success ]
