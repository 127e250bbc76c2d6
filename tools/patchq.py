#!/usr/bin/env python3
"""Keep patches/ as a git history, so the series is edited with git and exported as files.

  tools/patchq.py unpack SRC DEST   copy llama.cpp tree SRC to DEST, commit it as "base",
                                    then commit each patches/*.patch in order
  tools/patchq.py export DEST       write one patches/NNNN-name.patch per commit after "base"

A commit's subject is the patch file name without .patch; its body is the
DEP-3 header (Description/Author/Forwarded/Last-Update) written above the diff.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PATCHES = Path(__file__).resolve().parents[1] / "patches"
GIT = ["git", "-c", "user.name=llama-extrapolate", "-c", "user.email=dev@llama-extrapolate.invalid"]


def git(repo: Path, *args: str, **kw) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, text=True,
                          capture_output=True, **kw).stdout


def split_patch(text: str) -> tuple[str, str]:
    """DEP-3 header and diff of a patch file (the header ends at the first line '---')."""
    header, sep, diff = text.partition("\n---\n")
    if not sep:
        raise SystemExit("patch has no '---' line between its header and its diff")
    return header.strip() + "\n", diff


def unpack(src: Path, dest: Path) -> None:
    if dest.exists():
        raise SystemExit(f"{dest} exists: remove it or choose another directory")
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "base")
    git(dest, "tag", "base")
    for patch in sorted(PATCHES.glob("*.patch")):
        header, diff = split_patch(patch.read_text())
        subprocess.run([*GIT, "-C", str(dest), "apply", "--whitespace=nowarn", "-"], input=diff,
                       text=True, check=True)
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", patch.stem, "-m", header)
        print(f"applied {patch.name}")


def export(dest: Path) -> None:
    commits = git(dest, "rev-list", "--reverse", "base..HEAD").split()
    for old in PATCHES.glob("*.patch"):
        old.unlink()
    for c in commits:
        name = git(dest, "log", "-1", "--format=%s", c).strip()
        header = git(dest, "log", "-1", "--format=%b", c).strip()
        diff = git(dest, "diff", f"{c}~1", c)
        (PATCHES / f"{name}.patch").write_text(f"{header}\n---\n{diff}")
        print(f"wrote patches/{name}.patch")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "unpack":
        unpack(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "export":
        export(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
