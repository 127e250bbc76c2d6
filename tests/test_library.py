"""The patched library: reachable from llama_cpp and _core, one loaded copy, contexts handed over."""

import ctypes
from pathlib import Path

import pytest

from conftest import run_python


def test_core_reports_build_facts():
    import llama_extrapolate

    core = llama_extrapolate._core
    assert core.api_version() == core.COMPILED_API_VERSION == 1
    assert core.upstream_commit() == "0c1e570"
    assert core.version() == llama_extrapolate.__version__
    patches = core.patches()
    assert patches, "the build recorded no patches"
    assert patches[0].startswith("0001-")
    assert patches == sorted(patches)
    repo_patches = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "patches").glob("*.patch"))
    assert patches == repo_patches
    assert "api" in core.features()


def test_the_patched_library_is_built_without_ggml_amx_kernels():
    """ggml's AMX matrix kernels segfault at the first decode on some Sapphire Rapids machines (llama.cpp issue
    20824; every test here crashed on one with amx_int8): CMakeLists.txt compiles ggml-cpu without them. The
    system info of the library llama_cpp calls lists AMX_INT8 only when it was compiled in."""
    import llama_extrapolate  # noqa: F401  (points llama_cpp at the patched library)
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    assert "AVX" in info or "NEON" in info or "CPU" in info, info
    assert "AMX_INT8 = 1" not in info, info


def test_patch_function_reachable_through_llama_cpp_and_core():
    import llama_extrapolate
    import llama_cpp

    lib = llama_cpp.llama_cpp._lib
    fn = lib.llama_ext_api_version
    fn.restype = ctypes.c_int32
    assert fn() == llama_extrapolate._core.api_version()

    # one loaded copy: same file and same function address in both bindings
    assert Path(lib._name).resolve() == Path(llama_extrapolate._core.library_path()).resolve()
    assert Path(lib._name).resolve().parent == llama_extrapolate.LIB_DIR
    assert ctypes.cast(fn, ctypes.c_void_p).value == llama_extrapolate._core.api_address()


def test_llama_context_handed_to_core(small_llm):
    import llama_extrapolate

    info = llama_extrapolate.context_info(small_llm)
    assert info["n_ctx"] == small_llm.n_ctx() == 512
    assert info["n_batch"] == small_llm.n_batch == 128
    import llama_cpp

    assert info["n_ctx_train"] == llama_cpp.llama_model_n_ctx_train(small_llm.model) == 8192
    assert info["n_layer"] == 30
    assert (info["n_head"], info["n_head_kv"]) == (9, 3)
    assert info["rope_type"] == 0  # LLAMA_ROPE_TYPE_NORM
    assert info["f_max_alibi_bias"] == 0.0
    # the internal context object and the raw address work too
    assert llama_extrapolate.context_info(small_llm._ctx) == info
    assert llama_extrapolate.context_info(llama_extrapolate.context_address(small_llm)) == info


@pytest.mark.parametrize("bad, exc", [(None, TypeError), (0, ValueError), (-5, ValueError), ("ctx", TypeError)])
def test_context_address_rejects_non_contexts(bad, exc):
    import llama_extrapolate

    with pytest.raises(exc) as err:
        llama_extrapolate.context_address(bad)
    assert "context" in str(err.value)


def test_core_rejects_null_context():
    import llama_extrapolate

    with pytest.raises(ValueError, match="NULL"):
        llama_extrapolate._core.context_info(0)


def test_model_refusal_needs_the_hyperparameters(small_llm, default_model):
    """llama_ext_model_get_refusal answers from a loaded model's hyperparameters: a full load and the no_alloc load
    read_model_info makes answer alike; a vocab-only load, which has none, is refused with the fix rather than
    answered "takes every knob"; an unknown knob is named."""
    import os

    import llama_cpp

    import llama_extrapolate
    from llama_extrapolate import native

    core = llama_extrapolate._core
    address = native.model_address(small_llm)
    assert {knob: core.model_refusal(address, knob) for knob in ("lambda", "memory")} == {"lambda": None, "memory": None}
    with pytest.raises(ValueError, match="knob 'window': use one of lambda, ceiling, temperature, top_k, memory"):
        core.model_refusal(address, "window")
    assert native.model_layout(default_model, ("ceiling",))["refusals"] == {"ceiling": None}
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(default_model), params)
    try:
        with pytest.raises(ValueError, match="vocab-only model has no hyperparameters.*no_alloc=True"):
            core.model_refusal(ctypes.cast(model, ctypes.c_void_p).value, "lambda")
    finally:
        llama_cpp.llama_model_free(model)


def test_llama_cpp_imported_first_is_refused():
    proc = run_python("import llama_cpp\nimport llama_extrapolate\n")
    assert proc.returncode != 0
    assert "LibraryConflictError" in proc.stderr
    assert "Import llama_extrapolate before llama_cpp" in proc.stderr


def test_import_order_and_environment():
    # llama_extrapolate first: llama_cpp then runs on the patched library, and the
    # variable used to direct it does not leak into the environment of children.
    code = (
        "import os, llama_extrapolate, llama_cpp\n"
        "from pathlib import Path\n"
        "assert Path(llama_cpp.llama_cpp._lib._name).parent == llama_extrapolate.LIB_DIR\n"
        "assert 'LLAMA_CPP_LIB_PATH' not in os.environ\n"
        "print('ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
