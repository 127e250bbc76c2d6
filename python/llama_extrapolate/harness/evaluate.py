"""Streaming negative log-likelihood: the per-token loss of a long text, chunk by chunk.

A 32k-token text has 32k x n_vocab logits (6 GB for a 49k vocabulary), so the
logits of each decoded chunk are reduced to one NLL per token right away and
never kept, unlike ``llama_cpp.Llama(logits_all=True)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import llama_cpp
import numpy as np

from .. import native
from ..jsonfile import read_json_if, write_json_atomic, writes_one_file
from ..resources import peak_rss_bytes, peak_rss_reset


@dataclass
class NLLResult:
    nll: np.ndarray  # nll[i] = -log p(tokens[i + 1] | tokens[: i + 1])
    seconds: float
    resumed_from: int = 0  # tokens restored from a checkpoint (their seconds are in ``seconds``)

    def bucketize(self, size: int) -> List[dict]:
        """Mean NLL and perplexity per block of `size` target positions (position = index of the target token)."""
        if size <= 0:
            raise ValueError(f"bucket size={size} must be > 0")
        out = []
        for start in range(0, len(self.nll), size):
            part = self.nll[start:start + size]
            part = part[np.isfinite(part)]
            if len(part) == 0:
                break
            mean = float(part.mean())
            out.append({"start": start + 1, "end": start + len(part), "nll": mean, "ppl": float(np.exp(mean))})
        return out


def log_softmax_at(logits: np.ndarray, targets: np.ndarray, rows_per_step: int = 32) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] in float64, a few rows at a time.

    A whole chunk at once would hold several float64 copies of n_batch x n_vocab (about 600 MB for 512 x 49152),
    more than the KV cache of a Lambda window; a few rows keep the scoring's memory negligible.
    """
    out = np.empty(len(targets), dtype=np.float64)
    for i in range(0, len(targets), rows_per_step):
        rows = logits[i:i + rows_per_step].astype(np.float64)
        t = targets[i:i + rows_per_step]
        rows -= rows.max(axis=1, keepdims=True)
        picked = rows[np.arange(len(t)), t]
        np.exp(rows, out=rows)
        out[i:i + len(t)] = np.log(rows.sum(axis=1)) - picked
    return out


def score_chunk(ctx, tokens: np.ndarray, start: int, n: int, n_vocab: int, nll: np.ndarray) -> None:
    """After decoding tokens[start:start+n] with every row's logits: each one's NLL of its next token into
    ``nll`` (the last token of the stream has no next one to score)."""
    logits = native.logits_rows(ctx, n, n_vocab)
    targets = tokens[start + 1:start + n + 1]
    nll[start:start + len(targets)] = log_softmax_at(logits[: len(targets)], targets)


def streaming_nll(llm: llama_cpp.Llama, tokens: Sequence[int], *, n_batch: Optional[int] = None,
                  progress: bool = True, desc: str = "nll", context_shift: Optional[int] = None,
                  on_chunk: Optional[Callable[[np.ndarray, int], None]] = None,
                  checkpoint=None) -> NLLResult:
    """NLL of every token of `tokens` after the first, decoding `n_batch` tokens at a time from position 0.

    ``context_shift=n_keep``: llama.cpp's context shift (the StreamingLLM-like baseline of llama-cli):
    when the next chunk does not fit the cache, the oldest half of the tokens after the first n_keep is
    removed and the rest moved back (llama_memory_seq_rm + llama_memory_seq_add, keys re-rotated).
    ``on_chunk(nll, n_done)`` is called after each chunk (partial results for long runs).
    ``checkpoint`` (a ``checkpoint.StreamCheckpoint``): resume from it if it matches, and write it now and
    then, so that a killed run loses minutes, not the stream.
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.ndim != 1 or len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to score, got {len(tokens)}")
    n_vocab = llm.n_vocab()
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise ValueError(f"token ids must be in [0, {n_vocab}), got {tokens.min()}..{tokens.max()}")
    n_batch = llm.n_batch if n_batch is None else int(n_batch)
    if n_batch <= 0 or n_batch > llm.n_batch:
        raise ValueError(f"n_batch={n_batch} must be in 1..{llm.n_batch} (the context's n_batch)")
    n_cells = native.n_cells(llm.ctx)
    if context_shift is not None and not 0 <= context_shift < n_cells - 2 * n_batch:
        raise ValueError(f"context_shift={context_shift} (n_keep) must be in 0..{n_cells - 2 * n_batch - 1}: the cache "
                         f"of {n_cells} cells must hold n_keep plus two chunks of {n_batch}")

    stream = native.Stream(llm, n_batch, context_shift)
    stream.reset()
    nll = np.full(len(tokens) - 1, np.nan, dtype=np.float64)
    first, spent = 0, 0.0
    resumed = checkpoint.load(llm.ctx, len(tokens)) if checkpoint is not None else None
    if resumed is not None:
        if resumed.done % n_batch and resumed.done != len(tokens):
            stream.close()
            raise ValueError(f"checkpoint at token {resumed.done} is not at a chunk of n_batch={n_batch}")
        nll, stream.n_past, first, spent = resumed.nll, resumed.n_past, resumed.done, resumed.seconds
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tokens), initial=first, desc=desc, unit="tok")
    t0 = time.perf_counter() - spent
    try:
        for offset, n in stream.chunks(tokens[first:], logits="all"):
            start = first + offset
            score_chunk(llm.ctx, tokens, start, n, n_vocab, nll)
            if bar is not None:
                bar.update(n)
            if on_chunk is not None:
                on_chunk(nll, start + n)
            if checkpoint is not None and start + n < len(tokens) and checkpoint.due():
                checkpoint.save(llm.ctx, start + n, stream.n_past, nll, time.perf_counter() - t0)
    finally:
        stream.close()
        if bar is not None:
            bar.close()
    return NLLResult(nll=nll, seconds=time.perf_counter() - t0, resumed_from=first)


@dataclass
class ChunkedPerplexity:
    ppl: float
    nll: float  # mean over the scored tokens
    uncertainty: float  # llama-perplexity's "+/-": ppl times the standard error of the per-token NLL
    count: int
    running: List[float]  # perplexity after each chunk, llama-perplexity's "[i]ppl," line


def chunked_perplexity(llm: llama_cpp.Llama, tokens: Sequence[int], n_ctx: int, *, n_chunks: Optional[int] = None,
                       n_batch: Optional[int] = None, progress: bool = False) -> ChunkedPerplexity:
    """Perplexity the way llama.cpp's ``llama-perplexity`` computes it, for a cross-check against that tool.

    The tokens (the whole text tokenized once, BOS first) are cut into len // n_ctx chunks of n_ctx; each chunk
    is read alone from position 0 in an empty cache, its first token replaced by BOS when the vocabulary adds
    one, and only the second half is scored: the logits at positions n_ctx/2 .. n_ctx-2 against the next tokens,
    n_ctx - 1 - n_ctx/2 tokens per chunk. PPL = exp(mean NLL) over all scored tokens.
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    if n_ctx < 4:
        raise ValueError(f"n_ctx={n_ctx}: a chunk needs at least 4 tokens")
    if n_ctx > native.n_cells(llm.ctx):
        raise ValueError(f"n_ctx={n_ctx} is larger than the context's {native.n_cells(llm.ctx)} cells")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"{len(tokens)} tokens: llama-perplexity needs at least 2 * n_ctx = {2 * n_ctx}")
    total = len(tokens) // n_ctx if n_chunks is None else min(int(n_chunks), len(tokens) // n_ctx)
    if total < 1:
        raise ValueError(f"n_chunks={n_chunks} must be >= 1")
    bos = native.bos_if_added(llm)
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    for c in range(total):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        r = streaming_nll(llm, chunk, n_batch=n_batch, progress=progress, desc=f"chunk {c + 1}/{total}")
        scored = r.nll[first:]
        nll_sum += float(scored.sum())
        nll2_sum += float((scored ** 2).sum())
        count += len(scored)
        running.append(float(np.exp(nll_sum / count)))
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    se = float(np.sqrt(var / (count - 1))) if var > 0 else float("nan")
    return ChunkedPerplexity(ppl=float(np.exp(mean)), nll=mean, uncertainty=se * float(np.exp(mean)), count=count,
                             running=running)


# --- comparing configurations on the same tokens (``llama-extrapolate nll``) -----------------------
# the configuration names (names.NamedConfig parses, names and labels them); kept here for the callers that import
# them from the evaluation
from ..names import (BASELINES, MEMORY_CONFIG, MEMORY_LAYER_SUFFIX, MEMORY_PASSAGES_SUFFIX,  # noqa: E402,F401
                    PROFILE_CONFIG_PREFIX, TOP_K_CONFIG, NamedConfig)


class MemorySettings(NamedTuple):
    blocks: int  # m
    candidates: int  # c (0: the bound selects)
    selection: str = "head"  # see config.MEMORY_SELECTIONS
    passages: bool = False  # every key of the selected blocks, in the order of the text
    hold: bool = False  # the answer attends to the blocks its question selected
    memory_type: Optional[str] = None  # the store's type (None: NAMED_CONFIG_STORE, f16 for odd heads)
    principal_axes: bool = False  # the block summaries along the principal axes of the first keys
    landmark: int = 0  # tokens a landmark averages (0: the bound ranks the blocks)


def memory_config_name(name: str) -> str:
    """The name results are stored under (NamedConfig.name): a memory configuration with its m and candidates c
    ("lambda+memory" is the default's, which has changed, so a stored "lambda+memory" would not say what it ran
    with), ":passages" when the question reads whole blocks and ":layer" when the layer selects; any other name as
    it is."""
    return NamedConfig.parse(name).name if NamedConfig.is_memory_name(name) else name


def memory_settings_of(name: str) -> Optional[MemorySettings]:
    """(m, c, selection, passages, hold) of a document-memory configuration name (NamedConfig.parse); None for any other
    name. ValueError names a malformed m or c."""
    if not NamedConfig.is_memory_name(name):
        return None
    named = NamedConfig.parse(name)
    return MemorySettings(named.memory_blocks, named.memory_candidates, named.memory_selection, named.passages,
                          named.hold, named.memory_type, named.principal_axes, named.landmark)


def memory_blocks_of(name: str) -> Optional[int]:
    """The m of a document-memory configuration name (see memory_settings_of), None for any other."""
    settings = memory_settings_of(name)
    return None if settings is None else settings.blocks


@dataclass
class EvalSetup:
    """How one named configuration reads a stream: attention, cache size, context shift."""

    name: str
    attention: object  # AttentionConfig
    n_ctx: int
    context_shift: Optional[int] = None
    memory_capacity: Optional[int] = None  # tokens the document memory is opened for
    memory_type: Optional[str] = None  # the store's type: the name's, else options.NAMED_CONFIG_STORE
    memory_axes: Optional[str] = None  # the block summaries' axes ("principal"; None: the library's default)
    memory_landmark: int = 0  # tokens a landmark averages (0: the bound ranks the blocks)

    def llama_kwargs(self) -> dict:
        """What ``Llama`` needs besides the attention and n_ctx (the document memory's capacity, store type and
        summaries' axes)."""
        kwargs = {"memory_capacity": self.memory_capacity} if self.memory_capacity else {}
        if self.memory_type:
            kwargs["memory_type"] = self.memory_type
        if self.memory_axes:
            kwargs["memory_axes"] = self.memory_axes
        if self.memory_landmark:
            kwargs["memory_landmark"] = self.memory_landmark
        return kwargs

    @property
    def top_k_question(self) -> bool:
        """The top-k middle keys are switched on where the question starts."""
        return self.attention.top_k > 0 and self.attention.top_k_scope == "question"

    def describe(self) -> dict:
        a = self.attention
        top_k = ({"top_k": a.top_k, "top_k_layer": a.top_k_layer, "top_k_distance": a.top_k_distance,
                  "top_k_scope": a.top_k_scope} if a.top_k else {})
        return {**top_k, "sinks": a.sinks, "window": a.window, "ceiling": a.ceiling,
                "temperature": np.asarray(a.temperature).tolist(),
                "temperature_schedule": a.temperature_schedule, "log_length": a.log_length,
                "temperature_points": [[L, np.asarray(t).tolist()] for L, t in (a.temperature_points or ())],
                "n_ctx": self.n_ctx, "context_shift_n_keep": self.context_shift}


def setup_for(name: str, info, n_tokens: int, n_batch: int, *, window: Optional[int] = None,
              sinks: Optional[int] = None, n_keep: int = 4, profile_mode: str = "pmax") -> EvalSetup:
    """The configuration called ``name`` for this model and a stream of ``n_tokens`` tokens.

    lambda: LM-Infinite (S sinks, window W, ceiling C = W); vanilla: full attention, a cache for the whole
    stream; context-shift: llama.cpp's context shift over a cache of L_pre cells keeping n_keep tokens;
    window-only: W without sinks or ceiling; lambda-only: Lambda mask without ceiling; ceiling-only: full
    attention with distances capped at L_pre; log-length: full attention with tau(p) = log L_pre /
    log max(p + 1, L_pre); profile=PATH: full attention with the schedule of a calibration profile (its
    ``profile_mode`` entries).
    """
    from dataclasses import replace

    from ..config import DEFAULT_TOP_K_LAYER, AttentionConfig, memory_question_top_k
    from ..options import NAMED_CONFIG_STORE, memory_type_for

    l_pre = int(info.context_length)
    full = n_tokens + n_batch
    if name.startswith(PROFILE_CONFIG_PREFIX):
        cfg = AttentionConfig.from_profile(name[len(PROFILE_CONFIG_PREFIX):], model_path=info.path, mode=profile_mode)
        return EvalSetup(name, cfg, full)
    # the one rule of every command (run included): the model's metadata, else LM-Infinite's defaults (S = 10,
    # W = C = L_pre), then the caller's window and sinks. A stream read once never steps back, so no rollback
    # margin: the cache is S + W + n_batch
    given = {k: int(v) for k, v in (("window", window), ("sinks", sinks)) if v is not None}
    lam = AttentionConfig.from_model(info, rollback=0, **given)
    w = lam.resolve(info).window or l_pre
    if name == "lambda":
        cfg = lam
    elif name == "vanilla":
        return EvalSetup(name, AttentionConfig.vanilla(), full)
    elif name == "context-shift":
        return EvalSetup(name, AttentionConfig.vanilla(), l_pre, context_shift=n_keep)
    elif name == "window-only":
        cfg = replace(lam, sinks=0, ceiling=0)
    elif name == "lambda-only":
        cfg = replace(lam, ceiling=0)
    elif name == "ceiling-only":
        return EvalSetup(name, AttentionConfig.ceiling_only(w), full)
    elif name == TOP_K_CONFIG:
        # LM-Infinite's passkey setting (k = 5 from layer 5 on, or the last layer of a smaller model); the cache
        # keeps every key, so it holds the whole stream
        cfg = replace(lam, top_k=5, top_k_scope="question",
                      top_k_layer=min(DEFAULT_TOP_K_LAYER, int(info.block_count) - 1))
        return EvalSetup(name, cfg, full)
    elif (memory := memory_settings_of(name)) is not None:
        cfg = replace(lam, top_k=memory_question_top_k(memory.blocks, lam.memory_block_size, memory.passages),
                      top_k_scope="question", memory_blocks=memory.blocks,
                      memory_candidates=memory.candidates, memory_selection=memory.selection,
                      top_k_layer=min(DEFAULT_TOP_K_LAYER, int(info.block_count) - 1))
        return EvalSetup(name, cfg, cfg.resolve(info).required_n_ctx(n_batch, stream=n_tokens),
                         memory_capacity=n_tokens + n_batch,
                         memory_type=memory.memory_type or memory_type_for(info, NAMED_CONFIG_STORE),
                         memory_axes="principal" if memory.principal_axes else "channels",
                         memory_landmark=memory.landmark)
    elif name == "log-length":
        return EvalSetup(name, AttentionConfig(sinks=0, window=0, ceiling=0, temperature_schedule="log-length"), full)
    else:
        raise ValueError(f"configuration {name!r}: use one of {', '.join(BASELINES)}, {TOP_K_CONFIG} or "
                         f"{MEMORY_CONFIG}[:m=N] (passkey, needle) or profile=PATH")
    resolved = cfg.resolve(info)
    return EvalSetup(name, cfg, resolved.required_n_ctx(n_batch, stream=n_tokens))


@writes_one_file("out_path")
def compare_nll(model: str, tokens: Sequence[int], names: Sequence[str], out_path, *, bucket: int = 1024,
                n_batch: int = 512, threads: Optional[int] = None, window: Optional[int] = None,
                sinks: Optional[int] = None, meta: Optional[dict] = None, progress: bool = True,
                checkpoint_every: Optional[float] = 600.0, profile_mode: str = "pmax") -> dict:
    """Streaming NLL of each configuration over the same tokens, written to ``out_path`` as it goes.

    The JSON is rewritten after every chunk (atomically), so an interrupted run leaves a valid file;
    a rerun with the same model and tokens skips the configurations already complete and resumes the
    interrupted one from its last checkpoint (``<out_path>.checkpoints/``, written every
    ``checkpoint_every`` seconds, removed when the configuration completes; None: no checkpoints).
    """
    import hashlib
    from pathlib import Path

    from ..llama import Llama, thread_counts
    from ..model_info import read_model_info

    tokens = np.asarray(tokens, dtype=np.int32)
    info = read_model_info(model)
    out_path = Path(out_path)
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    results = read_json_if(out_path, lambda old: (old.get("tokens_sha256"), old.get("model"), old.get("bucket"))
                           == (digest, Path(model).name, bucket))
    results.update({"model": Path(model).name, "tokens": int(len(tokens)), "tokens_sha256": digest,
                    "bucket": bucket, "n_batch": n_batch, "threads": threads, **(meta or {})})
    results.setdefault("configs", {})

    def save() -> None:
        write_json_atomic(out_path, results, indent=1)

    setups = [setup_for(n, info, len(tokens), n_batch, window=window, sinks=sinks, profile_mode=profile_mode)
              for n in names]
    for st in setups:
        if results["configs"].get(st.name, {}).get("complete"):
            continue
        # threads per configuration: a resumed run may use other threads than the one before it
        entry = {"config": st.describe(), "complete": False, "threads": threads}
        results["configs"][st.name] = entry
        peak_rss_reset()
        llm = Llama(model, attention=st.attention, n_ctx=st.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                    verbose=False, **thread_counts(threads))
        t0 = time.perf_counter()
        last = [0.0]

        def on_chunk(nll: np.ndarray, done: int) -> None:
            now = time.perf_counter()
            if now - last[0] < 5 and done < len(tokens):
                return
            last[0] = now
            seconds = now - t0 + (ckpt.resumed_seconds if ckpt is not None else 0.0)
            part = NLLResult(nll=nll[: done - 1], seconds=seconds)
            entry.update(tokens_done=done, seconds=seconds, buckets=part.bucketize(bucket))
            save()

        ckpt = None
        if checkpoint_every is not None:
            from .checkpoint import StreamCheckpoint

            ckpt = StreamCheckpoint(out_path.with_name(out_path.name + ".checkpoints") / st.name.replace("/", "_"),
                                    key={"tokens_sha256": digest, "model": Path(model).name, "n_batch": n_batch,
                                         "config": st.describe()},
                                    every_seconds=checkpoint_every)
        try:
            r = streaming_nll(llm, tokens, n_batch=n_batch, progress=progress, desc=st.name,
                              context_shift=st.context_shift, on_chunk=on_chunk, checkpoint=ckpt)
        finally:
            llm.close()
        if ckpt is not None:
            ckpt.remove()
        entry.update(buckets=r.bucketize(bucket), tokens_done=int(len(tokens)), seconds=r.seconds,
                     tokens_per_second=len(tokens) / r.seconds, peak_rss_bytes=peak_rss_bytes(),
                     mean_nll=float(np.nanmean(r.nll)), complete=True,
                     **({"resumed_from_token": r.resumed_from} if r.resumed_from else {}))
        save()
    return results
