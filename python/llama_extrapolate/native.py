"""Every call across the C boundary, in one place.

Two routes reach the patched libllama: llama-cpp-python's ctypes bindings
(``llama_cpp.llama_*``) and our pybind11 module ``_core``. Both work on raw
pointers, where a wrong length or a freed batch crashes the process instead of
raising; keeping the calls here means the pointer handling, the decode loop and
the context shift are written (and reviewed) once, and the rest of the package
speaks numpy and Python ints. ``_library`` (loading the library) and ``logs``
(the log callback) are the only other modules that touch the C side.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import llama_cpp
import numpy as np

from . import interrupt
from ._library import load as _load

_core = _load()


# --- handles ------------------------------------------------------------------------------------
def context_address(obj: Any) -> int:
    """Address of the ``llama_context`` behind a ``llama_cpp.Llama`` (or its internal context).

    ``_core`` works on raw pointers so that it needs nothing of llama-cpp-python's classes; this
    extracts the pointer from whatever the user holds and refuses what is not a live context.
    """
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
    return _core.context_info(context_address(obj))


def model_address(obj: Any) -> int:
    """Address of the ``llama_model`` behind a ``llama_cpp.Llama`` (or a raw pointer)."""
    ptr = obj.model if hasattr(obj, "model") and not isinstance(obj, (int, ctypes.c_void_p)) else obj
    if isinstance(ptr, ctypes.c_void_p):
        ptr = ptr.value
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
        raise ValueError(f"{obj!r} has no loaded llama_model")
    return ptr


def library_facts() -> dict:
    """What the loaded library says it is (``llama-extrapolate info``): a bug report needs all of it."""
    return {
        "library": _core.library_path(),
        "llama_extrapolate": _core.version(),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": _core.upstream_commit(),
        "api_version": _core.api_version(),
        "patches": _core.patches(),
        "features": _core.features(),
        "backends": _core.backends(),
        "devices": _core.backend_devices(),
    }


def model_devices(obj: Any) -> dict:
    """{"layers": [the ggml device of each layer], "output": the output layer's} of a loaded model: where
    n_gpu_layers and the build put the attention."""
    return _core.model_devices(model_address(obj))


# --- the model file -----------------------------------------------------------------------------
def model_layout(path: Path, knobs: Sequence[str] = ()) -> Optional[dict]:
    """How llama.cpp builds the model of ``path``: its RoPE type, and per layer whether it rotates q and k (``rope``,
    False on NoPE layers), is a sliding-window layer (``swa``) or a recurrent one (``recurrent``); and ``refusals``,
    the library's reason for refusing each of ``knobs`` on this model (None where it takes it), from the list its
    refusals at context creation read. None when llama.cpp cannot load the file (the caller names the model and the
    fix).

    A no_alloc load: the hyperparameters and the tensors' metadata, no tensor data (vocab_only skips the
    hyperparameters, and a memory-mapped load faults the whole file in); no_alloc needs the file unmapped."""
    params = llama_cpp.llama_model_default_params()
    params.no_alloc = True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    params.lazy_mode = llama_cpp.LLAMA_LAZY_MODE_OFF
    params.use_extra_bufts = False
    params.n_gpu_layers = 0
    # llama.cpp's loader logs every metadata key at INFO; keep errors only, as Llama(verbose=False) does
    log = logging.getLogger("llama-cpp-python")
    level = log.level
    log.setLevel(max(level, logging.ERROR))
    try:
        model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
    finally:
        log.setLevel(level)
    if not model:
        return None
    try:
        address = ctypes.cast(model, ctypes.c_void_p).value
        layers = _core.model_layers(address)
        refusals = {knob: _core.model_refusal(address, knob) for knob in knobs}
        return {"rope_type": int(llama_cpp.llama_model_rope_type(model)), **layers, "refusals": refusals}
    finally:
        llama_cpp.llama_model_free(model)


def bos_if_added(llm: Any) -> Optional[int]:
    """The BOS id when the vocabulary prepends one to a text, else None (llama-perplexity's chunk rule)."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return llama_cpp.llama_vocab_bos(vocab) if llama_cpp.llama_vocab_get_add_bos(vocab) else None


def load_tokenizer(model_path: Union[str, Path]):
    """A vocabulary-only load of the model (no layers, no cache): tokenizing a long text before choosing the
    cache size costs milliseconds, not a model load. The caller closes it."""
    return llama_cpp.Llama(str(model_path), n_ctx=64, vocab_only=True, verbose=False)


# --- attention settings (the patched C API) --------------------------------------------------------
def model_attention(llm: Any) -> dict:
    """The attention settings the library loaded the model with (to check that the overrides arrived)."""
    return _core.model_attention(model_address(llm))


def set_temperature(ctx: int, temperature: np.ndarray, log_length: int, points_lengths: Sequence[int],
                    points_tau: np.ndarray) -> None:
    """Hand the library the temperature table, its log-length and its length points, as the C API wants them."""
    _core.set_temperature(ctx, np.ascontiguousarray(temperature, dtype=np.float32).ravel(), int(log_length))
    _core.set_temperature_points(ctx, np.asarray(points_lengths, dtype=np.uint32),
                                 np.ascontiguousarray(points_tau, dtype=np.float32).ravel())


def get_temperature(ctx: int) -> Tuple[np.ndarray, int]:
    """(tau[n_layer, n_head], log_length) as the library holds them."""
    return _core.get_temperature(ctx)


def get_temperature_points(ctx: int) -> Tuple[np.ndarray, np.ndarray]:
    """(lengths, tau per length) as the library holds them."""
    return _core.get_temperature_points(ctx)


def set_top_k(ctx: int, k: int, layer: int, distance: int) -> None:
    _core.set_top_k(ctx, int(k), int(layer), int(distance))


def get_top_k(ctx: int) -> Tuple[int, int, int]:
    """(k, layer, distance) the library applies now (k = 0: off)."""
    return tuple(int(x) for x in _core.get_top_k(ctx))


# --- document memory (patch 0012) -------------------------------------------------------------------
# the coordinates of the block summaries (enum llama_ext_memory_axes)
MEMORY_AXES = {"channels": 0, "principal": 1}


def memory_open(ctx: int, path: Optional[str], directory: Optional[str], keep: bool, type_id: int,
                capacity: int, reopen: bool = False, axes: str = "channels", landmark: int = 0) -> None:
    """Open the memory's store (the library's reason, e.g. an unwritable path or a full disk, is the ValueError)."""
    if axes not in MEMORY_AXES:
        raise ValueError(f"memory axes {axes!r}: use one of {', '.join(MEMORY_AXES)}")
    _core.memory_open(ctx, path or "", directory or "", bool(keep), int(type_id), int(capacity), bool(reopen),
                      MEMORY_AXES[axes], int(landmark))


def memory_axes(ctx: int, layer: int) -> Tuple[np.ndarray, bool]:
    """([n_kv, head_dim, head_dim] axes of ``layer``'s block summaries, a row each; whether they are the principal
    axes of the document's first keys (False: the key channels, or the first block is not complete yet))."""
    axes, principal = _core.memory_axes(ctx, int(layer))
    return np.asarray(axes, dtype=np.float32), bool(principal)


MEMORY_HOLD_MODES = {"select": 0, "keep": 1, "hold": 2}


def memory_set_hold(ctx: int, mode: str) -> None:
    """"select": each decode selects its blocks; "keep": and the last selection's keys and values stay in RAM;
    "hold": the decodes attend to the kept blocks without selecting or reading the store (the library's reason for
    a refusal, e.g. a hold before any keep, is the ValueError)."""
    if mode not in MEMORY_HOLD_MODES:
        raise ValueError(f"memory hold mode {mode!r}: use one of {', '.join(MEMORY_HOLD_MODES)}")
    _core.memory_set_hold(ctx, MEMORY_HOLD_MODES[mode])


def memory_set_question(ctx: int, candidates: int, select_tokens: int) -> None:
    """The candidates the next selecting decodes rerank and the last tokens whose queries select (the library's
    reason for a refusal, e.g. more candidates than the model was loaded with, is the ValueError)."""
    _core.memory_set_question(ctx, int(candidates), int(select_tokens))


def memory_info(ctx: int) -> Dict[str, int]:
    return {k: int(v) for k, v in _core.memory_info(ctx).items()}


def memory_selection(ctx: int, layer: int) -> np.ndarray:
    """[n_kv, m] blocks each KV head of ``layer`` selected in the last decode (-1 before any)."""
    return np.asarray(_core.memory_selection(ctx, int(layer)), dtype=np.int64)


def memory_read_block(ctx: int, block: int, layer: int, kv_head: int) -> Tuple[np.ndarray, np.ndarray]:
    k, v = _core.memory_read_block(ctx, int(block), int(layer), int(kv_head))
    return np.asarray(k), np.asarray(v)


def memory_last_error(ctx: int) -> str:
    """Why the document memory failed the last decode ("" when it did not, or there is none)."""
    return str(_core.memory_last_error(ctx))


# --- attention statistics (patch 0010) -----------------------------------------------------------
def stats_bin_lower() -> np.ndarray:
    """Smallest query-key distance of each distance bin."""
    return np.asarray(_core.stats_bin_lower(), dtype=np.int64)


def stats_read(llm: Any) -> Dict[str, Any]:
    return _core.stats_read(context_address(llm))


def stats_enable(llm: Any, on: bool) -> None:
    """Raises ValueError (the library's reason) on a context that cannot collect statistics."""
    _core.stats_enable(context_address(llm), bool(on))


STATS_REDUCE = {"auto": 0, "host": 1, "graph": 2}


def stats_set_reduce(llm: Any, reduce: str) -> None:
    """Raises ValueError (the library's reason) where the graph's ops cannot reduce them (several sequences)."""
    _core.stats_set_reduce(context_address(llm), STATS_REDUCE[reduce])


def stats_layer_reduce(llm: Any) -> np.ndarray:
    """[n_layer] bool: True where ggml ops in the graph reduce the layer's statistics, False where the CPU op does."""
    return np.asarray(_core.stats_layer_reduce(context_address(llm)), dtype=bool)


def stats_reset(llm: Any) -> None:
    _core.stats_reset(context_address(llm))


def stats_enabled(llm: Any) -> bool:
    return bool(_core.stats_enabled(context_address(llm)))


# --- the KV cache -------------------------------------------------------------------------------
# --- llama.cpp's RPC backend (rpc.py) -------------------------------------------------------------
def rpc_protocol() -> Tuple[int, int, int]:
    return tuple(_core.rpc_protocol())


def rpc_add_server(endpoint: str) -> List[str]:
    """Registers the devices of the server at ``endpoint`` (checked by rpc.probe first: ggml-rpc cannot be asked
    whether a server answers); their names."""
    return list(_core.rpc_add_server(endpoint))


def rpc_failure() -> Tuple[int, str]:
    """(count, message) of the RPC connections this process lost (patch 0016)."""
    count, message = _core.rpc_failure()
    return int(count), str(message)


def rpc_serve(endpoint: str, n_threads: int, cache_dir: str) -> None:
    _core.rpc_serve(endpoint, n_threads, cache_dir)


def n_cells(ctx) -> int:
    """Cells of the context's KV cache (its n_ctx)."""
    return int(llama_cpp.llama_n_ctx(ctx))


def clear_memory(ctx) -> None:
    """Empty the KV cache, data included (``llm.reset()`` only forgets the ids)."""
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)


def seq_pos_max(ctx, seq_id: int = 0) -> int:
    """Largest position sequence ``seq_id`` holds in the cache (-1 when empty)."""
    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(ctx), max(seq_id, 0)))


def forget_from(ctx, pos: int) -> None:
    """Remove every cached key from position ``pos`` on (sequence 0)."""
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, pos, -1)


def context_shift(ctx, n_past: int, n_keep: int) -> int:
    """llama.cpp's context shift (llama-cli's, the StreamingLLM-like baseline): drop the older half of the
    tokens after the first ``n_keep`` and move the rest back (keys re-rotated); the new n_past."""
    mem = llama_cpp.llama_get_memory(ctx)
    n_discard = (n_past - n_keep) // 2
    llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
    llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard)
    return n_past - n_discard


# --- state files --------------------------------------------------------------------------------
def write_state_file(ctx, path: Path, tokens: Sequence[int] = ()) -> None:
    """llama.cpp's state file of ``ctx`` with ``tokens`` stored beside it (written tensor by tensor, so the
    state never sits in Python memory)."""
    ids = (llama_cpp.llama_token * max(len(tokens), 1))(*[int(t) for t in tokens])
    if not llama_cpp.llama_state_save_file(ctx, str(path).encode(), ids, len(tokens)):
        raise RuntimeError(f"llama.cpp could not write the state to {path} (disk full? a top-k configuration, "
                           "whose state is refused?)")


def read_state_file(ctx, path: Path, max_tokens: int) -> Optional[List[int]]:
    """Load a state file into ``ctx``; the token ids stored with it, or None when llama.cpp refused the file
    (another model or context size, or more than ``max_tokens`` ids)."""
    ids = (llama_cpp.llama_token * max(max_tokens, 1))()
    count = ctypes.c_size_t(0)
    if not llama_cpp.llama_state_load_file(ctx, str(path).encode(), ids, max_tokens, ctypes.byref(count)):
        return None
    return list(ids[: count.value])


# --- decoding -----------------------------------------------------------------------------------
class Batch:
    """A ``llama_batch`` of up to ``capacity`` tokens of sequence 0, freed on close (or ``with``).

    llama-cpp-python's own batch helper wants the Llama object's state; the scoring loops drive a raw
    context and need to choose which rows return logits.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"batch capacity {capacity} must be >= 1")
        self.capacity = int(capacity)
        self._batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def fill(self, tokens: Sequence[int], start_pos: int, logits: str = "all") -> None:
        """Tokens at positions start_pos.. ; ``logits`` "all" or "last": which rows llama.cpp computes."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits={logits!r}: use 'all' or 'last'")
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"{n} tokens do not fit a batch of {self.capacity}")
        b = self._batch
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = logits == "all" or i == n - 1


def decode(ctx, batch: Batch, tokens: Sequence[int], start_pos: int, *, logits: str = "all") -> int:
    """Decode ``tokens`` at positions start_pos..; llama_decode's return code (0: done; 1: no cache cell
    free; 2: aborted), left to the caller, who knows what to advise."""
    batch.fill(tokens, start_pos, logits)
    return int(llama_cpp.llama_decode(ctx, batch._batch))


def logits_rows(ctx, n: int, n_vocab: int) -> np.ndarray:
    """The logits of the last decode, [n, n_vocab], a view into llama.cpp's buffer (valid until the next
    decode): every row of a batch decoded with logits="all"."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n, n_vocab))


def last_logits(ctx, n_vocab: int) -> np.ndarray:
    """The logits of the last token of the last decode (a view, valid until the next decode)."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))


class Stream:
    """One sequence read chunk by chunk on a raw context from position 0, with llama.cpp's context shift
    when ``context_shift`` (n_keep) is set.

    Scoring needs the logits of every row and control of positions that ``Llama.eval`` does not give;
    ``full_hint`` is the advice a full cache gets (the fix depends on what the caller is doing).
    """

    def __init__(self, llm: Any, n_batch: int, context_shift: Optional[int] = None, *,
                 full_hint: str = "raise n_ctx, use a Lambda window or a context shift") -> None:
        self.llm, self.n_batch, self.context_shift = llm, int(n_batch), context_shift
        self.ctx = llm.ctx
        self.cells = n_cells(self.ctx)
        self.full_hint = full_hint
        self.batch = Batch(self.n_batch)
        self.n_past = 0

    def close(self) -> None:
        self.batch.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reset(self) -> None:
        """An empty cache at position 0 (the Llama's ids forgotten too)."""
        self.llm.reset()
        clear_memory(self.ctx)
        self.n_past = 0

    def chunks(self, tokens: Sequence[int], logits: str = "last") -> Iterator[Tuple[int, int]]:
        """Decode ``tokens`` n_batch at a time; yields (offset in ``tokens``, chunk length) after each chunk,
        when its logits (``logits_rows``/``last_logits``) are readable."""
        for s in range(0, len(tokens), self.n_batch):
            interrupt.check()
            chunk = tokens[s:s + self.n_batch]
            n = len(chunk)
            if self.context_shift is not None and self.n_past + n > self.cells:
                self.n_past = context_shift(self.ctx, self.n_past, self.context_shift)
            rc = decode(self.ctx, self.batch, chunk, self.n_past, logits=logits)
            if rc != 0:
                why = memory_last_error(context_address(self.ctx))
                if why:
                    raise RuntimeError(f"llama_decode returned {rc} at position {self.n_past}: document memory: {why}")
                raise RuntimeError(f"llama_decode returned {rc} at position {self.n_past} (the KV cache of "
                                   f"{self.cells} cells is full or the decode was aborted): {self.full_hint}")
            self.n_past += n
            yield s, n

    def rollback(self, n_past: int) -> None:
        """Forget every token from position n_past on (a cache that keeps them all: vanilla or top-k)."""
        forget_from(self.ctx, n_past)
        self.n_past = n_past
