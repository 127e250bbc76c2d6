"""GGUF models with a big model's KV shapes and small projections: what the attention and the memory cost there.

What the Λ window, the KV cache and the document memory cost grows with the layers, the KV heads and the head
dimension, not with the width of the residual stream: llama.cpp reads ``attention.key_length`` apart from
``embedding_length``, so a model with Llama-2-7B's 32 layers of 32 KV heads x 128 but a residual stream of 256
has Llama-2-7B's cache, store and attention cost, and projections a few hundred times smaller than the real
weights (it reads fast enough to measure here). The weights are random (nothing here is about what the model
says), the tokenizer is the default model's, so texts tokenize as they do for the product's tests.

    python bench/kv_shapes.py llama-2-7b -o models/llama-2-7b-kv.gguf
    python bench/kv_shapes.py --list
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np


class KVShape(NamedTuple):
    """The attention's shapes of a published model, as its GGUF states them."""
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    context_length: int
    rope_base: float

    def kv_values_per_layer(self) -> int:
        return self.n_head_kv * self.head_dim


SHAPES = {
    "llama-2-7b": KVShape(n_layer=32, n_head=32, n_head_kv=32, head_dim=128, context_length=4096, rope_base=10000.0),
    "llama-3-8b": KVShape(n_layer=32, n_head=32, n_head_kv=8, head_dim=128, context_length=8192, rope_base=500000.0),
    "llama-3-70b": KVShape(n_layer=80, n_head=64, n_head_kv=8, head_dim=128, context_length=8192, rope_base=500000.0),
}

# the residual stream and the feed-forward width of every shape model: small, so that the weights cost little
N_EMBD = 256
N_FF = 512


def tokenizer_fields(model_path: str) -> dict:
    """The tokenizer's metadata of a GGUF file, to write into another (the shape models read text as it does)."""
    from gguf import GGUFReader

    reader = GGUFReader(model_path)
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out[key] = (field.contents(), field.types)
    if "tokenizer.ggml.tokens" not in out:
        raise ValueError(f"{model_path} has no tokenizer.ggml.tokens: use a GGUF file with its vocabulary")
    return out


def write(name: str, path: Path, tokenizer_from: str, seed: int = 0, n_embd: int = N_EMBD) -> Path:
    """Write the shape model ``name`` (a key of SHAPES) to ``path`` in F16, with ``tokenizer_from``'s vocabulary.
    ``n_embd``: the residual stream's width (what crosses between machines when the layers are split: the RPC
    benchmark measures it at two widths)."""
    import gguf

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: use one of {', '.join(SHAPES)}")
    if n_embd < 32 or n_embd % 32:
        raise ValueError(f"n_embd={n_embd}: give a multiple of 32 (at least 32)")
    shape = SHAPES[name]
    tok = tokenizer_fields(tokenizer_from)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        # [rows, cols] in numpy = ne = [cols, rows] in ggml: a projection from cols to rows
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"{name}-kv-shapes")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, types) in tok.items():
        if types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, types[0])
    q, kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    for il in range(shape.n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{il}.attn_q.weight", mat(q, n_embd))
        w.add_tensor(f"blk.{il}.attn_k.weight", mat(kv, n_embd))
        w.add_tensor(f"blk.{il}.attn_v.weight", mat(kv, n_embd))
        w.add_tensor(f"blk.{il}.attn_output.weight", mat(n_embd, q))
        w.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{il}.ffn_gate.weight", mat(N_FF, n_embd))
        w.add_tensor(f"blk.{il}.ffn_up.weight", mat(N_FF, n_embd))
        w.add_tensor(f"blk.{il}.ffn_down.weight", mat(n_embd, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cached(name: str, n_embd: int = N_EMBD) -> Path:
    """The shape model ``name`` at the residual width ``n_embd`` in bench/results/cache (ignored by git), written with
    the default model's vocabulary the first time a benchmark asks for it."""
    from llama_extrapolate.default_model import default_model_path

    suffix = "" if n_embd == N_EMBD else f"-e{n_embd}"
    path = Path(__file__).resolve().parent / "results" / "cache" / f"{name}-kv{suffix}.gguf"
    if not path.exists():
        write(name, path, str(default_model_path()), n_embd=n_embd)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("-o", "--output", type=Path, help="the GGUF file to write")
    ap.add_argument("--tokenizer-from", help="a GGUF file whose vocabulary to use (default: the default model's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-embd", type=int, default=N_EMBD, help="the residual stream's width")
    ap.add_argument("--list", action="store_true", help="print the shapes and what one token's keys and values take")
    args = ap.parse_args(argv)
    if args.list or not args.shape:
        for name, s in SHAPES.items():
            per_token = 2 * s.n_layer * s.kv_values_per_layer()
            print(f"{name:12s} {s.n_layer} layers x {s.n_head_kv} KV heads x {s.head_dim}: {per_token} K+V values "
                  f"a token ({per_token * 2 / 1024:.0f} KiB in F16)")
        return 0
    if args.output is None:
        ap.error("-o/--output is needed with a shape")
    tokenizer_from = args.tokenizer_from
    if tokenizer_from is None:
        from llama_extrapolate.default_model import default_model_path
        tokenizer_from = str(default_model_path())
    print(write(args.shape, args.output, tokenizer_from, args.seed, args.n_embd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
