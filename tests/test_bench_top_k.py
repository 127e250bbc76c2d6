"""The bookkeeping of bench/top_k.py: the settings of the paper's ablations and the accuracy tables."""

import pytest
from conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("top_k")


def test_settings_cover_tables_5_to_7_at_the_models_scale(bench):
    s = bench.settings(l_pre=8192, n_layer=30)
    assert s["lambda (no top-k)"][0] == 0
    assert s["top-k k=5 h0=5 D=C/2"] == (5, 5, 4096)
    assert {v[0] for k, v in s.items() if k.startswith("k=")} == {1, 3, 10, 20}
    # the paper's D of 512..4096 for Llama-2 (L = 4096) are 1/8..1 of L: the same fractions of 8192
    assert {v[2] for k, v in s.items() if k.startswith("D=")} == {1024, 2048, 6144, 8192}
    assert {v[1] for k, v in s.items() if k.startswith("h0=")} == {0, 4, 6, 8, 16, 24}
    # a model with fewer layers drops the h0 it does not have
    assert "h0=24" not in bench.settings(l_pre=8192, n_layer=20)


def test_accuracy_is_the_fraction_correct_per_setting_length_and_depth(bench):
    trials = [
        {"length": 8192, "depth": 0.0, "answers": {"a": {"correct": True}, "b": {"correct": False}}},
        {"length": 8192, "depth": 0.5, "answers": {"a": {"correct": False}, "b": {"correct": False}}},
        {"length": 16384, "depth": 0.0, "answers": {"a": {"correct": True}, "b": {"correct": True}}},
        {"length": 16384, "depth": 0.0, "answers": {"a": {"correct": False}, "b": {"correct": True}}},
    ]
    acc = bench.accuracy(trials)
    assert acc["a"]["8192"] == {"0.0": 1.0, "0.5": 0.0}
    assert acc["a"]["16384"] == {"0.0": 0.5}
    assert acc["a"]["all"] == pytest.approx(2 / 4)
    assert acc["b"]["all"] == pytest.approx(2 / 4)
    assert acc["b"]["16384"]["0.0"] == 1.0
