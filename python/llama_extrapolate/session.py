"""Reading a document and asking about it, one decode loop for every caller.

The command line, the benchmarks and the studies all read a long token stream chunk by chunk, decode a question,
then take greedy answer tokens one decode at a time. Written once here, the loop checks for a swallowed Ctrl-C
between chunks (``interrupt.check``), shows one kind of progress bar, times the same things the same way, and puts
the document memory's hold around a question and its answer where nothing can leave it set: a "hold" left on
would make every later decode attend to an old question's blocks.

A ``Session`` decodes on a ``Backend``: ``LlamaBackend``, the ``eval`` of a ``Llama`` of this package or a plain
``llama_cpp.Llama`` (what ``Session(llm)`` takes; the stream stays the Llama's, ``reset`` it there), or
``ContextBackend``, the Llama's raw context at positions it counts itself, with llama.cpp's context shift when asked
(the retrieval tasks' 'context-shift' baseline, which the Llama's eval cannot do). Scoring that needs every row's
logits is ``native.Stream``'s.
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import interrupt, native


@dataclass(frozen=True)
class ReadReport:
    """Tokens read and the seconds they took (the progress bar's own cost excluded)."""

    tokens: int
    seconds: float

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.seconds < 0:
            raise ValueError(f"ReadReport(tokens={self.tokens}, seconds={self.seconds}): neither can be negative")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


@dataclass(frozen=True)
class Step:
    """One greedy answer step: ``token`` is the greedy choice after the step's decode, ``seconds`` the decode and
    the choice together (what a user waits for between two answer tokens)."""

    token: int
    seconds: float


def _token_list(tokens: Sequence[int], what: str) -> list:
    """``tokens`` as a list of ints; a string or bytes (text not yet tokenized) is refused with the fix."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"{what}: got text ({tokens[:40]!r}...), expected token ids: tokenize it first, e.g. "
                        "llm.tokenize(text.encode('utf-8'))")
    return [int(t) for t in tokens]


def _count(n: Any, what: str, counted: str) -> int:
    """``n`` as a count of answer ``counted`` ("steps", "tokens"); anything but an int >= 0 is refused with its
    name."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{what}: n={n!r}: give the number of answer {counted}, an int >= 0")
    return n


def _vocab_only(llm: Any) -> bool:
    """Whether ``llm`` was loaded with vocab_only=True (a tokenizer: no layers to decode with, though a
    llama_cpp.Llama has a context all the same)."""
    params = getattr(llm, "model_params", None)
    return bool(getattr(llm, "vocab_only", False) or getattr(params, "vocab_only", False))


class Backend(ABC):
    """What a ``Session`` decodes on: a Llama (``llm``) and a way of decoding tokens after its stream. The session
    chunks, times, checks for interrupts and holds the memory's blocks; a backend only decodes, so that the reading
    and asking are written once whichever way the tokens reach llama.cpp. The logits, the memory and its hold are
    the Llama's context's, whichever way it was decoded."""

    llm: Any
    n_batch: int  # the tokens a decode takes: the session's default chunk

    @abstractmethod
    def eval(self, tokens: List[int]) -> None:
        """Decode ``tokens`` after the stream (one chunk of the session's)."""

    @property
    def has_memory(self) -> bool:
        """Whether the model reads with the document memory (only then is there a selection to hold): a Llama of
        this package loaded with it (a llama_cpp.Llama has none)."""
        resolved = getattr(self.llm, "attention_resolved", None)
        return bool(resolved is not None and resolved.memory)

    def last_logits(self) -> np.ndarray:
        """The logits of the last token of the last decode (a view, valid until the next decode)."""
        return native.last_logits(self.llm.ctx, self.llm.n_vocab())

    def memory_hold(self, mode: str) -> None:
        """Set the document memory's hold mode ("select", "keep", "hold"; see ``Llama.memory_hold``)."""
        self.llm.memory_hold(mode)

    def next_token(self) -> int:
        """The greedy choice after the last decode: the argmax of its last logits."""
        return int(np.argmax(self.last_logits()))


class LlamaBackend(Backend):
    """A Llama's own ``eval``: llama-cpp-python keeps the token ids, so its prefix reuse, ``generate`` and
    ``save_state`` see what the session read, and a ``Llama`` of this package reads a Lambda stream past n_ctx and
    applies its ``question_tokens`` and ``memory_answer``. The stream is the Llama's (``reset`` it there)."""

    def __init__(self, llm: Any) -> None:
        if not callable(getattr(llm, "eval", None)) or not hasattr(llm, "n_batch"):
            raise TypeError(f"Session: expected a llama_extrapolate.Llama or llama_cpp.Llama, got {type(llm).__name__}")
        if _vocab_only(llm):
            raise ValueError("Session: this Llama was loaded with vocab_only=True (tokenizer only, no layers); load it "
                             "without vocab_only to read and ask")
        self.llm, self.n_batch = llm, int(llm.n_batch)

    def eval(self, tokens: List[int]) -> None:
        self.llm.eval(tokens)


class ContextBackend(native.Stream, Backend):
    """The Llama's raw context, decoded at positions counted here (``native.Stream``), with llama.cpp's context shift
    when ``context_shift`` (n_keep) is set: when a chunk does not fit the cache, the older half of the tokens after
    the first n_keep is dropped and the rest moved back, keys re-rotated (llama-cli's, the StreamingLLM-like
    baseline). A Llama's eval stops at n_ctx instead, so the retrieval tasks read and ask on this backend, every
    configuration alike. llama-cpp-python's token ids are not kept: ``reset`` here empties the cache and forgets them.
    """

    def __init__(self, llm: Any, n_batch: int, context_shift: Optional[int] = None, *,
                 full_hint: str = "raise n_ctx, use a Lambda window or a context shift") -> None:
        if _vocab_only(llm):
            raise ValueError("ContextBackend: this Llama was loaded with vocab_only=True (tokenizer only, no cache); "
                             "load it without vocab_only to read and ask")
        if getattr(llm, "ctx", None) is None or not callable(getattr(llm, "n_vocab", None)):
            raise TypeError(f"ContextBackend: expected a live llama_extrapolate.Llama or llama_cpp.Llama, got "
                            f"{type(llm).__name__} (closed?)")
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise ValueError(f"ContextBackend: n_batch={n_batch!r}: give the tokens per decode, an int >= 1 (e.g. 512)")
        cells = native.n_cells(llm.ctx)
        if context_shift is not None and (isinstance(context_shift, bool) or not isinstance(context_shift, int)
                                          or not 0 <= context_shift < cells):
            raise ValueError(f"ContextBackend: context_shift={context_shift!r}: give n_keep, the tokens the shift "
                             f"keeps at the start, an int in 0..{cells - 1} (the cache has {cells} cells), or None "
                             "for no shift")
        super().__init__(llm, n_batch, context_shift, full_hint=full_hint)

    def eval(self, tokens: List[int]) -> None:
        for _ in self.chunks(tokens, logits="last"):
            pass


class Session:
    """Reading and asking on one model: ``read`` a stream n_batch tokens a decode, ``ask`` a question (its first
    greedy token and time), ``steps`` of a greedy answer.

    ``llm``: a ``Backend``, or a Llama (this package's or llama_cpp's), which is read through its own eval
    (``LlamaBackend``). ``n_batch``: tokens per decode, the backend's own by default; a smaller value makes an
    interrupt or a progress update come sooner, a larger one is split by the backend anyway.
    """

    def __init__(self, llm: Union[Backend, Any], *, n_batch: Optional[int] = None) -> None:
        self.backend = llm if isinstance(llm, Backend) else LlamaBackend(llm)
        n_batch = self.backend.n_batch if n_batch is None else n_batch
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise ValueError(f"Session: n_batch={n_batch!r}: give the tokens per decode, an int >= 1 (e.g. 512)")
        self.n_batch = n_batch

    @property
    def has_memory(self) -> bool:
        """Whether the model reads with the document memory (only then is there a selection to hold)."""
        return self.backend.has_memory

    # --- reading --------------------------------------------------------------------------------
    def chunks(self, tokens: Sequence[int]) -> Iterator[int]:
        """Decode ``tokens`` after the stream, n_batch at a time, yielding each chunk's length; a Ctrl-C that
        llama.cpp's callbacks swallowed is raised before the next chunk."""
        return self._chunks(_token_list(tokens, "read"))

    def _chunks(self, tokens: list) -> Iterator[int]:
        for start in range(0, len(tokens), self.n_batch):
            interrupt.check()
            chunk = tokens[start:start + self.n_batch]
            self.backend.eval(chunk)
            yield len(chunk)

    def read(self, tokens: Sequence[int], *, progress: bool = False, desc: str = "reading",
             leave: bool = True, done_before: int = 0,
             after_chunk: Optional[Callable[[], None]] = None) -> ReadReport:
        """Decode ``tokens`` after the stream, with a tqdm bar on stderr when ``progress`` (``leave=False``: the bar
        is erased when done, for a bar inside an outer one).

        ``done_before``: tokens of the same reading decoded earlier (a reading resumed from a checkpoint), so that
        the bar counts the whole reading. ``after_chunk`` is called after each decode, when the stream is whole
        (a checkpoint is taken there)."""
        tokens = _token_list(tokens, "read")
        bar = _token_bar(progress, len(tokens) + done_before, desc, leave, initial=done_before)
        t0 = time.perf_counter()
        try:
            for n in self._chunks(tokens):
                if bar is not None:
                    bar.update(n)
                if after_chunk is not None:
                    after_chunk()
        finally:
            seconds = time.perf_counter() - t0
            if bar is not None:
                bar.close()
        return ReadReport(tokens=len(tokens), seconds=seconds)

    # --- asking ---------------------------------------------------------------------------------
    def next_token(self) -> int:
        """The greedy choice after the last decode."""
        return self.backend.next_token()

    def steps(self, token: int, n: int) -> Iterator[Step]:
        """``n`` greedy steps from ``token``: each decodes the previous token alone (the first step ``token``) and
        yields the next greedy choice with the step's time. Each step is its own decode, as an answer is."""
        return self._steps(int(token), _count(n, "steps", "steps"))

    def _steps(self, token: int, n: int) -> Iterator[Step]:
        for _ in range(n):
            interrupt.check()
            t0 = time.perf_counter()
            self.backend.eval([token])
            token = self.backend.next_token()
            yield Step(token=token, seconds=time.perf_counter() - t0)

    def ask(self, question: Sequence[int], *, hold: bool = False, progress: bool = False,
            desc: str = "reading", leave: bool = True) -> "Question":
        """Decode ``question`` after the stream and take its first greedy answer token (with a bar of its tokens as
        ``read`` shows when ``progress``: a configuration that reads a whole prompt as its question, full
        attention or Λ over a long document, is a reading too).

        ``hold`` (the document memory only): the question selects its blocks and keeps them in RAM
        (``memory_hold("keep")``), and its answer attends to those blocks without selecting or reading the store
        again (``memory_hold("hold")``) until the returned ``Question`` is closed, which restores "select". Use it
        in a ``with`` block so that an exception restores it too.
        """
        question = _token_list(question, "ask")
        if not question:
            raise ValueError("ask: the question has no tokens; give at least one")
        if hold and not self.has_memory:
            raise ValueError("ask(hold=True): this Llama has no document memory (memory_blocks=0, or a plain "
                             "llama_cpp.Llama), so there is no selection to hold; use hold=False, or load the model "
                             "with the document memory")
        bar = _token_bar(progress, len(question), desc, leave)
        t0 = time.perf_counter()
        if hold:
            self.backend.memory_hold("keep")
        try:
            for n in self._chunks(question):
                if bar is not None:
                    bar.update(n)
            first = self.backend.next_token()
            seconds = time.perf_counter() - t0
            if hold:
                self.backend.memory_hold("hold")
        except BaseException:
            if hold:
                self.backend.memory_hold("select")
            raise
        finally:
            if bar is not None:
                bar.close()
        return Question(self, token=first, seconds=seconds, tokens=len(question), held=hold)


def _token_bar(progress: bool, total: int, desc: str, leave: bool, initial: int = 0):
    """A tqdm bar of tokens on stderr when ``progress`` (``leave=False``: erased when done, for a bar inside an
    outer one), else None."""
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="tok", file=sys.stderr, leave=leave)


class Question:
    """A question decoded by ``Session.ask``: its first greedy answer ``token``, the ``seconds`` from the start of
    its decode to that token, and, with a hold, the memory held until ``close`` (or the end of a ``with``)."""

    def __init__(self, session: Session, *, token: int, seconds: float, tokens: int, held: bool) -> None:
        self.session, self.token, self.seconds, self.tokens = session, int(token), float(seconds), int(tokens)
        self._held = held

    @property
    def held(self) -> bool:
        """Whether the memory still holds this question's blocks."""
        return self._held

    def answer(self, n: int) -> Iterator[Step]:
        """The answer's next ``n`` greedy steps after the first token (``Session.steps`` from ``token``): the
        answer's tokens are ``token`` and then each step's."""
        return self.session.steps(self.token, n)

    def answer_tokens(self, n: int, *, stop: Optional[int] = None) -> List[int]:
        """The greedy answer's first ``n`` tokens, ``token`` and then a step each, ending before ``stop`` (the
        end-of-text token) when it comes. The last token kept is not decoded: nothing reads what follows it."""
        n = _count(n, "answer_tokens", "tokens")
        tokens: List[int] = []
        token, steps = self.token, self.answer(max(n - 1, 0))
        while len(tokens) < n and token != stop:
            tokens.append(token)
            if len(tokens) < n:
                token = next(steps).token
        return tokens

    def close(self) -> None:
        """Release the hold: the memory selects its blocks at each decode again."""
        if self._held:
            self._held = False
            self.session.backend.memory_hold("select")

    def __enter__(self) -> "Question":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
