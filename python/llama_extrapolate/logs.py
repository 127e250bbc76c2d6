"""llama.cpp's log messages at their own levels, so that ``verbose=False`` shows errors, not warnings.

llama-cpp-python 0.3.36 routes llama.cpp's log through the ``llama-cpp-python`` logger, translating the
level by ggml's enum as it was before DEBUG was added at 1 (NONE, INFO, WARN, ERROR, DEBUG). The vendored
ggml numbers them NONE, DEBUG, INFO, WARN, ERROR, so every warning reaches the logger as an error and is
printed with ``verbose=False`` (for this product: "n_ctx_seq > n_ctx_train -- possible training context
overflow" on every long context, which is the point, not a problem), while every error arrives as a
debug message and is hidden. The callback installed here reads the levels of the library actually
loaded and feeds the same logger, so ``verbose`` keeps the meaning llama-cpp-python gives it: everything
with ``verbose=True``, errors only with ``verbose=False``.
"""

from __future__ import annotations

import ctypes
import logging
import sys

import llama_cpp

# ggml.h of the pinned llama.cpp: enum ggml_log_level
GGML_LOG_LEVEL_NONE = 0
GGML_LOG_LEVEL_DEBUG = 1
GGML_LOG_LEVEL_INFO = 2
GGML_LOG_LEVEL_WARN = 3
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5  # continues the previous message at its level

LOGGING_LEVEL = {
    GGML_LOG_LEVEL_NONE: logging.CRITICAL,
    GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    GGML_LOG_LEVEL_INFO: logging.INFO,
    GGML_LOG_LEVEL_WARN: logging.WARNING,
    GGML_LOG_LEVEL_ERROR: logging.ERROR,
}

logger = logging.getLogger("llama-cpp-python")  # the logger llama_cpp's set_verbose() sets the level of
_previous = logging.CRITICAL

# the error lines, whatever the verbosity: llama-cpp-python's exceptions say only "Failed to create llama_context",
# llama.cpp's reason is in its log (kept short: a load logs a few lines at most)
_errors: list = []
_errors_seen = 0
ERRORS_KEPT = 64


def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _previous, _errors_seen
    at = _previous if level == GGML_LOG_LEVEL_CONT else LOGGING_LEVEL.get(level, logging.ERROR)
    line = text.decode("utf-8", errors="replace")
    if at >= logging.ERROR:
        if level == GGML_LOG_LEVEL_CONT and _errors:
            _errors[-1] += line
        else:
            _errors.append(line)
            _errors_seen += 1
            del _errors[:-ERRORS_KEPT]
    _previous = at
    if logger.isEnabledFor(at):
        print(line, end="", flush=True, file=sys.stderr)


def error_mark() -> int:
    """A mark for errors_since: the number of error lines logged so far."""
    return _errors_seen


def errors_since(mark: int) -> str:
    """llama.cpp's error lines logged after mark, joined (the last ERRORS_KEPT at most), or ""."""
    n = min(_errors_seen - mark, len(_errors))
    return " ".join(e.strip() for e in _errors[len(_errors) - n:] if e.strip()) if n > 0 else ""


# kept referenced for as long as the library may call it
_callback = llama_cpp.llama_log_callback(_log)


def install() -> None:
    """Route llama.cpp's log through ``_log`` (after llama_cpp._logger installed its own)."""
    import llama_cpp._logger  # noqa: F401  (its import installs its callback: ours must come after)

    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
