"""Ctrl-C during `nll`, `passkey` and `calibrate`: the partial results on disk are valid and a rerun resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest


def _cli(*args):
    return [sys.executable, "-m", "llama_extrapolate.cli", *args]


def _interrupt_when(cmd, ready, timeout=240.0):
    """Start cmd, send SIGINT as soon as ready() holds; returns (exit code, stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"finished (exit {p.returncode}) before it could be interrupted:\n{err[-2000:]}")
            try:
                if ready():
                    break
            except (OSError, ValueError, KeyError):
                pass  # a file being replaced
            time.sleep(0.02)
        else:
            pytest.fail("never reached the point to interrupt")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, err


@pytest.fixture(scope="module")
def long_doc(tmp_path_factory):
    import random

    rng = random.Random(5)
    words = ["river", "stone", "light", "paper", "north", "quiet", "glass", "field", "ember", "orbit"]
    p = tmp_path_factory.mktemp("doc") / "doc.txt"
    p.write_text(" ".join(rng.choice(words) for _ in range(6000)))
    return p


def test_nll_interrupted_keeps_complete_configs_and_resumes(tmp_path, tiny_llama, long_doc):
    _, model = tiny_llama
    out = tmp_path / "nll.json"
    cmd = _cli("nll", "--model", str(model), "--file", str(long_doc), "--tokens", "12000", "--bucket", "1000",
               "--configs", "lambda,vanilla", "--window", "32", "--sinks", "4", "--n-batch", "200", "--threads", "1",
               "--quiet", "-o", str(out))

    def ready():
        c = json.loads(out.read_text())["configs"]
        return c.get("lambda", {}).get("complete") and "vanilla" in c

    rc, err = _interrupt_when(cmd, ready)
    assert rc == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    partial = json.loads(out.read_text())  # valid JSON
    assert partial["configs"]["lambda"]["complete"] and not partial["configs"]["vanilla"]["complete"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    final = json.loads(out.read_text())
    assert final["configs"]["vanilla"]["complete"] and final["configs"]["vanilla"]["tokens_done"] == 12000
    # the complete configuration was not run again
    assert final["configs"]["lambda"]["seconds"] == partial["configs"]["lambda"]["seconds"]


def test_passkey_interrupted_keeps_trials_and_resumes(tmp_path, tiny_llama):
    _, model = tiny_llama
    out = tmp_path / "pk.json"
    cmd = _cli("passkey", "--model", str(model), "--lengths", "300,600,900", "--depths", "0,0.5,1", "--trials", "2",
               "--configs", "lambda,vanilla", "--window", "32", "--sinks", "4", "--n-batch", "64", "--threads", "1",
               "--quiet", "-o", str(out))

    def count(res):
        return len(res.get("trials", []))

    rc, err = _interrupt_when(cmd, lambda: count(json.loads(out.read_text())) >= 3)
    assert rc == 130, err[-2000:]
    partial = json.loads(out.read_text())
    assert 3 <= count(partial) < 3 * 3 * 2 * 2
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    final = json.loads(out.read_text())
    assert count(final) == 3 * 3 * 2 * 2
    # the trials done before the interruption are kept as they were
    assert final["trials"][: count(partial)] == partial["trials"]


def test_calibrate_interrupted_resumes_to_the_same_profile(tmp_path, tiny_llama, long_doc):
    _, model = tiny_llama
    args = ["calibrate", "--model", str(model), "--text", str(long_doc), "--training-length", "64",
            "--lengths", "1024,2048", "--mode", "pmax", "--tol", "0.002", "--n-batch", "256", "--threads", "1",
            "--quiet"]
    ref = tmp_path / "ref.json"
    assert subprocess.run(_cli(*args, "-o", str(ref)), capture_output=True, timeout=600).returncode == 0
    out = tmp_path / "cal.json"
    passes = tmp_path / "cal.json.passes"
    rc, err = _interrupt_when(_cli(*args, "-o", str(out)),
                              lambda: len(json.loads(passes.read_text())["passes"]) >= 2)
    assert rc == 130, err[-2000:]
    assert not out.exists()
    n_before = len(json.loads(passes.read_text())["passes"])
    done = subprocess.run(_cli(*args[:-1], "-o", str(out)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming with {n_before} passes" in done.stderr
    got, want = json.loads(out.read_text()), json.loads(ref.read_text())
    assert [(e["length"], e["tau"]) for e in got["entries"]] == [(e["length"], e["tau"]) for e in want["entries"]]


def test_a_second_run_on_the_same_results_file_is_refused(tmp_path, tiny_llama, capsys):
    """Two runs resuming one file would each rewrite it without the other's trials: the second is refused at its
    start, naming the holder, and the file is free again once the first ends, however it ends (a kill included)."""
    import os

    from llama_extrapolate import cli
    from llama_extrapolate.harness import evaluate
    from llama_extrapolate.jsonfile import one_writer

    _, model = tiny_llama
    out = tmp_path / "pk.json"
    lock = tmp_path / "pk.json.lock"
    args = ["passkey", "--model", str(model), "--lengths", "300", "--depths", "0", "--trials", "1", "--configs",
            "lambda", "--window", "32", "--sinks", "4", "--n-batch", "64", "--threads", "1", "--quiet", "-o", str(out)]
    with one_writer(out):
        assert lock.read_text().strip() == str(os.getpid())
        assert cli.main(args) == 2
        assert f"{out} is being written by another run (pid {os.getpid()})" in capsys.readouterr().err
        # calibrate's profile too: its passes file is resumed the same way
        text = tmp_path / "text.txt"
        text.write_text("river stone light " * 200)
        assert cli.main(["calibrate", "--model", str(model), "--text", str(text), "--training-length", "64",
                         "--lengths", "128", "--quiet", "-o", str(out)]) == 2
        assert f"{out} is being written by another run" in capsys.readouterr().err
        with pytest.raises(RuntimeError, match="another output file"):
            evaluate.compare_nll(str(model), list(range(100)), ["lambda"], out, bucket=50, n_batch=32, threads=1,
                                 progress=False)
    assert not out.exists() and not lock.exists()
    assert cli.main(args) == 0 and len(json.loads(out.read_text())["trials"]) == 1
    assert not lock.exists()
    with pytest.raises(ZeroDivisionError):
        with one_writer(out):
            1 / 0
    with one_writer(out):
        pass
    # a holder killed outright: its lock file stays, its lock does not
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from llama_extrapolate.jsonfile import one_writer\n"
                               f"with one_writer({str(out)!r}):\n"
                               "    print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=f"pid {holder.pid}"):
            with one_writer(out):
                pass
        holder.kill()
        holder.wait(timeout=30)
        assert lock.exists()
        with one_writer(out):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()


def test_an_unwritable_results_directory_is_named_before_the_run(tmp_path, tiny_llama, capsys):
    from llama_extrapolate import cli

    _, model = tiny_llama
    not_a_directory = tmp_path / "results"
    not_a_directory.write_text("a file where the directory should be")
    out = not_a_directory / "pk.json"
    args = ["passkey", "--model", str(model), "--lengths", "300", "--depths", "0", "--trials", "1", "--configs",
            "lambda", "--window", "32", "--sinks", "4", "--n-batch", "64", "--threads", "1", "--quiet", "-o", str(out)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"cannot write results to {out}" in err and "writable directory" in err, err
