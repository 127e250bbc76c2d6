"""RULER (Hsieh et al., 2024), the long-context yardstick every peer reports, generated here in the model's tokenizer.

What is RULER's is taken as data, not code: the task templates and answer budgets (the ``TASKS`` literal of its
package's ``data/synthetic/constants.py``, parsed, never imported), the essays and QA paragraphs (SQuAD, HotpotQA)
of the same package, and the word lists RULER draws keys from (wonderwords' nouns, adjectives and verbs). The
generators below follow the benchmark's description (needles at sentence boundaries of the essays, chains of
variable assignments in filler, repeated words to count, a question's paragraphs among distractors); each sample
is filled to the largest haystack that leaves the answer's tokens inside the length, as RULER does, and is a pure
function of (seed, task, length, trial), so a rerun rebuilds the same prompt. Scores are RULER's: the share of the
references found in the answer (``all``) or whether any is (``part``, the QA tasks), in percent.

The sentence splitter is a regular expression (NLTK's data, which RULER uses, is not installed): a needle lands
after a '.', '!' or '?' that ends a sentence; RULER's figures for the same model differ by that much at most.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..jsonfile import write_json_atomic, writes_one_file
from .corpora import long_context_eval_file
from .tasks import PASSKEY_FILLER, Prompt

# RULER's task table (its synthetic.yaml): the generator each task uses and its arguments
RULER_TASKS: Dict[str, Tuple[str, dict]] = {
    "niah_single_1": ("niah", dict(type_haystack="repeat", type_needle_k="words", type_needle_v="numbers",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_single_2": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_single_3": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="uuids",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_1": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=4, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_2": ("niah", dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_3": ("niah", dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multivalue": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=4, num_needle_q=1)),
    "niah_multiquery": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=4)),
    "vt": ("variable_tracking", dict(num_chains=1, num_hops=4)),
    "cwe": ("common_words_extraction", dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    "qa_1": ("qa", dict(dataset="squad")),
    "qa_2": ("qa", dict(dataset="hotpotqa")),
}
# the grid: the NIAH variants that differ in kind, the two aggregation tasks and the two QA tasks
GRID_TASKS = ("niah_single_2", "niah_multikey_2", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa_1", "qa_2")
METRICS = {"niah": "all", "variable_tracking": "all", "common_words_extraction": "all", "qa": "part"}

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
DOCUMENT = "Document {i}:\n{document}"
CONTEXT_MARK = "\x00context\x00"  # where the context goes in a filled template: the document ends there
NIAH_DEPTHS = np.round(np.linspace(0, 100, num=40)).astype(int)  # RULER's needle depths, in percent
# essay words per step of the fit; every other haystack (lines, filler sentences, listed words, paragraphs) steps by
# one (RULER steps by 500 words, 25 lines or 10 of the rest, which leaves a prompt up to a step short of its length)
ESSAY_STEP = 50


@lru_cache(maxsize=1)
def templates() -> Dict[str, dict]:
    """RULER's templates, answer prefixes and answer budgets by generator ({'niah': {'template', 'answer_prefix',
    'tokens_to_generate'}, ...}), the literal of its constants module read without running it."""
    source = long_context_eval_file("data/synthetic/constants.py").decode("utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TASKS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError("nvidia-long-context-eval's data/synthetic/constants.py has no TASKS table")


@lru_cache(maxsize=1)
def word_lists() -> Dict[str, List[str]]:
    """wonderwords' nouns, adjectives and verbs (RULER's keys are adjective-noun pairs, its counted words all three)."""
    try:
        from importlib.resources import files

        root = files("wonderwords") / "assets"
    except ModuleNotFoundError:
        raise ImportError("RULER's tasks draw their words from wonderwords: pip install 'llama-extrapolate[ruler]' "
                          "(or pip install wonderwords)") from None
    return {kind: sorted({w.strip() for w in (root / f"{kind}list.txt").read_text().splitlines() if w.strip()})
            for kind in ("noun", "adjective", "verb")}


@lru_cache(maxsize=1)
def word_pool() -> List[str]:
    """Every word of the three lists once, sorted: the words RULER's common-words task lists."""
    lists = word_lists()
    return sorted(set(lists["noun"]) | set(lists["adjective"]) | set(lists["verb"]))


@lru_cache(maxsize=2)
def qa_data(dataset: str) -> Tuple[List[dict], List[str]]:
    """(questions, paragraphs) of RULER's QA task: each question with its answers, its own paragraphs ('gold') and,
    for SQuAD, the other paragraphs of its article ('near', the first distractors); unanswerable SQuAD questions
    left out, as RULER does."""
    if dataset == "squad":
        data = json.loads(long_context_eval_file("data/synthetic/json/squad.json"))["data"]
        docs = sorted({p["context"] for d in data for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in data:
            article = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for qa in p["qas"]:
                    if not qa["is_impossible"]:
                        gold = index[p["context"]]
                        qas.append({"query": qa["question"], "outputs": [a["text"] for a in qa["answers"]],
                                    "gold": [gold], "near": [i for i in article if i != gold]})
        return qas, docs
    if dataset == "hotpotqa":
        data = json.loads(long_context_eval_file("data/synthetic/json/hotpotqa.json"))
        text = lambda title, sents: f"{title}\n{''.join(sents)}"  # noqa: E731
        docs = sorted({text(t, p) for d in data for t, p in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        return ([{"query": d["question"], "outputs": [d["answer"]], "gold": [index[text(t, p)] for t, p in d["context"]],
                  "near": []} for d in data], docs)
    raise ValueError(f"QA dataset {dataset!r}: use squad or hotpotqa")


@lru_cache(maxsize=1)
def essay_words() -> Tuple[str, ...]:
    from .corpora import paul_graham_essays

    return tuple(re.sub(r"\s+", " ", paul_graham_essays()).split(" "))


def split_sentences(text: str) -> List[str]:
    """Sentences of ``text``: a break after '.', '!' or '?' (closing quotes kept) followed by a space."""
    return [s for s in re.split(r"(?<=[.!?])(?<![A-Z]\.)(?<=\S)\s+(?=[\"'(\[A-Z0-9])", text.strip()) if s]


def postprocess(prediction: str) -> str:
    """RULER's cleaning of an answer: stripped, control characters as line breaks."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def score(prediction: str, references: Sequence[str], metric: str) -> float:
    """RULER's score of one answer in percent: 'all' the share of the references in it, 'part' 100 when any is
    (case-insensitive substrings)."""
    found = [r.lower() in prediction.lower() for r in references]
    if metric == "all":
        return 100.0 * sum(found) / len(found)
    if metric == "part":
        return 100.0 * max(found)
    raise ValueError(f"metric {metric!r}: use all or part")


@dataclass
class Sample:
    """One RULER prompt: the tokens (document, then the question and the answer's prefix), what the answer must
    contain, how it is scored and the haystack it was filled with."""

    task: str
    length: int
    trial: int
    prompt: Prompt
    references: List[str]
    metric: str
    units: int  # haystack units the fit chose (words, lines, sentences, listed words or paragraphs)
    seed: List[int] = field(default_factory=list)


def sample_seed(seed: int, task: str, length: int, trial: int) -> List[int]:
    """The entropy of one sample's random numbers (recorded with the trial so that its prompt can be rebuilt)."""
    return [int(seed), zlib.crc32(task.encode()), int(length), int(trial)]


class _Generator:
    """The text of one sample for ``units`` haystack units: ``build(units)`` gives (instructions and context,
    question and answer prefix, references); every call starts from the sample's seed, so one ``units`` gives one
    text whichever calls came before."""

    def __init__(self, task: str, entropy: List[int], short: bool) -> None:
        if task not in RULER_TASKS:
            raise ValueError(f"RULER task {task!r}: use one of {', '.join(RULER_TASKS)}")
        self.task, self.entropy, self.short = task, entropy, short
        self.kind, self.args = RULER_TASKS[task]
        self.spec = templates()[self.kind]

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([*self.entropy, salt])

    @property
    def step(self) -> int:
        return ESSAY_STEP if self.kind == "niah" and self.args["type_haystack"] == "essay" else 1

    def fill(self, template: str, context: str, prefix: Optional[str] = None, **kw) -> Tuple[str, str, str]:
        """(document, question, answer prefix) of ``template`` and the answer prefix (the task's unless given): the
        document ends with ``context``."""
        before, after = template.format(context=CONTEXT_MARK, **kw).split(CONTEXT_MARK)
        prefix = self.spec.get("answer_prefix", "") if prefix is None else prefix
        return before + context, after, prefix.format(**kw)

    def build(self, units: int) -> Tuple[str, str, str, List[str]]:
        """(document, question, answer prefix, references) for ``units`` haystack units."""
        return getattr(self, "_" + self.kind)(units)

    # --- needle in a haystack ------------------------------------------------------------------------
    def _random(self, rng: np.random.Generator, kind: str) -> str:
        if kind == "numbers":
            return str(int(rng.integers(10 ** 6, 10 ** 7)))
        if kind == "words":
            words = word_lists()
            adj, noun = words["adjective"], words["noun"]
            return f"{adj[int(rng.integers(len(adj)))]}-{noun[int(rng.integers(len(noun)))]}"
        if kind == "uuids":
            return str(uuid.UUID(bytes=rng.bytes(16), version=4))
        raise ValueError(f"needle kind {kind!r}")

    def _niah(self, units: int) -> Tuple[str, str, str, List[str]]:
        a, rng = self.args, self.rng()
        n_keys = max(a["num_needle_k"], a["num_needle_q"])
        keys, values, needles = [], [], []
        for _ in range(n_keys):
            keys.append(self._random(rng, a["type_needle_k"]))
            values.append([self._random(rng, a["type_needle_v"]) for _ in range(a["num_needle_v"])])
            needles += [NEEDLE.format(kind=a["type_needle_v"], key=keys[-1], value=v) for v in values[-1]]
        needles = [needles[i] for i in rng.permutation(len(needles))]
        if a["type_haystack"] == "essay":
            sentences = split_sentences(" ".join(essay_words()[:units]))
            at = sorted(int(len(sentences) * d / 100) for d in rng.choice(NIAH_DEPTHS, len(needles), replace=False))
            parts, prev = [], 0
            for pos, needle in zip(at, needles):
                parts += [" ".join(sentences[prev:pos]), needle]
                prev = pos
            context = " ".join(p for p in parts + [" ".join(sentences[prev:])] if p)
        else:
            if a["type_haystack"] == "repeat":
                lines = [PASSKEY_FILLER.strip()] * units
            else:  # "needle": the haystack is needles of other keys
                lines = [NEEDLE.format(kind=a["type_needle_v"], key=self._random(rng, a["type_needle_k"]),
                                       value=self._random(rng, a["type_needle_v"])) for _ in range(units)]
            for index, needle in zip(sorted(rng.choice(units, len(needles), replace=False), reverse=True), needles):
                lines.insert(int(index), needle)
            context = "\n".join(lines)
        asked = rng.choice(n_keys, a["num_needle_q"], replace=False)
        queries = [keys[i] for i in asked]
        references = [v for i in asked for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, prefix, kind = self.spec["template"], self.spec.get("answer_prefix", ""), a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:  # one answer: the words in the singular, as RULER's
            template, prefix = (t.replace("Some", "A").replace("are all", "is").replace("are", "is")
                                .replace("answers", "answer") for t in (template, prefix))
            kind = kind[:-1]
        return (*self.fill(template, context, prefix, type_needle_v=kind, query=query), references)

    # --- variable tracking ---------------------------------------------------------------------------
    def _chain(self, rng: np.random.Generator, letters: int) -> Tuple[List[str], List[str], str]:
        hops = self.args["num_hops"]
        names: List[str] = []
        while len(names) < hops + 1:
            name = "".join(chr(65 + int(c)) for c in rng.integers(0, 26, letters))
            if name not in names:
                names.append(name)
        value = str(int(rng.integers(10000, 99999)))
        lines = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
        return names, lines, value

    def _vt_text(self, rng: np.random.Generator, units: int, letters: int) -> Tuple[str, str, str, List[str]]:
        if self.args["num_chains"] != 1:
            raise ValueError("variable tracking with more than one chain is not generated here")
        names, chain, value = self._chain(rng, letters)
        sentences = [PASSKEY_FILLER.strip() + "\n"] * units
        for j, pos in enumerate(sorted(rng.choice(len(sentences), len(chain), replace=False))):
            sentences.insert(int(pos) + j, chain[j])
        context = " ".join(sentences).replace(". \n", ".\n")
        return (*self.fill(self.spec["template"], context, query=value, num_v=len(names)), names)

    def _variable_tracking(self, units: int) -> Tuple[str, str, str, List[str]]:
        # one worked example first (RULER's: three-letter names, about 500 tokens), then the task
        *example, example_names = self._vt_text(self.rng(1), 15, 3)
        document, question, prefix, names = self._vt_text(self.rng(), units, 5)
        return "".join(example) + " " + " ".join(example_names) + "\n\n" + document, question, prefix, names

    # --- common words --------------------------------------------------------------------------------
    def _word_list(self, rng: np.random.Generator, n: int, common: int, rare: int) -> Tuple[str, List[str]]:
        pool = word_pool()
        if n > len(pool):
            raise ValueError(f"{n} distinct words asked, the word lists hold {len(pool)}")
        chosen = [pool[i] for i in rng.choice(len(pool), n, replace=False)]
        top = chosen[:self.args["num_cw"]]
        listed = top * common + chosen[self.args["num_cw"]:] * rare
        listed = [listed[i] for i in rng.permutation(len(listed))]
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), top

    def _common_words_extraction(self, units: int) -> Tuple[str, str, str, List[str]]:
        rng = self.rng()
        ex_n, ex_common, ex_rare, common, rare = ((20, 3, 1, 6, 1) if self.short else
                                                 (40, 10, 3, self.args["freq_cw"], self.args["freq_ucw"]))
        example_context, example_top = self._word_list(rng, ex_n, ex_common, ex_rare)
        context, top = self._word_list(rng, units, common, rare)
        example = "".join(self.fill(self.spec["template"], example_context, query=""))
        example += " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(example_top))
        document, question, prefix = self.fill(self.spec["template"], context, query="")
        return example + "\n" + document, question, prefix, top

    def min_units(self) -> int:
        """The least haystack a prompt can have: room for every needle or chain line, more words than the common
        ones, the question's own paragraphs."""
        a = self.args
        if self.kind == "niah":
            return max(a["num_needle_k"], a["num_needle_q"]) * a["num_needle_v"]
        if self.kind == "variable_tracking":
            return a["num_hops"] + 1
        if self.kind == "common_words_extraction":
            return a["num_cw"] + 1
        return len(self._question()["gold"])

    def max_units(self) -> Optional[int]:
        """The most haystack units there are (the word lists, the paragraphs, the essays), None when unbounded."""
        if self.kind == "common_words_extraction":
            return len(word_pool())
        if self.kind == "qa":
            return len(qa_data(self.args["dataset"])[1])
        if self.kind == "niah" and self.args["type_haystack"] == "essay":
            return len(essay_words())
        return None

    # --- question answering --------------------------------------------------------------------------
    def _question(self) -> dict:
        """The trial's question: the trial-th of a shuffle by the seed, so every length asks the same ones."""
        qas, _ = qa_data(self.args["dataset"])
        order = np.random.default_rng([self.entropy[0], self.entropy[1]]).permutation(len(qas))
        return qas[int(order[self.entropy[3] % len(qas)])]

    def _qa(self, units: int) -> Tuple[str, str, str, List[str]]:
        _, docs = qa_data(self.args["dataset"])
        qa, rng = self._question(), self.rng()
        gold, near = qa["gold"], qa["near"]
        if units < len(gold):
            raise ValueError(f"{units} paragraphs cannot hold the question's {len(gold)}")
        if units - len(gold) <= len(near):
            chosen = gold + [near[i] for i in rng.choice(len(near), units - len(gold), replace=False)]
        else:
            taken = set(gold) | set(near)
            rest = [int(i) for i in rng.permutation(len(docs))[: units + len(taken)] if int(i) not in taken]
            chosen = gold + near + rest[: units - len(gold) - len(near)]
        chosen = [chosen[i] for i in rng.permutation(len(chosen))]
        context = "\n\n".join(DOCUMENT.format(i=i + 1, document=docs[d]) for i, d in enumerate(chosen))
        return (*self.fill(self.spec["template"], context, query=qa["query"]), list(qa["outputs"]))


class PromptFormat:
    """How a sample's text becomes tokens: plain (RULER's 'base' template: the task's text, BOS first) or in the
    model's chat template (the task's text as the user's message, the answer's prefix after the assistant's
    header, as RULER formats chat models), from the GGUF's own template."""

    def __init__(self, vocab, chat: bool = False) -> None:
        self.vocab, self.chat = vocab, chat
        if chat and not vocab.metadata.get("tokenizer.chat_template"):
            raise ValueError("chat=True: this model's GGUF has no tokenizer.chat_template; use the plain format "
                             "(chat=False, the CLI's default)")

    def tokenize(self, text: str, bos: bool) -> List[int]:
        return self.vocab.tokenize(text.encode("utf-8"), add_bos=bos)

    def _user(self, content: str) -> List[int]:
        from ..reader import chat_prompt_tokens

        return chat_prompt_tokens(self.vocab, [{"role": "user", "content": content}])

    def tokens(self, document: str, question: str, prefix: str) -> List[int]:
        if self.chat:
            return self._user(document + question) + self.tokenize(prefix, False)
        return self.tokenize(document + question + prefix, True)

    def question_start(self, document: str, tokens: List[int]) -> int:
        """Where the question starts: the common prefix of ``tokens`` with the document's alone."""
        from ..reader import common_prefix

        alone = self._user(document) if self.chat else self.tokenize(document, True)
        return min(common_prefix(alone, tokens), len(tokens) - 1)


def ruler_sample(fmt: PromptFormat, task: str, length: int, seed: int, trial: int) -> Sample:
    """Task ``task``'s prompt of at most ``length`` tokens with room for its answer: the largest haystack (in
    the generator's steps) whose prompt and answer budget fit."""
    entropy = sample_seed(seed, task, length, trial)
    gen = _Generator(task, entropy, short=length < 4096)
    budget = length - int(gen.spec["tokens_to_generate"])
    step, top = gen.step, gen.max_units()
    top_k = None if top is None else top // step  # the most steps the haystack has
    sizes: Dict[int, int] = {}

    def size(k: int) -> int:
        if k not in sizes:
            sizes[k] = len(fmt.tokens(*gen.build(k * step)[:3]))
        return sizes[k]

    def fits(k: int) -> bool:
        return (top_k is None or k <= top_k) and size(k) <= budget

    low = -(-gen.min_units() // step)
    if not fits(low):
        raise ValueError(f"length={length} is too short for {task} ({size(low)} tokens with the least haystack, "
                         f"{gen.spec['tokens_to_generate']} more for the answer): use a longer length")
    # a guess from the tokens a unit adds, then bisection between a haystack that fits and one that does not
    per_unit = max(size(2 * low) - size(low), 1) / low if fits(2 * low) else float("inf")
    guess = max(low, int(low + 0.97 * (budget - size(low)) / per_unit)) if per_unit != float("inf") else low
    if top_k is not None:
        guess = min(guess, top_k)
    if fits(guess):
        low, hi = guess, guess + max(1, guess // 20)
        while fits(hi):
            low, hi = hi, hi + max(1, hi // 10)
            if top_k is not None and hi > top_k:
                hi = top_k + 1
                break
    else:
        hi = guess
    while hi - low > 1:
        mid = (low + hi) // 2
        if fits(mid):
            low = mid
        else:
            hi = mid
    document, question, prefix, references = gen.build(low * step)
    tokens = fmt.tokens(document, question, prefix)
    prompt = Prompt(tokens, references[0], 0.0, length, fmt.question_start(document, tokens),
                    n_new=int(gen.spec["tokens_to_generate"]))
    return Sample(task, length, trial, prompt, references, METRICS[gen.kind], low * step, entropy)


def score_table(trials: List[dict]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{task: {config: {length: mean score in percent}}}."""
    acc: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    for t in trials:
        acc.setdefault(t["task"], {}).setdefault(t["config"], {}).setdefault(str(t["length"]), []).append(t["score"])
    return {task: {c: {L: round(float(np.mean(v)), 2) for L, v in ls.items()} for c, ls in cs.items()}
            for task, cs in acc.items()}


def summary_table(trials: List[dict]) -> List[dict]:
    """One row per (task, config, length): samples, score, reading tokens per second, seconds to the first answer
    token and for the whole answer, the peak RSS of the reading group."""
    rows: Dict[tuple, List[dict]] = {}
    for t in trials:
        rows.setdefault((t["task"], t["config"], t["length"]), []).append(t)
    out = []
    for (task, config, length), ts in sorted(rows.items(), key=lambda x: (x[0][0], x[0][1], int(x[0][2]))):
        mean = lambda key: (float(np.mean([t[key] for t in ts if key in t])) if any(key in t for t in ts)  # noqa: E731
                            else None)
        out.append({"task": task, "config": config, "length": length, "samples": len(ts),
                    "score": round(float(np.mean([t["score"] for t in ts])), 2),
                    "read_tokens_per_second": mean("read_tokens_per_second"),
                    "first_token_seconds": mean("first_token_seconds"), "answer_seconds": mean("answer_seconds"),
                    "peak_rss_bytes": max(t.get("peak_rss_bytes", 0) for t in ts)})
    return out


def accuracy_by_config(trials: List[dict]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{config: {length: {task: score as a fraction}}}: the heatmap's layout (plots.plot_accuracy)."""
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for task, by_config in score_table(trials).items():
        for config, by_length in by_config.items():
            for length, value in by_length.items():
                out.setdefault(config, {}).setdefault(length, {})[task] = value / 100.0
    return out


@writes_one_file("out_path")
def run_ruler(model: str, task_names: Sequence[str], configs: Sequence[str], lengths: Sequence[int], trials: int,
              seed: int, out_path, *, chat: bool = False, n_batch: int = 512, threads: Optional[int] = None,
              window: Optional[int] = None, sinks: Optional[int] = None, progress: bool = True,
              share_reading: bool = True) -> dict:
    """RULER's score by task, configuration and length, ``trials`` samples per cell, each answered greedily with
    the task's answer budget. Trials are written as they finish and a rerun with the same model and seed skips
    those already there; the configurations that read alike read each prompt once (tasks.shared_readings)."""
    from .evaluate import memory_config_name
    from .tasks import answer_prompts, resumed_trials
    from ..model_info import read_model_info
    from ..native import load_tokenizer

    unknown = [t for t in task_names if t not in RULER_TASKS]
    if unknown or not task_names:
        raise ValueError(f"RULER task {unknown[0] if unknown else '(none)'!r}: use some of {', '.join(RULER_TASKS)}")
    if trials < 1:
        raise ValueError(f"trials={trials} must be >= 1")
    bad = [L for L in lengths if L < 512]
    if bad or not lengths:
        raise ValueError(f"length {bad[0] if bad else '(none)'}: RULER's prompts need 512 tokens or more")
    info = read_model_info(model)
    configs = [memory_config_name(c) for c in configs]
    out_path = Path(out_path)
    results = resumed_trials(out_path, {"benchmark": "ruler", "seed": seed, "model": Path(model).name,
                                        "chat": bool(chat)})
    done = {(t["config"], t["task"], t["length"], t["trial"]) for t in results["trials"]}

    def save() -> None:
        results["scores"] = score_table(results["trials"])
        results["summary"] = summary_table(results["trials"])
        write_json_atomic(out_path, results, indent=1)

    vocab = load_tokenizer(model)
    samples: Dict[tuple, Sample] = {}
    try:
        keys = [(task, L, k) for task in task_names for L in lengths for k in range(trials)]
        if progress:
            from tqdm import tqdm

            keys = tqdm(keys, desc="RULER prompts", unit="prompt", leave=False)
        fmt = PromptFormat(vocab, chat)
        for key in keys:
            if any((c, *key) not in done for c in configs):
                samples[key] = ruler_sample(fmt, *key[:2], seed, key[2])
    finally:
        vocab.close()

    def record(key: tuple, name: str, prompt: Prompt, text: str, timing: dict) -> dict:
        s = samples[key]
        answer = postprocess(text)
        return {"task": s.task, "config": name, "length": s.length, "trial": s.trial, "tokens": len(prompt.tokens),
                "question_tokens": len(prompt.tokens) - prompt.question_start, "units": s.units, "seed": s.seed,
                "references": s.references, "answer": answer, "score": score(answer, s.references, s.metric),
                **timing}

    answer_prompts(model, info, configs, {k: s.prompt for k, s in samples.items()},
                   lambda name, key: (name, *key) in done, record,
                   lambda trial: (results["trials"].append(trial), save()), n_batch=n_batch, threads=threads,
                   window=window, sinks=sinks, n_new=0, progress=progress, desc="RULER",
                   share_reading=share_reading, read_apart=True)
    save()
    return results
