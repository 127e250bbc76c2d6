"""Retrieval tasks over long inputs: passkey (Mohtashami & Jaggi) and a RULER-style needle in essays.

Passkey: a number hidden at a chosen depth in repeated filler ("The grass is
green. ..."), asked for at the end. Needle: "One of the special magic numbers
for <word> is: <number>." placed at a sentence boundary in real essay text.
Multi-key needle (RULER's MK-NIAH): the same, with three more such lines for
other words at random depths, so that the model must retrieve the number of the
word asked, not any number that stands out. All are scored by greedy decoding:
correct when the first number generated is the hidden one. Every configuration
reads the same prompts (same seed).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import native
from ..jsonfile import read_json_if, write_json_atomic, writes_one_file
from ..native import load_tokenizer
from ..reader import common_prefix  # noqa: F401 (tasks.common_prefix is what callers used)
from ..names import MEMORY_STORE_LAYOUT, NamedConfig
from ..session import ContextBackend, ReadReport, Session

PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                 "I will quiz you about the important information there.")
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_LINE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"

NEEDLE_LINE = " One of the special magic numbers for {word} is: {key}."
NEEDLE_QUESTION = ("\n\nWhat is the special magic number for {word} mentioned in the provided text? "
                   "The special magic number for {word} mentioned in the provided text is")
NEEDLE_WORDS = ("amber-falcon", "quiet-harbor", "silver-orchard", "northern-lantern", "velvet-canyon",
                "copper-meadow", "hollow-summit", "crimson-tide", "lucky-pebble", "distant-willow")

NEEDLE_DISTRACTORS = 3  # needle-multi: lines for other words besides the one asked

TASKS = ("passkey", "needle", "needle-multi")


@dataclass
class Prompt:
    tokens: List[int]
    key: str
    depth: float
    length: int
    question_start: int = 0  # index of the first token of the question (top_k_scope="question" switches there)
    n_new: Optional[int] = None  # answer tokens to generate (None: the run's)


def _question_start(tokenize: Callable[[str, bool], List[int]], document: str, tokens: List[int]) -> int:
    """Where the question starts in ``tokens``: the length of their common prefix with the document alone."""
    return min(common_prefix(tokenize(document, True), tokens), len(tokens) - 1)


def first_number(text: str) -> Optional[str]:
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


def passkey_prompt(tokenize: Callable[[str, bool], List[int]], length: int, depth: float,
                   rng: np.random.Generator) -> Prompt:
    """A passkey prompt of about ``length`` tokens with the key at fractional ``depth`` of the filler."""
    key = str(int(rng.integers(10000, 100000)))
    n_fixed = len(tokenize(PASSKEY_INTRO + PASSKEY_LINE.format(key=key) + PASSKEY_QUESTION, True))
    n_rep = len(tokenize(PASSKEY_FILLER * 20, False)) / 20
    n_filler = max(0, int((length - n_fixed) / n_rep))
    before = int(round(depth * n_filler))
    document = (PASSKEY_INTRO + PASSKEY_FILLER * before + PASSKEY_LINE.format(key=key)
                + PASSKEY_FILLER * (n_filler - before))
    tokens = tokenize(document + PASSKEY_QUESTION, True)
    return Prompt(tokens, key, depth, length, _question_start(tokenize, document, tokens))


def needle_prompt(tokenize: Callable[[str, bool], List[int]], haystack: str, length: int, depth: float,
                  rng: np.random.Generator, distractors: int = 0) -> Prompt:
    """The essays cut to about ``length`` tokens with a magic number at the sentence boundary nearest ``depth``;
    ``distractors`` more lines give numbers for other words at random depths (the multi-key needle)."""
    key = str(int(rng.integers(1_000_000, 10_000_000)))
    word = NEEDLE_WORDS[int(rng.integers(len(NEEDLE_WORDS)))]
    if not 0 <= distractors < len(NEEDLE_WORDS):
        raise ValueError(f"distractors={distractors}: use 0 to {len(NEEDLE_WORDS) - 1} (one word each)")
    needle, question = NEEDLE_LINE.format(word=word, key=key), NEEDLE_QUESTION.format(word=word)
    rest = [w for w in NEEDLE_WORDS if w != word]
    others = [(float(rng.random()), NEEDLE_LINE.format(word=rest[int(i)], key=int(rng.integers(1_000_000, 10_000_000))))
              for i in (rng.permutation(len(rest))[:distractors] if distractors else [])]
    budget = length - len(tokenize(needle + question + "".join(line + " " for _, line in others), True))
    if budget <= 0:
        raise ValueError(f"length={length} leaves no room for the essay text: use a length above "
                         f"{length - budget}")
    # characters per token of this text, then trim to the budget exactly
    sample = haystack[: 8 * budget + 1000]
    ids = tokenize(sample, False)
    if len(ids) < budget:
        raise ValueError(f"the haystack has {len(ids)} tokens, fewer than the {budget} needed for length={length}")
    text = llama_detok(tokenize, ids[:budget], sample)
    ends = [m.end() for m in re.finditer(r"[.!?]\s", text)]
    def boundary(d: float) -> int:
        return min(ends, key=lambda e: abs(e - int(d * len(text)))) if ends and 0 < d < 1 else (0 if d <= 0 else len(text))

    at = boundary(depth)
    # the distractors first, at boundaries of the text before the needle goes in (the needle's place is kept)
    inserts = sorted([(boundary(d), line + " ") for d, line in others] + [(at, needle + " ")], key=lambda x: x[0])
    document, prev = "", 0
    for pos, line in inserts:
        document += text[prev:pos] + line
        prev = pos
    document += text[prev:]
    tokens = tokenize(document + question, True)
    return Prompt(tokens, key, depth, length, _question_start(tokenize, document, tokens))


def llama_detok(tokenize, ids, sample: str) -> str:
    """The prefix of ``sample`` that tokenizes to about len(ids) tokens (binary search on characters)."""
    lo, hi = 0, len(sample)
    n = len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenize(sample[:mid], False)) <= n:
            lo = mid
        else:
            hi = mid - 1
    return sample[:lo]


class Stream:
    """Greedy answers to retrieval prompts: a ``Session`` on the Llama's raw context (``ContextBackend``), with
    llama.cpp's context shift when ``context_shift`` (n_keep) is set (the 'context-shift' configuration). The
    reading, the question and the hold of the memory's blocks around it are the Session's; what is the task's is
    where the middle keys switch on (the question's start, top_k_scope 'question'), the end-of-text stop and the
    one reading asked several ways from a saved state (``ask_each``). With ``progress`` each reading shows a bar of
    its tokens, erased when done (a 64k reading inside a grid's bar of trials takes minutes), a whole prompt read as
    the question (full attention, Λ alone, context shift) too."""

    def __init__(self, llm, n_batch: int, context_shift: Optional[int] = None, progress: bool = False) -> None:
        self.llm = llm
        self.progress = progress
        self.context = ContextBackend(llm, n_batch, context_shift)
        self.session = Session(self.context)
        # the last reading and the last answer, timed by the Session (what a grid reports beside the score)
        self.last_read: Optional[ReadReport] = None
        self.last_first_token_seconds = float("nan")
        self.last_answer_seconds = float("nan")
        self.answer_timing: Dict[str, tuple] = {}  # ask_each's: {name: (first token's seconds, answer's seconds)}

    @property
    def has_top_k(self) -> bool:
        """Whether the model keeps middle keys (a configuration without them reads and asks with nothing to switch)."""
        return self.llm.attention_resolved.top_k > 0

    def close(self) -> None:
        self.context.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """An empty cache at position 0."""
        self.context.reset()

    def greedy(self, prompt: Sequence[int], n_new: int, question_start: Optional[int] = None,
               hold: bool = False) -> List[int]:
        """Greedy answer; with ``question_start`` the top-k middle keys are switched on there (top_k_scope
        'question'), and the memory's blocks held for the answer with ``hold``."""
        if question_start is None:
            if hold:
                raise ValueError("hold: the answer holds the blocks of a question; give question_start")
            self.reset()
            return self.answer_question(prompt, n_new, progress=self.progress)
        self.read_document(prompt[:question_start])
        return self.ask(prompt[question_start:], n_new, hold)

    def read_document(self, document: Sequence[int]) -> None:
        """A new stream of ``document`` with the middle keys off (the reading; ``ask`` switches them on)."""
        self.reset()
        if self.has_top_k:
            self.llm.set_top_k_active(False)
        self.last_read = self.session.read(document, progress=self.progress, leave=False)

    def ask(self, question: Sequence[int], n_new: int, hold: bool = False) -> List[int]:
        """Greedy answer to ``question`` after the document in the cache, with the middle keys on; with ``hold``
        the question keeps the memory's blocks it selects and the answer attends to them."""
        if self.has_top_k:
            self.llm.set_top_k_active(True)
        return self.answer_question(question, n_new, hold)

    def answer_question(self, question: Sequence[int], n_new: int, hold: bool = False,
                        progress: bool = False) -> List[int]:
        """Greedy answer to ``question`` with the attention as it is set (the held blocks as ``ask`` says): at most
        ``n_new`` tokens, up to the end of text; ``progress``: a reading's bar of the question's tokens (a whole
        prompt read as the question)."""
        t0 = time.perf_counter()
        with self.session.ask(question, hold=hold, progress=progress, leave=False) as asked:
            self.last_first_token_seconds = asked.seconds
            out = asked.answer_tokens(n_new, stop=self.llm.token_eos())
        self.last_answer_seconds = time.perf_counter() - t0
        return out

    def ask_each(self, document: Sequence[int], question: Sequence[int], n_new: int,
                 top_ks: Dict[str, int], holds: Optional[Dict[str, bool]] = None,
                 selecting: Optional[Dict[str, Tuple[int, int]]] = None) -> Dict[str, List[int]]:
        """Read ``document`` once, then answer ``question`` once per entry of ``top_ks`` ({name: the question's
        top_k, 0 = no middle keys}; ``holds``: {name: the answer holds the question's blocks}; ``selecting``:
        {name: (the memory's candidates, the question's selecting tokens)}), each from the state right after the
        reading (saved to a temporary file, with the memory's blocks when it has a memory)."""
        import tempfile

        self.read_document(document)
        out: Dict[str, List[int]] = {}
        with tempfile.TemporaryDirectory(prefix="llama-extrapolate-reading-") as tmp:
            state = Path(tmp) / "reading.state"
            if len(top_ks) > 1:
                native.write_state_file(self.context.ctx, state, document)
            for i, (name, k) in enumerate(top_ks.items()):
                if i > 0:
                    self.reset()
                    if native.read_state_file(self.context.ctx, state, len(document)) != list(document):
                        raise RuntimeError(f"the state saved after the reading ({state}) did not load back")
                    self.context.n_past = len(document)
                self.llm.set_top_k(k)
                if selecting and name in selecting:
                    self.llm.set_memory_question(*selecting[name])
                out[name] = self.answer_question(question, n_new, bool((holds or {}).get(name)))
                self.answer_timing[name] = (self.last_first_token_seconds, self.last_answer_seconds)
        return out


def trial_rng(seed: int, length: int, depth: float, trial: int) -> np.random.Generator:
    """The random numbers of one trial's prompt (its key, its needle's word): studies that rebuild a prompt of
    ``run_retrieval`` take them from here."""
    return np.random.default_rng([seed, length, int(round(depth * 1000)), trial])


def shared_readings(configs: Sequence[str]) -> List[tuple]:
    """[(the configuration that reads, [the configurations asked after its reading])] in the order given.

    A document-memory configuration and its ':passages' and ':hold' twins read alike (the question's top_k and
    the answer's hold alone differ), and so do memories that differ only in their candidates c and the question's
    selecting tokens (':last=T'), which are set before each question (Llama.set_memory_question): the reading is
    loaded with the largest c of the group, which sizes the graph;
    and 'lambda' is the memory's reading with the memory left unused at the question: the same Λ mask over the
    same window and sinks (the memory only keeps what leaves the window; a key it still caches at the window's
    edge is masked), so all three read once. Every other configuration reads alone."""
    from dataclasses import replace

    groups: Dict[str, List[str]] = {}
    for name in configs:
        reader = (replace(NamedConfig.parse(name), passages=False, hold=False, memory_candidates=0,
                          select_tokens=0).name if NamedConfig.is_memory_name(name) else name)
        groups.setdefault(reader, []).append(name)
    # a memory's group reads with the largest candidates any of its names asks with
    groups = {(replace(NamedConfig.parse(r), memory_candidates=max(NamedConfig.parse(n).memory_candidates
                                                                   for n in names)).name
               if NamedConfig.is_memory_name(r) else r): names for r, names in groups.items()}
    readers = [r for r in groups if NamedConfig.is_memory_name(r)]
    if "lambda" in groups and readers:
        groups[readers[0]] += groups.pop("lambda")
    # a configuration alone reads as itself (a ':passages' one with its own top_k from the start)
    return [(names[0], names) if len(names) == 1 else (reader, names) for reader, names in groups.items()]


def memory_question(name: str) -> Tuple[int, int]:
    """(candidates, selecting tokens) a memory configuration's question selects with (Llama.set_memory_question)."""
    named = NamedConfig.parse(name)
    return named.memory_candidates, named.select_tokens


def holds(name: str) -> bool:
    """Whether configuration ``name``'s answer holds the blocks its question selected (a memory's ':hold')."""
    return NamedConfig.is_memory_name(name) and NamedConfig.parse(name).hold


def question_top_k(name: str, attention) -> int:
    """The top_k a question of configuration ``name`` takes after a reading with ``attention`` (a memory's):
    0 for 'lambda' (the memory unused), else the memory's rule (config.memory_question_top_k)."""
    from ..config import memory_question_top_k
    from .evaluate import memory_settings_of

    if name == "lambda":
        return 0
    settings = memory_settings_of(name)
    if settings is None:
        raise ValueError(f"configuration {name!r} does not ask after a memory's reading")
    return memory_question_top_k(settings.blocks, attention.memory_block_size, settings.passages)


@writes_one_file("out_path")
def run_retrieval(model: str, task: str, configs: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
                  trials: int, seed: int, out_path, *, n_batch: int = 512, threads: Optional[int] = None,
                  window: Optional[int] = None, sinks: Optional[int] = None, n_new: int = 10,
                  progress: bool = True, share_reading: bool = True) -> dict:
    """Accuracy by configuration, length and depth; each trial is written to ``out_path`` as it finishes and a
    rerun with the same settings skips the trials already there. With ``share_reading`` the configurations that
    read a prompt alike (``shared_readings``) read it once and are asked in turn from a saved state: the reading
    is nearly all of a trial's time at 16k tokens and more."""
    from .corpora import paul_graham_essays
    from .evaluate import memory_config_name
    from ..model_info import read_model_info

    if task not in TASKS:
        raise ValueError(f"task {task!r}: use one of {', '.join(TASKS)}")
    if trials < 1:
        raise ValueError(f"trials={trials} must be >= 1")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise ValueError(f"depth {bad[0]} must be in [0, 1] (0 = start of the text, 1 = end)")
    bad = [L for L in lengths if L < 64]
    if bad:
        raise ValueError(f"length {bad[0]} is too short: use 64 tokens or more")
    info = read_model_info(model)
    configs = [memory_config_name(c) for c in configs]  # trials say which m they ran with
    out_path = Path(out_path)
    results = resumed_trials(out_path, {"task": task, "seed": seed, "model": Path(model).name, "n_new": n_new})
    done = {(t["config"], t["length"], t["depth"], t["trial"]) for t in results["trials"]}

    def save() -> None:
        results["accuracy"] = accuracy_table(results["trials"])
        write_json_atomic(out_path, results, indent=1)

    vocab = load_tokenizer(model)
    haystack = paul_graham_essays() if task.startswith("needle") else ""

    def tokenize(text: str, bos: bool) -> List[int]:
        return vocab.tokenize(text.encode("utf-8"), add_bos=bos)

    prompts: Dict[tuple, Prompt] = {}
    for L in lengths:
        for d in depths:
            for k in range(trials):
                rng = trial_rng(seed, L, d, k)
                prompts[(L, d, k)] = (passkey_prompt(tokenize, L, d, rng) if task == "passkey"
                                      else needle_prompt(tokenize, haystack, L, d, rng,
                                                         NEEDLE_DISTRACTORS if task == "needle-multi" else 0))
    vocab.close()

    def record(key: tuple, name: str, p: Prompt, text: str, timing: dict) -> dict:
        L, d, k = key
        return {"config": name, "length": L, "depth": d, "trial": k, "tokens": len(p.tokens), "key": p.key,
                "answer": text.strip(), "correct": first_number(text) == p.key, **timing}

    answer_prompts(model, info, configs, prompts, lambda name, key: (name, *key) in done, record,
                   lambda trial: (results["trials"].append(trial), save()), n_batch=n_batch, threads=threads,
                   window=window, sinks=sinks, n_new=n_new, progress=progress, desc=task,
                   share_reading=share_reading)
    save()
    return results


def resumed_trials(out_path: Path, settings: dict) -> dict:
    """The results file's content when it was written with these ``settings`` (its trials are kept and skipped by
    the rerun), else a new one: the settings and an empty list of trials."""
    results = read_json_if(out_path, lambda old: all(old.get(k) == v for k, v in settings.items()))
    results.update(settings)
    results.setdefault("trials", [])
    return results


def answer_prompts(model: str, info, configs: Sequence[str], prompts: Dict[tuple, Prompt],
                   is_done: Callable[[str, tuple], bool], record: Callable[..., dict], keep: Callable[[dict], None],
                   *, n_batch: int, threads: Optional[int], window: Optional[int], sinks: Optional[int],
                   n_new: int, progress: bool, desc: str, share_reading: bool = True,
                   read_apart: bool = False) -> None:
    """Every prompt answered greedily under every configuration not yet done (``is_done(name, key)``): one Llama
    per reading group (``shared_readings``), each prompt read once per group and asked once per configuration,
    ``record(key, name, prompt, answer_text, timing)`` making the trial that ``keep`` stores (as soon as
    it is known, so that a stopped run resumes). ``timing``: the reading's tokens per second and seconds, the
    first answer token's and the whole answer's seconds, the trial's seconds, the reading group's peak RSS so
    far, and ``read_with`` when the reading was shared. ``read_apart``: every configuration reads the document
    and then decodes the question (timed apart), not only those whose middle keys switch on at the question."""
    from .evaluate import setup_for
    from ..llama import Llama, thread_counts
    from ..resources import peak_rss_bytes, peak_rss_reset

    total = len(configs) * len(prompts)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="trial",
                   initial=sum(1 for c in configs for k in prompts if is_done(c, k)))
    try:
        for reader, names in (shared_readings(configs) if share_reading else [(c, [c]) for c in configs]):
            todo = [(k, p, [n for n in names if not is_done(n, k)]) for k, p in prompts.items()]
            todo = [t for t in todo if t[2]]
            if not todo:
                continue
            longest = max(len(p.tokens) + (p.n_new or n_new) for p in prompts.values())
            st = setup_for(reader, info, longest, n_batch, window=window, sinks=sinks)
            llm = Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                        verbose=False, **thread_counts(threads), **st.llama_kwargs())
            stream = Stream(llm, n_batch, st.context_shift, progress=progress)
            if len(names) == 1 and NamedConfig.is_memory_name(reader):
                llm.set_memory_question(*memory_question(reader))  # the question's selecting tokens
            peak_rss_reset()  # each reading group's own peak (Linux), not an earlier group's
            try:
                for key, p, pending in todo:
                    t0 = time.perf_counter()
                    new = p.n_new or n_new
                    answers: Dict[str, tuple] = {}
                    if len(names) == 1:
                        out = stream.greedy(p.tokens, new,
                                            p.question_start if st.top_k_question or read_apart else None,
                                            hold=holds(reader))
                        answers[reader] = (out, stream.last_first_token_seconds, stream.last_answer_seconds)
                    else:
                        outs = stream.ask_each(p.tokens[:p.question_start], p.tokens[p.question_start:], new,
                                               {n: question_top_k(n, st.attention) for n in pending},
                                               {n: holds(n) for n in pending},
                                               {n: memory_question(n) for n in pending if NamedConfig.is_memory_name(n)})
                        answers = {n: (out, *stream.answer_timing[n]) for n, out in outs.items()}
                    seconds = time.perf_counter() - t0
                    read = stream.last_read
                    for name, (out, first, answer_s) in answers.items():
                        text = llm.detokenize(out).decode("utf-8", errors="replace")
                        timing = {"seconds": seconds, "first_token_seconds": first, "answer_seconds": answer_s,
                                  "answer_tokens": len(out), "peak_rss_bytes": peak_rss_bytes(),
                                  "date": time.strftime("%Y-%m-%d %H:%M")}  # (what the build of that hour computed)
                        if NamedConfig.is_memory_name(name):
                            timing["store_layout"] = MEMORY_STORE_LAYOUT
                        if name != reader or len(answers) > 1:
                            timing["read_with"] = reader  # one reading, then the question asked in several ways
                        if read is not None and read.tokens:
                            timing.update(read_seconds=read.seconds, read_tokens_per_second=read.tokens_per_second)
                        keep(record(key, name, p, text, timing))
                        if bar is not None:
                            bar.update(1)
            finally:
                stream.close()
                llm.close()
    finally:
        if bar is not None:
            bar.close()


def accuracy_table(trials: List[dict]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{config: {length: {depth: fraction correct}}}."""
    acc: Dict[str, Dict[str, Dict[str, List[bool]]]] = {}
    for t in trials:
        acc.setdefault(t["config"], {}).setdefault(str(t["length"]), {}).setdefault(str(t["depth"]), []).append(
            bool(t["correct"]))
    return {c: {L: {d: float(np.mean(v)) for d, v in ds.items()} for L, ds in ls.items()} for c, ls in acc.items()}
