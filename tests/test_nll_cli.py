"""``llama-extrapolate nll``: every baseline over the same tokens, incremental JSON, resume, context shift."""

import json

import numpy as np
import pytest

from conftest import random_tokens


def write_text(tmp_path, model, n):
    # the tiny model's vocabulary is bytes: one character per token
    rng = np.random.default_rng(4)
    text = "".join(rng.choice(list("abcdefghij klmnop"), n))
    f = tmp_path / "doc.txt"
    f.write_text(text)
    return f


def test_nll_compares_every_baseline_and_resumes(tmp_path, tiny_llama, monkeypatch):
    from llama_extrapolate import cli
    from llama_extrapolate.harness import evaluate

    model, path = tiny_llama
    doc = write_text(tmp_path, model, 400)
    out = tmp_path / "nll.json"
    configs = "lambda,vanilla,context-shift,window-only,lambda-only,ceiling-only,log-length"
    argv = ["nll", "--model", str(path), "--file", str(doc), "--tokens", "300", "--configs", configs,
            "--bucket", "25", "--n-batch", "32", "--window", "32", "--sinks", "4", "--threads", "2", "--quiet",
            "--output", str(out)]
    assert cli.main(argv) == 0
    res = json.loads(out.read_text())
    assert set(res["configs"]) == set(configs.split(","))
    for name, e in res["configs"].items():
        assert e["complete"] and e["tokens_done"] == 300, name
        assert len(e["buckets"]) == 12 and e["buckets"][-1]["end"] == 299
        assert e["tokens_per_second"] > 0 and e["peak_rss_bytes"] > 0
        assert e["threads"] == 2, name  # each configuration's own: a resumed one may run with other threads
    c = res["configs"]
    assert c["lambda"]["config"]["n_ctx"] < 300 < c["vanilla"]["config"]["n_ctx"]
    assert c["context-shift"]["config"]["n_ctx"] == 64  # the tiny model's training length
    # before anything leaves the window every configuration is full attention (temperature aside)
    first = {n: e["buckets"][0]["nll"] for n, e in c.items() if n != "log-length"}
    assert max(first.values()) - min(first.values()) < 1e-3
    assert out.with_suffix(".png").stat().st_size > 0

    # a rerun with the same tokens computes nothing
    def boom(*a, **k):
        raise AssertionError("a complete configuration was recomputed")

    monkeypatch.setattr(evaluate, "streaming_nll", boom)
    assert cli.main(argv) == 0


def test_interrupted_run_leaves_valid_partial_json(tmp_path, tiny_llama, monkeypatch):
    from llama_extrapolate.harness import evaluate

    model, path = tiny_llama
    tokens = random_tokens(model, 300, seed=9)
    out = tmp_path / "partial.json"
    real = evaluate.streaming_nll

    def interrupted(llm, toks, **kw):
        cb = kw.pop("on_chunk")

        def stop_after_half(nll, done):
            cb(nll, done)
            if done >= 160:
                raise KeyboardInterrupt

        return real(llm, toks, on_chunk=stop_after_half, **kw)

    monkeypatch.setattr(evaluate, "streaming_nll", interrupted)
    monkeypatch.setattr(evaluate.time, "perf_counter", iter(np.arange(0, 1e6, 10.0)).__next__)
    with pytest.raises(KeyboardInterrupt):
        evaluate.compare_nll(str(path), tokens, ["vanilla"], out, bucket=50, n_batch=32, threads=2, progress=False,
                             checkpoint_every=1e-9)
    part = json.loads(out.read_text())
    e = part["configs"]["vanilla"]
    assert not e["complete"] and 160 <= e["tokens_done"] < 300 and len(e["buckets"]) >= 3
    checkpoints = out.with_name("partial.json.checkpoints")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["vanilla.npz", "vanilla.state"]
    with np.load(checkpoints / "vanilla.npz") as meta:
        spent = float(meta["seconds"])  # on the fake clock: tens of seconds
    monkeypatch.undo()
    # stopped again at the first chunk after the resume: the partial entry counts the checkpoint's seconds
    monkeypatch.setattr(evaluate, "streaming_nll", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate.compare_nll(str(path), tokens, ["vanilla"], out, bucket=50, n_batch=32, threads=2, progress=False)
    e = json.loads(out.read_text())["configs"]["vanilla"]
    assert not e["complete"] and e["tokens_done"] == 160 and spent > 10 and e["seconds"] >= spent
    monkeypatch.undo()
    done = evaluate.compare_nll(str(path), tokens, ["vanilla"], out, bucket=50, n_batch=32, threads=2, progress=False)
    e = done["configs"]["vanilla"]
    # the chunk that reached 160 was interrupted in its callback, before its checkpoint: resumed at 128
    assert e["complete"] and e["resumed_from_token"] == 128
    assert not list(checkpoints.iterdir())  # removed once the configuration is complete
    fresh = evaluate.compare_nll(str(path), tokens, ["vanilla"], tmp_path / "fresh.json", bucket=50, n_batch=32,
                                 threads=2, progress=False)["configs"]["vanilla"]
    assert "resumed_from_token" not in fresh
    np.testing.assert_allclose([b["nll"] for b in e["buckets"]], [b["nll"] for b in fresh["buckets"]], atol=1e-6)


def test_context_shift_keeps_the_stream_going(tiny_llama):
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.harness.evaluate import streaming_nll

    model, path = tiny_llama
    tokens = random_tokens(model, 400, seed=10)
    # llama.cpp rounds n_ctx up to a multiple of 256: 256 cells
    small = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=256, n_batch=32,
                                    n_ubatch=32, n_threads=2, verbose=False, type_k=0, type_v=0)
    big = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=512, n_batch=32,
                                  n_ubatch=32, n_threads=2, verbose=False, type_k=0, type_v=0)
    try:
        with pytest.raises(RuntimeError, match="context shift"):
            streaming_nll(small, tokens, progress=False)
        shifted = streaming_nll(small, tokens, progress=False, context_shift=4).nll
        full = streaming_nll(big, tokens, progress=False).nll
        with pytest.raises(ValueError, match="context_shift=200"):
            streaming_nll(small, tokens, progress=False, context_shift=200)
    finally:
        small.close()
        big.close()
    assert np.all(np.isfinite(shifted))
    assert np.abs(shifted[:255] - full[:255]).max() < 1e-4  # identical until the first shift
    assert np.abs(shifted[260:] - full[260:]).max() > 1e-3  # different once tokens were dropped


@pytest.mark.parametrize("args, words", [
    (["--tokens", "1"], "--tokens 1"),
    (["--configs", "magic"], "configuration 'magic'"),
    (["--configs", "lambda,lambda+top-k"], "use it with the passkey command"),
    (["--configs", ""], "--configs is empty"),
    (["--corpus", "klingon"], "corpus 'klingon'"),
    (["--bucket", "0"], "--bucket 0"),
])
def test_nll_bad_input(tmp_path, tiny_llama, capsys, args, words):
    from llama_extrapolate import cli

    _, path = tiny_llama
    doc = tmp_path / "d.txt"
    doc.write_text("x" * 500)
    base = ["nll", "--model", str(path), "--tokens", "100", "--quiet", "--output", str(tmp_path / "o.json")]
    if "--corpus" not in args:
        base += ["--file", str(doc)]
    assert cli.main(base + args) == 2
    assert words in capsys.readouterr().err


def test_nll_refuses_short_and_binary_texts(tmp_path, tiny_llama, capsys):
    from llama_extrapolate import cli

    _, path = tiny_llama
    short = tmp_path / "s.txt"
    short.write_text("short")
    assert cli.main(["nll", "--model", str(path), "--file", str(short), "--tokens", "100", "--quiet"]) == 2
    assert "fewer than --tokens 100" in capsys.readouterr().err
    binary = tmp_path / "b.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert cli.main(["nll", "--model", str(path), "--file", str(binary), "--tokens", "100", "--quiet"]) == 2
    assert "not UTF-8" in capsys.readouterr().err
