"""bench/reading_speed.py's bookkeeping on a short reading: the prompt speed and each window's reading speed in one
entry per model, window and configuration, the ratio being the one the two speeds give (rule (b) of `run`'s
window)."""

import json

from conftest import load_bench


def test_reading_speed_records_each_window_against_the_prompt_speed(tmp_path):
    bench = load_bench("reading_speed")
    out = tmp_path / "reading_speed.json"
    config = "lambda+memory:m=4:c=16:q4_0"  # (the default's 64 blocks of 64 would not fit 1024 tokens)
    args = ["--tokens", "1024", "--windows", "64,128", "--config", config, "--repeats", "1", "--threads", "2",
            "--out", str(out)]
    assert bench.main(args) == 0
    assert bench.main(args[:3] + ["128"] + args[4:]) == 0  # a rerun replaces its window's entry
    d = json.loads(out.read_text())
    assert abs(d["rule"] - 2 / 3) < 1e-12
    assert [r["window"] for r in d["runs"]] == [64, 128]
    for r in d["runs"]:
        assert r["config"] == config and r["tokens"] == 1024
        assert r["prompt"]["tokens"] == 512 and len(r["prompt"]["runs"]) == 1
        assert abs(r["tok_s"] - 1024 / r["seconds"]) < 1e-6 * r["tok_s"]
        assert abs(r["ratio"] - r["tok_s"] / r["prompt"]["tok_s"]) < 1e-9
