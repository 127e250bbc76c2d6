"""llama.cpp's log keeps its levels: verbose=False shows llama.cpp's errors and hides its warnings.

llama-cpp-python 0.3.36 translates the levels by an older ggml enum (a warning printed as an error, an
error hidden as debug); ``llama_extrapolate.logs`` installs a callback with the vendored ggml's levels.
"""

import llama_extrapolate  # noqa: F401  (first: the patched library)
import pytest

OVERFLOW = "possible training context overflow"  # llama.cpp's LLAMA_LOG_WARN when n_ctx > n_ctx_train


@pytest.mark.parametrize("verbose", [False, True])
def test_warnings_follow_verbose(tiny_llama, capsys, verbose):
    """A context longer than the training length is this product's normal case: llama.cpp warns about it,
    and with verbose=False the warning must not reach the user (it did, as an "error")."""
    _, path = tiny_llama
    llm = llama_extrapolate.Llama(str(path), n_ctx=256, verbose=verbose, type_k=0, type_v=0)  # trained: 64
    llm.close()
    err = capsys.readouterr().err
    assert (OVERFLOW in err) == verbose


def test_errors_are_shown_without_verbose(tiny_llama, capsys):
    """llama.cpp's own reason for refusing a batch reaches the user with verbose=False (it was hidden)."""
    import llama_cpp

    _, path = tiny_llama
    llm = llama_extrapolate.Llama(str(path), n_ctx=64, verbose=False, type_k=0, type_v=0)
    try:
        bad = (llama_cpp.llama_token * 1)(llm.n_vocab() + 7)
        assert llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(bad, 1)) != 0
    finally:
        llm.close()
    assert f"invalid token[0] = {llm.n_vocab() + 7}" in capsys.readouterr().err


def test_levels_and_continuations(capsys):
    """The callback's mapping, message by message: a continuation keeps its message's level."""
    import logging

    from llama_extrapolate import logs

    level = logs.logger.level
    logs.logger.setLevel(logging.ERROR)  # what Llama(verbose=False) sets
    try:
        for ggml_level, text in [(logs.GGML_LOG_LEVEL_WARN, b"w "), (logs.GGML_LOG_LEVEL_CONT, b"w+ "),
                                 (logs.GGML_LOG_LEVEL_ERROR, b"e "), (logs.GGML_LOG_LEVEL_CONT, b"e+ "),
                                 (logs.GGML_LOG_LEVEL_INFO, b"i "), (logs.GGML_LOG_LEVEL_DEBUG, b"d ")]:
            logs._log(ggml_level, text, None)
    finally:
        logs.logger.setLevel(level)
    assert capsys.readouterr().err == "e e+ "
