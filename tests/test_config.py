"""AttentionConfig: defaults from the model, presets, and every bad value named."""

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def info(default_model):
    from llama_extrapolate import read_model_info

    return read_model_info(default_model)


def test_defaults_come_from_the_model(info):
    from llama_extrapolate import AttentionConfig

    r = AttentionConfig.lambda_only().resolve(info)
    assert (r.sinks, r.window, r.ceiling, r.log_length) == (10, 8192, 0, 0)
    assert r.temperature.shape == (30, 9) and np.all(r.temperature == 1.0)
    assert not r.temperature_on
    assert r.kv_overrides("llama") == {
        "llama.attention.lambda.sink_count": 10,
        "llama.attention.lambda.window": 8192,
        "llama.attention.lambda.ceiling": 0,
        "llama.attention.lambda.rollback": 256,
        "llama.attention.softmax_temperature.log_length": 0,
        "llama.attention.softmax_temperature": 1.0,
    }
    v = AttentionConfig.vanilla().resolve(info)
    assert (v.sinks, v.window, v.ceiling) == (0, 0, 0)
    ll = AttentionConfig.vanilla().with_temperature(1.0, "log-length").resolve(info)
    assert ll.log_length == 8192 and ll.temperature_on


def test_per_layer_temperature_expands_over_heads(info):
    from llama_extrapolate import AttentionConfig

    tau = np.linspace(0.5, 1.0, 30)
    r = AttentionConfig.vanilla().with_temperature(tau).resolve(info)
    assert r.temperature.shape == (30, 9)
    np.testing.assert_allclose(r.temperature[:, 4], tau, rtol=1e-6)
    assert "llama.attention.softmax_temperature" not in r.kv_overrides("llama")


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(sinks=-1), ValueError, "sinks=-1"),
    (dict(sinks=2.5), TypeError, "sinks=2.5"),
    (dict(sinks=True), TypeError, "sinks=True"),
    (dict(window=-8), ValueError, "window=-8"),
    (dict(window=2**31), ValueError, "window=2147483648"),
    (dict(ceiling="8k"), TypeError, "ceiling='8k'"),
    (dict(rollback=-1), ValueError, "rollback=-1"),
    (dict(rollback=None), TypeError, "rollback=None"),
    (dict(sinks=4, window=0), ValueError, "sinks=4 with window=0"),
    (dict(temperature=0.0), ValueError, "temperature has invalid value 0.0"),
    (dict(temperature=-1.0), ValueError, "temperature has invalid value -1.0"),
    (dict(temperature=math.nan), ValueError, "temperature has invalid value nan"),
    (dict(temperature=[1.0, math.inf]), ValueError, "temperature has invalid value inf"),
    (dict(temperature="hot"), TypeError, "temperature='hot'"),
    (dict(temperature_schedule="linear"), ValueError, "temperature_schedule='linear'"),
    (dict(log_length=4096), ValueError, "log_length=4096 needs temperature_schedule"),
    (dict(temperature_schedule="log-length", log_length=1), ValueError, "log_length=1"),
])
def test_bad_values_are_named(kwargs, exc, words):
    from llama_extrapolate import AttentionConfig

    with pytest.raises(exc) as err:
        AttentionConfig(**kwargs)
    assert words in str(err.value)


def test_shape_and_model_limits_are_named(info):
    from llama_extrapolate import AttentionConfig

    with pytest.raises(ValueError, match="temperature has 3 values; a per-layer temperature needs n_layer=30"):
        AttentionConfig.vanilla().with_temperature([1.0, 1.0, 1.0]).resolve(info)
    with pytest.raises(ValueError, match=r"shape \(30, 3\); a per-head temperature needs \(n_layer, n_head\)=\(30, 9\)"):
        AttentionConfig.vanilla().with_temperature(np.ones((30, 3))).resolve(info)
    r = AttentionConfig().resolve(info)
    assert (r.sinks, r.window, r.ceiling) == (10, 8192, 8192)
    assert AttentionConfig.ceiling_only().resolve(info).ceiling == 8192
    cfg = AttentionConfig.lambda_only(window=1024)
    with pytest.raises(ValueError, match="needs n_ctx >= sinks \\+ window \\+ rollback \\+ n_ubatch = 1802, got n_ctx=1024"):
        cfg.resolve(info).check_context(n_ctx=1024, n_ubatch=512)


def test_llama_rejects_bad_arguments(default_model, tmp_path):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig

    with pytest.raises(TypeError, match="must be an AttentionConfig"):
        llama_extrapolate.Llama(str(default_model), attention={"window": 4})
    with pytest.raises(ValueError, match="needs n_ctx >= sinks"):
        llama_extrapolate.Llama(str(default_model), attention=AttentionConfig.lambda_only(), n_ctx=2048,
                                verbose=False)
    with pytest.raises(ValueError, match="kv_overrides sets llama.attention.lambda.window=5"):
        llama_extrapolate.Llama(str(default_model), attention=AttentionConfig.lambda_only(window=64),
                                kv_overrides={"llama.attention.lambda.window": 5}, n_ctx=512, n_ubatch=64,
                                verbose=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        llama_extrapolate.Llama(str(tmp_path / "missing.gguf"), attention=AttentionConfig.vanilla())


def test_llama_sends_the_temperature_by_the_c_api_only(info):
    """The structure goes in as metadata at load, the temperature through the C API (one route each)."""
    from llama_extrapolate import AttentionConfig

    r = AttentionConfig(temperature=0.9, temperature_schedule="log-length").resolve(info)
    full = r.kv_overrides("llama")
    assert full["llama.attention.softmax_temperature"] == pytest.approx(0.9)
    assert full["llama.attention.softmax_temperature.log_length"] == 8192
    load = r.kv_overrides("llama", temperature=False)
    assert not [k for k in load if "softmax_temperature" in k]
    assert {k: v for k, v in full.items() if "softmax_temperature" not in k} == load


def test_one_rule_for_the_default_attention_of_every_command(info):
    """run, nll, passkey and trf --erf resolve the same Lambda settings when the user gives none: the model's
    metadata, else LM-Infinite's defaults (the evaluations drop only the rollback margin)."""
    import argparse

    from llama_extrapolate import AttentionConfig, cli
    from llama_extrapolate.harness.evaluate import setup_for

    args = argparse.Namespace(sinks=None, window=None, ceiling=None, top_k=None, top_k_layer=None,
                              top_k_distance=None, profile=None)
    run = cli._attention_from_args(args, info).resolve(info)
    ev = setup_for("lambda", info, 10_000, 512).attention.resolve(info)
    assert (run.sinks, run.window, run.ceiling) == (ev.sinks, ev.window, ev.ceiling) == (10, 8192, 8192)
    assert ev.rollback == 0 and run.rollback == AttentionConfig().resolve(info).rollback
    given = setup_for("lambda", info, 10_000, 512, window=64, sinks=4).attention.resolve(info)
    args.window, args.sinks = 64, 4
    assert (given.sinks, given.window, given.ceiling) == (4, 64, 64)
    run = cli._attention_from_args(args, info).resolve(info)
    assert (run.sinks, run.window, run.ceiling) == (4, 64, 64)


def test_memory_configurations_name_their_blocks(info, capsys):
    """"lambda+memory" selects the default m (run's and serve's too); "lambda+memory:m=N" another, with the same
    cache (the selected blocks are in the graph, patch 0012), "lambda+memory:m=N:c=C" with C candidates (by default
    4m, patch 0012); a malformed m or c is named, and nll refuses every memory configuration."""
    from llama_extrapolate import cli
    from llama_extrapolate.config import DEFAULT_MEMORY_BLOCK, DEFAULT_MEMORY_BLOCKS, MEMORY_CANDIDATES_PER_BLOCK
    from llama_extrapolate.harness.evaluate import memory_blocks_of, memory_config_name, setup_for

    default = setup_for("lambda+memory", info, 20_000, 512, window=1024)
    base = setup_for("lambda+memory:m=16", info, 20_000, 512, window=1024)
    more = setup_for("lambda+memory:m=64", info, 20_000, 512, window=1024)
    assert default.attention.memory_blocks == DEFAULT_MEMORY_BLOCKS
    assert base.attention.memory_blocks == 16 and more.attention.memory_blocks == 64
    assert more.n_ctx == base.n_ctx == 10 + 1024 + 512 + DEFAULT_MEMORY_BLOCK
    c = MEMORY_CANDIDATES_PER_BLOCK * DEFAULT_MEMORY_BLOCKS
    assert memory_config_name("lambda+memory") == f"lambda+memory:m={DEFAULT_MEMORY_BLOCKS}:c={c}"
    assert memory_config_name("lambda+memory:m=16") == f"lambda+memory:m=16:c={16 * MEMORY_CANDIDATES_PER_BLOCK}"
    assert memory_config_name("lambda+memory:m=16:c=0") == "lambda+memory:m=16:c=0"
    assert memory_config_name("lambda") == "lambda"
    assert default.attention.resolve(info).memory_candidates == c
    assert setup_for("lambda+memory:m=16:c=0", info, 20_000, 512).attention.resolve(info).memory_candidates == 0
    for bad in ("lambda+memory:m=16:c=16", "lambda+memory:m=16:c=x"):
        with pytest.raises(ValueError, match=r"c must be 0 \(the bound selects\) or a whole number > m"):
            setup_for(bad, info, 20_000, 512)
    assert base.top_k_question and more.top_k_question and more.memory_capacity == base.memory_capacity
    assert memory_blocks_of("lambda") is None and memory_blocks_of("lambda+memoryx") is None
    for bad in ("lambda+memory:m=0", "lambda+memory:m=x", "lambda+memory:m="):
        with pytest.raises(ValueError, match=r"m must be a whole number >= 1, as in lambda\+memory:m=64"):
            setup_for(bad, info, 20_000, 512)
    # ":layer": the KV heads of a layer select the same blocks (the document memory's patch, 0012)
    layer = setup_for("lambda+memory:m=16:c=0:layer", info, 20_000, 512, window=1024)
    assert layer.attention.resolve(info).memory_selection == "layer" and base.attention.memory_selection == "head"
    assert memory_config_name("lambda+memory:layer") == f"lambda+memory:m={DEFAULT_MEMORY_BLOCKS}:c={c}:layer"
    assert memory_config_name("lambda+memory:m=16:layer") == f"lambda+memory:m=16:c={16 * MEMORY_CANDIDATES_PER_BLOCK}:layer"
    # ":passages": every key of the selected blocks, in the order of the text (top_k = m * B)
    passages = setup_for("lambda+memory:m=16:c=64:passages:layer", info, 20_000, 512, window=1024).attention
    assert passages.top_k == 16 * DEFAULT_MEMORY_BLOCK and passages.memory_selection == "layer"
    assert base.attention.top_k == 5
    c16 = 16 * MEMORY_CANDIDATES_PER_BLOCK
    assert memory_config_name("lambda+memory:m=16:passages") == f"lambda+memory:m=16:c={c16}:passages"
    assert memory_config_name("lambda+memory:passages:layer").endswith(":passages:layer")
    # ":q4_0": the store's type, passed to Llama; left out, the q8_0 store such names ran with (not the library's
    # default, q4_0, which Llama takes when not told)
    assert setup_for("lambda+memory:m=16:q4_0", info, 20_000, 512).llama_kwargs()["memory_type"] == "q4_0"
    assert base.llama_kwargs()["memory_type"] == "q8_0"
    kv = layer.attention.resolve(info).kv_overrides("llama")
    assert kv["llama.attention.lambda.memory_per_layer"] is True
    assert base.attention.resolve(info).kv_overrides("llama")["llama.attention.lambda.memory_per_layer"] is False
    assert cli.main(["nll", "--configs", "lambda,lambda+memory:m=64", "--tokens", "64", "-o", "/dev/null"]) == 2
    assert "--configs lambda+memory:m=64: its middle keys are switched on" in capsys.readouterr().err


def test_model_info_is_read_once_per_file_version(default_model, tmp_path):
    import os
    import shutil

    from llama_extrapolate import read_model_info

    assert read_model_info(default_model) is read_model_info(default_model)
    copy = tmp_path / "m.gguf"
    shutil.copyfile(default_model, copy)
    first = read_model_info(copy)
    assert read_model_info(copy) is first
    os.utime(copy, ns=(first_ns := copy.stat().st_mtime_ns + 10**9, first_ns))
    again = read_model_info(copy)
    assert again is not first and again == first


def test_a_ceiling_on_a_model_without_positions_is_named(info):
    from dataclasses import replace

    from llama_extrapolate import AttentionConfig

    none = replace(info, architecture="gpt2", position_encoding="none", rope_type=None)
    with pytest.raises(ValueError, match="ceiling=32: gpt2 has no position encoding"):
        AttentionConfig(sinks=4, window=32, ceiling=32).resolve(none)


def test_full_attention_asked_for_has_no_sinks(tiny_llama):
    """window=0 (``run --window 0``) on a model whose metadata sets no window: full attention without the default
    sinks (before, the default 10 sinks came along and the configuration was refused)."""
    from llama_extrapolate import AttentionConfig, read_model_info

    info = read_model_info(tiny_llama[1])
    cfg = AttentionConfig.from_model(info, window=0)
    assert cfg.window == 0 and cfg.sinks == 0
    cfg.resolve(info)
    with pytest.raises(ValueError, match="sinks=4 with window=0"):  # asked for: kept, and refused
        AttentionConfig.from_model(info, window=0, sinks=4)
