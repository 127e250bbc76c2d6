"""Patch 0001 (cache-line alignment): every tensor of the compute graph starts on a cache line (64 bytes).

With ggml's 32-byte CPU alignment the KQ scores could start at 32 mod 64; two threads writing adjacent
tinyBLAS tiles then share the boundary cache lines, and a whole stretch of a W = 8192 stream read 35% slower
(bench/performance.py prefill dip). The check watches every node through llama.cpp's eval callback.
"""

import ctypes

import pytest


class _Tensor(ctypes.Structure):
    # the head of ggml.h's struct ggml_tensor, up to the name
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


@pytest.mark.parametrize("attention", ["vanilla", "lambda"])
def test_compute_tensors_start_on_a_cache_line(tiny_llama, monkeypatch, attention):
    import llama_extrapolate as le
    import llama_cpp.llama_cpp as ll
    from llama_extrapolate import AttentionConfig
    from conftest import random_tokens

    model, path = tiny_llama
    seen, misaligned = [0], []

    def watch(tensor, ask, user_data):
        if not ask:
            t = _Tensor.from_address(tensor)
            # views share their parent's storage at an offset of the view's choosing; only owners count
            if t.data and not t.view_src:
                seen[0] += 1
                if t.data % 64:
                    misaligned.append((t.name.decode(errors="replace"), t.data % 64))
        return True

    callback = ll.ggml_backend_sched_eval_callback(watch)
    default_params = ll.llama_context_default_params

    def with_callback():
        p = default_params()
        p.cb_eval = callback
        return p

    monkeypatch.setattr(ll, "llama_context_default_params", with_callback)
    cfg = AttentionConfig.vanilla() if attention == "vanilla" else AttentionConfig(sinks=2, window=24, ceiling=24, rollback=0)
    llm = le.Llama(str(path), attention=cfg, n_ctx=256, n_batch=32, n_ubatch=32, verbose=False)
    try:
        llm.eval(random_tokens(model, 100, seed=3))
    finally:
        llm.close()
    assert seen[0] > 50
    assert not misaligned, f"compute tensors not on a 64-byte boundary: {misaligned[:8]}"
