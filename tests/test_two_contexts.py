"""Two contexts with different attention configurations in one process: alternately and from two threads,
each gives what it gives alone (the patches keep their state per context, none in globals)."""

from __future__ import annotations

import threading

import numpy as np

from conftest import random_tokens


def _configs():
    from llama_extrapolate import AttentionConfig

    return {
        "vanilla": (AttentionConfig.vanilla(), 512),
        "lambda": (AttentionConfig(sinks=2, window=24, ceiling=24, rollback=0, temperature=0.8), 256),
    }


def _open(path, name):
    from llama_extrapolate import Llama

    cfg, n_ctx = _configs()[name]
    return Llama(str(path), attention=cfg, n_ctx=n_ctx, n_batch=40, n_ubatch=40, n_threads=1, logits_all=True,
                 verbose=False)


def _chunks(tokens, size=40):
    return [tokens[i:i + size] for i in range(0, len(tokens), size)]


def _alone(path, name, tokens):
    llm = _open(path, name)
    try:
        for c in _chunks(tokens):
            llm.eval(c)
        return np.array(llm.scores[: llm.n_tokens], copy=True)
    finally:
        llm.close()


def test_alternating_and_threaded_contexts_match_each_alone(tiny_llama):
    model, path = tiny_llama
    tokens = random_tokens(model, 200, seed=11)
    ref = {name: _alone(path, name, tokens) for name in _configs()}
    assert not np.allclose(ref["vanilla"][-50:], ref["lambda"][-50:])  # the configurations do differ

    # alternately: one chunk each in turn
    llms = {name: _open(path, name) for name in _configs()}
    try:
        for c in _chunks(tokens):
            for llm in llms.values():
                llm.eval(c)
        for name, llm in llms.items():
            assert np.array_equal(np.asarray(llm.scores[: llm.n_tokens]), ref[name]), name
    finally:
        for llm in llms.values():
            llm.close()

    # from two threads at once, several rounds
    results, errors = {}, []

    def work(name):
        try:
            for rep in range(3):
                results[(name, rep)] = _alone(path, name, tokens)
        except Exception as e:  # reported below: a thread's exception would otherwise be lost
            errors.append((name, e))

    threads = [threading.Thread(target=work, args=(name,)) for name in _configs()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for (name, rep), scores in results.items():
        assert np.array_equal(scores, ref[name]), (name, rep)
    assert len(results) == 6
