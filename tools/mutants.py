#!/usr/bin/env python3
"""Each strengthened test fails against a deliberately broken variant, and passes without it (issue 55, item 5).

  python tools/mutants.py            # every mutant: the test run with it (must fail), then without (must pass)
  python tools/mutants.py --list     # the mutants and what each breaks
  python tools/mutants.py NAME ...   # some of them

A test that was once too weak to fail is shown failing once: a mutant is a small patch of the package (or of what
the test reads from it) applied when the module is imported, in pytest and in every Python child it starts (the
server of `llama-extrapolate serve`). Nothing is edited: the patch is a sitecustomize.py written to a temporary
directory that goes first on PYTHONPATH for the mutated run only (it shadows any other sitecustomize). Neither the
package nor tests/ knows of it. A mutated run counts as failing only if every selected test fails, each with the
assertion that names the property (``expect``), not for another reason.

Two mutants break a test's comparison on both sides, so that the two agree and only the test's guard can fail it:
the library and the oracle (tests/reference.py) both without the ceiling, where the guard is that the knob moves
the oracle's logits in that family; Gemma's flash and non-flash paths both without it, where the guard is that the
knob moves the logits of the path flash attention is compared with.

The C++ side is not rebuilt: where the property lives in the library (the document memory's store holds its keys
unrotated), the mutant changes what the test reads from the store (``native.memory_read_block``), as a store
holding the cache's rotated keys would return them; the store itself and what the model computes from it are
left as they are.

Not covered: tests/test_llama_server.py needs llama.cpp's llama-server built from this tree's `pip install .`
build directory (tools/upstream.py); without one its tests are skipped.

Stdlib only; pytest runs in a subprocess of this interpreter. Exits 1 if a mutant survives or a test fails clean.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]

# runs ``patch(module)`` once ``module`` has executed, whoever imports it first
HOOK = '''
import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec
'''


@dataclass
class Mutant:
    name: str
    breaks: str  # what the broken variant does, and why the test must see it
    tests: Sequence[str]  # pytest arguments: node ids, or a file with -k
    patches: Dict[str, str]  # module -> source defining patch(module), run once the module has executed
    expect: str  # a regular expression the failing run's output must hold (the test's own assertion message)


def drop_knob(knob: str, off: str, when: str) -> str:
    """A patch of llama_extrapolate.llama: a Llama whose AttentionConfig has ``knob`` set to ``off`` before the
    model loads wherever ``when`` (an expression of attention and the Llama's keyword arguments) holds: what a
    library ignoring that knob computes."""
    return f'''
def patch(module):
    from dataclasses import replace

    import numpy as np  # noqa: F401 (for when)

    init = module.Llama.__init__

    def knob_dropped(self, model_path, *args, attention=None, **kwargs):
        if attention is not None and ({when}):
            attention = replace(attention, {knob}={off})
        init(self, model_path, *args, attention=attention, **kwargs)

    module.Llama.__init__ = knob_dropped
'''


MUTANTS = [
    Mutant(
        "server-decodes-after-client-left",
        "the server decodes a streamed answer to max_tokens whatever the client does: create_completion(stream=True) "
        "decodes every token (list()) before the first piece is sent, so a client closing after two pieces stops "
        "nothing",
        ["tests/test_server.py::test_client_leaving_mid_answer_stops_the_decode"],
        {"llama_extrapolate.llama": '''
def patch(module):
    create_completion = module.Llama.create_completion

    def decoded_whole(self, *args, **kwargs):
        out = create_completion(self, *args, **kwargs)
        return iter(list(out)) if kwargs.get("stream") else out

    module.Llama.create_completion = decoded_whole
'''},
        r"answer tokens decoded for a client that left after 2 pieces"),
    Mutant(
        "store-keys-rotated",
        "the document memory's store holds each key rotated by RoPE at its position (sinks + block*B + row, "
        "the tiny llama's base 10000), as the cache holds it, instead of rotated back to position 0: "
        "native.memory_read_block returns the keys so rotated, the values as stored",
        ["tests/test_memory.py::test_the_store_holds_every_token_after_the_sinks_unrotated"],
        {"llama_extrapolate.native": '''
SINKS, ROPE_BASE = 4, 10000.0  # tests/test_memory.py's S; tests/tinymodel.py's TinyLlama.rope_base


def patch(module):
    import numpy as np

    read = module.memory_read_block

    def keys_rotated(ctx, block, layer, kv_head):
        from reference import rope_angles, rotate  # tests/reference.py, on sys.path under pytest

        k, v = read(ctx, block, layer, kv_head)
        positions = SINKS + block * len(k) + np.arange(len(k))
        return rotate(k, rope_angles(positions, k.shape[-1], ROPE_BASE)).astype(k.dtype), v

    module.memory_read_block = keys_rotated
'''},
        r"keys of block 0, layer \d+, head \d+"),
    Mutant(
        "store-values-one-token-off",
        "the store holds each token's value one row off (row i of a block holds token i+1's value, the last row "
        "the block's first): native.memory_read_block returns the values so shifted, the keys as stored (shapes and "
        "finiteness unchanged)",
        ["tests/test_memory.py::test_the_store_holds_every_token_after_the_sinks_unrotated"],
        {"llama_extrapolate.native": '''
def patch(module):
    import numpy as np

    read = module.memory_read_block

    def values_shifted(ctx, block, layer, kv_head):
        k, v = read(ctx, block, layer, kv_head)
        return k, np.roll(v, -1, axis=0)

    module.memory_read_block = values_shifted
'''},
        r"values of block 0, layer \d+, head \d+"),
    Mutant(
        "knobs-ceiling-ignored",
        "the library ignores the distance ceiling (AttentionConfig.ceiling set to 0 before the model loads), in "
        "every family: the ceiling-only case (ubatch 64) of each must fail",
        ["tests/test_families.py", "-k", "test_knobs_match_the_oracle and ceiling-only-64"],
        {"llama_extrapolate.llama": drop_knob("ceiling", "0", "attention.ceiling")},
        r"ceiling-only, ubatch 64: max \|llama\.cpp - oracle\|"),
    Mutant(
        "knobs-ceiling-ignored-with-the-oracle",
        "the library and the oracle both ignore the ceiling (the oracle's forward() given RefAttention with ceiling "
        "0): they agree, and only the guard that the knob moves the oracle's logits in the family fails the test",
        ["tests/test_families.py", "-k", "test_knobs_match_the_oracle and ceiling-only-64"],
        {"llama_extrapolate.llama": drop_knob("ceiling", "0", "attention.ceiling"),
         "reference": '''
def patch(module):
    from dataclasses import replace

    forward = module.forward

    def forward_without_ceiling(model, tokens, cfg=None, *args, **kwargs):
        if cfg is not None and cfg.ceiling:
            cfg = replace(cfg, ceiling=0)
        return forward(model, tokens, cfg, *args, **kwargs)

    module.forward = forward_without_ceiling
'''},
        r"ceiling-only: without ceiling the oracle moves by"),
    Mutant(
        "knobs-temperature-ignored",
        "the library ignores the softmax temperature (AttentionConfig.temperature set to 1 before the model loads), "
        "in every family: the lambda+ceiling+temperature case (ubatch 64) of each must fail",
        ["tests/test_families.py", "-k", "test_knobs_match_the_oracle and lambda+ceiling+temperature-64"],
        {"llama_extrapolate.llama": drop_knob("temperature", "1.0",
                                              "np.any(np.asarray(attention.temperature) != 1.0)")},
        r"lambda\+ceiling\+temperature, ubatch 64: max \|llama\.cpp - oracle\|"),
    Mutant(
        "gemma-flash-ceiling-ignored",
        "flash attention ignores the ceiling on Gemma 2/3 (AttentionConfig.ceiling set to 0 when flash_attn=True; "
        "the non-flash path keeps it)",
        ["tests/test_families.py", "-k", "test_gemma_flash_attention_with_the_ceiling_is_the_exact_path and 64"],
        {"llama_extrapolate.llama": drop_knob("ceiling", "0", 'kwargs.get("flash_attn") and attention.ceiling')},
        r"ubatch 64: max \|flash - non-flash\|"),
    Mutant(
        "gemma-ceiling-ignored-on-both-paths",
        "Gemma 2/3 ignore the ceiling with and without flash attention (AttentionConfig.ceiling set to 0 for every "
        "Llama): the two paths agree, and only the guard that the ceiling moves the logits fails the test",
        ["tests/test_families.py", "-k", "test_gemma_flash_attention_with_the_ceiling_is_the_exact_path and 64"],
        {"llama_extrapolate.llama": drop_knob("ceiling", "0", "attention.ceiling")},
        r"without ceiling the logits move by"),
]

SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def pytest_run(mutant: Mutant, mutated: bool, verbose: bool) -> dict:
    """Run the mutant's tests, with its sitecustomize first on PYTHONPATH when ``mutated``: the counts of the
    pytest summary, its output and its duration."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if list((ROOT / "python" / "llama_extrapolate").glob("_core*")):  # a checkout with its module built in place
        paths.insert(0, str(ROOT / "python"))
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        if mutated:
            source = (f"# tools/mutants.py, mutant {mutant.name}: {mutant.breaks}\n{HOOK}\n"
                      f"for name, source in {mutant.patches!r}.items():\n"
                      "    defined = {}\n"
                      "    exec(source, defined)\n"
                      "    sys.meta_path.insert(0, _AfterImport(name, defined['patch']))\n")
            (Path(tmp) / "sitecustomize.py").write_text(source)
            paths.insert(0, tmp)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        cmd = [sys.executable, "-m", "pytest", *mutant.tests, "-q", "-p", "no:cacheprovider", "-rfEs"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    if verbose:
        print(out)
    last = [line for line in proc.stdout.splitlines() if SUMMARY.search(line)]
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
              for n, kind in SUMMARY.findall(last[-1] if last else "")}
    return dict(counts=counts, output=out, seconds=time.monotonic() - t0, returncode=proc.returncode)


def describe(counts: dict) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in ("failed", "passed", "skipped", "error") if counts.get(k)) or \
        "nothing ran"


def check(mutant: Mutant, verbose: bool) -> List[str]:
    """The mutant's two runs; the lines of its report (the first says whether it was killed)."""
    bad = pytest_run(mutant, True, verbose)
    clean = pytest_run(mutant, False, verbose)
    b, c = bad["counts"], clean["counts"]
    n = c.get("passed", 0) + c.get("failed", 0) + c.get("error", 0)
    # every selected test failed, each with the assertion that names the property (pytest's "E" lines)
    named = [line for line in bad["output"].splitlines() if line.startswith("E ") and re.search(mutant.expect, line)]
    killed = n > 0 and b.get("failed", 0) == n and not b.get("passed") and not b.get("error") and len(named) >= n
    clean_ok = n > 0 and c.get("passed", 0) == n
    skipped = not n and (b.get("skipped") or c.get("skipped"))
    if skipped:
        verdict = "SKIPPED"
    else:
        verdict = "ok" if killed and clean_ok else "FAILED"
    lines = [f"{verdict:8} {mutant.name}",
             f"         mutated:   {describe(b)} ({bad['seconds']:.0f} s): " +
             ("test failed as expected" if killed else
              "the mutant survived" if b.get("passed") else
              f"did not fail with /{mutant.expect}/")]
    if killed:
        message = re.sub(r"^E\s+", "", named[0])
        lines.append(f"                    {message[:160]}")
    lines.append(f"         unmutated: {describe(c)} ({clean['seconds']:.0f} s): " +
                 ("test passes unmutated" if clean_ok else "the test does not pass without the mutant"))
    if skipped:
        reasons = [line for line in (bad["output"] + clean["output"]).splitlines() if line.startswith("SKIPPED")]
        lines.append(f"         {reasons[0] if reasons else 'skipped'}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and what each breaks")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output of every run")
    args = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        ap.error(f"unknown mutant {unknown[0]!r}; one of {', '.join(by_name)}")
    chosen = [by_name[n] for n in args.names] or MUTANTS
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    breaks: {m.breaks}\n    test:   {' '.join(m.tests)}")
        return 0
    report = []
    for m in chosen:
        lines = check(m, args.verbose)
        print("\n".join(lines), flush=True)
        report.append(lines[0])
    print("\nsummary:\n" + "\n".join(report))
    return 0 if all(not line.startswith("FAILED") for line in report) else 1


if __name__ == "__main__":
    sys.exit(main())
