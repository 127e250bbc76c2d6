import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# the patched library must be the one llama_cpp loads, whichever test imports llama_cpp first
import llama_extrapolate  # noqa: F401,E402

REPO = Path(__file__).resolve().parents[1]


def clean_env(**extra):
    """Environment for a child Python without LLAMA_CPP_LIB_PATH (so llama_cpp uses its own library)."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    env.update(extra)
    return env


def run_python(code: str, *args: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=clean_env() if env is None else env,
        timeout=timeout,
    )


def load_bench(name: str):
    """A script of bench/ as a module (its bookkeeping is tested; its runs are benchmarks)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def upstream_binary(target: str) -> str:
    """llama.cpp's own executable, built by tools/upstream.py from the tree `pip install .` patched; a test that needs
    it is skipped with the reason where there is no such tree (an install from a wheel)."""
    spec = importlib.util.spec_from_file_location("upstream", REPO / "tools" / "upstream.py")
    up = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(up)
    try:
        up.pip_build_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return str(up.build([target], quiet=True)[target])


def at_once(client, n: int = 2, timeout: float = 600) -> list:
    """client(i) for i < n, each in its own thread, all started together (clients of one server); their results."""
    import threading

    results = [None] * n

    def run(i):
        results[i] = client(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def tiny_llm(path, attention, ubatch=64, **kw):
    """A Llama on a tiny test model as the oracle tests want it: F32 K/V (the oracle's precision), 512 cells, every
    token's logits, two threads, ``ubatch`` tokens a micro-batch; ``kw`` overrides any of them."""
    kw = {"type_k": 0, "type_v": 0, "n_ctx": 512, "logits_all": True, "n_threads": 2, "verbose": False, **kw}
    return llama_extrapolate.Llama(str(path), attention=attention, n_batch=ubatch, n_ubatch=ubatch, **kw)


def save_mid_document(llm, tokens, doc: int):
    """Read tokens[:doc] with the question's retrieval off, save the state, then read the rest with it on (the
    question): the state and the memory's info at the save."""
    llm.set_top_k_active(False)
    llm.eval(tokens[:doc])
    state = llm.save_state()
    saved = llm.memory_info()
    llm.set_top_k_active(True)
    llm.eval(tokens[doc:])
    return state, saved


def _saved_mid_document(a, tokens, doc: int, layers):
    """save_mid_document on context a, with its logits for the rest and its selections in ``layers``."""
    import numpy as np

    state, saved = save_mid_document(a, tokens, doc)
    return state, saved, np.asarray(a.scores[doc:len(tokens)], dtype=np.float64), \
        {il: a.memory_selection(il) for il in layers}


def _went_on_from(b, state, tokens, doc: int, layers) -> dict:
    """Context b loads the state with the question's retrieval off and reads tokens[doc:] with it on: its logits for
    the rest, its selections in ``layers`` and its memory after the load."""
    import numpy as np

    b.set_top_k_active(False)
    b.load_state(state)
    loaded = b.memory_info()
    b.set_top_k_active(True)
    b.eval(tokens[doc:])
    return {"got": np.asarray(b.scores[doc:len(tokens)], dtype=np.float64),
            "got_sel": {il: b.memory_selection(il) for il in layers}, "loaded": loaded}


def memory_state_round_trip(make, tokens, doc: int, layers) -> dict:
    """The document memory saved and restored with the stream: context a reads tokens[:doc] with the question's
    retrieval off, saves its state, turns retrieval on and reads the rest; context b (from ``make()`` too) reads
    something the state must replace, loads the state and reads the rest the same way. Their logits for the rest
    (``want``, ``got``), each one's selections in ``layers`` (``want_sel``, ``got_sel``), a's memory at the save and
    b's after the load (``saved``, ``loaded``), for the caller to compare."""
    a, b = make(), make()
    try:
        state, saved, want, want_sel = _saved_mid_document(a, tokens, doc, layers)
        b.set_top_k_active(False)
        b.eval(tokens[:40])
        return {"want": want, "want_sel": want_sel, "saved": saved, "state": state,
                **_went_on_from(b, state, tokens, doc, layers)}
    finally:
        a.close()
        b.close()


def kept_state_reopened(make, reopen, tokens, doc: int, layers) -> dict:
    """The kept store's round trip: context a (``make()``, its store in a kept file) reads tokens[:doc] with the
    question's retrieval off, saves its state and reads on (the file goes on past the state's blocks) and is closed;
    a new context (``reopen()``, the file reopened) loads the state and reads the same rest. The same keys as
    memory_state_round_trip's, for the caller to compare."""
    a = make()
    try:
        state, saved, want, want_sel = _saved_mid_document(a, tokens, doc, layers)
    finally:
        a.close()
    b = reopen()
    try:
        return {"want": want, "want_sel": want_sel, "saved": saved, "state": state,
                **_went_on_from(b, state, tokens, doc, layers)}
    finally:
        b.close()


@pytest.fixture(scope="session")
def default_model():

    return llama_extrapolate.default_model_path()


@pytest.fixture(scope="session")
def default_model_f32(default_model, tmp_path_factory):
    """The default model with its weights dequantized to F32, the same tokenizer and metadata. With an F32 cache its
    logits are exact up to the order of the sums, so a test can tell a wrong attention from rounding: the quantized
    model turns a one-ulp difference into up to ~0.5 in its logits (a rounding of the activations flips), and does
    so in upstream llama.cpp too when a token takes another cell."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(default_model))
    path = tmp_path_factory.mktemp("f32") / "default-f32.gguf"
    writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor(tensor.name, dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def small_llm(default_model):
    from llama_cpp import Llama

    llm = Llama(model_path=str(default_model), n_ctx=512, n_batch=128, n_threads=2, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random llama-like GGUF model (RoPE, GQA 4/2) and its weights, for the oracle."""
    from tinymodel import TinyLlama

    model = TinyLlama()
    model.make_weights()
    return model, model.write(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_mpt_model(tmp_path_factory):
    """A tiny random MPT-like GGUF model (ALiBi) and its weights."""
    from tinymodel import TinyMPT

    model = TinyMPT()
    model.make_weights()
    return model, model.write(tmp_path_factory.mktemp("tiny") / "tiny-mpt.gguf")


def random_tokens(model, n, seed):
    import numpy as np

    return np.random.default_rng(seed).integers(3, model.n_vocab, size=n).tolist()


def two_sequence_context(llm, n_batch, n_ctx=512, unified=True):
    """A raw context for two sequences in one F32 cache on llm's model (the Llama's own holds one): unified, or one
    stream per sequence."""
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, 2
    params.kv_unified, params.type_k, params.type_v = unified, 0, 0
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.n_threads = params.n_threads_batch = 2
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    assert ctx, "could not create a two-sequence context"
    return ctx


def read_behind_another_sequence(llm, tokens, other_at, n_ctx=512):
    """Read tokens as sequence 0, 64 a time, on a two-sequence context of llm's model (llm closed after), another
    sequence's 7 tokens decoded before the chunk starting at other_at (0: they take the first cells). Returns the
    logits of every token of sequence 0."""
    import llama_cpp
    import numpy as np

    ctx = two_sequence_context(llm, 64, n_ctx)
    n_vocab = llm.n_vocab()
    batch = llama_cpp.llama_batch_init(64, 0, 1)

    def decode(chunk, seq, pos0, logits):
        batch.n_tokens = len(chunk)
        for i, t in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        assert llama_cpp.llama_decode(ctx, batch) == 0

    try:
        got = np.empty((len(tokens), n_vocab))
        for start in range(0, len(tokens), 64):
            if start == other_at:
                decode(tokens[::-1][:7], 1, 0, False)
            chunk = tokens[start:start + 64]
            decode(chunk, 0, start, True)
            got[start:start + len(chunk)] = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx),
                                                                   shape=(len(chunk), n_vocab))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llm.close()
    return got
