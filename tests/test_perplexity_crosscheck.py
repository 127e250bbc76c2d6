"""Our perplexity equals llama.cpp's own `llama-perplexity` on the same text, model and chunking.

`llama-perplexity` is built by tools/upstream.py from the llama.cpp tree `pip install .` patched (the same commit
and patches as the library under test); it needs that build directory, so an install from a wheel skips this.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from conftest import upstream_binary


@pytest.fixture(scope="module")
def llama_perplexity():
    return upstream_binary("llama-perplexity")


def test_chunked_perplexity_matches_llama_perplexity(tmp_path, llama_perplexity):
    from llama_extrapolate import AttentionConfig, Llama
    from llama_extrapolate.harness.corpora import paul_graham_essays
    from llama_extrapolate.harness.evaluate import chunked_perplexity
    from llama_extrapolate.default_model import default_model_path

    model = str(default_model_path())
    n_ctx, chunks = 256, 4
    text = paul_graham_essays()[:8000]
    doc = tmp_path / "essays.txt"
    doc.write_text(text, encoding="utf-8")
    run = subprocess.run([str(llama_perplexity), "-m", model, "-f", str(doc), "-c", str(n_ctx), "-b", str(n_ctx),
                          "--chunks", str(chunks), "-t", "2", "-fa", "off", "--no-warmup"],
                         capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-2000:]
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", log)]
    assert final and len(running) == chunks, log[-2000:]

    llm = Llama(model, attention=AttentionConfig.vanilla(), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                n_threads=2, verbose=False)
    try:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        ours = chunked_perplexity(llm, tokens, n_ctx, n_chunks=chunks)
    finally:
        llm.close()
    assert ours.count == chunks * (n_ctx - 1 - n_ctx // 2)
    # the tool prints 4 decimals (running values, PPL) and 5 for the uncertainty
    assert ours.ppl == pytest.approx(float(final.group(1)), abs=6e-4)
    assert ours.uncertainty == pytest.approx(float(final.group(2)), abs=6e-5)
    assert np.allclose(ours.running, running, atol=6e-4)
    print(f"llama-perplexity {final.group(1)} +/- {final.group(2)}; ours {ours.ppl:.6f} +/- {ours.uncertainty:.6f}")


def test_chunked_perplexity_rejects_short_input(tiny_llama):
    from llama_extrapolate import AttentionConfig, Llama
    from llama_extrapolate.harness.evaluate import chunked_perplexity

    _, path = tiny_llama
    llm = Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=64, n_batch=64, verbose=False)
    try:
        with pytest.raises(ValueError, match="needs at least 2 \\* n_ctx = 64"):
            chunked_perplexity(llm, list(range(3, 40)), 32)
        cells = llm.n_ctx()  # llama.cpp rounds the context up to 256 cells
        with pytest.raises(ValueError, match=f"n_ctx={2 * cells} is larger"):
            chunked_perplexity(llm, [5] * (4 * cells), 2 * cells)
    finally:
        llm.close()
