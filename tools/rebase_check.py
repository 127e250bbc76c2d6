#!/usr/bin/env python3
"""Measure how far the patch series is from applying to another llama.cpp tree.

  python tools/rebase_check.py TREE [--patches DIR] [--json OUT]

TREE is a llama.cpp source tree, an extracted sdist that vendors one (vendor/llama.cpp, as
llama-cpp-python's does), or a .tar.gz / .zip of either. The tree is copied into a scratch git
repository and never modified. Each patch is then tried in order:

  applies           `git apply` takes it as it is (hunks may move: git finds them by context)
  applies-reduced   it takes it only with one line of context (`git apply -C1`): review the hunks
  fails             some hunks do not apply even so; the others are applied (`--reject`) so the
                    later patches are tried against as much of the series as could go in

and the report lists, per patch, its size, how much of it lands in upstream files (the part a
rebase has to merge; the rest is in files the series creates) and which hunks were rejected. The summary counts what an upgrade costs
before anyone starts it. With the pinned tree every patch must apply.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=llama-extrapolate", "-c", "user.email=dev@llama-extrapolate.invalid",
       "-c", "core.autocrlf=false"]


@dataclass
class FileDiff:
    path: str
    new_file: bool
    hunks: int = 0
    added: int = 0
    removed: int = 0


@dataclass
class PatchReport:
    name: str
    status: str = ""
    hunks: int = 0
    hunks_upstream: int = 0
    added_upstream: int = 0
    removed_upstream: int = 0
    added_new_files: int = 0
    rejected: List[str] = field(default_factory=list)
    message: str = ""


def parse_diff(text: str) -> List[FileDiff]:
    """Files of a patch with their hunk and line counts (a patch file is a DEP-3 header, '---', a git diff)."""
    _, sep, diff = text.partition("\n---\n")
    if not sep:
        raise SystemExit("patch has no '---' line between its DEP-3 header and its diff")
    files: List[FileDiff] = []
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
            files.append(FileDiff(path=m.group(2) if m else line, new_file=False))
        elif not files:
            continue
        elif line.startswith("new file mode"):
            files[-1].new_file = True
        elif line.startswith("@@"):
            files[-1].hunks += 1
        elif line.startswith("+") and not line.startswith("+++"):
            files[-1].added += 1
        elif line.startswith("-") and not line.startswith("---"):
            files[-1].removed += 1
    return files


def find_llama_tree(path: Path) -> Path:
    """The directory holding include/llama.h: the path itself, its vendor/llama.cpp, or one level below."""
    for cand in (path, path / "vendor" / "llama.cpp", *sorted(path.glob("*")), *sorted(path.glob("*/vendor/llama.cpp"))):
        if (cand / "include" / "llama.h").is_file() and (cand / "src").is_dir():
            return cand
    raise SystemExit(f"{path}: no llama.cpp tree found (looked for include/llama.h and src/ in it, in "
                     "vendor/llama.cpp and one level below); pass a llama.cpp checkout or an sdist that vendors one")


def unpack(source: Path, scratch: Path) -> Path:
    if source.is_dir():
        return find_llama_tree(source)
    if not source.is_file():
        raise SystemExit(f"{source}: no such file or directory")
    out = scratch / "unpacked"
    out.mkdir()
    if source.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(source) as tar:
            tar.extractall(out)
    elif source.suffix == ".zip":
        with zipfile.ZipFile(source) as zf:
            zf.extractall(out)
    else:
        raise SystemExit(f"{source}: expected a directory, .tar.gz, .tgz, .tar or .zip")
    return find_llama_tree(out)


def git(repo: Path, *args: str, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=check, text=True, capture_output=True, input=input)


def try_patch(repo: Path, patch: Path) -> PatchReport:
    text = patch.read_text()
    files = parse_diff(text)
    diff = text.partition("\n---\n")[2]
    # upstream files: those of the tree the series is applied to (a file an earlier patch created is ours)
    upstream = [f for f in files if git(repo, "cat-file", "-e", f"base:{f.path}", check=False).returncode == 0]
    ours = [f for f in files if f not in upstream]
    report = PatchReport(
        name=patch.name, hunks=sum(f.hunks for f in files), hunks_upstream=sum(f.hunks for f in upstream),
        added_upstream=sum(f.added for f in upstream), removed_upstream=sum(f.removed for f in upstream),
        added_new_files=sum(f.added for f in ours))
    for status, extra in (("applies", []), ("applies-reduced", ["-C1"])):
        if git(repo, "apply", "--check", "--whitespace=nowarn", *extra, "-", check=False, input=diff).returncode == 0:
            git(repo, "apply", "--whitespace=nowarn", *extra, "-", input=diff)
            report.status = status
            return report
    done = git(repo, "apply", "--reject", "--whitespace=nowarn", "-", check=False, input=diff)
    report.status = "fails"
    current = ""
    for line in done.stderr.splitlines():
        m = re.match(r"Applying patch (\S+) with (\d+) reject", line)
        if m:
            current = m.group(1)
        m = re.match(r"Rejected hunk #(\d+)", line)
        if m:
            report.rejected.append(f"{current} hunk {m.group(1)}")
        if line.startswith("error:"):
            report.message = (report.message + " " + line.strip()).strip()
    for rej in repo.rglob("*.rej"):
        rej.unlink()
    return report


def check(tree: Path, patches: List[Path]) -> List[PatchReport]:
    with tempfile.TemporaryDirectory(prefix="rebase-check-") as tmp:
        scratch = Path(tmp)
        src = unpack(tree, scratch)
        repo = scratch / "tree"
        shutil.copytree(src, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "base")
        git(repo, "tag", "base")
        return [try_patch(repo, p) for p in patches]


def print_report(tree: Path, reports: List[PatchReport]) -> None:
    print(f"llama.cpp tree: {tree}")
    print(f"{'patch':48} {'result':16} {'hunks':>5} {'in upstream':>11} {'+up':>5} {'-up':>4} {'+ours':>5}")
    for r in reports:
        print(f"{r.name:48} {r.status:16} {r.hunks:5d} {r.hunks_upstream:11d} {r.added_upstream:5d} "
              f"{r.removed_upstream:4d} {r.added_new_files:5d}")
        for h in r.rejected:
            print(f"    rejected: {h}")
        if r.message and r.status == "fails" and not r.rejected:
            print(f"    {r.message[:300]}")
    ok = sum(r.status == "applies" for r in reports)
    reduced = sum(r.status == "applies-reduced" for r in reports)
    failed = [r for r in reports if r.status == "fails"]
    print(f"{ok} of {len(reports)} apply, {reduced} only with reduced context, {len(failed)} fail "
          f"({sum(len(r.rejected) for r in failed)} rejected hunks of "
          f"{sum(r.hunks_upstream for r in reports)} in upstream files)")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", type=Path, help="llama.cpp tree, sdist directory, or archive")
    ap.add_argument("--patches", type=Path, default=ROOT / "patches", help="the series (default: patches/)")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = ap.parse_args(argv)
    patches = sorted(args.patches.glob("*.patch"))
    if not patches:
        raise SystemExit(f"{args.patches}: no *.patch files")
    reports = check(args.tree, patches)
    print_report(args.tree, reports)
    if args.json:
        args.json.write_text(json.dumps({"tree": str(args.tree), "patches": [asdict(r) for r in reports]}, indent=1)
                             + "\n")
    return 0 if all(r.status != "fails" for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
