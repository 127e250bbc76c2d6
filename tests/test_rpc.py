"""The patched attention with the model's layers on llama.cpp's RPC backend: two ``llama-extrapolate rpc-server``
processes on 127.0.0.1 stand for two machines.

Each knob reads a tiny model with every layer on the two servers (llama.cpp splits them by the servers' free memory)
and with none, each in a process of its own (the RPC devices, once registered, stay for the process); the layers
must really be on both servers. The servers run the same CPU kernels as this process, so a knob computed there is
the local CPU's result within float rounding of a split graph (1e-5 of the logits); the custom ops (the document
memory's block reader, the statistics' host reduction) must stay here (patch 0016), or the server would be handed
this process's function pointers. Bad addresses, a closed port, a server that does not answer and another protocol
are Python exceptions that say what to do, before ggml-rpc (which ends the process on a failed connection) is asked.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import random_tokens
from reference import RefAttention, RefStats, forward
from test_backends import CACHE, LAMBDA, MEMORY, QUESTION, TOP_K, WORKER

from llama_extrapolate import rpc  # noqa: E402
from llama_extrapolate.server import free_port  # noqa: E402

N_TOKENS = 300


@pytest.fixture(scope="module")
def rpc_servers(tmp_path_factory):
    """Two RPC servers on this machine ("127.0.0.1:P1,127.0.0.1:P2"), stopped after the module."""
    from llama_extrapolate import _core

    assert "RPC" in _core.backends(), f"the default build has ggml's RPC backend; this one has {_core.backends()}"
    logs = tmp_path_factory.mktemp("rpc")
    servers = []
    try:
        for i in range(2):
            servers.append(rpc.start_local(logs / f"server{i}.log"))
        yield ",".join(str(endpoint) for _, endpoint in servers)
    finally:
        for server, _ in servers:
            server.terminate()
            server.wait(timeout=30)


def read(tmp_path, model, attention, tokens, servers=None, question=None, stats=False, stats_reduce=None,
         refused=None, **extra):
    """(logits, facts) of one reading in a child process, with every layer on ``servers`` or all here; with
    ``refused`` the refusal's message is expected instead."""
    llama = dict(CACHE, **extra)
    if attention.get("memory_blocks"):
        llama.update(memory_type="f32", memory_capacity=512)
    if servers:
        # one layer on each server with the tiny models' two (and the output layer on the second)
        llama.update(rpc_servers=servers, tensor_split=[1, 2])
    spec = dict(model=str(model), attention=attention, tokens=list(map(int, tokens)), question=question,
                n_gpu_layers=-1 if servers else 0, stats=stats, stats_reduce=stats_reduce, llama=llama)
    name = "rpc" if servers else "cpu"
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    out = str(tmp_path / f"{name}-out")
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / f"{name}.json"), out], capture_output=True,
                          text=True, timeout=600)
    if refused is not None:
        assert done.returncode != 0 and refused in done.stderr, done.stderr[-2000:]
        return done.stderr.strip().splitlines()[-1]
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out + ".npy").astype(np.float64), json.loads(Path(out + ".json").read_text())


def on_both(rpc_servers, tmp_path, path, attention, tokens, **kw):
    got, facts = read(tmp_path, path, attention, tokens, servers=rpc_servers, **kw)
    cpu, cpu_facts = read(tmp_path, path, attention, tokens, **kw)
    assert facts["devices"]["layers"] == ["RPC0", "RPC1"], facts["devices"]  # a layer on each server
    assert set(cpu_facts["devices"]["layers"]) == {"CPU"}, cpu_facts["devices"]
    return got, facts, cpu, cpu_facts


CASES = {
    "lambda+ceiling+temperature": (dict(LAMBDA, temperature=0.9, temperature_schedule="log-length", log_length=40),
                                   RefAttention(**LAMBDA, tau=0.9, log_length=40)),
    "top-k": (dict(LAMBDA, **TOP_K), RefAttention(**LAMBDA, **TOP_K)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rpc_each_knob_on_two_servers_equals_the_cpu_and_the_oracle(rpc_servers, tiny_llama, tmp_path, case):
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    attention, ref_cfg = CASES[case]
    got, _, cpu, _ = on_both(rpc_servers, tmp_path, path, attention, tokens)
    ref = forward(model, tokens, ref_cfg)
    assert np.abs(ref - forward(model, tokens)).max() > 0.5, "the knob must change the logits for the test to tell"
    assert np.abs(cpu - ref).max() < 2e-3, "the CPU backend is off the oracle"
    assert np.array_equal(got, cpu), f"{case}: RPC vs CPU, max {np.abs(got - cpu).max():.2e}"
    assert np.abs(got - ref).max() < 2e-3, f"{case}: RPC vs the oracle, max {np.abs(got - ref).max():.2e}"


def test_rpc_document_memory_keeps_its_cache_here_and_selects_the_cpus_blocks(rpc_servers, tiny_llama, tmp_path):
    """With the memory the KV cache stays in this process (offload_kqv=False is set for it) and the memory's block
    reader, a custom op, runs here; the layers' products run on the servers. Each KV head selects the blocks the CPU
    run selects, and the answer's logits are the oracle's given those blocks."""
    model, path = tiny_llama
    tokens = random_tokens(model, N_TOKENS, seed=2)
    attention = dict(LAMBDA, **TOP_K, **MEMORY)
    got, facts, cpu, cpu_facts = on_both(rpc_servers, tmp_path, path, attention, tokens, question=QUESTION)
    assert facts["selection"] == cpu_facts["selection"]
    sel = {int(il): np.asarray(s) for il, s in facts["selection"].items()}
    assert all((s >= 0).all() for s in sel.values()), sel
    ref = forward(model, tokens, RefAttention(**LAMBDA, **TOP_K, top_k_from=QUESTION, memory_blocks=sel,
                                              memory_block=MEMORY["memory_block_size"]))
    assert np.abs(ref - forward(model, tokens, RefAttention(**LAMBDA))).max() > 0.5
    assert np.array_equal(got, cpu), np.abs(got - cpu).max()
    assert np.abs(got[QUESTION:] - ref[QUESTION:]).max() < 2e-3, np.abs(got[QUESTION:] - ref[QUESTION:]).max()


def test_rpc_document_memory_with_the_cache_on_the_servers_is_refused(tiny_llama):
    """offload_kqv=True asks for the cache on the servers, where the memory cannot read its blocks: refused before
    any server is asked, with the fix."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    with pytest.raises(ValueError, match="offload_kqv=False"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(**LAMBDA, **TOP_K, **MEMORY),
                                rpc_servers="127.0.0.1:1", offload_kqv=True, verbose=False, **CACHE)


@pytest.mark.parametrize("reduce", [None, "host"])
def test_rpc_attention_statistics(rpc_servers, tiny_llama, tmp_path, reduce):
    """By default ggml ops reduce the statistics where the attention runs (the servers); with reduce="host" the CPU
    custom op does, here (patch 0016 keeps it off the servers). Either way the sums are the CPU run's and the
    oracle's."""
    model, path = tiny_llama
    tokens = random_tokens(model, 120, seed=3)
    attention = dict(sinks=4, window=32, ceiling=0)
    _, facts, _, cpu_facts = on_both(rpc_servers, tmp_path, path, attention, tokens, stats=True, stats_reduce=reduce)
    assert facts["stats_on_graph"] == [reduce is None] * model.n_layer, facts["stats_on_graph"]
    ref = RefStats(model.n_layer, model.n_head)
    forward(model, tokens, RefAttention(sinks=4, window=32), stats=ref)
    for key in ("pmax", "entropy", "logit_mean", "logit_var"):
        got, cpu = np.asarray(facts["stats"][key]), np.asarray(cpu_facts["stats"][key])
        assert np.allclose(got, cpu, rtol=1e-6, atol=0), f"{key}: off the CPU run"
        assert np.abs(got - getattr(ref, key)).max() < 1e-2 * np.abs(getattr(ref, key)).max(), f"{key}: off the oracle"
    for key in ("count", "n_keys"):
        assert np.array_equal(np.asarray(facts["stats"][key]), getattr(ref, key)), key


def test_rpc_run_command_reads_and_answers_on_the_servers(rpc_servers, tiny_llama, tmp_path):
    """`run --rpc` with the document memory on: the reading and the answer go through the servers (their logs say
    a client came) and the answer is the local run's."""
    model, path = tiny_llama
    doc = tmp_path / "doc.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 60)
    base = [sys.executable, "-m", "llama_extrapolate", "run", "--model", str(path), "--file", str(doc), "--prompt",
            "Where does the fox jump?", "--max-tokens", "8", "--window", "64", "--memory-blocks", "2",
            "--memory-block-size", "32", "--no-chat", "--threads", "1", "--quiet"]
    here = subprocess.run(base, capture_output=True, text=True, timeout=600)
    there = subprocess.run(base + ["--rpc", rpc_servers], capture_output=True, text=True, timeout=600)
    assert here.returncode == 0, here.stderr[-2000:]
    assert there.returncode == 0, there.stderr[-2000:]
    assert there.stdout == here.stdout and there.stdout.strip(), (there.stdout, here.stdout)


def test_rpc_bad_servers_are_refused_with_the_fix(tiny_llama):
    from llama_extrapolate import rpc

    for bad, said in (("127.0.0.1", "has no port"), ("127.0.0.1:0", "from 1 to 65535"),
                      ("127.0.0.1:x", "from 1 to 65535"), ("[::1]:50052", "not IPv6"),
                      ("127.0.0.1:50052,", "empty entry"), ("a:1,a:1", "listed twice")):
        with pytest.raises(ValueError, match=said):
            rpc.parse_servers(bad)
    with pytest.raises(TypeError, match="host:port"):
        rpc.parse_servers(50052)

    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    model, path = tiny_llama
    with pytest.raises(ValueError, match="n_gpu_layers=0 with rpc_servers"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(**LAMBDA), rpc_servers="127.0.0.1:1",
                                n_gpu_layers=0, verbose=False, **CACHE)
    with pytest.raises(rpc.RPCServerError, match="connection refused: start the server"):
        llama_extrapolate.Llama(str(path), attention=AttentionConfig(**LAMBDA), rpc_servers=f"127.0.0.1:{free_port()}",
                                verbose=False, **CACHE)


def silent_server(answer: bytes = b""):
    """A listening socket that accepts and answers ``answer`` (nothing: it never answers); its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        conn.recv(64)
        if answer:
            conn.sendall(answer)
        time.sleep(5)
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_rpc_a_server_that_does_not_answer_or_speaks_otherwise_is_an_error():
    from llama_extrapolate import rpc

    start = time.monotonic()
    with pytest.raises(rpc.RPCServerError, match="did not answer within 1 s"):
        rpc.probe(rpc.Endpoint("127.0.0.1", silent_server()), timeout=1)
    assert time.monotonic() - start < 4
    with pytest.raises(rpc.RPCServerError, match="not a ggml RPC server"):
        rpc.probe(rpc.Endpoint("127.0.0.1", silent_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")), timeout=2)
    hello = (28).to_bytes(8, "little") + bytes([6, 0, 0, 0]) + bytes(24)
    with pytest.raises(rpc.RPCServerError, match="speaks protocol 6.0.0"):
        rpc.probe(rpc.Endpoint("127.0.0.1", silent_server(hello)), timeout=2)


def test_rpc_server_command_refuses_a_bad_port():
    done = subprocess.run([sys.executable, "-m", "llama_extrapolate", "rpc-server", "--port", "70000"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--port 70000 must be from 1 to 65535" in done.stderr, done.stderr


LOSE = """
import os, signal, sys
import llama_extrapolate as le
from llama_extrapolate import AttentionConfig, rpc
path, endpoint, pid, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tokens = [int(t) for t in sys.argv[5].split(",")]
llm = le.Llama(path, attention=AttentionConfig(sinks=4, window=32, ceiling=32), rpc_servers=endpoint, rpc_timeout=2,
               n_ctx=512, n_batch=64, n_ubatch=64, verbose=False)
llm.eval(tokens[:64])
os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
try:
    for at in range(64, len(tokens), 8):
        llm.eval(tokens[at:at + 8])
    print("no error")
except rpc.RPCServerError as exc:
    print("RPCServerError:", exc)
llm.close()
print("closed")
"""


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_rpc_a_server_lost_in_the_middle_of_a_reading_is_an_error_not_a_crash_or_a_hang(tiny_llama, tmp_path, how):
    """The server is killed (its connection closes) or stopped (it no longer answers, the connection stays open)
    after the first batch: the next decodes raise RPCServerError naming the server, within the answer timeout (2 s
    here), and the model closes; patch 0016 (ggml-rpc ended the process, or waited forever)."""
    model, path = tiny_llama
    server, endpoint = rpc.start_local(tmp_path / "server.log")
    try:
        tokens = ",".join(map(str, random_tokens(model, 200, seed=5)))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", LOSE, str(path), str(endpoint), str(server.pid), how, tokens],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        said = done.stdout.strip().splitlines()
        assert said[0].startswith(f"RPCServerError: RPC server {endpoint}: the connection was lost"), said
        assert "restart the server" in said[0] and said[-1] == "closed", said
        assert time.monotonic() - start < 60
    finally:
        server.kill()
        server.wait(timeout=30)
