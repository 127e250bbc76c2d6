"""llama.cpp's own `llama-server`, built from the patched tree, with the attention given as `--override-kv` metadata
(the server's patch, 0015), asked with the official openai client as a chat front-end would.

The binary is built by tools/upstream.py from the llama.cpp tree `pip install .` patched (a few minutes, once); an
install from a wheel has no such tree, and these tests are skipped with that reason. The server is started by
`llama-extrapolate serve --llama_server BINARY`, which turns the same settings as `serve` into llama-server's
command line.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the server tests need the openai client: pip install '.[test]'")
pytest.importorskip("llama_cpp.server.app", reason="llama-extrapolate serve needs llama-cpp-python[server]")

from conftest import at_once, clean_env, upstream_binary  # noqa: E402
from llama_extrapolate.harness.corpora import paul_graham_essays  # noqa: E402
from llama_extrapolate.server import ServerProcess, free_port  # noqa: E402

WINDOW = 1024
CAPACITY = 32768
SETTINGS = ("--window", str(WINDOW), "--memory_capacity", str(CAPACITY), "--n_threads", "2")


@pytest.fixture(scope="module")
def binary():
    return upstream_binary("llama-server")


class LlamaServer(ServerProcess):
    def __init__(self, binary: str, *args: str, tmp_path) -> None:
        super().__init__("--llama_server", binary, *args, log_path=tmp_path / "llama-server.log", env=clean_env(),
                         start_timeout=300)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=900, max_retries=0)


@pytest.fixture(scope="module")
def server(binary, tmp_path_factory):
    s = LlamaServer(binary, *SETTINGS, tmp_path=tmp_path_factory.mktemp("llama-server"))
    yield s
    s.stop()


LONG = paul_graham_essays()[:85_000]  # about 20k tokens of SmolLM2


def planted(text: str, key: int, at: int) -> str:
    """text with a pass key planted at character ``at``."""
    return f"{text[:at]}\nThe pass key is {key}. Remember it. {key} is the pass key.\n{text[at:]}"


def assert_passkey_found(server, seed: int = 1) -> None:
    """A request served with the answer to its prompt: a random pass key planted in a short document is the one
    the greedy completion of "The pass key is" gives (not any text: a server answering something else fails)."""
    key = int(np.random.default_rng(seed).integers(10_000, 100_000))
    prompt = planted(paul_graham_essays()[:1500], key, 700) + "\n\nWhat is the pass key? The pass key is"
    r = server.client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    assert str(key) in r.choices[0].text, (key, r.choices[0].text)


def chat(server, content: str, max_tokens: int = 16, stream: bool = False, cache_prompt: bool = True):
    """The answer and llama-server's timings (cache_n: prompt tokens reused, prompt_n: read)."""
    messages = [{"role": "user", "content": content}]
    if not stream:
        r = server.client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                  temperature=0, extra_body={"cache_prompt": cache_prompt})
        return r.choices[0].message.content, r.model_extra["timings"], r.usage
    pieces, timings = [], None
    for chunk in server.client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens,
                                                       temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        timings = (chunk.model_extra or {}).get("timings", timings)
    return pieces, timings, None


def test_command_line_carries_the_settings(binary):
    """What `serve --llama_server` runs: the attention as metadata, the cache sized for it, one slot."""
    from llama_extrapolate.config import DEFAULT_MEMORY_BLOCKS
    from llama_extrapolate.server import ExtrapolateSettings, llama_server_args

    args = llama_server_args(ExtrapolateSettings(window=WINDOW, memory_capacity=CAPACITY, n_threads=2))
    joined = " ".join(args)
    for part in (f"llama.attention.lambda.window=int:{WINDOW}", f"llama.attention.lambda.memory_blocks=int:{DEFAULT_MEMORY_BLOCKS}",
                 "llama.attention.lambda.rollback=int:256", "-np 1", f"--memory-capacity {CAPACITY}",
                 "--question-tokens 128"):
        assert part in joined, (part, joined)
    # the bounded cache (sinks, window, rollback, ubatch, the block at the window's edge), not the document; the
    # memory's selected blocks are in the graph (the document memory's patch, 0012)
    assert int(args[args.index("-c") + 1]) == 10 + WINDOW + 256 + 512 + 64 < CAPACITY
    assert "llama.attention.lambda.memory_per_layer=bool:false" in joined
    # llama.cpp's server ranks by the bound (serve's default landmarks are the library's): the bound's candidates
    from llama_extrapolate.config import MEMORY_CANDIDATES_PER_BLOCK

    assert (f"llama.attention.lambda.memory_candidates=int:{MEMORY_CANDIDATES_PER_BLOCK * DEFAULT_MEMORY_BLOCKS}"
            in joined), joined
    layer = " ".join(llama_server_args(ExtrapolateSettings(window=WINDOW, memory_capacity=CAPACITY, n_threads=2,
                                                           memory_selection="layer")))
    assert "llama.attention.lambda.memory_per_layer=bool:true" in layer
    with pytest.raises(ValueError, match="sinks=500 > window=100"):
        llama_server_args(ExtrapolateSettings(window=100, sinks=500))
    # a setting of the library's question that llama-server cannot carry is refused, not dropped
    with pytest.raises(ValueError, match="memory_select_tokens=32 with --llama_server"):
        llama_server_args(ExtrapolateSettings(window=WINDOW, memory_capacity=CAPACITY, memory_select_tokens=32))


def test_long_document_then_second_question_reuses_the_stream(server):
    """A 20k-token prompt (20x the window, 7x the cache's cells) answered with the pass key planted near its end;
    the next question about the same document, streamed, reads only its own tokens and answers with the key too."""
    key = int(np.random.default_rng(4).integers(10_000, 100_000))
    doc = planted(LONG, key, len(LONG) - 500)
    text, timings, usage = chat(server, f"{doc}\n\nWhat is the pass key? Answer with the number only.")
    assert usage.prompt_tokens > 20_000, usage
    assert str(key) in text, (key, text)
    assert timings["cache_n"] == 0 and timings["prompt_n"] == usage.prompt_tokens, timings

    pieces, timings2, _ = chat(server, f"{doc}\n\nWhich number is the pass key?", stream=True)
    assert len(pieces) > 2 and str(key) in "".join(pieces), (key, pieces)
    # what was read, not how long it took (a timing is the benchmark's: bench/server.py)
    assert timings2["cache_n"] > usage.prompt_tokens - 64 and timings2["prompt_n"] < 64, timings2


def test_same_answer_as_the_python_library(server):
    """/v1/completions with token ids (a 6k-token document and a question) gives the same greedy answer as
    llama_extrapolate.Llama with the same settings: the server reads the prompt in the same batches, the last
    128 tokens with the document memory."""
    from llama_extrapolate import Llama
    from llama_extrapolate.server import ExtrapolateModelSettings, attention_settings

    # llama-server ranks the memory's blocks by the bound (llama_server_args): so does the library here (with the
    # landmarks, serve's default, the answers agreed by chance while the landmarks reranked 128 candidates, and
    # not once they selected alone)
    built = attention_settings(ExtrapolateModelSettings(window=WINDOW, memory_capacity=CAPACITY, n_threads=2,
                                                        memory_landmark=0))
    built["kwargs"]["memory_answer"] = "select"  # as llama-server answers: its patch selects at every token
    llm = Llama(built["model"], n_ctx=built["n_ctx"], n_threads=2, n_batch=512, n_ubatch=512, verbose=False,
                **built["kwargs"])
    try:
        doc = llm.tokenize(paul_graham_essays()[:26_000].encode(), add_bos=True)
        prompt = doc + llm.tokenize(b"\n\nQuestion: what is the first essay's title? Answer:", add_bos=False)
        assert len(prompt) > 6000
        ours = llm.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()
    theirs = server.client.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0)
    assert theirs.choices[0].text == ours, (theirs.choices[0].text, ours)


TINY_LAMBDA = dict(window=32, sinks=4, memory_blocks=0, n_threads=2)
TINY_MEMORY = dict(TINY_LAMBDA, top_k_layer=1, memory_blocks=4, memory_block_size=32, memory_type="f32",
                   memory_capacity=2048, question_tokens=16)


@pytest.mark.parametrize("settings", [TINY_LAMBDA, TINY_MEMORY, dict(TINY_MEMORY, memory_selection="layer")],
                         ids=["lambda", "memory", "memory-per-layer"])
def test_a_stream_read_on_is_re_based_as_the_library_does(binary, tiny_llama, tmp_path, settings):
    """A 701-token prompt, then the same prompt one token longer twice (the server reads the new token from its
    cached stream): the log-probabilities at each step equal llama_extrapolate.Llama's within float rounding. The
    server decodes through llama_process, which once skipped the position re-basing (patch 0007): 4.8e-4 (Lambda)
    and 2.4e-3 (memory) apart after the first re-base, where two layouts of the library's cache give the same bits."""
    import httpx

    from llama_extrapolate import Llama
    from llama_extrapolate.server import ExtrapolateModelSettings, attention_settings

    model, path = tiny_llama
    # llama-server ranks the memory's blocks by the bound (llama_server_args): so does the library here
    bound = dict(memory_landmark=0) if settings["memory_blocks"] else {}
    built = attention_settings(ExtrapolateModelSettings(model=str(path), **settings, **bound))
    assert built["resolved"].memory == (settings["memory_blocks"] > 0)
    if built["resolved"].memory:
        built["kwargs"]["memory_answer"] = "select"  # as llama-server answers: its patch selects at every token
    prompt = [1] + np.random.default_rng(11).integers(3, model.n_vocab, size=700).tolist()
    # the answer kept to ASCII bytes: the server reports a token's probabilities once its text is whole (they are
    # the raw logits', which a bias does not change)
    ascii_only = [[t, False] for t in range(3 + 128, model.n_vocab)]

    server = LlamaServer(binary, "--model", str(path), *[f"--{k}={v}" for k, v in settings.items()],
                         tmp_path=tmp_path)
    steps, tokens = [], list(prompt)
    try:
        for _ in range(3):
            r = httpx.post(server.url + "/completion", json={
                "prompt": tokens, "n_predict": 1, "temperature": 0, "n_probs": 10, "return_tokens": True,
                "ignore_eos": True, "logit_bias": ascii_only}, timeout=600).json()
            assert r["timings"]["prompt_n"] == (1 if steps else len(prompt)), r["timings"]
            steps.append({t["id"]: t["logprob"] for t in r["completion_probabilities"][0]["top_logprobs"]})
            tokens.append(r["tokens"][0])
    finally:
        server.stop()

    llm = Llama(built["model"], n_ctx=built["n_ctx"], n_threads=2, n_batch=512, n_ubatch=512, verbose=False,
                **built["kwargs"])
    try:
        llm.eval(prompt)
        for i, theirs in enumerate(steps):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)
            logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            err = max(abs(logprobs[t] - lp) for t, lp in theirs.items())
            assert err < 1e-4, f"step {i}: llama-server and the library {err:.2e} apart"
            llm.eval([tokens[len(prompt) + i]])
    finally:
        llm.close()


def test_a_prompt_sharing_a_few_tokens_with_a_re_based_stream_is_read_again(binary, tiny_llama, tmp_path):
    """A prompt that shares 24 tokens with a cached stream re-based long ago (700 tokens, W = 32): the tokens after
    the sinks are gone, so the server cannot keep the 24 and reads the prompt again (llama_memory_seq_rm refuses the
    cut). Before, the cut was translated to one back to the sinks and the next batch failed ("Invalid input batch",
    HTTP 500)."""
    import httpx

    model, path = tiny_llama
    first = [1] + np.random.default_rng(11).integers(3, 131, size=700).tolist()
    second = first[:24] + np.random.default_rng(12).integers(3, 131, size=40).tolist()
    server = LlamaServer(binary, "--model", str(path), *[f"--{k}={v}" for k, v in TINY_LAMBDA.items()],
                         tmp_path=tmp_path)
    try:
        for prompt in (first, second):
            r = httpx.post(server.url + "/completion", json={"prompt": prompt, "n_predict": 2, "ignore_eos": True},
                           timeout=600)
            assert r.status_code == 200, r.text
            assert r.json()["timings"]["prompt_n"] == len(prompt), r.json()["timings"]
    finally:
        server.stop()


def test_two_clients_are_served_in_turn_with_their_own_answers(server):
    """Two clients at once get the answers each gets alone. Each prompt is read whole (cache_prompt false): a
    prompt read after another would reuse the chat template's first tokens and read the rest in other batches,
    which changes the last bits of the logits and, some tokens later, a greedy answer's words."""
    prompts = [f"{paul_graham_essays()[i * 3000:i * 3000 + 2500]}\n\nSummarize the text in one sentence."
               for i in (3, 7)]
    alone = [chat(server, p, cache_prompt=False)[0] for p in prompts]
    together = at_once(lambda i: chat(server, prompts[i], cache_prompt=False)[0])
    assert together == alone
    assert alone[0] != alone[1], "two texts summarized alike: the answers do not tell whose is whose"


def test_a_prompt_beyond_the_memory_is_refused_and_the_next_served(server):
    """More tokens than --memory-capacity: HTTP 400 naming the size, before any reading; the server goes on."""
    big = (paul_graham_essays() * 2)[:150_000]  # about 35k tokens > CAPACITY
    with pytest.raises(openai.BadRequestError, match="exceeds the available context size"):
        chat(server, big)
    text, _, _ = chat(server, "Say hello.")
    assert "hello" in text.lower(), text
    assert_passkey_found(server, seed=2)


def test_slots_one_by_default_and_two_refused_with_the_reason(binary, tmp_path):
    """A stream's cache holds one sequence: llama-server left to pick its slots (-np auto) takes one when a window
    is given with --override-kv (upstream's auto is 4), and -np 2 stops it at load with the reason."""
    from llama_extrapolate.server import ExtrapolateSettings, llama_server_args

    args = llama_server_args(ExtrapolateSettings(window=WINDOW, memory_capacity=CAPACITY, n_threads=2,
                                                 port=free_port()))
    at = args.index("-np")
    auto = args[:at] + args[at + 2:]
    log_path = tmp_path / "auto.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([binary, *auto], stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        try:
            for _ in range(600):
                if "listening on" in log_path.read_text() or proc.poll() is not None:
                    break
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(30)
    text = log_path.read_text()
    assert "n_slots = 1" in text, text[-2000:]
    assert "DEPRECATED" not in text, text[-2000:]

    two = args[:at + 1] + ["2"] + args[at + 2:]
    run = subprocess.run([binary, *two], capture_output=True, text=True, timeout=300, env=clean_env())
    assert run.returncode != 0
    assert "several sequences" in run.stdout + run.stderr, (run.stdout + run.stderr)[-2000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
