"""The reading-and-asking session every caller shares: its chunks compute what one decode computes, its progress
and interrupts land between chunks, its greedy answer is llama-cpp-python's, and a hold of the document memory
around a question and its answer is always released."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import random_tokens, tiny_llm

TEXT = ("The old lighthouse keeper climbed the stairs every evening at dusk. He lit the lamp, wound the clock and "
        "wrote one line in his logbook about the weather, the ships and the birds he had seen that day. In winter "
        "the storms came from the north, and in summer the fog rolled in from the sea.")


def last_logits(llm) -> np.ndarray:
    from llama_extrapolate import native

    return native.last_logits(llm.ctx, llm.n_vocab()).astype(np.float64)


@pytest.fixture
def fresh(small_llm):
    """The session-wide llama_cpp.Llama on the default model, from an empty stream."""
    small_llm.reset()
    return small_llm


@pytest.fixture(scope="module")
def text_tokens(small_llm):
    tokens = small_llm.tokenize(TEXT.encode("utf-8"), add_bos=True)
    assert 40 < len(tokens) < small_llm.n_batch, "one eval must be one decode for the comparison"
    return tokens


def test_reading_in_chunks_gives_one_decodes_logits(fresh, text_tokens):
    from llama_extrapolate.session import Session

    report = Session(fresh, n_batch=16).read(text_tokens)
    chunked = last_logits(fresh)
    assert report.tokens == len(text_tokens) == fresh.n_tokens and report.seconds > 0
    fresh.reset()
    fresh.eval(text_tokens)  # fewer tokens than n_batch: one decode
    whole = last_logits(fresh)
    # bit for bit on the CPU here (each row's work does not depend on the batch); a float32 rounding's room elsewhere
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-3)


def test_progress_counts_every_token(fresh, text_tokens, capsys):
    from llama_extrapolate.session import Session

    Session(fresh, n_batch=16).read(text_tokens, progress=True, desc="lighthouse")
    err = capsys.readouterr().err
    assert "lighthouse" in err and f"{len(text_tokens)}/{len(text_tokens)}" in err


def test_an_interrupt_between_chunks_stops_the_read(fresh, text_tokens, monkeypatch):
    """A Ctrl-C swallowed inside llama.cpp's callbacks (recorded by the interrupt handler) stops the read before the
    next chunk, not after the whole document."""
    from llama_extrapolate import interrupt
    from llama_extrapolate.session import Session

    decode = fresh.eval

    def decode_then_interrupt(tokens):
        decode(tokens)
        monkeypatch.setattr(interrupt, "_pending", True)

    monkeypatch.setattr(fresh, "eval", decode_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        Session(fresh, n_batch=16).read(text_tokens)
    assert fresh.n_tokens == 16


def test_the_greedy_answer_is_llama_cpp_pythons(fresh, text_tokens):
    from llama_extrapolate.session import Session

    question = fresh.tokenize(b" Where did the fog come from in summer? It came from the", add_bos=False)
    session = Session(fresh)
    session.read(text_tokens)
    asked = session.ask(question)
    steps = list(asked.answer(5))
    got = [asked.token] + [s.token for s in steps]
    assert asked.tokens == len(question) and asked.seconds > 0 and all(s.seconds > 0 for s in steps)

    fresh.reset()
    want = list(itertools.islice(fresh.generate(text_tokens + question, temp=0.0), len(got)))
    assert got == want


def test_bad_input_is_named(fresh):
    from llama_extrapolate.session import Session

    with pytest.raises(ValueError, match="n_batch=0"):
        Session(fresh, n_batch=0)
    with pytest.raises(TypeError, match="expected a llama_extrapolate.Llama"):
        Session("model.gguf")
    session = Session(fresh)
    with pytest.raises(TypeError, match="tokenize it first"):
        session.read("some text")
    with pytest.raises(ValueError, match="no tokens"):
        session.ask([])
    with pytest.raises(ValueError, match="no document memory"):
        session.ask([1, 2], hold=True)
    with pytest.raises(ValueError, match="n=-1"):
        list(session.steps(1, -1))


# --- the document memory's hold (the tiny random llama, as tests/test_memory.py reads it) -----------------------
N_DOC, N_QUESTION, N_ANSWER = 250, 20, 8


def memory_llm(path):
    from llama_extrapolate import AttentionConfig

    attention = AttentionConfig(sinks=4, window=32, ceiling=32, top_k=3, top_k_layer=1, top_k_distance=16,
                                top_k_scope="question", memory_blocks=2, memory_block_size=32, memory_candidates=0)
    return tiny_llm(path, attention, memory_type="f32", memory_capacity=512)


@pytest.fixture
def memory(tiny_llama):
    """(a Llama with the document memory that has read the document, the question, the calls to memory_hold)."""
    model, path = tiny_llama
    tokens = random_tokens(model, N_DOC + N_QUESTION, seed=2)
    llm = memory_llm(path)
    calls = []
    hold = llm.memory_hold

    def recording(mode):
        calls.append(mode)
        hold(mode)

    llm.memory_hold = recording
    llm.eval(tokens[:N_DOC])
    llm.set_top_k_active(True)
    yield llm, tokens[N_DOC:], calls
    llm.close()


def test_a_held_answer_is_memory_hold_by_hand(memory, tiny_llama):
    from llama_extrapolate import native
    from llama_extrapolate.session import Session

    llm, question, calls = memory
    with Session(llm).ask(question, hold=True) as asked:
        assert asked.held and calls == ["keep", "hold"]
        got = [asked.token] + [s.token for s in asked.answer(N_ANSWER)]
    assert not asked.held and calls == ["keep", "hold", "select"]

    _, path = tiny_llama
    by_hand = memory_llm(path)
    try:
        by_hand.eval(random_tokens(tiny_llama[0], N_DOC, seed=2))
        by_hand.set_top_k_active(True)
        by_hand.memory_hold("keep")
        by_hand.eval(question)
        by_hand.memory_hold("hold")
        want = [native.greedy_next(by_hand)]
        for _ in range(N_ANSWER):
            by_hand.eval(want[-1:])
            want.append(native.greedy_next(by_hand))
        by_hand.memory_hold("select")
    finally:
        by_hand.close()
    assert got == want


def test_the_hold_is_released_after_an_exception(memory, monkeypatch):
    from llama_extrapolate import interrupt
    from llama_extrapolate.session import Session

    llm, question, calls = memory
    with pytest.raises(RuntimeError, match="mid-answer"):
        with Session(llm).ask(question, hold=True) as asked:
            next(asked.answer(3))
            raise RuntimeError("mid-answer")
    assert calls == ["keep", "hold", "select"]

    calls.clear()
    monkeypatch.setattr(interrupt, "_pending", True)  # a Ctrl-C while the question is read
    with pytest.raises(KeyboardInterrupt):
        Session(llm).ask(question, hold=True)
    assert calls == ["keep", "select"]
