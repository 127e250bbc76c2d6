#!/usr/bin/env bash
# On a machine with a GPU: the backend tests and the reading speed, in one command, for a package built
# with a GPU backend (e.g. CMAKE_ARGS="-DGGML_CUDA=on" pip install ".[test]"). The backend tests read tiny models
# with every layer on the first GPU device and compare each knob with the CPU backend and the numpy oracle
# (tests/test_backends.py: they skip, saying why, where no GPU backend was built); then the default model reads a
# stream with every layer offloaded (bench/performance.py stream, section "stream_gpu" of --out) and the statistics'
# overhead is measured with either reduction (section "stats_overhead_gpu"). Never run on a GPU (none here): the
# backend tests have run on lavapipe through tools/vulkan.sh, and this script's benchmark steps only on the CPU
# build with small sizes.
#
#   tools/gpu.sh                      # from the repository's root, in the environment where the GPU build is installed
#   TOKENS=65536 tools/gpu.sh         # a longer stream (default 16384)
#   OUT=/tmp/gpu.json tools/gpu.sh    # results elsewhere (default bench/results/performance_gpu.json)
set -euo pipefail
cd "$(dirname "$0")/.."

tokens="${TOKENS:-16384}"
out="${OUT:-bench/results/performance_gpu.json}"

python -m pytest -v tests/test_backends.py
python bench/performance.py stream --config lambda --tokens "$tokens" --n-gpu-layers -1 --key stream_gpu --out "$out"
python bench/performance.py stats --tokens 2048 --n-gpu-layers -1 --key stats_overhead_gpu --out "$out"
echo "results: $out"
