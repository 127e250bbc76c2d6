"""`llama-extrapolate serve` as a client sees it: a subprocess on a free port, asked with the official openai client.

One server (default model, window 1024, the document memory) serves most tests in turn, as a chat front-end would:
a long document, the second question about it, two clients at once, a client that leaves mid-answer, requests it
must refuse. The reading is the slow part (about 20k tokens once), so the tests share that stream.
"""

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the server tests need the openai client: pip install '.[test]'")
pytest.importorskip("llama_cpp.server.app", reason="llama-extrapolate serve needs llama-cpp-python[server]")
import httpx  # noqa: E402  (installed with openai)

from conftest import at_once, clean_env  # noqa: E402
from llama_extrapolate.harness.corpora import paul_graham_essays  # noqa: E402
from llama_extrapolate.server import ServerProcess, free_port  # noqa: E402

WINDOW = 1024
CAPACITY = 32768


class Server(ServerProcess):
    def __init__(self, *args: str, tmp_path) -> None:
        super().__init__(*args, log_path=tmp_path / "serve.log", env=clean_env())
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=900, max_retries=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server("--window", str(WINDOW), "--memory_capacity", str(CAPACITY), "--n_threads", "2",
               tmp_path=tmp_path_factory.mktemp("serve"))
    yield s
    s.stop()


def document(n_chars: int) -> str:
    return paul_graham_essays()[:n_chars]


QUESTION = "In one sentence, what is the text above about?"


def planted(text: str, key: int, at: int) -> str:
    """text with a pass key planted at character ``at``."""
    return f"{text[:at]}\nThe pass key is {key}. Remember it. {key} is the pass key.\n{text[at:]}"


def library_answer(prompt: str, max_tokens: int, **settings) -> str:
    """llama_extrapolate.Llama's greedy completion of prompt with the server's settings (and its batch sizes)."""
    from llama_extrapolate import Llama
    from llama_extrapolate.server import ExtrapolateModelSettings, attention_settings

    built = attention_settings(ExtrapolateModelSettings(**settings))
    llm = Llama(built["model"], n_ctx=built["n_ctx"], n_threads=2, n_batch=512, n_ubatch=512, verbose=False,
                **built["kwargs"])
    try:
        return llm.create_completion(prompt, max_tokens=max_tokens, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()


def assert_passkey_found(server, seed: int = 1) -> None:
    """A request served with the answer to its prompt: a random pass key planted in a short document is the one
    the greedy completion of "The pass key is" gives (not any text: a server answering something else fails)."""
    key = int(np.random.default_rng(seed).integers(10_000, 100_000))
    prompt = planted(document(1500), key, 700) + "\n\nWhat is the pass key? The pass key is"
    r = server.client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    assert str(key) in r.choices[0].text, (key, r.choices[0].text)


def ask(server, content: str, max_tokens: int = 16, stream: bool = False, **kw):
    messages = [{"role": "user", "content": content}]
    if not stream:
        r = server.client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                  temperature=0, **kw)
        return r.choices[0].message.content, r.usage
    pieces = []
    for chunk in server.client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                       temperature=0, stream=True, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return "".join(pieces), None


def test_long_document_then_second_question_reuses_the_stream(server):
    """A 20k-token prompt (far beyond the window's 1,024 and the cache's cells) is answered; the second question
    about the same document reads only the new tokens, streamed, and answers with the pass key planted near its
    end."""
    key = int(np.random.default_rng(4).integers(10_000, 100_000))
    doc = planted(document(85_000), key, 85_000 - 500)  # about 20k tokens of SmolLM2
    text, usage = ask(server, f"{doc}\n\n{QUESTION}")
    assert usage.prompt_tokens > 20_000, usage
    assert text.strip(), "empty answer"
    first = server.stats()
    assert first["last_prompt"]["read"] == usage.prompt_tokens and first["last_prompt"]["reused"] == 0, first
    assert first["memory"]["n_blocks"] > 250, first  # what left the window went to the memory

    text2, _ = ask(server, f"{doc}\n\nWhat is the pass key in the text above?", stream=True)
    assert str(key) in text2, (key, text2)
    second = server.stats()["last_prompt"]
    assert second["reused"] > usage.prompt_tokens - 64, second  # the document was not read again
    assert second["read"] < 64, second
    assert second["seconds"] < first["last_prompt"]["seconds"] / 5, (first, second)


def test_two_clients_at_once_do_not_mix(server):
    """Two documents asked at the same time are served in turn, each answer the one it gets alone."""
    docs = [document(3000), paul_graham_essays()[200_000:203_000]]
    alone = [ask(server, f"{d}\n\n{QUESTION}")[0] for d in docs]
    together = at_once(lambda i: ask(server, f"{docs[i]}\n\n{QUESTION}", stream=(i == 1))[0])
    assert together == alone
    assert alone[0] != alone[1]


def streamed_answer_tokens(server, prompt: str, max_tokens: int, leave_after: int = 0) -> int:
    """Stream a completion of prompt (end of text forbidden, so that it runs to max_tokens), reading every piece or
    closing after ``leave_after`` of them; the tokens the server decoded for the answer once it has stopped (its
    count unchanged for two seconds): all it decoded for the request, less the prompt tokens it read."""
    before = server.stats()["tokens_decoded"]
    with httpx.stream("POST", server.url + "/v1/completions", timeout=600,
                      json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "logit_bias": {"<|endoftext|>": -100, "<|im_end|>": -100},
                            "logit_bias_type": "tokens"}) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got += 1
                if got == leave_after:
                    break
    last, still = None, 0
    for _ in range(600):  # a server that goes on decoding after the client left is waited for, to its end
        st = server.stats()
        still = still + 1 if st["tokens_decoded"] == last else 0
        if still == 4:
            break
        last = st["tokens_decoded"]
        time.sleep(0.5)
    return st["tokens_decoded"] - before - st["last_prompt"]["read"]


def test_client_leaving_mid_answer_stops_the_decode(server):
    """A streaming client that closes after two pieces: the decode stops there (not max_tokens later), and the
    next request is served. The same request read to its end decodes the whole answer (so that the answer would
    run that long: a server ignoring the client's leaving decodes that many)."""
    prompt, max_tokens = document(2000), 200
    stayed = streamed_answer_tokens(server, prompt, max_tokens)
    assert stayed >= max_tokens - 1, f"{stayed} answer tokens decoded for a client that read to the end"
    left = streamed_answer_tokens(server, prompt, max_tokens, leave_after=2)
    print(f"answer tokens decoded: {stayed} for the client that stayed, {left} for the one that left")
    assert left < max_tokens // 10, f"{left} answer tokens decoded for a client that left after 2 pieces"
    assert_passkey_found(server)
def test_prompt_beyond_the_memory_is_a_400_and_the_server_goes_on(server):
    """A prompt longer than the memory holds: HTTP 400 naming memory_capacity, before any reading; then a normal
    request is served."""
    too_long = paul_graham_essays()[: 4 * CAPACITY + 40_000]
    with pytest.raises(openai.BadRequestError) as exc:
        ask(server, too_long)
    assert "memory_capacity" in str(exc.value)
    assert_passkey_found(server, seed=2)


def test_a_request_sets_its_attention_and_bad_values_get_400(server):
    """A request's "attention" object sets the middle keys for that request alone; a field a request cannot set
    (the window shapes the cache) or a value out of range is HTTP 400 naming it, streaming or not, before any
    reading, and the server goes on."""
    from llama_extrapolate.config import DEFAULT_MEMORY_BLOCKS

    bad = [({"window": 100}, "attention.window: fixed when the model loads (restart the server with --window)"),
           ({"top_k": 0}, "attention.top_k=0: give an integer >= 1"),
           ({"top_k": 5000}, f"top_k=5000 > memory_blocks*memory_block_size={DEFAULT_MEMORY_BLOCKS * 64}"),
           ({"question_tokens": "all"}, "attention.question_tokens='all'"),
           ("five", "attention='five'")]
    for value, words in bad:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError, match=re.escape(words)):
                ask(server, "Say hello.", stream=stream, extra_body={"attention": value})
    text, _ = ask(server, "Say hello.", extra_body={"attention": {"top_k": 2, "top_k_distance": 300,
                                                                   "question_tokens": 16}})
    assert "hello" in text.lower(), text
    attention = server.stats()["attention"]
    assert (attention["top_k"], attention["top_k_distance"]) == (2, 300), attention
    ask(server, "Say hello.")
    attention = server.stats()["attention"]
    assert (attention["top_k"], attention["top_k_distance"]) == (5, 512), attention  # the model's own again


def test_bad_attention_settings_stop_the_server_with_the_reason(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "llama_extrapolate", "serve", "--window", "100", "--sinks", "500",
                           "--port", str(free_port())], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "sinks" in proc.stderr and "window" in proc.stderr, proc.stderr

    proc = subprocess.run([sys.executable, "-m", "llama_extrapolate", "serve", "--n_ctx", "600", "--window", "1024",
                           "--port", str(free_port())], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 2 and "n_ctx=600" in proc.stderr, proc.stderr


def test_passages_setting_reads_whole_blocks(default_model):
    """`passages` in a model's settings (or --passages) is run's --passages: top_k = memory_blocks x block size,
    refused beside top_k and without the memory."""
    from llama_extrapolate.server import ExtrapolateModelSettings, attention_settings

    got = attention_settings(ExtrapolateModelSettings(model=str(default_model), memory_blocks=16, passages=True))
    assert got["resolved"].top_k == 16 * 64 and got["resolved"].memory
    with pytest.raises(ValueError, match="--passages with --top-k 5"):
        attention_settings(ExtrapolateModelSettings(model=str(default_model), top_k=5, passages=True))
    with pytest.raises(ValueError, match="--passages without the document memory"):
        attention_settings(ExtrapolateModelSettings(model=str(default_model), memory_blocks=0, passages=True))


def test_config_file_models_take_attention_settings(tmp_path, default_model):
    """llama-cpp-python's config file, with the attention settings in the model: read back from the library."""
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"models": [{"model": str(default_model), "model_alias": "smol", "window": 256,
                                              "sinks": 4, "memory_blocks": 0, "verbose": False}]}))
    s = Server("--config_file", str(config), tmp_path=tmp_path)
    try:
        models = httpx.get(s.url + "/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["smol"]
        # the first request of a new server reads the prompt as a new Llama does: the library's greedy answer
        prompt = f"{document(4000)}\n\n{QUESTION}\n"
        r = s.client.completions.create(model="smol", prompt=prompt, max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens > 256
        assert r.choices[0].text == library_answer(prompt, 8, model=str(default_model), window=256, sinks=4,
                                                   memory_blocks=0)
        st = s.stats()
        assert st["memory"] is None and st["stream_tokens"] > 256
        assert (st["attention"]["window"], st["attention"]["sinks"]) == (256, 4)
    finally:
        s.stop()


def test_cache_keeps_the_streams_of_other_documents(tmp_path):
    """--cache true (llama-cpp-python's RAM cache of states, with the memory's blocks in each): a user going back
    to a document read before another is served from the cache, not by reading it again."""
    s = Server("--window", "512", "--memory_capacity", "8192", "--n_threads", "2", "--cache", "true",
               "--cache_size", str(1 << 30), tmp_path=tmp_path)
    try:
        docs = [document(8000), paul_graham_essays()[300_000:308_000]]
        first = []
        for d in docs:
            ask(s, f"{d}\n\n{QUESTION}", max_tokens=8)
            first.append(s.stats()["last_prompt"])
            assert first[-1]["reused"] == 0, first
        ask(s, f"{docs[0]}\n\n{QUESTION}", max_tokens=8)
        again = s.stats()["last_prompt"]
        assert again["tokens"] == first[0]["tokens"] and again["read"] <= 2, (first, again)
    finally:
        s.stop()


def test_a_server_killed_mid_reading_goes_on_from_its_checkpoint(tmp_path):
    """--checkpoint_path: the reading of a long prompt is saved as it goes. The server killed in the middle of one
    (SIGKILL: no chance to save anything) and started again goes on from the last checkpoint when the prompt comes
    back: it reads only the rest and answers. (Whether the answer is the one a reading that never stopped gives
    is the restore's exactness: test_state.py, where a memory stream restored after a re-basing is still off.)"""
    import threading

    key = int(np.random.default_rng(7).integers(10_000, 100_000))
    prompt = planted(document(24_000), key, 2_000) + "\n\nWhat is the pass key? The pass key is"
    state = tmp_path / "stream.state"
    args = ("--window", "512", "--memory_capacity", "16384", "--n_threads", "2", "--checkpoint_path", str(state),
            "--checkpoint_every", "0.5")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    s = Server(*args, tmp_path=tmp_path / "a")
    failed = []

    def request():
        try:
            s.client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
        except Exception as exc:  # the server is killed under it
            failed.append(exc)

    client = threading.Thread(target=request)
    client.start()
    meta = tmp_path / "stream.state.json"
    try:
        deadline = time.time() + 600
        while not (meta.is_file() and json.loads(meta.read_text())["tokens"] >= 2048):
            assert time.time() < deadline and client.is_alive(), s.log()
            time.sleep(0.2)
        s.proc.kill()
        client.join(60)
    finally:
        s.stop()
    assert failed, "the request ended before the kill"
    saved = json.loads(meta.read_text())["tokens"]

    s = Server(*args, tmp_path=tmp_path / "b")
    try:
        r = s.client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
        last = s.stats()["last_prompt"]
    finally:
        s.stop()
    assert last["reused"] == saved and last["read"] == last["tokens"] - saved, (saved, last)
    assert r.choices[0].text.strip() and r.choices[0].finish_reason == "length", r.choices[0]
