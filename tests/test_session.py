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
        want = [int(np.argmax(last_logits(by_hand)))]
        for _ in range(N_ANSWER):
            by_hand.eval(want[-1:])
            want.append(int(np.argmax(last_logits(by_hand))))
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


def test_answer_tokens_stop_before_the_stop_token(fresh, text_tokens):
    """``answer_tokens``: the first token and then a step each, cut before the end-of-text token (the retrieval
    tasks' answer)."""
    from llama_extrapolate.session import Session

    question = fresh.tokenize(b" Where did the fog come from in summer? It came from the", add_bos=False)
    session = Session(fresh)
    session.read(text_tokens)
    asked = session.ask(question)
    want = [asked.token] + [s.token for s in asked.answer(4)]
    for n in (0, 1, 5):
        fresh.reset()
        session.read(text_tokens)
        assert session.ask(question).answer_tokens(n) == want[:n]
    fresh.reset()
    session.read(text_tokens)
    assert session.ask(question).answer_tokens(5, stop=want[2]) == want[:2]
    with pytest.raises(ValueError, match="answer_tokens: n=-1"):
        asked.answer_tokens(-1)


# --- the raw-context backend (the retrieval tasks', with llama.cpp's context shift) ------------------------------
def test_the_raw_context_reads_asks_and_holds_as_the_llama_does(tiny_llama):
    """ContextBackend decodes the same chunks at the same positions as a Llama's eval (LlamaBackend): the question
    asked with the memory's blocks held gets the same answer, step for step, with the same logits."""
    from llama_extrapolate.session import ContextBackend, LlamaBackend, Session

    model, path = tiny_llama
    tokens = random_tokens(model, N_DOC + N_QUESTION, seed=2)
    runs = {}
    for name in ("llama", "context"):
        llm = memory_llm(path)
        backend = LlamaBackend(llm) if name == "llama" else ContextBackend(llm, llm.n_batch)
        try:
            session = Session(backend)
            assert session.has_memory and session.n_batch == 64
            session.read(tokens[:N_DOC])
            llm.set_top_k_active(True)
            with session.ask(tokens[N_DOC:], hold=True) as asked:
                answer, logits = [asked.token], [backend.last_logits().copy()]
                for step in asked.answer(N_ANSWER):
                    answer.append(step.token)
                    logits.append(backend.last_logits().copy())
            runs[name] = answer, np.array(logits, dtype=np.float64)
        finally:
            if name == "context":
                backend.close()
            llm.close()
    assert runs["context"][0] == runs["llama"][0]
    # the Llama reads every row's logits (logits_all), the raw context the last row's only: the same rows
    np.testing.assert_allclose(runs["context"][1], runs["llama"][1], rtol=0, atol=1e-5)


def shifted_by_hand(path, document, question, n_answer, *, cells, n_batch, n_keep):
    """(answer tokens, logits of each greedy choice) of a greedy answer to ``question`` after ``document`` on a plain
    llama_cpp.Llama, llama.cpp's context shift written out with llama_cpp's own calls as llama-cli does it: when a
    chunk does not fit, drop the older half of the tokens after the first n_keep and move the rest back. Nothing of
    llama_extrapolate.native is used, so that it checks the backend rather than restating it."""
    import llama_cpp

    ref = llama_cpp.Llama(str(path), n_ctx=cells, n_batch=n_batch, n_ubatch=n_batch, n_threads=2, type_k=0, type_v=0,
                          verbose=False)
    ctx, batch = ref.ctx, llama_cpp.llama_batch_init(n_batch, 0, 1)
    mem = llama_cpp.llama_get_memory(ctx)
    assert llama_cpp.llama_n_ctx(ctx) == cells
    state = {"n_past": 0, "shifts": 0}

    def decode(chunk):
        n_past = state["n_past"]
        if n_past + len(chunk) > cells:
            n_discard = (n_past - n_keep) // 2
            assert llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
            llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard)
            n_past -= n_discard
            state["shifts"] += 1
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, n_past + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(chunk) - 1
        assert llama_cpp.llama_decode(ctx, batch) == 0
        state["n_past"] = n_past + len(chunk)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(ref.n_vocab(),)).copy()

    try:
        for start in range(0, len(document), n_batch):
            decode(document[start:start + n_batch])
        logits = [decode(question)]
        answer = [int(np.argmax(logits[-1]))]
        for _ in range(n_answer):
            logits.append(decode(answer[-1:]))
            answer.append(int(np.argmax(logits[-1])))
    finally:
        llama_cpp.llama_batch_free(batch)
        ref.close()
    assert state["shifts"] >= 2, "the document must make the cache shift"
    return answer, np.array(logits, dtype=np.float64)


def test_the_context_shift_backend_gives_llama_cpps_context_shift(tiny_llama):
    """The 'context-shift' configuration's logits: a 700-token document through a 256-cell cache (several shifts,
    one while answering) asked through a Session on ContextBackend, against the shift written by hand on a plain
    llama_cpp.Llama."""
    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.session import ContextBackend, Session

    model, path = tiny_llama
    tokens = random_tokens(model, 720, seed=11)
    document, question = tokens[:700], tokens[700:]
    want, want_logits = shifted_by_hand(path, document, question, N_ANSWER, cells=256, n_batch=32, n_keep=4)

    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=256, n_batch=32, n_ubatch=32,
                                  n_threads=2, verbose=False, type_k=0, type_v=0)
    try:
        with ContextBackend(llm, 32, context_shift=4) as backend:
            session = Session(backend)
            session.read(document)
            assert backend.n_past < len(document)  # shifted
            asked = session.ask(question)
            got, logits = [asked.token], [backend.last_logits().copy()]
            for step in asked.answer(N_ANSWER):
                got.append(step.token)
                logits.append(backend.last_logits().copy())
    finally:
        llm.close()
    assert got == want
    # the same decodes on the same cells: bit for bit on the CPU
    np.testing.assert_array_equal(np.array(logits, dtype=np.float64), want_logits)


def test_the_raw_context_refuses_bad_input(tiny_llama):
    import llama_cpp

    import llama_extrapolate
    from llama_extrapolate import AttentionConfig
    from llama_extrapolate.session import ContextBackend, Session

    _, path = tiny_llama
    llm = llama_extrapolate.Llama(str(path), attention=AttentionConfig.vanilla(), n_ctx=256, n_batch=32, n_ubatch=32,
                                  n_threads=2, verbose=False)
    try:
        for n_batch in (0, True, 32.0):
            with pytest.raises(ValueError, match="n_batch="):
                ContextBackend(llm, n_batch)
        for n_keep in (-1, 256, True, 4.0):
            with pytest.raises(ValueError, match=r"context_shift=.*0\.\.255"):
                ContextBackend(llm, 32, context_shift=n_keep)
        with ContextBackend(llm, 32) as backend:
            assert not backend.has_memory
            with pytest.raises(ValueError, match="no document memory"):
                Session(backend).ask([5, 6], hold=True)
    finally:
        llm.close()
    with pytest.raises(TypeError, match="expected a live"):
        ContextBackend(llm, 32)  # closed
    with pytest.raises(TypeError, match="expected a live"):
        ContextBackend("model.gguf", 32)
    vocab = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
    try:
        with pytest.raises(ValueError, match="vocab_only"):
            ContextBackend(vocab, 32)
        with pytest.raises(ValueError, match="vocab_only"):
            Session(vocab)  # a llama_cpp.Llama's vocab_only is in its model_params
    finally:
        vocab.close()
