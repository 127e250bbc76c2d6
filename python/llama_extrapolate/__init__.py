"""llama-extrapolate: read documents far longer than a GGUF model was trained on.

Importing this package makes ``llama_cpp`` run on the patched libllama that the
package ships, and binds ``llama_extrapolate._core`` to the same loaded copy.
Import it before ``llama_cpp``.
"""

from __future__ import annotations

from ._library import LIB_DIR, LibraryConflictError, load as _load

_core = _load()

from .logs import install as _install_log  # noqa: E402

_install_log()

from .config import AttentionConfig, ResolvedAttention  # noqa: E402
from .native import context_address, context_info  # noqa: E402
from .llama import Llama  # noqa: E402
from .model_info import InvalidModelError, ModelInfo, knob_support, read_model_info  # noqa: E402
from .default_model import ModelNotFoundError, default_model_path  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AttentionConfig",
    "InvalidModelError",
    "LIB_DIR",
    "Llama",
    "ModelInfo",
    "ResolvedAttention",
    "read_model_info",
    "knob_support",
    "LibraryConflictError",
    "ModelNotFoundError",
    "context_address",
    "context_info",
    "default_model_path",
]
