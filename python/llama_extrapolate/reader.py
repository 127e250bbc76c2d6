"""Reading a long document, then answering about it: what ``llama-extrapolate run`` does.

llama-cpp-python evaluates a prompt in one call with no progress; a 200k-token
document takes minutes on a laptop, so the prompt is evaluated here first, in
n_batch chunks under a progress bar, and the completion that follows finds it
in the cache (llama-cpp-python reuses the longest matching prefix) and only
decodes what is new.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from .session import ReadReport, Session


def read_text_file(path: Union[str, Path]) -> str:
    """The file as text; names the file and the fix when it is missing, binary or not UTF-8."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory: give a text file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): convert it, e.g. with iconv -t UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path} is empty: give a document to read")
    return text


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (where a prompt's document ends and its question starts)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def first_tokens(model: str, file: Optional[str], corpus: str, n: int) -> Tuple[List[int], str]:
    """(the first n tokens of ``file``, else of the named corpus, with BOS; a description of the text),
    tokenized by a vocabulary-only load of the model."""
    from .harness.corpora import load_corpus
    from .native import load_tokenizer

    if file:
        text, desc = read_text_file(file), str(file)
    else:
        text, desc = load_corpus(corpus), corpus
    tok = load_tokenizer(model)
    try:
        tokens = tok.tokenize(text[: 12 * n].encode("utf-8"), add_bos=True)[:n]
    finally:
        tok.close()
    if len(tokens) < n:
        raise ValueError(f"the text {desc} has {len(tokens)} tokens, fewer than --tokens {n}: use a longer "
                         "text or fewer tokens")
    return tokens, desc


def cache_cells(resolved, info, document: str, question: str, *, max_tokens: int, n_batch: int,
                n_ctx: Optional[int] = None) -> int:
    """The KV cache cells ``answer`` needs for this document and question.

    With a window the cache is bounded (S + W + rollback + one batch) whatever the length; with top-k middle
    keys it keeps every key (the document, the question, the chat template's few tokens and the answer); with
    full attention it is ``n_ctx``, or the training length. ``n_ctx`` only has a meaning in the last case, and
    is refused elsewhere rather than ignored.
    """
    if n_ctx is not None and (resolved.top_k > 0 or resolved.window > 0):
        what = f"window={resolved.window}" if resolved.window > 0 else f"top_k={resolved.top_k}"
        raise ValueError(f"n_ctx={n_ctx} has no effect with {what}: the cache is sized from the window (and, with "
                         "top-k, the document); drop n_ctx, or use window=0 for full attention in n_ctx cells")
    if resolved.top_k > 0 and not resolved.memory:
        return document_tokens(info, document, question) + 64 + max_tokens + n_batch
    if resolved.window > 0:
        return resolved.required_n_ctx(n_batch, stream=0)
    return int(n_ctx or info.context_length)


def document_tokens(info, document: str, question: str) -> int:
    """Tokens of the document and the question (a vocabulary-only load: milliseconds, no layers)."""
    from .native import load_tokenizer

    vocab = load_tokenizer(info.path)
    try:
        return len(vocab.tokenize(f"{document}\n\n{question}".encode("utf-8"), add_bos=True))
    finally:
        vocab.close()


def memory_capacity(resolved, info, document: str, question: str, *, max_tokens: int) -> int:
    """Tokens the document memory must hold for this document, its question and the answer (and the chat
    template's few tokens): its file is reserved for them before reading starts. Never less than the blocks it
    selects (a short document leaves most of them unused)."""
    return max(document_tokens(info, document, question) + 256 + max_tokens, resolved.memory_cells)


def chat_prompt_tokens(llm, messages: List[dict]) -> Optional[List[int]]:
    """The tokens create_chat_completion will evaluate for ``messages`` (None if the model has no chat template)."""
    from llama_cpp import llama_chat_format

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        return None
    eos = llm._model.token_eos()
    bos = llm._model.token_bos()
    fmt = llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
        bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        stop_token_ids=[eos],
    )
    result = fmt(messages=messages)
    return llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)


def read_tokens(llm, tokens: List[int], *, progress: bool = True, desc: str = "reading",
                keep_last: bool = False, after_chunk=None) -> ReadReport:
    """Evaluate ``tokens`` from an empty cache, n_batch at a time, with a progress bar on stderr.

    The last token is left for the completion to evaluate (it needs that token's logits), unless
    ``keep_last`` (a prefix that more tokens follow). ``after_chunk``: as ``Session.read``'s (checkpoints).
    """
    llm.reset()
    body = tokens if keep_last else tokens[:-1]
    return Session(llm).read(body, progress=progress, desc=desc, after_chunk=after_chunk)


def _state_fingerprint(llm) -> dict:
    """What a saved document state is only valid for: the model file, the attention, the cache size."""
    import hashlib
    import json
    import os

    r = llm.attention_resolved
    attention = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in vars(r).items()}
    path = Path(llm.model_path)
    return {"model": path.name, "model_bytes": os.path.getsize(path), "n_ctx": int(llm.n_ctx()),
            "attention_sha256": hashlib.sha256(json.dumps(attention, sort_keys=True).encode()).hexdigest()}


def memory_layout(model_path: str, resolved, memory_type: str, axes: str, landmark: int) -> dict:
    """What the blocks of a kept memory file and a state's summaries of them are valid for: the model, the first
    stored layer, the block size, the stored type, and how the blocks are summarized (the bound's axes or the
    landmarks), which the library checks again when the state is loaded."""
    import os

    return {"model": Path(model_path).name, "model_bytes": os.path.getsize(model_path),
            "first_layer": resolved.top_k_layer, "block_size": resolved.memory_block_size, "type": memory_type,
            "axes": axes, "landmark": int(landmark)}


def kept_memory_matches(state: Path, memory_file: str, model_path: str, resolved, memory_type: str, axes: str,
                        landmark: int) -> bool:
    """Whether the state saved at ``state`` references the kept memory file ``memory_file`` with this layout: then
    a context reopens the file as the state left it (``memory_reopen``), else it starts the file anew (a rerun with
    other summaries reads the document again rather than meeting the library's refusal of the state)."""
    return state_memory(state) == {"file": memory_file,
                                   **memory_layout(model_path, resolved, memory_type, axes, landmark)}


def ids_sha256(tokens: Sequence[int]) -> str:
    """A hash of token ids, kept in a state's JSON: a prompt is checked against a state without loading it."""
    import hashlib

    import numpy as np

    return hashlib.sha256(np.asarray(list(tokens), dtype="<i4").tobytes()).hexdigest()


def _state_tokens(llm, path: Path, tokens: Sequence[int]) -> Tuple[int, bool]:
    """(n, hashed) of the state saved at ``path``: its n tokens when it is valid for ``llm`` (the same model,
    attention and cache), 0 < n <= len(tokens), and its JSON's hash of the ids (if it has one: ``hashed``) is that of
    tokens[:n]; else (0, False)."""
    meta = _state_meta(path) if path.is_file() else None
    if meta is None:
        return 0, False
    n = meta.get("tokens")
    if meta.get("fingerprint") != _state_fingerprint(llm) or not isinstance(n, int) or not 0 < n <= len(tokens):
        return 0, False
    if "ids_sha256" not in meta:
        return n, False
    return (n, True) if meta["ids_sha256"] == ids_sha256(tokens[:n]) else (0, False)


def state_prefix(llm, path: Path, tokens: Sequence[int]) -> Optional[int]:
    """The tokens of the state saved at ``path`` when it is valid for ``llm`` and its ids (by their hash) are a
    prefix of ``tokens``, shorter than them; else None (another document, settings, or no state)."""
    n, hashed = _state_tokens(llm, path, tokens)
    return n if hashed and n < len(tokens) else None


def remove_state(path: Path) -> None:
    """A saved state and its JSON, gone (the kept memory file it referenced is another stream's from now on)."""
    _meta_path(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def _meta_path(path: Path) -> Path:
    """The JSON beside a state file: what the state is valid for (save_document_state writes it)."""
    return path.with_name(path.name + ".json")


def _state_meta(path: Path) -> Optional[dict]:
    """A state file's JSON, or None when there is none or it cannot be read (the state is then not used)."""
    import json

    try:
        meta = json.loads(_meta_path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def state_memory(path: Path) -> Optional[dict]:
    """The kept memory file a saved state references ({"file": ..., and its memory_layout}), or None."""
    meta = _state_meta(path)
    return meta.get("memory") if meta else None


def load_document_state(llm, path: Path, tokens: List[int]) -> int:
    """Restore a stream saved after a prefix of ``tokens`` (same model, attention and cache): the whole document,
    or a checkpoint of a reading that stopped. Returns the tokens restored; 0 when ``path`` holds another document
    or settings (the caller reads from the start)."""
    from .native import clear_memory, read_state_file

    n, _ = _state_tokens(llm, path, tokens)  # another document's is known by its hash without loading it
    if n == 0:
        return 0
    llm.reset()
    if read_state_file(llm.ctx, path, n) != list(tokens[:n]):
        llm.reset()
        clear_memory(llm.ctx)
        return 0
    llm.input_ids[0:n] = tokens[:n]
    llm.n_tokens = n
    return n


def save_document_state(llm, path: Path) -> None:
    """The stream as read so far (the library's state file, with its token ids) and what it is valid for.

    With the document memory on a kept file, the state references the file's blocks instead of copying them, so
    that a checkpoint costs the cache and the summaries, not the store."""
    import json

    from .native import write_state_file

    n = llm.n_tokens
    ids = llm.input_ids[0:n]
    if len(ids) != n:
        raise ValueError(f"the state {path}: the first ids of the {n}-token stream are no longer kept; cannot save it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    t0 = time.perf_counter()
    write_state_file(llm.ctx, tmp, ids)
    meta_path = _meta_path(path)
    meta_path.unlink(missing_ok=True)
    tmp.replace(path)
    # what the save cost, for the reader of a checkpointed reading (bench/resume.py)
    meta = {"fingerprint": _state_fingerprint(llm), "tokens": n, "ids_sha256": ids_sha256(ids),
            "bytes": path.stat().st_size,
            "write_s": round(time.perf_counter() - t0, 3)}
    if getattr(llm, "memory_file", None):
        meta["memory"] = {"file": llm.memory_file,
                          **memory_layout(llm.model_path, llm.attention_resolved, llm.memory_type,
                                          llm.memory_axes, llm.memory_landmark)}
    meta_path.write_text(json.dumps(meta, indent=1))


class Checkpoints:
    """Saves the stream to a state file at most every ``every`` seconds of a reading (at a chunk's end, when the
    stream is whole), so that a reading of hours that is stopped goes on from the last one."""

    def __init__(self, llm, path: Path, every: float) -> None:
        self.llm, self.path, self.every = llm, path, float(every)
        self.last = time.perf_counter()

    def restart(self) -> None:
        """The clock starts with a reading (a stream idle between requests is not a reading's time)."""
        self.last = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self.last < self.every:
            return
        save_document_state(self.llm, self.path)  # its JSON records what the save cost
        self.last = time.perf_counter()


def read_prompt(llm, tokens: List[int], doc_end: int, *, state: Optional[Path] = None, progress: bool = True,
                top_k_question: bool = False, checkpoint_every: Optional[float] = None) -> None:
    """Read a prompt whose first ``doc_end`` tokens are the document, the rest the question: the document
    from ``state`` when it holds this document (else read and saved there), then the question.

    ``checkpoint_every`` (seconds, with ``state``): the reading is saved to ``state`` that often, and a state
    that holds a prefix of the document (a reading that stopped) is read on from there."""
    if checkpoint_every is not None and (state is None or not checkpoint_every > 0):
        raise ValueError(f"checkpoint_every={checkpoint_every!r}: give seconds > 0, with a state file to write")
    if top_k_question:
        llm.set_top_k_active(False)  # the document with the Lambda mask, the question with the middle keys
    restored = load_document_state(llm, state, tokens[:doc_end]) if state is not None else 0
    if state is not None and progress:
        if restored == doc_end:
            said = f"restored ({doc_end} tokens, not read again)"
        elif restored:
            said = f"a checkpoint of {restored} of the document's {doc_end} tokens: reading on from there"
        else:
            said = "none for this document and settings; reading, then saving it"
        if restored < doc_end and checkpoint_every:
            said += f" (a checkpoint every {checkpoint_every:g} s)"
        print(f"document state {state}: {said}", file=sys.stderr)
    if restored < doc_end:
        saver = Checkpoints(llm, state, checkpoint_every) if checkpoint_every else None
        if restored:
            Session(llm).read(tokens[restored:doc_end], progress=progress, done_before=restored, desc="reading on",
                              after_chunk=saver)
        else:
            read_tokens(llm, tokens[:doc_end], progress=progress, keep_last=True, after_chunk=saver)
        if state is not None:
            save_document_state(llm, state)
    if top_k_question:
        llm.set_top_k_active(True)
    rest = tokens[llm.n_tokens:-1]
    if rest:
        Session(llm).read(rest)


def answer(llm, document: str, question: str, *, max_tokens: int = 256, sampling_temperature: float = 0.0,
           chat: bool = True, progress: bool = True, state: Optional[Path] = None,
           checkpoint_every: Optional[float] = None) -> Iterator[str]:
    """Read ``document`` with a progress bar, then stream the answer to ``question`` as text pieces.

    ``state``: a file for the stream after the document (the library's state): a later question about the
    same document with the same model and settings starts from it instead of reading the document again.
    ``checkpoint_every``: seconds between checkpoints of the reading in ``state`` (a rerun goes on from the last).
    """
    if not question.strip():
        raise ValueError("the prompt is empty: ask something about the document (--prompt)")
    messages = [{"role": "user", "content": f"{document}\n\n{question}"}]
    tokens = chat_prompt_tokens(llm, messages) if chat else None
    if tokens is None:
        prompt = f"{document}\n\n{question}\n"
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True)
    r = getattr(llm, "attention_resolved", None)
    top_k_question = r is not None and r.top_k > 0 and r.top_k_scope == "question"
    if checkpoint_every is not None and state is None:
        raise ValueError("checkpoint_every needs a state file (state=...): the checkpoint is written there")
    if top_k_question or state is not None:
        # where the document ends and the question starts: the prompt of the document alone shares that prefix
        doc_only = chat_prompt_tokens(llm, [{"role": "user", "content": document}]) if chat else None
        if doc_only is None:
            doc_only = llm.tokenize(document.encode("utf-8"), add_bos=True)
        read_prompt(llm, tokens, min(common_prefix(tokens, doc_only), len(tokens) - 1), state=state,
                    progress=progress, top_k_question=top_k_question, checkpoint_every=checkpoint_every)
    else:
        read_tokens(llm, tokens, progress=progress)
    if chat and llm.metadata.get("tokenizer.chat_template"):
        stream = llm.create_chat_completion(messages=messages, max_tokens=max_tokens,
                                            temperature=sampling_temperature,
                                            stream=True)
        for part in stream:
            piece = part["choices"][0]["delta"].get("content")
            if piece:
                yield piece
    else:
        for part in llm.create_completion(tokens, max_tokens=max_tokens, temperature=sampling_temperature,
                                         stream=True):
            piece = part["choices"][0]["text"]
            if piece:
                yield piece
