#!/usr/bin/env python3
"""Write docs/patches.md's per-patch sections from the series itself, or check that they match it.

  python tools/patch_doc.py            # rewrite the sections' description and file lines, and the net line
  python tools/patch_doc.py --check    # exit 1 naming each section that differs from its patch

A section is "## NNNN-name", then the patch's DEP-3 Description as one paragraph (its first line in bold), then
"- upstream files: ..." and "- files of ours: ..." with the lines each file gains (+) and loses (−). Files of ours
are those a patch of the series creates. Any other line of a section (the earlier series' patches it holds) is
left as written. The page's "Net against upstream" line sums the whole series.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import series_check  # noqa: E402

DOC = ROOT / "docs" / "patches.md"
MINUS = "\u2212"
NET = re.compile(r"^Net against upstream: .*$", re.M)


def file_counts(diff: str) -> Tuple[Dict[str, List[int]], set]:
    """{path: [added, deleted]} in the order the diff names them, and the paths it creates."""
    counts: Dict[str, List[int]] = {}
    created = set()
    cur = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            cur = line.split(" b/", 1)[1]
            counts.setdefault(cur, [0, 0])
        elif line.startswith("--- /dev/null") and cur:
            created.add(cur)
        elif line.startswith(("+++ ", "--- ")):
            continue
        elif cur and line.startswith("+"):
            counts[cur][0] += 1
        elif cur and line.startswith("-"):
            counts[cur][1] += 1
    return counts, created


def shown(path: str) -> str:
    """llama.cpp's own sources by their path under src/ or include/, the rest (ggml, common, tools) by full path."""
    for top in ("src/", "include/"):
        if path.startswith(top):
            return path[len(top):]
    return path


def file_list(paths: List[Tuple[str, List[int]]]) -> str:
    def one(path: str, c: List[int]) -> str:
        return f"`{shown(path)}` +{c[0]}" + (f"/{MINUS}{c[1]}" if c[1] else "")
    return ", ".join(one(p, c) for p, c in paths)


def description(header: str) -> str:
    """The DEP-3 Description as a paragraph: its first line in bold, the continuation lines joined."""
    lines = header.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("Description:"))
    title = lines[i][len("Description:"):].strip()
    body = []
    for line in lines[i + 1:]:
        if not line.startswith(" "):
            break
        body.append(line.strip())
    return f"**{title}.** " + " ".join(body)


def sections() -> Tuple[Dict[str, List[str]], str]:
    """The generated lines of each patch's section (by patch name) and the net line."""
    patches = sorted((ROOT / "patches").glob("*.patch"))
    parsed = []
    ours = set()
    for p in patches:
        header, diff = series_check.split_header(p.read_text())
        counts, created = file_counts(diff)
        ours |= created
        parsed.append((p.stem, header, counts))
    out: Dict[str, List[str]] = {}
    up_add = up_del = our_add = 0
    up_files, our_files = set(), set()
    for name, header, counts in parsed:
        upstream = [(f, c) for f, c in counts.items() if f not in ours]
        mine = [(f, c) for f, c in counts.items() if f in ours]
        lines = [description(header), ""]
        if upstream:
            lines.append("- upstream files: " + file_list(upstream))
        if mine:
            lines.append("- files of ours: " + file_list(mine))
        out[name] = lines
        for f, c in upstream:
            up_add, up_del = up_add + c[0], up_del + c[1]
            up_files.add(f)
        for f, c in mine:
            our_add += c[0] - c[1]
            our_files.add(f)
    net = (f"Net against upstream: +{up_add}/{MINUS}{up_del} lines in {len(up_files)} upstream files, "
           f"{our_add} lines in {len(our_files)} files of ours.")
    return out, net


def rewrite(doc: str) -> str:
    """doc with each section's generated lines replaced (lines of other kinds kept) and the net line."""
    gen, net = sections()
    parts = re.split(r"(?m)^(## \d{4}-[a-z0-9-]+)\n", doc)
    res = [parts[0]]
    for title, body in zip(parts[1::2], parts[2::2]):
        name = title[3:]
        if name in gen:
            kept = [line for line in body.split("\n") if line.startswith("- ") and not
                    line.startswith(("- upstream files:", "- files of ours:"))]
            rest = body.split("\n\n## ", 1)  # (a section ends where the next heading or the page does)
            tail = "\n".join(gen[name] + kept) + "\n"
            body = "\n" + tail + ("\n" if body.endswith("\n\n") or len(rest) > 1 else "")
        res.append(title + "\n" + body)
    return NET.sub(net, "".join(res))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report the sections that differ, change nothing")
    args = ap.parse_args(argv)
    doc = DOC.read_text()
    new = rewrite(doc)
    if args.check:
        if new != doc:
            old_s = dict(zip(*[iter(re.split(r"(?m)^## (\d{4}-[a-z0-9-]+)\n", doc)[1:])] * 2))
            new_s = dict(zip(*[iter(re.split(r"(?m)^## (\d{4}-[a-z0-9-]+)\n", new)[1:])] * 2))
            names = [n for n in new_s if old_s.get(n) != new_s[n]]
            print("docs/patches.md differs from the series: " + (", ".join(names) or "the net line")
                  + " (python tools/patch_doc.py)")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
