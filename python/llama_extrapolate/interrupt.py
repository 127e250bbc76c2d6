"""Ctrl-C that is not lost inside llama.cpp's callbacks.

Python delivers SIGINT as a KeyboardInterrupt in whatever Python code runs next. During a decode that is often
llama-cpp-python's log callback, a ctypes callback, where the exception is printed and dropped, and the run goes
on. The command line installs this handler, which also records the request; the long loops call ``check()``
between decodes, so a swallowed Ctrl-C still stops the run at the next chunk.
"""

from __future__ import annotations

import signal
import threading

_pending = False


def _on_sigint(signum, frame):
    global _pending
    _pending = True
    raise KeyboardInterrupt


def install():
    """Route SIGINT through the recording handler (main thread only, as signal requires); returns the handler
    it replaced, for ``restore``."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGINT, _on_sigint)
    return None


def restore(previous) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, previous)


def clear() -> None:
    global _pending
    _pending = False


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived and was swallowed on its way."""
    if _pending:
        raise KeyboardInterrupt
