"""Bad input, table-driven: every case raises (or exits with) a clear error that names the offending value.

Model files are opened in a subprocess, so a crash inside llama.cpp (a segfault, an abort) fails the case
instead of taking pytest down with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


# --- model files --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory, tiny_llama):
    model, good = tiny_llama
    d = tmp_path_factory.mktemp("bad-models")
    raw = Path(good).read_bytes()
    files = {"good": Path(good), "missing": d / "missing.gguf", "directory": d}
    (d / "empty.gguf").write_bytes(b"")
    (d / "text.gguf").write_text("not a model " * 100)
    (d / "header-only.gguf").write_bytes(raw[:64])
    (d / "truncated.gguf").write_bytes(raw[: len(raw) // 2])
    (d / "tail-cut.gguf").write_bytes(raw[:-4096])
    for name in ("empty", "text", "header-only", "truncated", "tail-cut"):
        files[name] = d / f"{name}.gguf"
    files["no-context-length"] = model.write(d / "noctx.gguf", context_length=None)
    files["context-length-0"] = model.write(d / "ctx0.gguf", context_length=0)
    files["unknown-arch"] = model.write(d / "foo.gguf", arch="foo")
    files["no-rope-no-alibi"] = model.write(d / "gpt2.gguf", arch="gpt2")
    return files


MODEL_CASES = [
    # (file, attention config expression, exception class name, text the message must hold)
    ("missing", "None", "ModelNotFoundError", "missing.gguf does not exist"),
    ("directory", "None", "ModelNotFoundError", "is a directory"),
    ("empty", "None", "InvalidModelError", "empty.gguf is not a readable GGUF"),
    ("text", "None", "InvalidModelError", "text.gguf is not a readable GGUF"),
    ("header-only", "None", "InvalidModelError", "header-only.gguf is not a readable GGUF"),
    ("truncated", "None", "InvalidModelError", "truncated.gguf is not a readable GGUF"),
    ("tail-cut", "None", "InvalidModelError", "tail-cut.gguf"),
    ("no-context-length", "None", "InvalidModelError", "no llama.context_length"),
    ("context-length-0", "None", "InvalidModelError", "llama.context_length = 0"),
    ("unknown-arch", "None", "InvalidModelError", "could not load"),
    ("unknown-arch", "None", "InvalidModelError", "unknown model architecture: 'foo'"),  # llama.cpp's reason
    # llama's tensors under gpt2's name: llama.cpp's reason, read before any setting is resolved
    ("no-rope-no-alibi", "AttentionConfig(sinks=4, window=32, ceiling=32)", "InvalidModelError",
     "gpt2.attention.layer_norm_epsilon"),
    ("no-rope-no-alibi", "None", "InvalidModelError", "gpt2"),
]


@pytest.mark.parametrize("name,attention,exc,text", MODEL_CASES, ids=[f"{c[0]}:{c[1][:10]}" for c in MODEL_CASES])
def test_bad_model_file_raises_in_a_subprocess(bad_models, name, attention, exc, text):
    code = textwrap.dedent(f"""
        import sys
        import llama_extrapolate as le
        from llama_extrapolate import AttentionConfig
        try:
            le.Llama({str(bad_models[name])!r}, attention={attention}, n_ctx=256, n_batch=64, verbose=False)
        except Exception as e:
            print("EXC", type(e).__name__, "|", str(e))
            sys.exit(3)
        print("NO ERROR")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, f"exit {r.returncode} (a negative code is a signal: a crash)\n{r.stdout}\n{r.stderr[-2000:]}"
    line = [x for x in r.stdout.splitlines() if x.startswith("EXC ")][-1]
    got_type, message = line[4:].split(" | ", 1)
    assert got_type == exc, line
    assert text in message, line


@pytest.mark.parametrize("positions", [True, False])
def test_a_sequence_id_beyond_n_seq_max_is_an_error_not_an_abort(tiny_llama, positions):
    """A batch for sequence 3 of a two-sequence Lambda context with a KV stream per sequence: llama_decode returns
    an error (before, the position re-basing looked sequence 3 up in the cache's streams and aborted)."""
    _, path = tiny_llama
    code = textwrap.dedent(f"""
        import llama_extrapolate as le
        import llama_cpp
        llm = le.Llama({str(path)!r}, attention=le.AttentionConfig(sinks=4, window=32, ceiling=0), n_ctx=1024,
                       verbose=False)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max, params.kv_unified = 1024, 64, 64, 2, False
        ctx = llama_cpp.llama_init_from_model(llm.model, params)
        batch = llama_cpp.llama_batch_init(4, 0, 1)
        batch.n_tokens = 4
        for i in range(4):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 5, i, 1, 3, True
        if not {positions}:
            batch.pos = None
        print("RC", llama_cpp.llama_decode(ctx, batch))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode} (a negative code is a signal: a crash)\n{r.stderr[-2000:]}"
    rc = int([x for x in r.stdout.splitlines() if x.startswith("RC ")][-1][3:])
    assert rc != 0 and "seq_id" in r.stderr, (rc, r.stderr[-2000:])


def test_llama_cpps_refusal_of_a_context_reaches_the_exception(tiny_llama):
    """llama-cpp-python says only "Failed to create llama_context"; llama.cpp's reason is in its log (on stderr,
    where a caller's code cannot read it): the exception carries it."""
    _, path = tiny_llama
    code = textwrap.dedent(f"""
        import llama_extrapolate as le
        try:
            le.Llama({str(path)!r}, attention=None, n_ctx=256, type_v=8, flash_attn=False, verbose=False)
        except ValueError as e:
            print("EXC", str(e))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "could not create a context" in r.stdout and "quantized V cache requires flash_attn" in r.stdout, r.stdout


# --- configuration values -------------------------------------------------------------------------------------


def _config_cases():
    from llama_extrapolate import AttentionConfig as A

    return [
        ("sinks", lambda m: A(sinks=-1), ValueError, "sinks=-1"),
        ("window", lambda m: A(window=-5), ValueError, "window=-5"),
        ("ceiling", lambda m: A(ceiling=-2), ValueError, "ceiling=-2"),
        ("rollback", lambda m: A(rollback=-1), ValueError, "rollback=-1"),
        ("temperature 0", lambda m: A(temperature=0.0), ValueError, "invalid value 0.0"),
        ("temperature nan", lambda m: A(temperature=float("nan")), ValueError, "invalid value nan"),
        ("temperature per layer", lambda m: _llama(m, A(temperature=[1.0, 0.9, 0.8])), ValueError,
         "temperature has 3 values"),
        ("schedule", lambda m: A(temperature_schedule="cosine"), ValueError, "temperature_schedule='cosine'"),
        ("points order", lambda m: A(temperature_schedule="points", temperature_points=((16384, 0.9), (8192, 1.0))),
         ValueError, "8192 after 16384"),
        ("n_ctx too small", lambda m: _llama(m, A(sinks=4, window=1024)), ValueError, "got n_ctx=256"),
        ("flash with ceiling", lambda m: _llama(m, A(sinks=4, window=32, ceiling=16), n_ctx=1024, flash_attn=True),
         ValueError, "flash_attn=True with ceiling=16"),
        ("quantized V with ceiling", lambda m: _llama(m, A(sinks=4, window=32, ceiling=32), n_ctx=1024, type_k=8,
                                                      type_v=8), ValueError, "type_v=8"),
        ("top-k without window", lambda m: A(window=0, sinks=0, top_k=5), ValueError, "top_k=5 with window=0"),
        ("top-k layer", lambda m: _llama(m, A(sinks=4, window=32, top_k=5, top_k_layer=7), n_ctx=1024), ValueError,
         "top_k_layer=7"),
        ("top-k distance 0", lambda m: A(top_k=5, top_k_distance=0), ValueError, "top_k_distance=0"),
        ("top-k scope", lambda m: A(top_k=5, top_k_scope="prompt"), ValueError, "top_k_scope='prompt'"),
        ("top-k layer without k", lambda m: A(top_k_layer=3), ValueError, "without top_k"),
        ("top-k negative", lambda m: A(top_k=-1), ValueError, "top_k=-1"),
        ("flash with top-k", lambda m: _llama(m, A(sinks=4, window=32, ceiling=0, top_k=2, top_k_layer=1), n_ctx=1024,
                                              flash_attn=True), ValueError, "flash_attn=True with top_k=2"),
        ("attention type", lambda m: _llama(m, "lambda"), TypeError, "attention='lambda'"),
        ("sinks beyond window", lambda m: _llama(m, A(sinks=100, window=10)), ValueError, "sinks=100 > window=10"),
        ("profile not JSON", lambda m: A.from_profile(str(m)), ValueError, "is not a calibration profile"),
    ]


def _llama(model_path, attention, n_ctx=256, **kw):
    from llama_extrapolate import Llama

    llm = Llama(str(model_path), attention=attention, n_ctx=n_ctx, n_batch=64, verbose=False, **kw)
    llm.close()


CONFIG_IDS = ["sinks", "window", "ceiling", "rollback", "temperature 0", "temperature nan", "temperature per layer",
              "schedule", "points order", "n_ctx too small", "flash with ceiling", "quantized V with ceiling",
              "top-k without window", "top-k layer", "top-k distance 0", "top-k scope", "top-k layer without k",
              "top-k negative", "flash with top-k", "attention type", "sinks beyond window", "profile not JSON"]


@pytest.mark.parametrize("case", CONFIG_IDS)
def test_bad_configuration_is_named(tiny_llama, case):
    _, path = tiny_llama
    name, call, exc, text = {c[0]: c for c in _config_cases()}[case]
    with pytest.raises(exc) as err:
        call(path)
    assert text in str(err.value)


def test_vocab_only_tokenizes_and_refuses_to_decode(default_model):
    """A tokenizer-only load works as in llama-cpp-python (it used to fail setting the temperature of a context
    without layers) and decoding or touching the attention names vocab_only instead of an assertion or a crash."""
    import llama_cpp
    from llama_extrapolate import AttentionConfig, Llama

    plain = llama_cpp.Llama(str(default_model), vocab_only=True, verbose=False)
    expected = plain.tokenize(b"The passkey is 31415.")
    plain.close()
    # the Lambda defaults would need n_ctx >= 8970: a tokenizer load must not ask for it
    llm = Llama(str(default_model), attention=AttentionConfig(), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(b"The passkey is 31415.") == expected
        assert llm.detokenize(expected) == b"The passkey is 31415."
        calls = [(lambda: llm.eval(expected), "eval: this Llama was loaded with vocab_only=True"),
                 (lambda: llm("hello", max_tokens=2), "eval: this Llama was loaded with vocab_only=True"),
                 (llm.get_temperature, "get_temperature: this Llama was loaded with vocab_only=True"),
                 (lambda: llm.set_temperature(1.2), "set_temperature: this Llama was loaded with vocab_only=True")]
        for call, text in calls:
            with pytest.raises(ValueError) as err:
                call()
            assert text in str(err.value)
    finally:
        llm.close()


# --- texts ---------------------------------------------------------------------------------------------------


def test_bad_texts_are_named(tmp_path, tiny_llama):
    from llama_extrapolate.harness.corpora import load_corpus
    from llama_extrapolate.reader import read_text_file

    _, model = tiny_llama
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        (lambda: read_text_file(model), ValueError, "is not UTF-8 text"),
        (lambda: read_text_file(empty), ValueError, "empty.txt is empty"),
        (lambda: read_text_file(tmp_path), ValueError, "is a directory"),
        (lambda: read_text_file(tmp_path / "nope.txt"), FileNotFoundError, "nope.txt"),
        (lambda: load_corpus("bible"), ValueError, "corpus 'bible'"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc) as err:
            call()
        assert text in str(err.value), str(err.value)


# --- command line ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    p = tmp_path_factory.mktemp("doc") / "doc.txt"
    p.write_text("a sentence of the document. " * 200)
    return p


CLI_CASES = [
    (["nll", "--tokens", "1"], "--tokens 1"),
    (["nll", "--tokens", "64", "--bucket", "0"], "--bucket 0"),
    (["nll", "--tokens", "64", "--configs", "bogus"], "bogus"),
    (["nll", "--tokens", "64", "--threads", "0"], "--threads 0"),
    (["nll", "--tokens", "64", "--checkpoint-every", "-5"], "--checkpoint-every -5"),
    (["passkey", "--depths", "1.5"], "1.5"),
    (["passkey", "--lengths", "ten"], "ten"),
    (["calibrate", "--lengths", "abc"], "--lengths 'abc'"),
    (["calibrate", "--mode", "pmax", "--granularity", "token"], "token"),
    (["trf", "--eps", "0"], "--eps '0'"),
    (["trf", "--heads", "0"], "--heads 0"),
    (["run", "--file", "/nonexistent/doc.txt", "--prompt", "q"], "/nonexistent/doc.txt"),
    (["run", "--file", "DOC", "--prompt", "q", "--sinks", "100000", "--window", "10"], "sinks=100000 > window=10"),
]


@pytest.mark.parametrize("argv,text", CLI_CASES, ids=[" ".join(c[0][:3]) for c in CLI_CASES])
def test_bad_cli_arguments_exit_2_naming_the_value(argv, text, tiny_llama, doc, tmp_path, capsys):
    from llama_extrapolate import cli

    _, model = tiny_llama
    argv = [str(doc) if a == "DOC" else a for a in argv]
    extra = []
    if argv[0] in ("nll", "passkey", "calibrate", "run"):
        extra += ["--model", str(model)]
    if argv[0] == "nll":
        extra += ["--file", str(doc)]
    if argv[0] == "calibrate":
        extra += ["--text", str(doc)]
    if argv[0] != "run":
        extra += ["-o", str(tmp_path / "out.json")]
    rc = cli.main(argv + extra)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert text in err, err
