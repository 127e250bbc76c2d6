#!/usr/bin/env bash
# On a machine with a GPU: the backend tests and the benchmarks, in one command and one JSON, for a package built
# with a GPU backend (e.g. CMAKE_ARGS="-DGGML_CUDA=on" pip install ".[test]"). Sized for under ten minutes on
# one GPU (the default model, 16k-token streams; not measured: no GPU here):
#   - the backend tests (tests/test_backends.py: tiny models with every layer on the first GPU device, each knob
#     against the CPU backend and the numpy oracle), each item's outcome in section "backend_tests";
#   - the default model's stream with every layer offloaded (bench/performance.py stream: "stream_gpu");
#   - flash attention against the plain path with the Λ mask and the ceiling ("flash_gpu");
#   - the statistics' overhead with either reduction ("stats_overhead_gpu");
#   - the document memory's cost, its KV cache in host memory and the layers on the GPU (bench/memory.py cost:
#     "memory_cost_gpu").
# Never run on a GPU (none here): the backend tests have run on lavapipe through tools/vulkan.sh, and this script's
# steps on the CPU build with small sizes (GPU_LAYERS=0; TOKENS of 4096 at least: the memory's 64 blocks of 64).
# Exit status 1 when a backend test failed or none ran; every step runs whatever the tests' outcome.
#
#   tools/gpu.sh                        # from the repository's root, in the environment where the GPU build is installed
#   TOKENS=65536 tools/gpu.sh           # longer streams (default 16384)
#   OUT=/tmp/gpu.json tools/gpu.sh      # results elsewhere (default bench/results/gpu.json)
set -euo pipefail
cd "$(dirname "$0")/.."

tokens="${TOKENS:-16384}"
layers="${GPU_LAYERS:--1}"
out="${OUT:-bench/results/gpu.json}"
mkdir -p build/gpu "$(dirname "$out")"

set +e
python -m pytest -ra tests/test_backends.py --junitxml=build/gpu/backend-tests.xml
set -e
device=$(python -c "import llama_extrapolate as l; print(', '.join(d['name'] + ': ' + d['description'] for d in l._core.backend_devices() if d['backend'] not in ('CPU', 'RPC')))" 2>/dev/null || true)
rc=0
python tools/backend_result.py build/gpu/backend-tests.xml "$out" --section backend_tests --device "${device:-none}" || rc=1

python bench/performance.py stream --config lambda --tokens "$tokens" --n-gpu-layers "$layers" --key stream_gpu --out "$out"
block=$(( tokens < 4096 ? tokens : 4096 ))
python bench/performance.py flash --tokens "$tokens" --block "$block" --decode 32 --paired-decode 3 --n-gpu-layers "$layers" \
    --key flash_gpu --out "$out"
python bench/performance.py stats --tokens 2048 --n-gpu-layers "$layers" --key stats_overhead_gpu --out "$out"
python bench/memory.py cost --tokens "$tokens" --window 1024 --n-gpu-layers "$layers" --key memory_cost_gpu --out "$out"
echo "results: $out"
exit "$rc"
