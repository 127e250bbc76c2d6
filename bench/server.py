"""Time to the first answer token from `llama-extrapolate serve`: the first question on a long document, then a second
question on the same document (the stream reused), asked with the openai client as a chat front-end would.

    python bench/server.py --tokens 100000 -o bench/results/server_ttft.json

Writes JSON: per question the prompt tokens, what the server read and reused (GET /extrapolate/stats), the time to
the first streamed token and to the end of the answer, and the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from llama_extrapolate.harness.corpora import paul_graham_essays
from llama_extrapolate.default_model import default_model_path
from llama_extrapolate.native import load_tokenizer
from llama_extrapolate.server import ServerProcess

QUESTIONS = ("In one sentence, what is the text above about?", "Name one person the text above mentions.")


def document_of(tokens: int, model: str) -> str:
    """The essays cut to about ``tokens`` tokens of the model."""
    text = paul_graham_essays()
    vocab = load_tokenizer(model)
    try:
        chars = int(len(text) * tokens / len(vocab.tokenize(text.encode(), add_bos=False)))
    finally:
        vocab.close()
    if chars > len(text):
        raise ValueError(f"--tokens {tokens}: the essays hold fewer; use at most {tokens * len(text) // chars}")
    return text[:chars]


def ask(client, content: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first, pieces = None, []
    for chunk in client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                                max_tokens=max_tokens, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            pieces.append(chunk.choices[0].delta.content)
    return dict(first_token_s=round(first, 2) if first is not None else None,
                answer_s=round(time.perf_counter() - t0, 2), answer="".join(pieces))


def main(argv=None) -> int:
    import openai

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("-o", "--output", default="bench/results/server_ttft.json")
    args = ap.parse_args(argv)

    model = str(default_model_path())
    doc = document_of(args.tokens, model)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess("--window", str(args.window), "--n_threads", str(args.threads),
                               "--memory_capacity", str(args.tokens + 4096), log_path=Path(tmp) / "serve.log")
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=7200, max_retries=0)
            rows = []
            for i, q in enumerate(QUESTIONS):
                r = ask(client, f"{doc}\n\n{q}", args.max_tokens)
                r.update(question=i + 1, **{k: v for k, v in server.stats()["last_prompt"].items()})
                print(json.dumps(r), flush=True)
                rows.append(r)
        finally:
            server.stop()
    out = dict(model=Path(model).name, tokens=args.tokens, window=args.window, threads=args.threads,
               memory="default (16 blocks of 64, top-5 keys, question scope)", questions=rows)
    Path(args.output).write_text(json.dumps(out, indent=1))
    print(f"results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
