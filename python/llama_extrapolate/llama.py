"""A drop-in ``llama_cpp.Llama`` that takes ``attention=AttentionConfig(...)``.

Everything of llama-cpp-python keeps working (completion, chat, eval,
sampling); the attention is configured through GGUF metadata overrides at load
and the C API at run time, then read back from the library so that a setting
that did not arrive is an error, not vanilla attention in disguise.
"""

from __future__ import annotations

import copy
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Tuple

import llama_cpp
import numpy as np

from . import logs, native
from .config import AttentionConfig, ResolvedAttention, Temperature
from .options import DEFAULT_CHECKPOINT_SECONDS, DEFAULT_MEMORY_AXES, memory_type_for
from .native import context_address
from .rpc import DEFAULT_ANSWER_TIMEOUT
from .history import TokenHistory
from .model_info import InvalidModelError, knob_support, read_model_info


# what llama-cpp-python's checks see as the context length when the stream is unbounded
UNBOUNDED_CONTEXT = 2**31 - 1
# tokens the document memory holds when the caller does not say (its file is reserved for them: ~12 KB a token
# for SmolLM2 at q8_0)
DEFAULT_MEMORY_CAPACITY = 131072
# the store file's header, before its first block's record
STORE_HEADER_BYTES = 4096



def thread_counts(threads: Optional[int]) -> dict:
    """llama_cpp.Llama's thread arguments for a run given ``threads`` CPU threads: the decode's and the batch's.
    llama-cpp-python's batch default is every core whatever n_threads says, so a reading told one thread took
    all of them (and two runs side by side each busy-waited on the other's cores); None keeps its defaults."""
    return {} if threads is None else {"n_threads": int(threads), "n_threads_batch": int(threads)}

@dataclass(frozen=True)
class PromptReport:
    """What the last generation did with its prompt: ``read`` tokens were decoded, ``reused`` came from the
    stream already in the cache (llama-cpp-python's prefix reuse, or a cached state), in ``seconds`` from the
    call to the first sampled token."""
    tokens: int
    read: int
    reused: int
    seconds: float


class Llama(llama_cpp.Llama):
    """``llama_cpp.Llama`` with LM-Infinite attention and softmax temperatures.

    ``attention=None`` leaves the attention untouched (bit-identical to
    llama-cpp-python); ``AttentionConfig()`` is LM-Infinite with the model's
    defaults.
    """

    def __init__(self, model_path: str, *args: Any, attention: Optional[AttentionConfig] = None,
                 memory_path: Optional[str] = None, memory_dir: Optional[str] = None, memory_keep: bool = False,
                 memory_type: Optional[str] = None, memory_capacity: Optional[int] = None, memory_reopen: bool = False,
                 memory_axes: str = DEFAULT_MEMORY_AXES, memory_landmark: int = 0,
                 question_tokens: Optional[int] = None, memory_answer: str = "select",
                 memory_select_tokens: Optional[int] = None, checkpoint_path: Optional[str] = None,
                 checkpoint_every: float = DEFAULT_CHECKPOINT_SECONDS, rpc_servers: Any = None,
                 rpc_timeout: float = DEFAULT_ANSWER_TIMEOUT, **kwargs: Any) -> None:
        self.tokens_decoded = 0  # every token eval decoded, prompts and answers
        self.rpc_devices: list = []  # the RPC servers' devices this model's layers may be on
        self._rpc_failures = 0  # lost RPC connections of the process seen so far (patch 0016)
        self._checkpoints = None  # a long prompt's reading saved as it goes (checkpoint_path)
        self._memory_reopened = False  # a kept memory file reopened, not yet restored or cleared
        self.last_prompt: Optional[PromptReport] = None
        self.memory_capacity: Optional[int] = None  # tokens the document memory holds, once it is open
        self.memory_type: Optional[str] = None
        self.memory_axes: Optional[str] = None
        self.memory_landmark: Optional[int] = None  # tokens per landmark (0: the bound ranks the blocks)
        self.memory_file: Optional[str] = None
        if attention is not None and not isinstance(attention, AttentionConfig):
            raise TypeError(f"attention={attention!r} must be an AttentionConfig (or None for vanilla attention)")
        self.attention = attention if attention is not None else AttentionConfig.vanilla()
        self.model_info = read_model_info(model_path)
        self.attention_resolved: ResolvedAttention = self.attention.resolve(self.model_info)
        self.question_tokens = self._check_question_tokens(question_tokens)
        self.memory_answer = self._check_memory_answer(memory_answer)
        self._held_at: Optional[int] = None  # the stream's length when the kept blocks were selected

        if args:
            raise TypeError("pass llama_cpp.Llama options by keyword (n_ctx=..., n_batch=...)")
        n_ctx = int(kwargs.get("n_ctx", 512))
        n_batch = min(int(kwargs.get("n_batch", 512)), n_ctx) if n_ctx > 0 else int(kwargs.get("n_batch", 512))
        n_ubatch = min(int(kwargs.get("n_ubatch", 512)), n_batch)
        self.vocab_only = bool(kwargs.get("vocab_only", False))
        if not self.vocab_only:  # a tokenizer-only load has no cache to size
            self.attention_resolved.check_context(n_ctx, n_ubatch)
            learned = self.model_info.position_encoding == "learned"
            if learned and n_ctx > self.model_info.context_length:
                # the text would reach positions the embeddings have no row for (patch 0014 refuses the batch;
                # unpatched llama.cpp aborted the process)
                raise ValueError(f"n_ctx={n_ctx}: {self.model_info.architecture} has learned absolute position "
                                 f"embeddings, one per position up to its context length "
                                 f"{self.model_info.context_length} and none past it; use n_ctx <= "
                                 f"{self.model_info.context_length} (or 0, the model's own)")

        r = self.attention_resolved
        self._check_attention_options(kwargs)
        # the structure (mask, ceiling, cache, top-k) goes in as metadata, read at load; the temperature is set
        # through the C API below and read back, so it has one route
        every = r.kv_overrides(self.model_info.architecture)
        user = dict(kwargs.pop("kv_overrides", None) or {})
        clash = sorted(k for k in every if k in user and user[k] != every[k])
        if clash:
            raise ValueError(
                f"kv_overrides sets {clash[0]}={user[clash[0]]!r}, which attention= also sets "
                f"(to {every[clash[0]]!r}): configure it in AttentionConfig only"
            )
        user.update(r.kv_overrides(self.model_info.architecture, temperature=False))

        self.rpc_devices = self._add_rpc_servers(rpc_servers, kwargs, rpc_timeout)
        mark = logs.error_mark()
        try:
            super().__init__(model_path, kv_overrides=user, **kwargs)
        except ValueError as exc:
            self._check_rpc()
            reason = logs.errors_since(mark) or "run with verbose=True to see llama.cpp's log"
            if str(exc).startswith("Failed to load model"):
                raise InvalidModelError(f"{model_path}: llama.cpp could not load the model (tensors missing or not "
                                        f"matching {self.model_info.architecture}'s layout, or a corrupt file): "
                                        f"{reason}") from exc
            if str(exc).startswith("Failed to create llama_context"):
                raise ValueError(f"{model_path}: llama.cpp could not create a context for this "
                                 f"{self.model_info.architecture} model with these settings: {reason}") from exc
            raise

        if self.vocab_only:
            # a tokenizer-only load: llama.cpp reads no layer metadata and builds no cache, so there is no
            # attention to set or to check; decoding is refused in eval
            self._unbounded_stream = False
            return

        if self.rpc_devices:
            placed = self.devices()["layers"]
            if not set(placed) & set(self.rpc_devices):
                raise RuntimeError(f"rpc_servers: no layer went to the RPC devices {self.rpc_devices} (layers on "
                                   f"{sorted(set(placed))}): n_gpu_layers={kwargs.get('n_gpu_layers')} offloads none "
                                   "there")
        loaded = native.model_attention(self)
        expected = self.attention_resolved
        if (loaded["n_sink"], loaded["n_window"], loaded["n_ceiling"], loaded["n_rollback"], loaded["n_top_k"]) != (
                    expected.sinks, expected.window, expected.ceiling, expected.rollback, expected.top_k) or (expected.top_k > 0 and (loaded["n_top_k_layer"], loaded["n_top_k_distance"])
                                        != (expected.top_k_layer, expected.top_k_distance)) or (
                    (loaded["n_memory_blocks"], loaded["n_memory_candidates"], loaded["memory_per_layer"]) != (
                        expected.memory_blocks, expected.memory_candidates, expected.memory_selection == "layer")) or (
                    expected.memory and loaded["n_memory_block_size"] != expected.memory_block_size):
            raise RuntimeError(f"the library was loaded with {loaded}, not with {expected}: the overrides did not apply")
        # per-layer / per-head values and points (metadata carries only one number) go through the C API
        self._apply_temperature(expected)
        if memory_type is None:
            memory_type = memory_type_for(self.model_info)
        if checkpoint_path is not None:
            memory_path, memory_keep, memory_reopen = self._checkpoint_to(
                checkpoint_path, checkpoint_every, memory_path, memory_keep, memory_reopen, memory_type,
                memory_axes, memory_landmark)
        if expected.memory:
            self._open_memory(memory_path, memory_dir, memory_keep, memory_type, memory_capacity, memory_reopen,
                              memory_axes, memory_landmark)
            if memory_select_tokens is not None:
                self.set_memory_question(select_tokens=memory_select_tokens)
        else:
            given = [name for name, value in (("memory_path", memory_path is not None),
                                              ("memory_capacity", memory_capacity is not None),
                                              ("memory_reopen", bool(memory_reopen)),
                                              ("memory_select_tokens", memory_select_tokens is not None),
                                              ("memory_axes", memory_axes != DEFAULT_MEMORY_AXES),
                                              ("memory_landmark", bool(memory_landmark))) if value]
            if given:
                raise ValueError(f"{'/'.join(given)} without the document memory: use AttentionConfig("
                                 "memory_blocks=64, top_k=5, ...) to keep what leaves the window")
        if expected.top_k > 0 and expected.top_k_scope == "question":
            self.set_top_k_active(False)  # read with plain Lambda attention until the question

        # with a window the cache is bounded, so a stream may be as long as the caller likes: the token
        # history keeps the recent ids only, and llama-cpp-python's context-window checks
        # (create_completion's "Requested tokens exceed context window") see no limit; with top-k
        # middle keys the cache keeps every key and n_ctx is the limit, as for vanilla attention
        self._unbounded_stream = expected.bounded_cache
        if self._unbounded_stream:
            self.input_ids = TokenHistory()
            self._n_ctx = UNBOUNDED_CONTEXT
            self._guard_rollbacks()

    def _add_rpc_servers(self, servers: Any, kwargs: dict, rpc_timeout: float) -> list:
        """The devices of llama.cpp's RPC servers at ``servers`` ("host:port,..."), registered for this model, which
        offloads every layer to them unless n_gpu_layers says how many (llama.cpp fills the RPC devices first).
        The document memory reads its blocks from a KV cache in this machine's memory: with it the cache stays here
        (offload_kqv=False) and the attention is computed here, the layers' products on the servers."""
        if servers is None or servers == "" or servers == []:
            return []
        from . import rpc

        if self.vocab_only:
            raise ValueError("rpc_servers with vocab_only=True: a tokenizer-only load has no layers to offload")
        layers = kwargs.setdefault("n_gpu_layers", -1)
        if isinstance(layers, bool) or not isinstance(layers, int) or layers == 0:
            raise ValueError(f"n_gpu_layers={layers!r} with rpc_servers offloads no layer to them: give the number "
                             "of layers to offload (-1 or leave it out: all)")
        if self.attention_resolved.memory:
            if kwargs.get("offload_kqv"):
                raise ValueError("offload_kqv=True with the document memory and rpc_servers: the memory reads its "
                                 "blocks from a KV cache in this machine's memory; use offload_kqv=False (or leave "
                                 "it out)")
            kwargs["offload_kqv"] = False
        self._rpc_failures = native.rpc_failure()[0]
        return rpc.add_servers(servers, answer_timeout=rpc_timeout)

    def _check_rpc(self) -> None:
        """A lost RPC server (patch 0016) completes what was sent to it with zeroed answers and fails the next
        graph computation: a decode in which it was lost returned logits that are not the model's. Raised here,
        after every decode, before anything reads them."""
        if not self.rpc_devices:
            return
        from . import rpc

        count, message = native.rpc_failure()
        if count > self._rpc_failures:
            self._rpc_failures = count
            raise rpc.RPCServerError(f"{message}: this model's stream cannot go on; restart the server and load the "
                                     "model again (a reading checkpointed with --state or checkpoint_path goes on "
                                     "from its last checkpoint)")

    def _check_memory_answer(self, mode: str) -> str:
        """``memory_answer``: "select" (every decode selects the memory's blocks anew) or "hold" (a decode of two
        or more tokens, a document's chunk or a question, selects them and keeps them; a decode of one token, an
        answer's, attends to the kept ones). An answer token then costs what the kept blocks cost, not a selection
        over the document: at Llama-2-7B's shapes 0.28 s instead of 3.3 s (docs/memory.md)."""
        from .config import MEMORY_ANSWER_MODES

        if mode not in MEMORY_ANSWER_MODES:
            raise ValueError(f"memory_answer={mode!r}: use 'select' (each answer token selects the memory's blocks) "
                             "or 'hold' (the answer attends to the blocks its question selected)")
        if mode == "hold" and not self.attention_resolved.memory:
            raise ValueError("memory_answer='hold' needs the document memory: use AttentionConfig(memory_blocks=64, "
                             "...), or leave memory_answer='select'")
        return mode

    def _set_memory_hold_for(self, n_tokens: int) -> str:
        """The hold mode of a decode of ``n_tokens`` under memory_answer="hold": one token after a selection that
        is still in the stream holds it; anything else selects and keeps."""
        held = self._held_at is not None and self.n_tokens >= self._held_at
        mode = "hold" if n_tokens == 1 and held else "keep"
        native.memory_set_hold(self._attention_context("eval"), mode)
        if mode == "keep":
            self._held_at = None  # until the decode has kept its selection
        return mode

    def _check_question_tokens(self, n: Optional[int]) -> Optional[int]:
        """``question_tokens``: the middle keys (top_k_scope="question") are switched on for the last n tokens of
        every prompt and for the answer, so that llama-cpp-python's own completion calls (and the server) use
        them where a caller cannot say where the question starts."""
        if n is None:
            return None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"question_tokens={n!r}: give the number of prompt tokens (>= 1, e.g. 128) that end "
                             "each prompt and read with the middle keys, or None to switch them yourself")
        r = self.attention_resolved
        if r.top_k == 0 or r.top_k_scope != "question":
            raise ValueError(f"question_tokens={n} needs middle keys for the question (top_k > 0 and "
                             f"top_k_scope='question'; got top_k={r.top_k}, top_k_scope={r.top_k_scope!r}): "
                             "drop question_tokens, or configure them")
        return n

    def _open_memory(self, path: Optional[str], directory: Optional[str], keep: bool, type_name: str,
                     capacity: Optional[int], reopen: bool = False, axes: str = DEFAULT_MEMORY_AXES,
                     landmark: int = 0) -> None:
        """Open the store the hidden keys go to. Its file is reserved for ``capacity`` tokens up front, so that a
        disk too small or an unwritable path is an error now, not in the middle of a document.

        A kept file (``memory_keep``) is referenced by the states saved from this context, not copied into them;
        ``memory_reopen`` opens such a file as it was left, so that ``load_state`` of a state that references it
        goes on from its blocks (a checkpointed reading resumes without reading or copying the store).

        ``landmark`` = n > 0 keeps, instead of each block's min/max summary, the mean of each run of n of its keys,
        and a question ranks the blocks by their best landmark's q.k instead of the bound: scattered keys widen a
        block's box until the bound ranks the one block that holds an answer among hundreds, while the mean of the
        few keys around it still points at it (at Llama-2-7B's shapes and 128k tokens, 16 tokens a landmark: 0.96 GB
        of RAM where the summaries take 0.48)."""
        from .config import MEMORY_TYPES

        if type_name not in MEMORY_TYPES:
            raise ValueError(f"memory_type={type_name!r}: use one of {', '.join(MEMORY_TYPES)}")
        if capacity is None:
            capacity = DEFAULT_MEMORY_CAPACITY
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < self.attention_resolved.memory_cells:
            raise ValueError(f"memory_capacity={capacity!r}: give the number of tokens to hold (the document's "
                             f"length), at least memory_blocks*memory_block_size="
                             f"{self.attention_resolved.memory_cells}")
        if keep and not path:
            raise ValueError("memory_keep=True needs memory_path: an anonymous file cannot be kept")
        if reopen and not keep:
            raise ValueError("memory_reopen=True needs memory_keep=True and memory_path: only a kept file is left "
                             "for a later context to reopen")
        if directory is not None and not os.path.isdir(directory):
            raise ValueError(f"memory_dir={directory!r} is not a directory: create it or choose another")
        if axes not in native.MEMORY_AXES:
            raise ValueError(f"memory_axes={axes!r}: use 'principal' (each KV head's blocks summarized along the "
                             "principal axes of the document's first keys: a tighter bound) or 'channels' (along "
                             "the key channels, Quest's summary)")
        block = self.attention_resolved.memory_block_size
        if (isinstance(landmark, bool) or not isinstance(landmark, int) or landmark < 0
                or (landmark and (landmark > block or block % landmark))):
            raise ValueError(f"memory_landmark={landmark!r}: give the tokens a landmark averages, a divisor of the "
                             f"memory's block size {block} (e.g. {max(1, block // 4)}), or 0 for the bound")
        if landmark and axes != "channels":
            raise ValueError(f"memory_landmark={landmark} with memory_axes={axes!r}: the axes are those of the blocks' "
                             "min/max summaries, which the landmarks replace; drop one of them")
        native.memory_open(self._attention_context("memory"), path, directory, keep, MEMORY_TYPES[type_name],
                           capacity, bool(reopen), axes, landmark)
        self.memory_capacity = capacity
        self.memory_type = type_name
        self.memory_axes = axes
        self.memory_landmark = landmark
        self.memory_file = path if keep else None  # a file that outlives the context, referenced by its states

    def _checkpoint_to(self, path: str, every: float, memory_path: Optional[str], memory_keep: bool,
                       memory_reopen: bool, memory_type: Optional[str], memory_axes: str,
                       memory_landmark: int) -> tuple:
        """Checkpoint the reading of long prompts to ``path`` every ``every`` seconds, so that a process stopped
        in the middle of a reading of hours (a server restarted, a laptop shut) goes on from the last checkpoint
        when the same prompt comes back. The memory's blocks go to a kept file beside it (``path``.memory unless
        ``memory_path`` says), referenced by the checkpoint, not copied into it; the file is reopened when the
        checkpoint references it. Returns the memory's (path, keep, reopen)."""
        from pathlib import Path

        from . import reader

        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise ValueError(f"checkpoint_every={every!r}: give the seconds of reading between checkpoints (> 0)")
        if not self.attention_resolved.bounded_cache:
            raise ValueError(f"checkpoint_path={path!r} needs a window (a bounded cache: AttentionConfig() or "
                             "window=W), whose stream is read in batches a checkpoint can come between")
        state = Path(path)
        if state.is_dir():
            raise ValueError(f"checkpoint_path={path!r} is a directory: name a file for the stream's state")
        if not state.parent.is_dir():
            raise ValueError(f"checkpoint_path={path!r}: its directory {str(state.parent)!r} does not exist; create "
                             "it or choose another")
        if self.attention_resolved.memory:
            memory_path = memory_path or str(state) + ".memory"
            memory_keep = True
            memory_reopen = memory_reopen or (Path(memory_path).is_file() and reader.kept_memory_matches(
                state, memory_path, self.model_path, self.attention_resolved, memory_type, memory_axes,
                memory_landmark))
            self._memory_reopened = memory_reopen
        self._checkpoints = reader.Checkpoints(self, state, every)
        return memory_path, memory_keep, memory_reopen

    def _resume_reading(self, tokens: list) -> None:
        """Before a prompt: go on from the checkpoint when it holds more of the prompt than the stream does; a
        checkpoint of another prompt is dropped (the stream now writes over the memory file it references)."""
        from . import reader

        path = self._checkpoints.path
        n = reader.state_prefix(self, path, tokens)
        if n is not None and n > self.reusable_prefix(tokens):
            if reader.load_document_state(self, path, tokens) == n:  # (its reset forgets the held blocks)
                self._memory_reopened = False
                return
            n = None  # refused by the library (its memory file changed): read the prompt
        if n is None and path.is_file():
            reader.remove_state(path)
        if self._memory_reopened:
            native.clear_memory(self.ctx)  # the reopened file's blocks are not this stream's
            self.reset()
            self._memory_reopened = False

    def devices(self) -> dict:
        """The ggml device of each layer and of the output layer ({"layers": [...], "output": ...}, e.g. "CPU",
        "Vulkan0"): n_gpu_layers offloads layers to a GPU backend where the library was built with one."""
        return native.model_devices(self)

    def memory_info(self) -> dict:
        """Tokens, blocks and bytes (on disk, in RAM) of the document memory."""
        if not self.attention_resolved.memory:
            raise ValueError("memory_info: this model was loaded without the document memory (memory_blocks=0)")
        return native.memory_info(self._attention_context("memory_info"))

    def memory_disk_bytes(self, tokens: Optional[int] = None) -> int:
        """The store's bytes for ``tokens`` (default: the capacity its file reserved): the keys and values of every
        stored layer and KV head in the store's type, whole blocks, and the file's header. ``run`` says it before
        reading: at Llama-2-7B's shapes in q8_0 it is 235 KB a token, 30 GB for 128k tokens."""
        import gguf

        mi = self.memory_info()
        block_values, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(mi["type"])]
        per_value = block_bytes / block_values
        layers = [il for il in range(mi["layer_first"], self.model_info.block_count)
                  if il not in self.model_info.recurrent_layers]
        n = self.memory_capacity if tokens is None else int(tokens)
        blocks = -(-n // mi["n_block"])
        record = len(layers) * mi["n_kv"] * 2 * mi["n_block"] * mi["head_dim"] * per_value
        return STORE_HEADER_BYTES + int(blocks * record)

    def memory_hold(self, mode: str) -> None:
        """What the next decodes do with the blocks the memory selects: "select" (each decode selects and reads its
        own, the default), "keep" (the same, and the last selection stays in RAM: m*B keys and values per KV head of
        every stored layer), "hold" (attend to the kept blocks: no selection, no read of the store). A question read
        with "keep" and its answer decoded with "hold" pay the selection once: each answer token then costs what
        the attention over the kept blocks costs, whatever the document's length."""
        native.memory_set_hold(self._attention_context("memory_hold"), mode)

    def set_memory_question(self, candidates: Optional[int] = None, select_tokens: Optional[int] = None) -> None:
        """How the next questions select their blocks, between decodes (a reading is the same whatever they are,
        so one reading can be asked in several ways): ``candidates`` reranked per KV head by their exact q.k (0:
        the bound alone; more than memory_blocks and at most the memory_candidates the model was loaded with, which
        sizes the graph) and ``select_tokens``, the question's last tokens whose queries select (0: all; fewer
        costs less: a 128-token question's rerank at 128k tokens is products of every query with every candidate
        key). None keeps the current value. Read back from the library."""
        for name, value in (("candidates", candidates), ("select_tokens", select_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
                raise ValueError(f"set_memory_question: {name}={value!r}: give a whole number >= 0 (0: "
                                 f"{'the bound alone selects' if name == 'candidates' else 'every token selects'})")
        if not self.attention_resolved.memory:
            raise ValueError("set_memory_question: this model was loaded without the document memory "
                             "(memory_blocks=0)")
        ctx = self._attention_context("set_memory_question")
        now = native.memory_info(ctx)
        want = (now["n_candidates"] if candidates is None else int(candidates),
                now["n_select_tokens"] if select_tokens is None else int(select_tokens))
        native.memory_set_question(ctx, *want)
        got = native.memory_info(ctx)
        if (got["n_candidates"], got["n_select_tokens"]) != want:
            raise RuntimeError(f"set_memory_question: asked candidates={want[0]}, select_tokens={want[1]}; the "
                               f"library holds {got['n_candidates']}, {got['n_select_tokens']}")

    def _stored_layer_context(self, layer: int, what: str) -> int:
        """The context of a call about stored layer ``layer`` (ValueError for a layer the memory does not store)."""
        ctx = self._attention_context(what)
        r, info = self.attention_resolved, self.model_info
        if not r.top_k_layer <= layer < info.block_count or layer in info.recurrent_layers:
            why = "keeps a recurrent state" if layer in info.recurrent_layers else "is not stored"
            raise ValueError(f"{what}({layer}): layer {layer} {why}; the memory stores the attention layers from "
                             f"top_k_layer = {r.top_k_layer} to {info.block_count - 1}")
        return ctx

    def memory_selection(self, layer: int) -> np.ndarray:
        """[n_kv, m] blocks each KV head of ``layer`` selected in the last decode."""
        return native.memory_selection(self._stored_layer_context(layer, "memory_selection"), layer)

    def memory_summary_axes(self, layer: int) -> Tuple[np.ndarray, bool]:
        """([n_kv, head_dim, head_dim] axes of ``layer``'s block summaries, one a row; whether they are the principal
        axes of the document's first keys, set when the first block was complete)."""
        return native.memory_axes(self._stored_layer_context(layer, "memory_summary_axes"), layer)

    def _check_attention_options(self, kwargs: dict) -> None:
        """Refuse llama_cpp options under which the configured attention would not be exact."""
        r, encoding = self.attention_resolved, self.model_info.position_encoding
        flash = bool(kwargs.get("flash_attn"))
        if r.top_k > 0 and flash:
            raise ValueError(f"flash_attn=True with top_k={r.top_k}: the top-k middle keys need the non-flash "
                             "attention path; use flash_attn=False")
        rope_ceiling = r.ceiling > 0 and encoding == "rope"
        if rope_ceiling and flash:
            # flash attention sees a far key through one copy per query, rotated to distance C: a few copies when
            # only the sinks are ever far (the window within the ceiling), too many otherwise
            # (llama_cpp.Llama opens one sequence, or n_batch of them with embedding=True)
            several = bool(kwargs.get("embedding"))
            if r.window == 0 or r.ceiling < r.window or several:
                raise ValueError(f"flash_attn=True with ceiling={r.ceiling}, window={r.window}"
                                 f"{', embedding=True' if several else ''}: the RoPE distance ceiling takes flash "
                                 "attention only with a window (Λ mask) no wider than the ceiling and one sequence "
                                 "(not embedding=True, which opens several), where only the sinks are ever far; set "
                                 "ceiling >= window, or use flash_attn=False")
        type_v = kwargs.get("type_v")
        if (r.top_k > 0 or (rope_ceiling and not flash)) and type_v is not None and int(type_v) not in (0, 1):
            # llama.cpp quantizes the V cache only for flash attention, which these paths do not use
            raise ValueError(f"type_v={type_v}: a quantized V cache needs flash attention, which the top-k middle "
                             "keys cannot use and the distance ceiling uses only with flash_attn=True; quantize K "
                             "only (type_k=8 for q8_0) and keep type_v f16 (1), or pass flash_attn=True")
        refused = knob_support(self.model_info)["temperature"]
        if refused and r.temperature_on:
            raise ValueError(f"a softmax temperature on {self.model_info.architecture} is not supported with {refused}; "
                             "use temperature=1 and no schedule")
        if self.model_info.softcapped_logits and flash and r.temperature_on:
            raise ValueError(f"flash_attn=True with a softmax temperature on {self.model_info.architecture}: the "
                             "temperature divides the softcapped logits, and flash attention caps them inside its "
                             "kernel; use flash_attn=False")
        if encoding == "alibi" and flash:
            if r.temperature_on:
                raise ValueError("flash_attn=True with a softmax temperature on an ALiBi model: the temperature-"
                                 "scaled bias does not fit the f16 flash-attention mask; use flash_attn=False")
            if (r.window > 0 or r.ceiling > 0) and not 0 < r.ceiling <= 2048:
                # flash attention takes the ALiBi distances from an f16 mask: integers are exact only to 2048
                raise ValueError(f"flash_attn=True on an ALiBi model needs a ceiling in 1..2048 (got ceiling="
                                 f"{r.ceiling}): distances above 2048 are not exact in the f16 mask; use "
                                 "flash_attn=False")

    def _attention_context(self, what: str) -> int:
        """The context whose attention is set or read; a vocab-only load has none worth the name."""
        if self.vocab_only:
            raise ValueError(f"{what}: this Llama was loaded with vocab_only=True (tokenizer only, no layers); "
                             "load it without vocab_only to set or read the attention")
        return context_address(self)

    def _apply_temperature(self, r: ResolvedAttention) -> None:
        ctx = self._attention_context("set_temperature")
        if r.temperature.size == 0:
            return  # no attention heads (a recurrent model): resolve refused any temperature but 1
        native.set_temperature(ctx, r.temperature, r.log_length, r.points_lengths, r.points_tau)
        got, got_log_length = native.get_temperature(ctx)
        got_lengths, got_points = native.get_temperature_points(ctx)
        if (not np.array_equal(got, r.temperature) or got_log_length != r.log_length
                or tuple(int(x) for x in got_lengths) != r.points_lengths
                or not np.array_equal(got_points, r.points_tau)):
            raise RuntimeError("the library did not take the temperature that was set")

    def set_temperature(self, temperature: Temperature = 1.0, schedule: Optional[str] = None,
                        log_length: Optional[int] = None, points=None) -> None:
        """Change the softmax temperature between decodes (no reload; calibration tries many values)."""
        config = self.attention.with_temperature(temperature, schedule, log_length, points)
        resolved = config.resolve(self.model_info)
        self._apply_temperature(resolved)
        self.attention, self.attention_resolved = config, resolved

    def set_top_k_active(self, on: bool) -> None:
        """Switch the top-k middle keys on or off from the next decode on (``top_k_scope="question"``: read the
        document with them off, then switch them on for the question and the answer)."""
        r = self.attention_resolved
        if r.top_k == 0:
            raise ValueError("set_top_k_active: this model was loaded without top-k middle keys; use "
                             "AttentionConfig(top_k=5, ...) so that the cache keeps them")
        native.set_top_k(self._attention_context("set_top_k_active"), r.top_k if on else 0, r.top_k_layer,
                        r.top_k_distance)

    def set_top_k(self, k: int, layer: Optional[int] = None, distance: Optional[int] = None) -> None:
        """Change k, the first layer and the distance of the top-k middle keys between decodes (k = 0: off;
        None keeps the value set last). A k > 0 becomes the one ``set_top_k_active(True)`` switches on."""
        from dataclasses import replace

        r = self.attention_resolved
        layer = r.top_k_layer if layer is None else layer
        distance = r.top_k_distance if distance is None else distance
        if r.top_k == 0:
            raise ValueError("set_top_k: this model was loaded without top-k middle keys; use "
                             "AttentionConfig(top_k=5, ...) so that the cache keeps them")
        if k == 0:
            native.set_top_k(self._attention_context("set_top_k"), 0, 0, 0)
            return
        config = replace(self.attention, top_k=k, top_k_layer=layer, top_k_distance=distance)
        resolved = config.resolve(self.model_info)
        native.set_top_k(self._attention_context("set_top_k"), resolved.top_k, resolved.top_k_layer,
                        resolved.top_k_distance)
        self.attention, self.attention_resolved = config, resolved

    @property
    def top_k_state(self) -> tuple:
        """(k, layer, distance) the library applies now (k = 0: off)."""
        return native.get_top_k(self._attention_context("top_k_state"))

    def get_temperature(self) -> tuple:
        """(tau[n_layer, n_head], log_length) as the library holds them."""
        return native.get_temperature(self._attention_context("get_temperature"))

    def close(self) -> None:
        # a constructor that raised before llama_cpp.Llama.__init__ left nothing to close
        if hasattr(self, "_stack"):
            super().close()

    # --- unbounded streams (Lambda window) ------------------------------------------------------
    def _guard_rollbacks(self) -> None:
        """Refuse a rollback further back than the cache keeps the window (the caller then re-reads).

        llama-cpp-python reuses a cached prompt prefix by removing the cache suffix from the first
        differing position; with a bounded cache the window keys before that position may already be
        freed, which would silently drop them from attention. Past ``rollback`` tokens the removal
        reports failure, and llama-cpp-python re-evaluates the prompt.
        """
        remove = self._ctx.kv_cache_seq_rm
        margin = self.attention_resolved.rollback

        def kv_cache_seq_rm(seq_id: int, p0: int, p1: int) -> bool:
            pos_max = native.seq_pos_max(self.ctx, seq_id)
            if p1 < 0 and 0 < p0 <= pos_max and p0 < pos_max + 1 - margin:
                return False
            return remove(seq_id, p0, p1)

        self._ctx.kv_cache_seq_rm = kv_cache_seq_rm

    def eval(self, tokens) -> None:
        """Decode tokens; with a window, the stream may grow past n_ctx (the cache stays bounded). With
        ``question_tokens`` the last ones of the call read with the middle keys, the rest without."""
        tokens = list(tokens)
        keeps = (self.memory_answer == "hold" and bool(tokens) and not self.vocab_only
                 and self._set_memory_hold_for(len(tokens)) == "keep")
        if self._checkpoints is not None:
            self._checkpoints.restart()
        if self.question_tokens is None or self.vocab_only:
            self._eval(tokens, checkpoints=True)
        else:
            split = max(0, len(tokens) - self.question_tokens)
            if split > 0:
                self.set_top_k_active(False)
                self._eval(tokens[:split], checkpoints=True)
            self.set_top_k_active(True)
            self._eval(tokens[split:])
        if keeps and self.top_k_state[0] > 0:
            self._held_at = self.n_tokens  # (the memory selects only for the middle keys: not while they are off)

    def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        """llama-cpp-python's generation, recording in ``last_prompt`` how much of the prompt was read."""
        tokens = list(tokens)
        if self.memory_capacity is not None and len(tokens) > self.memory_capacity:
            raise ValueError(f"the prompt has {len(tokens)} tokens and the document memory holds "
                             f"{self.memory_capacity} (memory_capacity): shorten the prompt, or load the model with a "
                             "larger memory_capacity")
        t0 = time.perf_counter()
        if self._checkpoints is not None and tokens:
            self._resume_reading(tokens)
        before = self.tokens_decoded
        first = True
        for token in super().generate(tokens, *args, **kwargs):
            if first:
                read = self.tokens_decoded - before
                self.last_prompt = PromptReport(tokens=len(tokens), read=read, reused=max(0, len(tokens) - read),
                                                seconds=time.perf_counter() - t0)
                first = False
            yield token

    def _eval(self, tokens: list, checkpoints: bool = False) -> None:
        """Decode ``tokens`` a batch at a time; ``checkpoints``: the stream may be saved between batches (a
        document's reading, not its question's tokens, whose memory selection an answer may hold)."""
        if self.vocab_only:
            raise ValueError("eval: this Llama was loaded with vocab_only=True (tokenizer only, no layers); load "
                             "it without vocab_only to decode")
        if not tokens:
            return
        if not self._unbounded_stream:
            tokens = list(tokens)
            if self.attention_resolved.top_k > 0 and self.n_tokens + len(tokens) > self._n_ctx:
                raise ValueError(
                    f"top_k={self.attention_resolved.top_k} keeps every key in the cache, and "
                    f"{self.n_tokens + len(tokens)} tokens exceed n_ctx={self._n_ctx}: raise n_ctx to the "
                    "document length (plus the answer), or use top_k=0 for a bounded cache")
            try:
                super().eval(tokens)
            except RuntimeError:
                self._check_rpc()
                raise
            self._check_rpc()
            self.tokens_decoded += len(tokens)
            return
        if self._logits_all and self.n_tokens + len(tokens) > self.scores.shape[0]:
            raise ValueError(
                f"logits_all=True keeps every token's logits, and {self.n_tokens + len(tokens)} tokens exceed "
                f"n_ctx={self.scores.shape[0]}: use logits_all=False for long streams, or "
                "llama_extrapolate.harness.evaluate.streaming_nll to score them"
            )
        if not self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1):
            raise RuntimeError(f"could not roll the cache back to token {self.n_tokens}")
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i:i + self.n_batch]
            n_past, n = self.n_tokens, len(batch)
            self._batch.set_batch(batch=batch, n_past=n_past, logits_all=self._logits_all)
            try:
                self._ctx.decode(self._batch)
            except RuntimeError as exc:
                self._check_rpc()
                why = native.memory_last_error(self._attention_context("eval"))
                if why:
                    raise RuntimeError(f"{exc}: document memory: {why}") from None
                raise
            self._check_rpc()
            self.input_ids[n_past:n_past + n] = batch
            if self._logits_all:
                logits = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(n * self._n_vocab,))
                self.scores[n_past:n_past + n, :].reshape(-1)[::] = logits
            self.n_tokens += n
            self.tokens_decoded += n
            self._requires_eval = False
            if checkpoints and self._checkpoints is not None:
                self._checkpoints()

    def reset(self) -> None:
        super().reset()
        self._held_at = None
        if isinstance(self.input_ids, TokenHistory):
            self.input_ids.reset()

    # --- state save/load ------------------------------------------------------------------------
    def set_cache(self, cache) -> None:
        """llama-cpp-python prefers the current stream to a cached state when the stream shares at least as
        long a prefix with the prompt; a bounded stream cannot roll back past its rollback margin, so it
        would read the whole prompt again. The cache is wrapped so that the choice knows the margin."""
        if cache is not None and self._unbounded_stream:
            cache = StreamAwareCache(cache, self)
        super().set_cache(cache)

    def reusable_prefix(self, tokens) -> int:
        """Tokens of ``tokens`` the current stream can keep (llama-cpp-python's prefix reuse, after the
        rollback guard): the shared prefix, or 0 when keeping it would roll back past the margin."""
        shared = llama_cpp.Llama.longest_token_prefix(self._input_ids, tokens)
        if shared == len(tokens):
            shared -= 1  # llama-cpp-python replays the last prompt token for fresh logits
        if shared <= 0 or (self._unbounded_stream and shared < self.n_tokens - self.attention_resolved.rollback):
            return 0
        return shared

    def save_state(self) -> llama_cpp.LlamaState:
        """llama-cpp-python's state, exact for a Lambda stream too: the library's state carries the
        re-basing offsets of the window (patch 0007), and the id history keeps its absolute positions."""
        if self.vocab_only:
            raise ValueError("save_state: this Llama was loaded with vocab_only=True (tokenizer only, no cache); "
                             "load it without vocab_only")
        state = super().save_state()
        if state.llama_state_size <= 0:
            raise RuntimeError("llama.cpp wrote an empty state (run with verbose=True to see why)")
        if isinstance(self.input_ids, TokenHistory):
            state.input_ids = copy.deepcopy(self.input_ids)
        return state

    def load_state(self, state: llama_cpp.LlamaState) -> None:
        history = copy.deepcopy(state.input_ids) if isinstance(state.input_ids, TokenHistory) else None
        if history is not None and not self._unbounded_stream:
            raise ValueError("load_state: the state is of a Lambda stream (unbounded token history) and this Llama "
                             "has a bounded context; load it into a Llama with the same attention")
        if history is None and self._unbounded_stream:
            raise ValueError("load_state: this Llama reads an unbounded Lambda stream and the state is not of one "
                             "(it came from a Llama with another attention); load it into a Llama with the same "
                             "attention")
        super().load_state(state)
        self._held_at = None  # the kept blocks were another stream's
        if history is not None:
            self.input_ids = history


class StreamAwareCache(llama_cpp.llama_cache.BaseLlamaCache):
    """A llama-cpp-python cache seen through a bounded-stream Llama.

    llama-cpp-python looks a prompt up, then loads the cached state only if it shares a longer prefix with
    the prompt than the current stream does. A Lambda stream can keep only what lies within its rollback
    margin, so the lookup loads the state itself when the stream's usable prefix is shorter (llama-cpp-python
    then finds the stream equal to the state and goes on from there).
    """

    def __init__(self, inner: llama_cpp.llama_cache.BaseLlamaCache, llm: Llama) -> None:
        super().__init__(inner.capacity_bytes)
        self.inner = inner
        self._llm = weakref.ref(llm)

    @property
    def cache_size(self) -> int:
        return self.inner.cache_size

    def __contains__(self, key) -> bool:
        return key in self.inner

    def __setitem__(self, key, value) -> None:
        self.inner[key] = value

    def __getitem__(self, key):
        item = self.inner[key]
        llm = self._llm()
        if llm is not None:
            cached = llama_cpp.Llama.longest_token_prefix(item.input_ids.tolist(), key)
            if cached > llm.reusable_prefix(key):
                llm.load_state(item)
        return item
