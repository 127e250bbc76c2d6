"""The one place that reaches into llama-cpp-python's server (``llama_cpp.server``).

``llama-extrapolate serve`` is llama-cpp-python's FastAPI server with our model class and settings. Its server
has no hook for either, so three of its internals are used, all here and nowhere else:

* ``LlamaProxy.load_llama_from_model_settings`` builds ``llama_cpp.Llama`` from some forty settings by looking the
  class up on the ``llama_cpp`` module; ``build_llama`` points that name at our class for one build (under a lock),
  so every setting it knows reaches our model as it would upstream.
* ``llama_cpp.server.app.create_app`` builds its proxy through the module name ``LlamaProxy``; ``create_app``
  points it at ours for the time of the call.
* the proxy's private fields (the settings by alias, the current model) are read through ``AdaptedProxy``.

These are internals, not API: they are checked against the one version they were written for, and importing this
module with another version fails with the versions and the fix rather than misbehaving at the first request.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Pattern, Sequence

ADAPTED_VERSION = "0.3.36"


class UnsupportedLlamaCppError(ImportError):
    """llama-cpp-python is installed at a version whose server internals this module was not written for."""


try:
    import llama_cpp
    import llama_cpp.server.app as _app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.errors import ErrorResponse, RouteErrorHandler
    from llama_cpp.server.model import LlamaProxy
    from llama_cpp.server.settings import ModelSettings, ServerSettings
except ImportError as exc:  # the server's packages are an extra
    raise ImportError(f"llama-extrapolate serve needs the server packages ({exc.name} is missing): "
                      "pip install 'llama-extrapolate[server]'") from exc


def check_version(version: str) -> None:
    """Refuse a llama-cpp-python whose server this adapter does not know (its internals change between
    releases)."""
    if version != ADAPTED_VERSION:
        raise UnsupportedLlamaCppError(
            f"llama-cpp-python {version} is installed; llama-extrapolate's server adapts the internals of "
            f"llama-cpp-python {ADAPTED_VERSION} (the version its patched library is built from): "
            f"pip install 'llama-cpp-python[server]=={ADAPTED_VERSION}'")


check_version(llama_cpp.__version__)

__all__ = ["ADAPTED_VERSION", "AdaptedProxy", "ErrorResponse", "ModelSettings", "ServerSettings",
           "UnsupportedLlamaCppError", "add_args_from_model", "add_refusal", "build_llama", "check_version",
           "create_app", "current_proxy", "parse_model_from_args"]

_building = threading.RLock()  # create_app builds the first model inside its own block


@contextlib.contextmanager
def _module_attribute(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.name`` is ``value`` for the time of the block (one block at a time, the others wait)."""
    with _building:
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            yield
        finally:
            setattr(module, name, saved)


def build_llama(settings: ModelSettings, factory: Callable[..., Any]) -> Any:
    """llama-cpp-python's model built from ``settings`` as its server builds it, with ``factory`` (our Llama with
    the attention's keywords bound) in place of ``llama_cpp.Llama``."""
    with _module_attribute(llama_cpp, "Llama", factory):
        return LlamaProxy.load_llama_from_model_settings(settings)


class AdaptedProxy(LlamaProxy):
    """llama-cpp-python's model proxy with its private fields read through names of our own."""

    def settings_by_alias(self) -> Dict[str, ModelSettings]:
        """Every model's settings by the alias requests name it with."""
        return dict(self._model_settings_dict)

    def alias_of(self, model: Optional[str]) -> str:
        """The alias a request's ``model`` resolves to (the default model's for an unknown or missing name, as
        llama-cpp-python answers it)."""
        return model if model in self._model_settings_dict else self._default_model_alias

    @property
    def current_alias(self) -> Optional[str]:
        return self._current_model_alias

    @property
    def current_model(self) -> Any:
        return getattr(self, "_current_model", None)


def current_proxy() -> Optional[AdaptedProxy]:
    """The proxy of the app ``create_app`` made (None before)."""
    return _app._llama_proxy


def add_refusal(pattern: Pattern[str], formatter: Callable) -> None:
    """Answer an exception whose message matches ``pattern`` with ``formatter``'s (status, ErrorResponse) instead
    of llama-cpp-python's HTTP 500."""
    RouteErrorHandler.pattern_and_formatters[pattern] = formatter


def create_app(server_settings: ServerSettings, model_settings: Sequence[ModelSettings],
               proxy_class: type) -> Any:
    """llama-cpp-python's FastAPI app, its models held by ``proxy_class`` (a subclass of AdaptedProxy)."""
    if not issubclass(proxy_class, AdaptedProxy):
        raise TypeError(f"proxy_class {proxy_class!r} must subclass llama_cpp_server.AdaptedProxy")
    models: List[ModelSettings] = list(model_settings)
    with _module_attribute(_app, "LlamaProxy", proxy_class):
        return _app.create_app(server_settings=server_settings, model_settings=models)
