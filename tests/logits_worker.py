"""Child process for test_logits_identical: logits of a 256-token prompt.

Run with "patched" (imports llama_extrapolate first, so llama_cpp loads the
patched libllama) or "stock" (llama-cpp-python's own library).
"""

import inspect
import json
import sys

import numpy as np

N_TOKENS = 256


def prompt_text() -> str:
    # real text that is on every machine: a module of the Python standard library
    import json.decoder

    return inspect.getsource(json.decoder)


def main(mode: str, model: str, out: str) -> None:
    if mode == "patched":
        import llama_extrapolate  # noqa: F401
    elif mode != "stock":
        raise SystemExit(f"mode must be patched or stock, not {mode!r}")
    import llama_cpp
    import llama_cpp.llama_cpp as lib

    # ggml's extra weight buffers (AMX, repacking) off in both runs: llama-cpp-python's own library is built with
    # -march=native and holds the AMX kernels ours leaves out (they segfault on some Xeons, see CMakeLists.txt), so
    # only the plain CPU kernels, compiled alike in both, are compared
    default_params = lib.llama_model_default_params

    def model_params():
        params = default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = model_params
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=N_TOKENS, n_ubatch=N_TOKENS,
                          n_threads=2, logits_all=True, verbose=False)
    tokens = llm.tokenize(prompt_text().encode(), add_bos=True)[:N_TOKENS]
    assert len(tokens) == N_TOKENS, len(tokens)
    llm.eval(tokens)
    np.save(out, np.asarray(llm.scores[:N_TOKENS], dtype=np.float32))
    print(json.dumps({"library": llama_cpp.llama_cpp._lib._name, "tokens": len(tokens)}))
    llm.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
