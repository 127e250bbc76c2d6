"""Handing llama-cpp-python objects to the native module.

``_core`` works on raw ``llama_context`` pointers so that it needs nothing of
llama-cpp-python's Python classes; these helpers extract the pointer from
whatever the user holds and refuse what is not a live context.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ._library import load as _load


def context_address(obj: Any) -> int:
    """Address of the ``llama_context`` behind a ``llama_cpp.Llama`` (or its internal context)."""
    if obj is None:
        raise TypeError("expected a llama_cpp.Llama, its context, or a context address; got None")
    ctx = obj
    if hasattr(ctx, "_ctx"):  # llama_cpp.Llama
        ctx = ctx._ctx
    if hasattr(ctx, "ctx"):  # llama_cpp._internals.LlamaContext
        ctx = ctx.ctx
    if isinstance(ctx, ctypes.c_void_p):
        ctx = ctx.value
    if ctx is None:
        raise ValueError(f"{obj!r} has no live llama_context (was it closed?)")
    if not isinstance(ctx, int) or isinstance(ctx, bool):
        raise TypeError(
            f"expected a llama_cpp.Llama, its context, or a context address; got {type(obj).__name__}"
        )
    if ctx <= 0:
        raise ValueError(f"context address {ctx} is not a valid pointer")
    return ctx


def context_info(obj: Any) -> dict:
    """Facts of a live context, read by the patched library itself."""
    return _load().context_info(context_address(obj))


def model_address(obj: Any) -> int:
    """Address of the ``llama_model`` behind a ``llama_cpp.Llama`` (or a raw pointer)."""
    ptr = obj.model if hasattr(obj, "model") and not isinstance(obj, (int, ctypes.c_void_p)) else obj
    if isinstance(ptr, ctypes.c_void_p):
        ptr = ptr.value
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
        raise ValueError(f"{obj!r} has no loaded llama_model")
    return ptr
