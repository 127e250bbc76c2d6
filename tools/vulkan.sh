#!/usr/bin/env bash
# The Vulkan build and its tests (docs/gpu.md), as a user without a GPU runs them: Mesa's lavapipe is
# the Vulkan device. Installs the build's system packages where it can (Debian/Ubuntu, as root or with sudo),
# builds the package with ggml's Vulkan backend in its own venv and build directory (the CPU build's are left as
# they are), and runs the backend tests on the first Vulkan device.
#
#   tools/vulkan.sh            # from the repository's root
set -euo pipefail
cd "$(dirname "$0")/.."

packages="libvulkan-dev glslc spirv-headers mesa-vulkan-drivers"
missing=""
for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if ! command -v apt-get >/dev/null; then
        echo "tools/vulkan.sh: install$missing (the Vulkan loader and headers, glslc, SPIR-V headers, a Vulkan" \
             "driver) with your system's package manager" >&2
        exit 2
    fi
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q $missing
fi

# ggml's Vulkan backend at the pinned commit uses Vulkan-Hpp of 1.3.261 or later (VK_EXT_layer_settings); Debian 12
# ships 1.3.239. Where the system's headers are older, those of Debian 13's libvulkan-dev (1.4.309, headers only:
# the package is unpacked into build/, nothing is installed) are the ones the build compiles with; the program
# still loads the system's loader, which passes the newer structures through.
cmake_args="-DGGML_VULKAN=on"
have=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' /usr/include/vulkan/vulkan_core.h 2>/dev/null || true)
if [ "${have:-0}" -lt 261 ] && command -v apt-get >/dev/null; then
    headers="$PWD/build/vulkan-headers"
    if [ ! -f "$headers/usr/include/vulkan/vulkan.hpp" ]; then
        apt_dir=$(mktemp -d)
        echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
        apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
                  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Sandbox::User=root")
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
        apt-get "${apt_opts[@]}" update -q
        (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev)
        mkdir -p "$headers" && dpkg-deb -x "$apt_dir"/libvulkan-dev_*.deb "$headers"
        rm -rf "$apt_dir"
    fi
    echo "Vulkan headers ${have:-none} on the system: building with $(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$headers/usr/include/vulkan/vulkan_core.h") from Debian 13"
    cmake_args="$cmake_args -DVulkan_INCLUDE_DIR=$headers/usr/include"
fi

python -m venv .venv-vulkan && . .venv-vulkan/bin/activate
start=$(date +%s)
CMAKE_ARGS="$cmake_args" pip install ".[test]" --config-settings=build-dir=build/vulkan
echo "Vulkan install took $(( $(date +%s) - start )) s"
# in CI the packages above were installed to run these tests: no device is a failure, not a skip
[ "${CI:-}" = "true" ] && export LLAMA_EXTRAPOLATE_REQUIRE_GPU=1
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"
set +e
python -m pytest -ra tests/test_backends.py --junitxml=build/vulkan/backend-tests.xml "$@"
rc=$?
set -e
# the whole file's outcome per item (not a selection's) to checks/vulkan_backend_tests.json, rewritten when one changes
if [ "$#" -eq 0 ]; then
    device=$(python -c "import llama_extrapolate as l; print(', '.join(d['name'] + ': ' + d['description'] for d in l._core.backend_devices() if d['backend'] == 'Vulkan'))" 2>/dev/null || true)
    python tools/backend_result.py build/vulkan/backend-tests.xml checks/vulkan_backend_tests.json --device "${device:-none}" || { [ "$rc" -ne 0 ] || rc=1; }
fi
exit "$rc"
