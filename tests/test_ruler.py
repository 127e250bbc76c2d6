"""``llama-extrapolate ruler``: RULER's tasks generated here match the benchmark's definition (its task table, its
metrics, what each prompt must hold), fill the asked length, rebuild from their seed, and are answered and scored
end to end on the default model. The scores of real models are bench/'s."""

import json
import re

import pytest


@pytest.fixture(scope="module")
def vocab(default_model):
    from llama_extrapolate.native import load_tokenizer

    v = load_tokenizer(default_model)
    yield v
    v.close()


@pytest.fixture(scope="module")
def plain(vocab):
    from llama_extrapolate.harness.ruler import PromptFormat

    return PromptFormat(vocab)


def test_the_task_table_is_rulers():
    """Every task's generator and arguments are those of the benchmark's synthetic.yaml."""
    import yaml

    from llama_extrapolate.harness import ruler
    from llama_extrapolate.harness.corpora import long_context_eval_file

    table = yaml.safe_load(long_context_eval_file("synthetic.yaml"))
    for name, (kind, args) in ruler.RULER_TASKS.items():
        assert table[name]["task"] == kind, name
        assert table[name]["args"] == args, name
    assert set(ruler.GRID_TASKS) <= set(ruler.RULER_TASKS)
    assert set(table) - set(ruler.RULER_TASKS) == {"fwe"}  # the one task not generated here


def test_scores_are_rulers_metrics():
    """Our scorer against the benchmark's own per-sample metrics, on answers that hold none, some or all of the
    references, in another case, or only a part of one."""
    from long_context_eval.eval.synthetic import constants

    from llama_extrapolate.harness import ruler

    refs = [["8537845"], ["1", "22", "333"], ["Inherited wealth", "inheritance"], ["VAR", "ABCDE"], ["yes"]]
    preds = ["It is 8537845.", "22 and 1 but not the third", "inherited WEALTH", "", "No, yes."]
    for metric, theirs in (("all", constants.string_match_all_per_sample),
                           ("part", constants.string_match_part_per_sample)):
        ours = [ruler.score(p, r, metric) for p, r in zip(preds, refs)]
        assert ours == pytest.approx(theirs(preds, refs))
    assert ruler.postprocess("  \x01 answer\tone\n") == "answer\none"
    with pytest.raises(ValueError, match="metric 'most'"):
        ruler.score("x", ["x"], "most")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
                                  "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery",
                                  "vt", "cwe", "qa_1", "qa_2"])
def test_a_sample_fills_its_length_and_holds_its_answer(plain, task):
    from llama_extrapolate.harness import ruler

    length = 4096
    s = ruler.ruler_sample(plain, task, length, 7, 1)
    gen = ruler._Generator(task, s.seed, short=False)
    budget = length - s.prompt.n_new
    # it fits with its answer, and one more step of haystack would not (or the haystack has no more)
    assert len(s.prompt.tokens) <= budget
    more = gen.build(s.units + gen.step)
    top = gen.max_units()
    assert (top is not None and s.units + gen.step > top) or len(plain.tokens(*more[:3])) > budget
    assert s.prompt.n_new == ruler.templates()[gen.kind]["tokens_to_generate"]
    # the prompt's text: what the answer needs is in the document, the question at the end
    document, question, prefix, references = gen.build(s.units)
    assert references == s.references and s.metric == ruler.METRICS[gen.kind]
    assert plain.tokens(document, question, prefix) == s.prompt.tokens
    if gen.kind == "niah":
        for value in references:
            assert re.search(r"One of the special magic \w+ for [\w-]+ is: " + re.escape(value) + r"\.", document)
            key = re.search(r"for ([\w-]+) is: " + re.escape(value), document).group(1)
            assert key in question
    elif gen.kind == "variable_tracking":
        main = document[document.rindex("Memorize and track"):]
        value = re.search(r"VAR " + references[0] + r" = (\d+)", main).group(1)
        assert value in question
        for a, b in zip(references, references[1:]):
            assert f"VAR {b} = VAR {a} " in main
    elif gen.kind == "common_words_extraction":
        numbered = document[document.rindex("Below is a numbered list"):].split("\n", 1)[1]
        listed = [w for w in re.split(r"(?:^| )\d+\. ", numbered) if w]  # some entries are two words
        counts = {w: listed.count(w) for w in set(listed)}
        assert len(references) == 10 and all(counts[w] == 30 for w in references)
        assert min(counts[w] for w in references) > max(c for w, c in counts.items() if w not in references)
    else:
        qas, docs = ruler.qa_data(gen.args["dataset"])
        qa = gen._question()
        assert qa["query"] in question and qa["outputs"] == references
        for gold in qa["gold"]:
            assert docs[gold] in document
    # the question starts after the document: its tokens hold the question's words, not the haystack
    tail = plain.vocab.detokenize(s.prompt.tokens[s.prompt.question_start:]).decode()
    assert question.strip()[:20] in tail and len(tail) < len(question) + len(prefix) + 40
    # a pure function of (seed, task, length, trial)
    assert ruler.ruler_sample(plain, task, length, 7, 1).prompt.tokens == s.prompt.tokens
    assert ruler.ruler_sample(plain, task, length, 7, 2).prompt.tokens != s.prompt.tokens


def test_a_length_too_short_is_refused_with_the_least_length(plain):
    from llama_extrapolate.harness import ruler

    with pytest.raises(ValueError, match=r"length=600 is too short for qa_2 .* use a longer length"):
        ruler.ruler_sample(plain, "qa_2", 600, 0, 0)
    with pytest.raises(ValueError, match="RULER task 'niah_single_9'"):
        ruler.ruler_sample(plain, "niah_single_9", 4096, 0, 0)


def test_the_chat_format_puts_the_task_in_the_users_turn(vocab, plain):
    from llama_extrapolate.harness import ruler

    chat = ruler.PromptFormat(vocab, chat=True)
    s = ruler.ruler_sample(chat, "niah_single_2", 2048, 0, 0)
    text = vocab.detokenize(s.prompt.tokens, special=True).decode()
    prefix = ruler.templates()["niah"]["answer_prefix"]
    assert text.startswith("<|im_start|>") and "<|im_start|>user" in text
    assert text.rstrip().endswith(prefix.format(type_needle_v="number", query=re.search(
        r"for ([\w-]+) mentioned", text).group(1)).replace(" are", " is").strip())
    # the document ends inside the user's turn; the question, the assistant's header and the prefix follow
    tail = vocab.detokenize(s.prompt.tokens[s.prompt.question_start:], special=True).decode()
    assert "What is the special magic number" in tail and "<|im_start|>assistant" in tail
    assert len(s.prompt.tokens) <= 2048 - 128


def test_ruler_answers_and_scores_end_to_end(default_model, plain, tmp_path):
    """The default model finds a single needle at 2k tokens with full attention and through the document memory
    over a 512-token window (the Λ window alone cannot: the needle left it); the rerun resumes, every trial says
    how it was timed."""
    from llama_extrapolate.harness import ruler

    out = tmp_path / "ruler.json"
    configs = ["vanilla", "lambda+memory:m=8:c=32", "lambda"]
    res = ruler.run_ruler(str(default_model), ["niah_single_2"], configs, [2048], 1, 0, out, window=512,
                          progress=False)
    scores = res["scores"]["niah_single_2"]
    assert scores["vanilla"]["2048"] == 100.0
    assert scores["lambda+memory:m=8:c=32"]["2048"] == 100.0
    assert scores["lambda"]["2048"] == 0.0
    trials = {t["config"]: t for t in res["trials"]}
    # the needle had left the window: the memory brought it back
    gen = ruler._Generator("niah_single_2", trials["vanilla"]["seed"], short=False)
    document = gen.build(trials["vanilla"]["units"])[0]
    needle = document.index(trials["vanilla"]["references"][0])
    behind = trials["vanilla"]["tokens"] - len(plain.tokenize(document[:needle], True))
    assert behind > 512 + 10 + 64
    for t in trials.values():
        assert t["seed"] == ruler.sample_seed(0, "niah_single_2", 2048, 0)
        assert t["read_tokens_per_second"] > 0 and 0 < t["first_token_seconds"] <= t["answer_seconds"]
        assert t["peak_rss_bytes"] > 0 and t["question_tokens"] < 60
    assert trials["lambda"]["read_with"] == "lambda+memory:m=8:c=32"
    assert len(res["summary"]) == 3
    again = ruler.run_ruler(str(default_model), ["niah_single_2"], configs, [2048], 1, 0, out, window=512,
                            progress=False)
    assert len(again["trials"]) == 3
    assert json.loads(out.read_text())["trials"] == again["trials"]


def test_the_cli_refuses_an_unknown_task(default_model, tmp_path, capsys):
    from llama_extrapolate.cli import main

    code = main(["ruler", "--model", str(default_model), "--tasks", "niah,vt", "--lengths", "2048",
                 "-o", str(tmp_path / "r.json")])
    assert code != 0
    assert "RULER task 'niah'" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
