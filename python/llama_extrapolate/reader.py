"""Reading a long document, then answering about it: what ``llama-extrapolate run`` does.

llama-cpp-python evaluates a prompt in one call with no progress; a 200k-token
document takes minutes on a laptop, so the prompt is evaluated here first, in
n_batch chunks under a progress bar, and the completion that follows finds it
in the cache (llama-cpp-python reuses the longest matching prefix) and only
decodes what is new.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Union

from . import interrupt


@dataclass
class ReadReport:
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


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


def read_tokens(llm, tokens: List[int], *, progress: bool = True, desc: str = "reading") -> ReadReport:
    """Evaluate ``tokens`` from an empty cache, n_batch at a time, with a progress bar on stderr.

    The last token is left for the completion to evaluate (it needs that token's logits).
    """
    llm.reset()
    body = tokens[:-1]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(body), desc=desc, unit="tok", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        for s in range(0, len(body), llm.n_batch):
            interrupt.check()
            chunk = body[s:s + llm.n_batch]
            llm.eval(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return ReadReport(tokens=len(body), seconds=time.perf_counter() - t0)


def answer(llm, document: str, question: str, *, max_tokens: int = 256, temperature: float = 0.0,
           chat: bool = True, progress: bool = True) -> Iterator[str]:
    """Read ``document`` with a progress bar, then stream the answer to ``question`` as text pieces."""
    if not question.strip():
        raise ValueError("the prompt is empty: ask something about the document (--prompt)")
    messages = [{"role": "user", "content": f"{document}\n\n{question}"}]
    tokens = chat_prompt_tokens(llm, messages) if chat else None
    if tokens is None:
        prompt = f"{document}\n\n{question}\n"
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True)
    r = getattr(llm, "attention_resolved", None)
    if r is not None and r.top_k > 0 and r.top_k_scope == "question":
        # the document with the Lambda mask, then the question and the answer with the middle keys
        doc_only = chat_prompt_tokens(llm, [{"role": "user", "content": document}]) if chat else None
        if doc_only is None:
            doc_only = llm.tokenize(document.encode("utf-8"), add_bos=True)
        from .tasks import common_prefix

        start = common_prefix(tokens, doc_only)
        llm.set_top_k_active(False)
        read_tokens(llm, tokens[:start + 1], progress=progress)
        llm.set_top_k_active(True)
    else:
        read_tokens(llm, tokens, progress=progress)
    if chat and llm.metadata.get("tokenizer.chat_template"):
        stream = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=temperature,
                                            stream=True)
        for part in stream:
            piece = part["choices"][0]["delta"].get("content")
            if piece:
                yield piece
    else:
        for part in llm.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, stream=True):
            piece = part["choices"][0]["text"]
            if piece:
                yield piece


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
