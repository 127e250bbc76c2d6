"""Reading a document and asking about it, one decode loop for every caller.

The command line, the benchmarks and the studies all read a long token stream chunk by chunk, decode a question,
then take greedy answer tokens one decode at a time. Written once here, the loop checks for a swallowed Ctrl-C
between chunks (``interrupt.check``), shows one kind of progress bar, times the same things the same way, and puts
the document memory's hold around a question and its answer where nothing can leave it set: a "hold" left on
would make every later decode attend to an old question's blocks.

A ``Session`` wraps a ``Llama`` of this package or a plain ``llama_cpp.Llama``; the stream stays the Llama's
(``reset`` it there). Scoring that needs every row's logits or explicit positions is ``native.Stream``'s.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from . import interrupt
from .native import greedy_next


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


class Session:
    """Reading and asking on one Llama: ``read`` a stream n_batch tokens a decode, ``ask`` a question (its first
    greedy token and time), ``steps`` of a greedy answer.

    ``n_batch``: tokens per decode, the Llama's own by default; a smaller value makes an interrupt or a progress
    update come sooner, a larger one is split by the Llama's eval anyway.
    """

    def __init__(self, llm: Any, *, n_batch: Optional[int] = None) -> None:
        if not callable(getattr(llm, "eval", None)) or not hasattr(llm, "n_batch"):
            raise TypeError(f"Session: expected a llama_extrapolate.Llama or llama_cpp.Llama, got {type(llm).__name__}")
        if getattr(llm, "vocab_only", False):
            raise ValueError("Session: this Llama was loaded with vocab_only=True (tokenizer only, no layers); load it "
                             "without vocab_only to read and ask")
        n_batch = llm.n_batch if n_batch is None else n_batch
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise ValueError(f"Session: n_batch={n_batch!r}: give the tokens per decode, an int >= 1 (e.g. 512)")
        self.llm, self.n_batch = llm, n_batch

    @property
    def has_memory(self) -> bool:
        """Whether the Llama reads with the document memory (only then is there a selection to hold)."""
        resolved = getattr(self.llm, "attention_resolved", None)
        return bool(resolved is not None and resolved.memory)

    # --- reading --------------------------------------------------------------------------------
    def chunks(self, tokens: Sequence[int]) -> Iterator[int]:
        """Decode ``tokens`` after the stream, n_batch at a time, yielding each chunk's length; a Ctrl-C that
        llama.cpp's callbacks swallowed is raised before the next chunk."""
        return self._chunks(_token_list(tokens, "read"))

    def _chunks(self, tokens: list) -> Iterator[int]:
        for start in range(0, len(tokens), self.n_batch):
            interrupt.check()
            chunk = tokens[start:start + self.n_batch]
            self.llm.eval(chunk)
            yield len(chunk)

    def read(self, tokens: Sequence[int], *, progress: bool = False, desc: str = "reading",
             leave: bool = True) -> ReadReport:
        """Decode ``tokens`` after the stream, with a tqdm bar on stderr when ``progress`` (``leave=False``: the bar
        is erased when done, for a bar inside an outer one)."""
        tokens = _token_list(tokens, "read")
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(tokens), desc=desc, unit="tok", file=sys.stderr, leave=leave)
        t0 = time.perf_counter()
        try:
            for n in self._chunks(tokens):
                if bar is not None:
                    bar.update(n)
        finally:
            seconds = time.perf_counter() - t0
            if bar is not None:
                bar.close()
        return ReadReport(tokens=len(tokens), seconds=seconds)

    # --- asking ---------------------------------------------------------------------------------
    def next_token(self) -> int:
        """The greedy choice after the last decode."""
        return greedy_next(self.llm)

    def steps(self, token: int, n: int) -> Iterator[Step]:
        """``n`` greedy steps from ``token``: each decodes the previous token alone (the first step ``token``) and
        yields the next greedy choice with the step's time. Each step is its own decode, as an answer is."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"steps: n={n!r}: give the number of answer steps, an int >= 0")
        token = int(token)
        for _ in range(n):
            interrupt.check()
            t0 = time.perf_counter()
            self.llm.eval([token])
            token = greedy_next(self.llm)
            yield Step(token=token, seconds=time.perf_counter() - t0)

    def ask(self, question: Sequence[int], *, hold: bool = False) -> "Question":
        """Decode ``question`` after the stream and take its first greedy answer token.

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
        t0 = time.perf_counter()
        if hold:
            self.llm.memory_hold("keep")
        try:
            for _ in self._chunks(question):
                pass
            first = greedy_next(self.llm)
            seconds = time.perf_counter() - t0
            if hold:
                self.llm.memory_hold("hold")
        except BaseException:
            if hold:
                self.llm.memory_hold("select")
            raise
        return Question(self, token=first, seconds=seconds, tokens=len(question), held=hold)


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

    def close(self) -> None:
        """Release the hold: the memory selects its blocks at each decode again."""
        if self._held:
            self._held = False
            self.session.llm.memory_hold("select")

    def __enter__(self) -> "Question":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
