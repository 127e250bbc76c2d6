#!/usr/bin/env python3
"""Check that patches/ is a series in final form, not a history.

  python tools/series_check.py [--patches DIR] [--tree TREE]

- every patch is named NNNN-name.patch, numbered 0001, 0002, ... without a gap, and has a DEP-3 header
  (Description, Author, Forwarded) above its diff;
- no patch deletes a line that an earlier patch added: a change to a feature amends that feature's patch
  (tools/patchq.py), it does not stack a patch that rewrites it;
- with --tree (a pristine llama.cpp tree), every patch applies in order with `git apply`, hunks at their
  place (no fuzz: the context must match).

Prints one line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^(\d{4})-[a-z0-9][a-z0-9-]*\.patch$")
HEADER_FIELDS = ("Description:", "Author:", "Forwarded:")
# lines this short ("}", "return 0;", blank) recur everywhere: deleting one is no sign of a rewrite
SIGNIFICANT = 12


@dataclass
class PatchLines:
    """The lines a patch adds and deletes, per file (stripped of the leading +/- and surrounding blanks)."""
    added: Dict[str, Set[str]] = field(default_factory=dict)
    deleted: Dict[str, List[str]] = field(default_factory=dict)


def split_header(text: str) -> tuple:
    header, sep, diff = text.partition("\n---\n")
    return (header, diff) if sep else ("", text)


def diff_lines(diff: str) -> PatchLines:
    out = PatchLines()
    cur: Optional[str] = None
    for line in diff.splitlines():
        m = re.match(r"^\+\+\+ b/(\S+)", line)
        if m:
            cur = m.group(1)
            continue
        if line.startswith("--- ") or line.startswith("diff --git") or cur is None:
            continue
        body = line[1:].strip()
        if len(body) < SIGNIFICANT:
            continue
        if line.startswith("+"):
            out.added.setdefault(cur, set()).add(body)
        elif line.startswith("-"):
            out.deleted.setdefault(cur, []).append(body)
    return out


def check_names_and_headers(patches: List[Path]) -> List[str]:
    problems = []
    for i, p in enumerate(patches, start=1):
        m = NAME.match(p.name)
        if not m:
            problems.append(f"{p.name}: not named NNNN-lowercase-words.patch")
        elif int(m.group(1)) != i:
            problems.append(f"{p.name}: numbered {m.group(1)}, expected {i:04d} (no gaps)")
        header, _ = split_header(p.read_text())
        missing = [f for f in HEADER_FIELDS if not any(line.startswith(f) for line in header.splitlines())]
        if missing:
            problems.append(f"{p.name}: DEP-3 header lacks {', '.join(missing)} (above a line '---')")
    return problems


def check_rewrites(patches: List[Path]) -> List[str]:
    """Lines a patch deletes that an earlier patch of the series added."""
    problems = []
    earlier: Dict[str, Dict[str, str]] = {}  # file -> line -> the patch that added it
    for p in patches:
        lines = diff_lines(split_header(p.read_text())[1])
        for path, deleted in lines.deleted.items():
            for body in deleted:
                owner = earlier.get(path, {}).get(body)
                if owner is not None:
                    problems.append(f"{p.name} deletes a line {owner} added in {path}: {body[:80]}")
        for path, added in lines.added.items():
            for body in added:
                earlier.setdefault(path, {}).setdefault(body, p.name)
    return problems


def check_applies(patches: List[Path], tree: Path) -> List[str]:
    with tempfile.TemporaryDirectory(prefix="series-check-") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(tree, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        subprocess.run(["git", "init", "-q"], cwd=work, check=True)
        for p in patches:
            diff = split_header(p.read_text())[1]
            r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=work, input=diff,
                               text=True, capture_output=True)
            if r.returncode != 0:
                return [f"{p.name} does not apply after the patches before it: {r.stderr.strip()[:500]}"]
    return []


def check(patch_dir: Path, tree: Optional[Path] = None) -> List[str]:
    patches = sorted(patch_dir.glob("*.patch"))
    if not patches:
        return [f"no patches in {patch_dir}"]
    problems = check_names_and_headers(patches) + check_rewrites(patches)
    if tree is not None:
        problems += check_applies(patches, tree)
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patches", type=Path, default=ROOT / "patches")
    ap.add_argument("--tree", type=Path, help="a pristine llama.cpp tree to apply the series to")
    args = ap.parse_args(argv)
    problems = check(args.patches, args.tree)
    for line in problems:
        print(line)
    n = len(sorted(args.patches.glob("*.patch")))
    print(f"{n} patches: {'ok' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
