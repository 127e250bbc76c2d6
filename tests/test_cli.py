"""`llama-extrapolate info`, run as a user would (child processes, so a crash is a failure)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "llama_extrapolate", *args],
                          capture_output=True, text=True, env=clean_env(), timeout=timeout)


def test_info_default_model_text():
    proc = cli("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "context length   8192" in out
    assert "architecture     llama" in out
    assert "RoPE, normal, base 100000" in out
    assert "layers           30" in out
    assert "heads            9" in out
    assert "KV heads         3" in out
    assert "llama.cpp commit   0c1e570" in out
    # the library names the patches it was built with: the series in patches/, every one of them
    for patch in sorted((Path(__file__).resolve().parents[1] / "patches").glob("*.patch")):
        assert patch.name in out


def test_info_console_script_json(default_model):
    script = Path(sys.executable).parent / "llama-extrapolate"
    if not script.exists():
        pytest.skip(f"console script not installed beside {sys.executable}")
    proc = subprocess.run([str(script), "info", "--json", "--model", str(default_model)],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    model = facts["model"]
    assert model["context_length"] == 8192
    assert model["architecture"] == "llama"
    assert (model["block_count"], model["head_count"], model["head_count_kv"]) == (30, 9, 3)
    assert model["position_encoding"] == "rope" and model["rope_type"] == "normal"
    assert model["rope_freq_base"] == 100000.0
    lib = facts["library"]
    assert lib["llama_cpp_commit"] == "0c1e570"
    assert lib["llama_cpp_python"] == "0.3.36"
    assert Path(lib["library"]).name == "libllama.so"


def _write_gguf(path, *, context_length=True):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    if context_length:
        writer.add_context_length(64)
    writer.add_head_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("case", ["missing", "text", "truncated-header", "truncated-data", "no-context-length"])
def test_info_bad_model_is_a_clear_error(case, tmp_path, default_model):
    path = tmp_path / f"{case}.gguf"
    if case == "text":
        path.write_text("this is not a model\n")
    elif case.startswith("truncated"):
        data = default_model.read_bytes()
        path.write_bytes(data[:4096] if case == "truncated-header" else data[: len(data) // 2])
    elif case == "no-context-length":
        _write_gguf(path, context_length=False)
    proc = cli("info", "--model", str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # an error exit, not a crash
    assert "error:" in proc.stderr
    assert str(path) in proc.stderr
    if case == "no-context-length":
        assert "llama.context_length" in proc.stderr


def test_sampling_and_softmax_temperatures_have_different_names(capsys):
    """`run --sampling-temperature` is the sampler's; the attention's softmax temperature comes from --profile,
    so no flag of run is called plain --temperature (it used to be the sampler's, unlike every other one)."""
    from llama_extrapolate import cli

    run = cli.build_parser()._subparsers._group_actions[0].choices["run"]
    flags = {f for a in run._actions for f in a.option_strings}
    assert "--sampling-temperature" in flags and "--temperature" not in flags
    assert cli.main(["run", "--file", __file__, "--prompt", "x", "--sampling-temperature", "-1"]) == 2
    assert "--sampling-temperature -1.0 must be >= 0" in capsys.readouterr().err


def test_trf_theory_and_model_windows_have_different_names():
    from llama_extrapolate import cli

    trf = cli.build_parser()._subparsers._group_actions[0].choices["trf"]
    flags = {f for a in trf._actions for f in a.option_strings}
    assert {"--rpe-window", "--rpe-sinks", "--window", "--sinks"} <= flags
    assert not {"--erf-window", "--erf-sinks"} & flags


def test_run_refuses_n_ctx_where_it_has_no_effect(capsys, tmp_path):
    from llama_extrapolate import cli

    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    assert cli.main(["run", "--file", str(doc), "--prompt", "x", "--window", "64", "--n-ctx", "10"]) == 2
    err = capsys.readouterr().err
    assert "n_ctx=10 has no effect with window=64" in err


@pytest.mark.parametrize("flag, value", [("--memory-selection", "layer"), ("--memory-candidates", "256"),
                                         ("--passages", None), ("--memory-answer", "hold"),
                                         ("--memory-select-tokens", "32")])
def test_run_refuses_memory_options_without_the_memory(capsys, tmp_path, flag, value):
    from llama_extrapolate import cli

    doc = tmp_path / "doc.txt"
    doc.write_text("A short document.\n")
    given = [flag] if value is None else [flag, value]
    assert cli.main(["run", "--file", str(doc), "--prompt", "x", "--memory-blocks", "0", *given]) == 2
    assert f"{' '.join(given)} without the document memory" in capsys.readouterr().err


@pytest.mark.parametrize("given, top_k", [([], 5), (["--top-k", "8"], 8), (["--passages"], 64 * 64),
                                          (["--passages", "--memory-blocks", "16", "--memory-block-size", "32"],
                                           16 * 32)])
def test_run_passages_read_every_key_of_the_selected_blocks(default_model, given, top_k):
    """--passages sets top-k to M*B (the passages mode: whole blocks in the order of the text), as the benchmark's
    ":passages" configurations do; --top-k beside it is refused, not silently overridden."""
    from llama_extrapolate import cli, read_model_info

    args = cli.build_parser().parse_args(["run", "--file", __file__, "--prompt", "x", "--memory-blocks", "64",
                                          *given])
    cfg = cli._attention_from_args(args, read_model_info(default_model))
    assert cfg.top_k == top_k and cfg.top_k_scope == "question"
    args = cli.build_parser().parse_args(["run", "--file", __file__, "--prompt", "x", "--memory-blocks", "64",
                                          "--passages", "--top-k", "5"])
    with pytest.raises(ValueError, match="--passages with --top-k 5: .*drop one of them"):
        cli._attention_from_args(args, read_model_info(default_model))


def test_shared_options_are_declared_once():
    """Each shared option has one definition: the same help text in every command that takes it (calibrate's
    --corpus is its own: it reads only the essays; rpc-server's --threads compute other machines' layers)."""
    from llama_extrapolate import cli

    helps = {}
    for name, cmd in cli.build_parser()._subparsers._group_actions[0].choices.items():
        for action in cmd._actions:
            for flag in action.option_strings:
                if flag in ("--model", "--n-batch", "--threads", "--sinks", "--window", "--corpus") and (
                        name != "calibrate" or flag != "--corpus") and name != "rpc-server":
                    helps.setdefault(flag, set()).add(action.help)
    assert set(helps) == {"--model", "--n-batch", "--threads", "--sinks", "--window", "--corpus"}
    assert all(len(h) == 1 for h in helps.values()), helps
