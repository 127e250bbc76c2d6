"""bench/kv_shapes.py writes a model with a big model's KV shapes that llama.cpp reads as such; bench/scale.py's
bookkeeping on a short reading of it."""

import json

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def shape_model(tmp_path_factory):
    shapes = load_bench("kv_shapes")
    from llama_extrapolate.default_model import default_model_path

    path = tmp_path_factory.mktemp("shapes") / "llama-3-8b-kv.gguf"
    return shapes.write("llama-3-8b", path, str(default_model_path())), shapes.SHAPES["llama-3-8b"]


def test_the_shape_model_has_the_big_models_kv_shapes_and_the_default_vocabulary(shape_model):
    import llama_extrapolate as le
    from llama_extrapolate import native
    from llama_extrapolate.default_model import default_model_path

    path, shape = shape_model
    info = le.read_model_info(str(path))
    assert (info.block_count, info.head_count, info.head_count_kv, info.rope_dimension_count) == (32, 32, 8, 128)
    assert info.embedding_length == load_bench("kv_shapes").N_EMBD  # small projections: the weights cost little
    text = b"The document memory at the user's model size."
    ours, theirs = native.load_tokenizer(str(path)), native.load_tokenizer(str(default_model_path()))
    try:
        assert ours.tokenize(text, add_bos=True) == theirs.tokenize(text, add_bos=True)
    finally:
        ours.close()
        theirs.close()
    llm = le.Llama(str(path), n_ctx=256, verbose=False)
    try:
        tokens = llm.tokenize(text)
        llm.eval(tokens)
        # llama.cpp keeps 128 values per KV head (attention.key_length), not embedding_length / head_count = 8:
        # the state holds each token's K and V in F16 for 32 layers x 8 KV heads x 128
        per_token = 2 * 2 * shape.n_layer * shape.n_head_kv * shape.head_dim
        assert llm.save_state().llama_state_size >= len(tokens) * per_token
    finally:
        llm.close()


def test_unknown_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shape 'llama-9b': use one of"):
        load_bench("kv_shapes").write("llama-9b", tmp_path / "x.gguf", "unused")


def test_scale_run_records_reading_questions_and_reads(shape_model, tmp_path, monkeypatch):
    bench = load_bench("scale")
    path, _ = shape_model
    monkeypatch.setattr(bench, "shape_model", lambda shape: str(path))
    out = tmp_path / "scale.json"
    common = ["--shape", "llama-3-8b", "--tokens", "300", "--window", "64", "--n-batch", "64", "--threads", "1",
              "--out", str(out)]
    for _ in range(2):  # the second run replaces the first's entry
        assert bench.main(common + ["--configs", "lambda"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 1
    run = runs[0]
    assert (run["shape"], run["tokens"], run["config"]) == ("llama-3-8b", 300, "lambda")
    assert run["read_tok_s"] > 0 and run["peak_rss_bytes"] > run["kv_cache_bytes"] > 0
    for q, n in (("short_question", None), ("long_question", bench.LONG_QUESTION_TOKENS)):
        assert len(run[q]["answer_step_s"]) == bench.ANSWER_TOKENS and run[q]["first_token_s"] > 0
        assert n is None or run[q]["question_tokens"] == n


def test_a_kept_reading_is_reused_for_the_questions(shape_model, tmp_path, monkeypatch):
    """--reading-dir keeps the state after the document and the store it references; a second run with the same
    shape, length and configuration loads them instead of reading, records when the reading was made, and its
    question reads the store the first run wrote (what a rerun measures is the questions, on the same reading)."""
    bench = load_bench("scale")
    path, _ = shape_model
    monkeypatch.setattr(bench, "shape_model", lambda shape: str(path))
    out, kept = tmp_path / "scale.json", tmp_path / "readings"
    args = ["--shape", "llama-3-8b", "--tokens", "600", "--window", "64", "--n-batch", "64", "--threads", "1",
            "--configs", "memory:m=2:c=4:hold", "--reading-dir", str(kept), "--out", str(out)]
    assert bench.main(args) == 0
    first = json.loads(out.read_text())["runs"][0]
    (reading,) = kept.iterdir()
    assert {p.name for p in reading.iterdir()} == {"reading.json", "reading.state", "reading.state.json",
                                                   "store.kvstore"}
    assert "reading_reused" not in first
    assert bench.main(args) == 0
    (again,) = json.loads(out.read_text())["runs"]
    assert again["reading_reused"] == json.loads((reading / "reading.json").read_text())["date"]
    assert again["read_s"] == first["read_s"] and again["memory"]["n_blocks"] == first["memory"]["n_blocks"] > 2
    assert again["short_question"]["question_rchar"] > 0  # the question read the kept store
    # asked three times, the reading reloaded between: the median repetition is the entry's, and every repetition
    # answers with the first run's token
    assert bench.main(args + ["--repeat", "3"]) == 0
    (third,) = json.loads(out.read_text())["runs"]
    for q in ("short_question", "long_question"):
        times = third[q]["first_token_s_repeats"]
        assert len(times) == 3 and third[q]["first_token_s"] == sorted(times)[1]
        assert third[q]["first_tokens_repeats"] == [first[q]["first_token"]] * 3 and third[q]["question_rchar"] > 0
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "2"])  # nothing kept to ask again


def test_the_shape_models_memory_is_stored_by_its_key_head_not_its_residual_width(shape_model):
    """The shape model's residual stream over its heads is 256 / 32 = 8 values, its key heads 128 (attention.key_length):
    the memory's default type follows the key head (q4_0), as it would on the real model."""
    import llama_extrapolate as le
    from llama_extrapolate.options import memory_type_for

    path, shape = shape_model
    info = le.read_model_info(str(path))
    assert info.key_length == shape.head_dim == 128 and info.embedding_length // info.head_count == 8
    assert memory_type_for(info) == "q4_0"


def test_resume_kills_a_checkpointed_reading_and_records_the_rerun(shape_model, tmp_path, monkeypatch):
    """bench/resume.py on a short reading: the killed run left a checkpoint, the rerun went on from it, and the entry
    says where, what it cost and that the answers are the same."""
    resume = load_bench("resume")
    path, _ = shape_model
    monkeypatch.setitem(__import__("sys").modules, "scale", type("scale", (), {"shape_model": staticmethod(
        lambda shape: str(path))}))
    out = tmp_path / "resume.json"
    assert resume.main(["--shape", "llama-3-8b", "--tokens", "1536", "--checkpoint-every", "0.5", "--kill-after",
                        "1", "--window", "256", "--dir", str(tmp_path), "--out", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["runs"]
    assert entry["same_answer"] and entry["resumed"]["answer"] == entry["uninterrupted"]["answer"]
    ckpt = entry["killed"]["checkpoint"]
    assert 0 < ckpt["tokens"] < 1536 and ckpt["tokens"] % 512 == 0 and ckpt["bytes"] > 0
    assert any(f"a checkpoint of {ckpt['tokens']} of the document's" in line for line in entry["resumed"]["said"])
    assert abs(entry["final_state"]["tokens"] - 1536) < 16 and not list(tmp_path.glob("resume-*"))
