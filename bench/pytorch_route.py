"""The PyTorch route a user would otherwise take, against llama-extrapolate: how much faster
the library reads the same tokens with the same attention.

Hugging Face transformers loads the same GGUF file (dequantized to float32, as transformers does) and
reads the same essay tokens with LM-Infinite's Lambda attention written here in PyTorch: S = 10 sinks,
window W = 8192, ceiling C = W, a cache of unrotated keys bounded to the sinks and the window (keys are
rotated at their own positions; a query further than C from a sink scores it at distance C), n_batch
tokens at a time. llama-extrapolate reads the stream with AttentionConfig(sinks=10, window=C=8192)
through ``evaluate.streaming_nll``. Same CPU, same threads (torch.set_num_threads), same tokens.

Recorded per route: tokens/s over each 2048-token block, the mean NLL of each block (the two routes
compute the same attention, so their NLL must agree up to the quantized matmuls of llama.cpp), peak RSS.
The ratio at 16k and 32k is taken over the 8192 tokens before each mark.

Needs the optional packages of the comparison: pip install 'llama-extrapolate[compare]'
(a CPU build of torch, transformers, accelerate).

    python bench/pytorch_route.py [--tokens 32768] [--routes torch,llama-extrapolate]
    python bench/pytorch_route.py table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from tables import rate_before  # noqa: E402  (one definition: tools/tables.py prints the documents' tables with it too)
RESULTS = HERE / "results" / "pytorch_route.json"
SINKS, WINDOW, BLOCK, MARKS = 10, 8192, 2048, (16384, 32768)


class LambdaAttention:
    """LM-Infinite's attention for one layer of a Hugging Face Llama, with a bounded cache of unrotated keys."""

    def __init__(self, attn, rotary, sinks: int, window: int, ceiling: int):
        import torch

        self.torch = torch
        self.attn, self.rotary = attn, rotary
        self.n_head = attn.config.num_attention_heads
        self.n_kv = attn.config.num_key_value_heads
        self.d = attn.head_dim
        self.scale = attn.scaling
        self.sinks, self.window, self.ceiling = sinks, window, ceiling
        self.k = torch.zeros(self.n_kv, 0, self.d)
        self.v = torch.zeros(self.n_kv, 0, self.d)
        self.pos = torch.zeros(0, dtype=torch.long)

    def rotate(self, x, pos):
        """RoPE of x [heads, n, d] at positions pos [n] (Hugging Face's rotate-half layout)."""
        cos, sin = self.rotary(x, pos[None, :])
        cos, sin = cos[0], sin[0]
        half = x.shape[-1] // 2
        rot = self.torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def __call__(self, x, pos):
        torch = self.torch
        n = x.shape[0]
        q = self.attn.q_proj(x).view(n, self.n_head, self.d).transpose(0, 1)
        k = self.attn.k_proj(x).view(n, self.n_kv, self.d).transpose(0, 1)
        v = self.attn.v_proj(x).view(n, self.n_kv, self.d).transpose(0, 1)
        keys, vals, kpos = torch.cat((self.k, k), 1), torch.cat((self.v, v), 1), torch.cat((self.pos, pos))
        group = self.n_head // self.n_kv
        k_rot = self.rotate(keys, kpos).repeat_interleave(group, 0)
        logits = torch.matmul(self.rotate(q, pos), k_rot.transpose(1, 2)) * self.scale
        dist = pos[:, None] - kpos[None, :]
        sink = kpos < self.sinks
        visible = (dist >= 0) & ((dist < self.window) | sink[None, :])
        far = visible & (dist >= self.ceiling)
        if bool(far.any()):
            # the sinks seen from further than C: the query rotated to C against the unrotated key
            n_s = int(sink.sum())
            q_c = self.rotate(q, torch.full((n,), self.ceiling, dtype=torch.long))
            far_logits = torch.matmul(q_c, keys[:, :n_s].repeat_interleave(group, 0).transpose(1, 2)) * self.scale
            logits[:, :, :n_s] = torch.where(far[None, :, :n_s], far_logits, logits[:, :, :n_s])
        logits = logits.masked_fill(~visible[None], float("-inf"))
        out = torch.matmul(torch.softmax(logits, dim=-1), vals.repeat_interleave(group, 0))
        # keep the sinks and the keys the next query (at pos[-1] + 1) still sees in its window
        keep = sink | (kpos > pos[-1] + 1 - self.window)
        self.k, self.v, self.pos = keys[:, keep], vals[:, keep], kpos[keep]
        return self.attn.o_proj(out.transpose(0, 1).reshape(n, self.n_head * self.d))


class TorchLambdaReader:
    """The Hugging Face model's own modules (embedding, norms, projections, MLP, head) around LambdaAttention."""

    def __init__(self, model_path: Path, threads: int, sinks: int, window: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                          dtype=torch.float32).eval()
        m = self.model.model
        self.layers = [LambdaAttention(layer.self_attn, m.rotary_emb, sinks, window, window) for layer in m.layers]
        self.n_past = 0

    def feed(self, tokens) -> np.ndarray:
        """Logits [n, n_vocab] of the next tokens."""
        torch = self.torch
        m = self.model.model
        with torch.inference_mode():
            ids = torch.tensor(tokens, dtype=torch.long)
            pos = torch.arange(self.n_past, self.n_past + len(tokens))
            h = m.embed_tokens(ids)
            for layer, attn in zip(m.layers, self.layers):
                h = h + attn(layer.input_layernorm(h), pos)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            logits = self.model.lm_head(m.norm(h))
        self.n_past += len(tokens)
        return logits.numpy()


def essay_tokens(model: str, n: int) -> list:
    from llama_extrapolate.reader import first_tokens

    return list(first_tokens(model, None, "pg-essays", n)[0])


def run_torch(model: str, tokens: list, n_batch: int, threads: int, sinks: int, window: int) -> dict:
    from tqdm import tqdm

    from llama_extrapolate.harness.evaluate import log_softmax_at
    from llama_extrapolate.resources import peak_rss_bytes

    t0 = time.perf_counter()
    reader = TorchLambdaReader(Path(model), threads, sinks, window)
    load_s = time.perf_counter() - t0
    toks = np.asarray(tokens)
    nll = np.full(len(toks) - 1, np.nan)
    stamps = []
    t0 = time.perf_counter()
    for s in tqdm(range(0, len(toks), n_batch), desc="torch", unit="batch"):
        logits = reader.feed(toks[s:s + n_batch].tolist())
        targets = toks[s + 1:s + n_batch + 1]
        nll[s:s + len(targets)] = log_softmax_at(logits[: len(targets)], targets)
        stamps.append((s + len(logits), time.perf_counter() - t0))
    return {"load_s": load_s, "stamps": stamps, "nll": nll, "peak_rss_bytes": peak_rss_bytes()}


def run_ours(model: str, tokens: list, n_batch: int, threads: int, sinks: int, window: int) -> dict:
    import llama_extrapolate as le
    from llama_extrapolate.harness.evaluate import streaming_nll
    from llama_extrapolate.resources import peak_rss_bytes

    cfg = le.AttentionConfig(sinks=sinks, window=window, ceiling=window, rollback=0)
    info = le.read_model_info(model)
    t0 = time.perf_counter()
    llm = le.Llama(model, attention=cfg, n_ctx=cfg.resolve(info).required_n_ctx(n_batch, stream=len(tokens)),
                   n_batch=n_batch, n_ubatch=n_batch, n_threads=threads, n_threads_batch=threads, verbose=False)
    load_s = time.perf_counter() - t0
    stamps = []
    t_start = [None]

    def on_chunk(nll, done):
        stamps.append((done, time.perf_counter() - t_start[0]))

    t_start[0] = time.perf_counter()
    r = streaming_nll(llm, tokens, n_batch=n_batch, desc="llama-extrapolate", on_chunk=on_chunk)
    llm.close()
    return {"load_s": load_s, "stamps": stamps, "nll": r.nll, "peak_rss_bytes": peak_rss_bytes()}


def summarize_route(raw: dict) -> dict:
    """Blocks of BLOCK tokens: tokens/s and mean NLL (from the chunk time stamps)."""
    blocks, last_done, last_t = [], 0, 0.0
    for done, t in raw["stamps"]:
        if done - last_done >= BLOCK or done == raw["stamps"][-1][0]:
            part = raw["nll"][last_done:done]  # nll[i] scores token i + 1
            blocks.append({"end": done, "tokens": done - last_done, "tok_s": (done - last_done) / (t - last_t),
                           "nll": float(np.nanmean(part))})
            last_done, last_t = done, t
    return {"load_s": raw["load_s"], "blocks": blocks, "seconds": raw["stamps"][-1][1],
            "mean_nll": float(np.nanmean(raw["nll"])), "peak_rss_bytes": raw["peak_rss_bytes"]}


def summary(results: dict) -> dict:
    routes = results.get("routes", {})
    out = {}
    ours, torch_ = routes.get("llama-extrapolate"), routes.get("torch")
    if ours and torch_:
        for mark in MARKS:
            a, b = rate_before(ours["blocks"], mark), rate_before(torch_["blocks"], mark)
            if a and b:
                out[f"tok_s_ratio_{mark}"] = a / b
        diffs = [abs(x["nll"] - y["nll"]) for x, y in zip(ours["blocks"], torch_["blocks"]) if x["end"] == y["end"]]
        out["max_abs_block_nll_diff"] = max(diffs) if diffs else None
    return out


def table(results: dict) -> str:
    rows = ["| route | load s | tok/s before 16k | tok/s before 32k | mean NLL | peak RSS MiB |", "|---|---|---|---|---|---|"]
    for name, r in results.get("routes", {}).items():
        rates = [rate_before(r["blocks"], m) for m in MARKS]
        cells = ["–" if x is None else f"{x:.1f}" for x in rates]
        rows.append(f"| {name} | {r['load_s']:.1f} | {cells[0]} | {cells[1]} | {r['mean_nll']:.4f} | "
                    f"{r['peak_rss_bytes'] / 2**20:.0f} |")
    s = results.get("summary", {})
    extra = ", ".join(f"{k} = {v:.3g}" for k, v in s.items() if v is not None)
    return "\n".join(rows) + (f"\n\n{extra}" if extra else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "table"])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--routes", default="llama-extrapolate,torch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--sinks", type=int, default=SINKS)
    p.add_argument("--window", type=int, default=WINDOW, help="W = C")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    if args.mode == "table":
        print(table(results))
        return 0
    import llama_extrapolate as le
    from llama_extrapolate.jsonfile import write_json_atomic

    model = str(le.default_model_path())
    tokens = essay_tokens(model, args.tokens)
    if (results.get("tokens"), results.get("window"), results.get("sinks")) != (args.tokens, args.window, args.sinks):
        results = {}
    results.update({"model": Path(model).name, "tokens": args.tokens, "threads": args.threads,
                    "n_batch": args.n_batch, "sinks": args.sinks, "window": args.window, "ceiling": args.window,
                    "machine": {"cpu": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}})
    results.setdefault("routes", {})
    runners = {"llama-extrapolate": run_ours, "torch": run_torch}
    for name in [r.strip() for r in args.routes.split(",") if r.strip()]:
        if name not in runners:
            raise SystemExit(f"--routes {name!r}: use llama-extrapolate and/or torch")
        # each route in a fresh process, so the peak RSS is its own
        if len(args.routes.split(",")) > 1:
            import subprocess

            subprocess.run([sys.executable, __file__, "run", "--tokens", str(args.tokens), "--routes", name,
                            "--threads", str(args.threads), "--n-batch", str(args.n_batch), "--out", str(out),
                            "--sinks", str(args.sinks), "--window", str(args.window)],
                           check=True)
            results = json.loads(out.read_text())
            continue
        results["routes"][name] = summarize_route(runners[name](model, tokens, args.n_batch, args.threads, args.sinks, args.window))
        results["summary"] = summary(results)
        write_json_atomic(out, results, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
