"""The bookkeeping of bench/memory.py's cost run on a short stream: what it records, and one entry per setting
(the passages mode its own)."""

import json

from conftest import load_bench


def test_cost_run_keeps_one_entry_per_setting(tmp_path, monkeypatch):
    bench = load_bench("memory")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    common = ["cost", "--tokens", "800", "--window", "128", "--n-batch", "128", "--memory-blocks", "4",
              "--memory-candidates", "8"]
    for extra in ([], ["--passages"], []):  # the third replaces the first's entry
        assert bench.main(common + extra) == 0
    runs = json.loads((tmp_path / "memory_cost.json").read_text())["runs"]
    assert [r.get("passages", False) for r in runs] == [False, True]
    for run, name in zip(runs, ("lambda+memory:m=4:c=8", "lambda+memory:m=4:c=8:passages")):
        assert set(run["configs"]) == {"lambda", name}
        assert (run["memory_blocks"], run["memory_candidates"], run["tokens"]) == (4, 8, 800)
        mem = run["configs"][name]
        assert mem["memory"]["n_blocks"] >= (800 - 10 - 128) // 64 and mem["disk_bytes_per_token"] > 0
        assert run["read_speed_ratio"] > 0 and run["peak_rss_ratio"] > 0


def test_a_cost_entry_is_put_in_the_file_as_it_is_when_the_run_ends(tmp_path):
    """Two cost runs of other settings ending one after the other both stay: each reads the file under its lock
    when it ends (they read it at their start before, and the later one dropped the earlier one's entry)."""
    import pytest

    from llama_extrapolate.jsonfile import one_writer

    bench = load_bench("memory")
    path = tmp_path / "memory_cost.json"
    key = lambda r: (r["tokens"], r.get("passages", False))
    bench.replace_run(path, {"tokens": 8, "x": 1}, key)
    bench.replace_run(path, {"tokens": 8, "passages": True, "x": 2}, key)
    bench.replace_run(path, {"tokens": 4, "x": 3}, key, sort=True)
    bench.replace_run(path, {"tokens": 8, "x": 4}, key, sort=True)
    assert [r["x"] for r in json.loads(path.read_text())["runs"]] == [3, 4, 2]
    with one_writer(path), pytest.raises(RuntimeError, match="another run"):
        bench.replace_run(path, {"tokens": 2, "x": 5}, key)


def test_cost_run_with_a_key_writes_a_section_of_another_file(tmp_path, monkeypatch):
    """tools/gpu.sh's one JSON: with --key and --out the run is a section of that file (its other sections kept),
    with the devices its layers were on, and memory_cost.json is not touched."""
    bench = load_bench("memory")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    out = tmp_path / "gpu.json"
    out.write_text(json.dumps({"stream_gpu": {"x": 1}}))
    assert bench.main(["cost", "--tokens", "800", "--window", "128", "--n-batch", "128", "--memory-blocks", "4",
                       "--memory-candidates", "8", "--key", "memory_cost_gpu", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["stream_gpu"] == {"x": 1} and not (tmp_path / "memory_cost.json").exists()
    run = d["memory_cost_gpu"]
    assert set(run["configs"]) == {"lambda", "lambda+memory:m=4:c=8"} and "n_gpu_layers" not in run
    assert all(c["devices"] == ["CPU"] for c in run["configs"].values())
    import pytest

    with pytest.raises(SystemExit):
        bench.main(["cost", "--tokens", "800", "--key", "memory_cost_gpu"])  # --key without --out
