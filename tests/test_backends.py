"""The patched attention on a GPU backend: ggml's Vulkan backend, run here on Mesa's lavapipe.

Each knob reads a tiny model with every layer offloaded (n_gpu_layers=-1) and with none (and no op offloaded),
each in a process of its own (ggml picks its Vulkan devices when the library loads); the layers must really be on
the Vulkan device. The Vulkan backend rounds differently from the CPU's: on lavapipe the logits of the plain model
(no knob) are 9e-6 apart from the CPU's by test-backend-ops' measure (NMSE, the squared error over the reference's
squared norm; its tolerance for a matrix product is 5e-4) and 0.04 at most. Each knob must stay within that
backend's error (NMSE < 1e-4 against the CPU and the oracle) while it moves the logits by more than 0.5: a knob
the Vulkan graph computed otherwise would be far outside. (The largest single difference is not bounded: where
two middle keys score within the backend's rounding of each other the top-k keys may differ, 0.2 on one logit.) Ops the Vulkan backend lacks run on the CPU
through ggml's scheduler, with copies; that is a cost, not a different result.

The same tests run on the first device of whatever GPU backend the library was built with (CUDA, Metal, ...:
``CMAKE_ARGS="-DGGML_CUDA=on" pip install ".[test]"``, then ``pytest tests/test_backends.py``); only Vulkan on
lavapipe has been run. Skipped with the reason where the library has no GPU backend (a CPU build: the Vulkan one is
``CMAKE_ARGS="-DGGML_VULKAN=on" pip install .``, docs/gpu.md) or no device is visible.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import random_tokens
from reference import RefAttention, RefStats, forward, forward_mpt

WORKER = Path(__file__).with_name("backend_worker.py")
N_TOKENS = 300
QUESTION = 250
NMSE_MAX = 1e-4  # Vulkan (lavapipe) against the CPU: 9e-6 for the plain model
LAMBDA = dict(sinks=4, window=32, ceiling=32)
TOP_K = dict(top_k=3, top_k_layer=1, top_k_distance=16)
MEMORY = dict(top_k_scope="question", memory_blocks=2, memory_block_size=32, memory_candidates=0)
CACHE = dict(type_k=0, type_v=0, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2)


def vulkan_env() -> dict:
    """The first Vulkan device unless told otherwise: ggml only takes GPUs by default, and lavapipe is a CPU."""
    env = dict(os.environ)
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    return env


# set by tools/vulkan.sh in CI: a build and a driver were installed for these tests, so no device is a failure
REQUIRE_GPU = "LLAMA_EXTRAPOLATE_REQUIRE_GPU"


def no_device(reason: str):
    """A skip with the reason, or where a device is required (REQUIRE_GPU=1) a failure: CI installs lavapipe to run
    these tests, and a stage whose tests all skipped would pass without having run them."""
    if os.environ.get(REQUIRE_GPU) == "1":
        pytest.fail(f"{REQUIRE_GPU}=1 and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def gpu():
    """The first device of the library's GPU backend (Vulkan here; CUDA, Metal, ... where built), or no_device with
    the reason."""
    from llama_extrapolate import _core

    others = [b for b in _core.backends() if b not in ("CPU", "BLAS", "RPC")]
    if not others:
        no_device(f"the library was built with the backends {_core.backends()}, no GPU backend: "
                  "CMAKE_ARGS=\"-DGGML_VULKAN=on\" pip install . builds the Vulkan one (docs/gpu.md)")
    probe = subprocess.run([sys.executable, "-c", "import json, llama_extrapolate; "
                            "print(json.dumps(llama_extrapolate._core.backend_devices()))"],
                           env=vulkan_env(), capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        no_device(f"no usable {others} device (GGML_VK_VISIBLE_DEVICES={vulkan_env()['GGML_VK_VISIBLE_DEVICES']}): "
                  f"{probe.stderr.strip()[-300:]}")
    devices = [d for d in json.loads(probe.stdout.strip().splitlines()[-1]) if d["backend"] in others]
    if not devices:
        no_device(f"the {others} backend sees no device" +
                  (" (Mesa's lavapipe: apt-get install mesa-vulkan-drivers)" if "Vulkan" in others else ""))
    return devices[0]["name"]


def read_on(backend, tmp_path, model, attention, tokens, question=None, stats=False, stats_reduce=None, refused=None,
            **extra):
    """(logits, facts) of one reading in a child process on "cpu" (no layer offloaded) or "gpu" (all); with
    ``refused``, the library's refusal is expected instead and its message returned. ``extra``: Llama keywords."""
    # the CPU run offloads no op either (with a GPU backend llama.cpp offloads large products by default)
    llama = dict(CACHE, op_offload=backend == "gpu", **extra)
    if attention.get("memory_blocks"):
        llama.update(memory_type="f32", memory_capacity=512)
    spec = dict(model=str(model), attention=attention, tokens=list(map(int, tokens)), question=question,
                n_gpu_layers=-1 if backend == "gpu" else 0, stats=stats, stats_reduce=stats_reduce, llama=llama)
    spec_path = tmp_path / f"{backend}.json"
    spec_path.write_text(json.dumps(spec))
    out = str(tmp_path / f"{backend}-out")
    done = subprocess.run([sys.executable, str(WORKER), str(spec_path), out], capture_output=True, text=True,
                          env=vulkan_env() if backend == "gpu" else dict(os.environ), timeout=600)
    if refused is not None:
        assert done.returncode != 0 and refused in done.stderr, done.stderr[-2000:]
        return done.stderr.strip().splitlines()[-1]
    assert done.returncode == 0, done.stderr[-2000:]
    return np.load(out + ".npy").astype(np.float64), json.loads(Path(out + ".json").read_text())


def both(gpu, tmp_path, model, attention, tokens, **kw):
    """The readings on the Vulkan device and on the CPU; checks that the layers were where they were sent."""
    got, facts = read_on("gpu", tmp_path, model, attention, tokens, **kw)
    cpu, cpu_facts = read_on("cpu", tmp_path, model, attention, tokens, **kw)
    assert set(facts["devices"]["layers"]) == {gpu}, facts["devices"]
    assert set(cpu_facts["devices"]["layers"]) == {"CPU"}, cpu_facts["devices"]
    return got, facts, cpu, cpu_facts


def nmse(a, b):
    """test-backend-ops' measure: the squared error over the reference's squared norm."""
    return float(np.sum((a - b) ** 2) / np.sum(b ** 2))


def check_within_the_backends_error(got, cpu, ref, plain, what, cpu_tol=2e-3):
    """got (Vulkan) against the CPU backend and the oracle ref, where the knob moves the logits from plain (the
    model without it) by far more than the backend's rounding; cpu_tol: the CPU tests' tolerance."""
    assert np.abs(ref - plain).max() > 0.5, f"{what}: the knob must change the logits for the test to tell"
    assert np.abs(cpu - ref).max() < cpu_tol, f"{what}: the CPU backend is off the oracle"
    for other, name in ((cpu, "the CPU backend"), (ref, "the oracle")):
        rel = nmse(got, other)
        assert rel < NMSE_MAX, f"{what}: against {name}, NMSE {rel:.2e}, max {np.abs(got - other).max():.3f}"


CASES = {
    "vanilla": (dict(sinks=0, window=0, ceiling=0), RefAttention(), None),
    "lambda+ceiling+temperature": (dict(LAMBDA, temperature=0.9, temperature_schedule="log-length", log_length=40),
                                   RefAttention(**LAMBDA, tau=0.9, log_length=40), None),
    "top-k": (dict(LAMBDA, **TOP_K), RefAttention(**LAMBDA, **TOP_K), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_knob_on_the_gpu_equals_the_cpu_and_the_oracle(gpu, tiny_llama, tmp_path, case):
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    attention, ref_cfg, question = CASES[case]
    got, _, cpu, _ = both(gpu, tmp_path, path, attention, tokens, question=question)
    ref = forward(model, tokens, ref_cfg)
    plain = forward(model, tokens) if case != "vanilla" else ref + 1.0  # (vanilla: nothing to move)
    check_within_the_backends_error(got, cpu, ref, plain, f"{case} on {gpu}")


def test_flash_attention_with_the_ceiling_on_the_gpu(gpu, tiny_llama, tmp_path):
    """Patch 0008's far sinks (one rotated copy per query, concatenated to K and V, an F16 mask) through the Vulkan
    backend's flash attention, with f16 K/V as flash attention keeps them: within the backend's error of the CPU's
    flash path and of the f16 oracle (the CPU tests' tolerance there: 3e-2)."""
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    attention = dict(LAMBDA, temperature=0.9)
    got, _, cpu, _ = both(gpu, tmp_path, path, attention, tokens, flash_attn=True, type_k=1, type_v=1)
    ref = forward(model, tokens, RefAttention(**LAMBDA, tau=0.9), f16_cache=True)
    without = forward(model, tokens, RefAttention(sinks=4, window=32, tau=0.9), f16_cache=True)
    check_within_the_backends_error(got, cpu, ref, without, f"flash attention with the ceiling on {gpu}",
                                    cpu_tol=3e-2)


@pytest.mark.parametrize("landmark", [0, 16])
def test_memory_with_offloaded_layers_selects_the_cpus_blocks(gpu, tiny_llama, tmp_path, landmark):
    """The document memory with every layer on the GPU device and the KV cache in host memory (offload_kqv=False:
    the memory reads and writes its blocks there), its blocks ranked by the bound or by landmarks of 16 keys (run's
    default): each layer's KV heads select the blocks the CPU backend selects, and the answer's logits are the
    oracle's given those blocks, within the backend's error. (On lavapipe this crashed until patch 0004: ggml-vulkan
    left stale buffers in the descriptor bindings a pipeline does not use, and the question's larger graphs
    reallocate the compute buffer.)"""
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    attention = dict(LAMBDA, **TOP_K, **MEMORY)
    got, facts, cpu, cpu_facts = both(gpu, tmp_path, path, attention, tokens, question=QUESTION, offload_kqv=False,
                                      memory_landmark=landmark)
    assert facts["n_landmark"] == cpu_facts["n_landmark"] == landmark
    assert facts["selection"] == cpu_facts["selection"], (facts["selection"], cpu_facts["selection"])
    sel = {int(il): np.asarray(s) for il, s in facts["selection"].items()}
    assert all((s >= 0).all() for s in sel.values()), sel
    ref = forward(model, tokens, RefAttention(**LAMBDA, **TOP_K, top_k_from=QUESTION, memory_blocks=sel,
                                              memory_block=MEMORY["memory_block_size"]))
    check_within_the_backends_error(got[QUESTION:], cpu[QUESTION:], ref[QUESTION:],
                                    forward(model, tokens, RefAttention(**LAMBDA))[QUESTION:],
                                    f"the document memory on {gpu}")


def test_memory_with_the_cache_on_the_gpu_is_refused_with_the_fix(gpu, tiny_llama, tmp_path):
    """With offload_kqv (llama.cpp's default) the KV cache is in the GPU's memory, where the memory cannot read its
    blocks: refused at memory_open, with the fix, never a crash."""
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    why = read_on("gpu", tmp_path, path, dict(LAMBDA, **TOP_K, **MEMORY), tokens, question=QUESTION,
                  offload_kqv=True, refused="KV cache on the host")
    assert "offload_kqv = False" in why, why


def test_alibi_with_the_ceiling_and_temperature_on_the_gpu(gpu, tiny_mpt_model, tmp_path):
    model, path = tiny_mpt_model
    tokens = random_tokens(model, N_TOKENS, seed=2)
    got, _, cpu, _ = both(gpu, tmp_path, path, dict(LAMBDA, temperature=0.9), tokens)
    ref = forward_mpt(model, tokens, RefAttention(**LAMBDA, tau=0.9))
    check_within_the_backends_error(got, cpu, ref, forward_mpt(model, tokens), f"ALiBi on {gpu}",
                                    cpu_tol=1e-2)  # (test_attention_alibi.py's)


@pytest.mark.parametrize("reduce", [None, "host"])
def test_attention_statistics_with_offloaded_layers(gpu, tiny_llama, tmp_path, reduce):
    """By default (patch 0010) ggml ops reduce the statistics on the GPU device that runs the attention, and only
    the sums come back; with reduce="host" the CPU op does, the scheduler copying the logits, the mask and the
    softmax to the host. Either way the sums equal the CPU backend's and the oracle's."""
    model, path = tiny_llama
    tokens = random_tokens(model, 120, seed=3)
    attention = dict(sinks=4, window=32, ceiling=0)
    _, facts, _, cpu_facts = both(gpu, tmp_path, path, attention, tokens, stats=True, stats_reduce=reduce)
    assert facts["stats_on_graph"] == [reduce is None] * model.n_layer, facts["stats_on_graph"]
    assert cpu_facts["stats_on_graph"] == [False] * model.n_layer, cpu_facts["stats_on_graph"]
    ref = RefStats(model.n_layer, model.n_head)
    forward(model, tokens, RefAttention(sinks=4, window=32), stats=ref)
    got, cpu = facts["stats"], cpu_facts["stats"]
    for key in ("pmax", "entropy", "logit_mean", "logit_var"):
        # relative to the field's largest sum: the logits' means sum terms of both signs (the backend's rounding
        # of the logits, not the reduction, moves one sum of 8 by 1%: the CPU op on the Vulkan layers does too)
        for other, name in ((np.asarray(cpu[key]), "the CPU backend"), (getattr(ref, key), "the oracle")):
            err = np.abs(np.asarray(got[key]) - other).max() / np.abs(other).max()
            assert err < 1e-2, f"{key}: {err:.2e} off {name}"
    for key in ("count", "n_keys"):
        assert np.array_equal(np.asarray(got[key]), getattr(ref, key)), key
    mass = np.asarray(got["mass"])
    assert np.abs(mass - ref.mass).max() < 1e-2 * ref.count.max(), np.abs(mass - ref.mass).max()
    assert np.abs(mass - np.asarray(cpu["mass"])).max() < 1e-2 * ref.count.max()


def test_the_device_of_each_layer_is_named(tiny_llama, capsys):
    """Llama.devices() (patch 0005) and `info` say where the attention runs: here no layer is offloaded."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig, _core
    from llama_extrapolate.cli import main

    model, path = tiny_llama
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig(sinks=4, window=32), n_gpu_layers=0,
                                  verbose=False, n_ctx=512, n_batch=64, n_ubatch=64)
    try:
        assert llm.devices() == {"layers": ["CPU"] * model.n_layer, "output": "CPU"}
    finally:
        llm.close()
    assert "CPU" in _core.backends()
    assert main(["info", "--model", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("devices "))
    assert "CPU (CPU, cpu: " in line, line
