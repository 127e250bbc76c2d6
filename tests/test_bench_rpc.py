"""bench/rpc.py's bookkeeping on a short reading: a cell with the layers on two local RPC servers against the same
cell all local (the same greedy answer: the servers compute what the CPU computes), the bytes that crossed counted
on the loopback, the layers on both servers, and the 70B projection's fit of the traffic against the residual
stream's width."""

import json

import pytest

from conftest import load_bench


def test_cells_record_the_split_and_the_traffic(tmp_path):
    from llama_extrapolate import _core

    if "RPC" not in _core.backends():
        pytest.fail(f"the default build has ggml's RPC backend; this one has {_core.backends()}")
    bench = load_bench("rpc")
    out = tmp_path / "rpc.json"
    common = ["--model", "default", "--tokens", "300", "--window", "128", "--n-batch", "64", "--capacity", "2048",
              "--threads", "1", "--out", str(out)]
    assert bench.main(common + ["--servers", "0,2", "--configs", "lambda"]) == 0
    assert bench.main(common + ["--servers", "2", "--configs", "memory:m=2:c=4:hold"]) == 0
    cells = {(c["servers"], c["config"]): c for c in json.loads(out.read_text())["cells"]}
    local, split = cells[(0, "lambda")], cells[(2, "lambda")]
    memory = cells[(2, "lambda+memory:m=2:c=4:hold")]
    assert local["placement"] == {"CPU": local["n_layer"]} and local["bytes_per_read_token"] is None
    for c in (split, memory):
        assert set(c["placement"]) == {"RPC0", "RPC1"} and sum(c["placement"].values()) == c["n_layer"]
        # the weights went to the servers at load; every token read and answered sent its activations
        assert c["bytes_load"] > 0.5 * c["model_bytes"]
        assert c["bytes_per_read_token"] > 0 and c["bytes_per_answer_token"] > 0
        assert len(c["server_peak_rss_bytes"]) == 2
        assert all(p >= b for p, b in zip(c["server_peak_rss_bytes"], c["server_base_rss_bytes"]))
    assert split["first_token"] == local["first_token"]
    # with the memory the cache is on the client: each layer's queries, keys and values cross, more than the
    # residual stream alone (Λ keeps the cache on the servers)
    assert memory["bytes_per_read_token"] > split["bytes_per_read_token"]
    assert memory["memory_capacity"] == 2048 and memory["memory_disk_bytes_at_capacity"] > 0
    # a memory named without its store's type stores as run and serve do for this model
    from llama_extrapolate import read_model_info
    from llama_extrapolate.default_model import default_model_path
    from llama_extrapolate.options import memory_type_for

    assert memory["memory_type"] == memory_type_for(read_model_info(str(default_model_path())))


def test_projection_fits_the_traffic_on_the_residual_width():
    bench = load_bench("rpc")
    cells = []
    for width in (256, 512):
        for n in (2, 4):
            cells.append({"model": "llama-3-70b", "n_embd": width, "tokens": 1024, "servers": n, "config": "lambda",
                          "bytes_per_read_token": 1000.0 + 8.0 * n * width, "bytes_per_answer_token": 5000.0 + width,
                          "server_peak_rss_bytes": [3e9] * n, "server_base_rss_bytes": [1e9] * n,
                          "model_bytes": 4e9, "client_peak_rss_bytes": 5e8})
    p = bench.project(cells)
    assert abs(p["weights_q4_0_bytes"] - p["params"] * 4.5 / 8) < 1
    assert 69e9 < p["params"] < 72e9  # Llama-3-70B's published size
    rows = {r["servers"]: r for r in p["rows"]}
    for n in (2, 4):
        assert abs(rows[n]["bytes_per_read_token"] - (1000.0 + 8.0 * n * 8192)) < 1e-6
        assert abs(rows[n]["bytes_per_answer_token"] - (5000.0 + 8192)) < 1e-6
        assert rows[n]["server_ram_beyond_weights_bytes"] == 2e9 - 4e9 / n
        assert abs(rows[n]["weights_per_server_bytes"] - p["weights_q4_0_bytes"] / n) < 1
