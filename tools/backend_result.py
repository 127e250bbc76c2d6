#!/usr/bin/env python3
"""The backend tests' outcome as a committed JSON: each item passed, failed or skipped (with the reason), the device
they ran on and the patches of the tree, from pytest's JUnit XML.

    tools/backend_result.py build/vulkan/backend-tests.xml checks/vulkan_backend_tests.json --device NAME
    tools/backend_result.py build/gpu/backend-tests.xml bench/results/gpu.json --section backend_tests --device NAME

The file is rewritten only when an item's outcome, the device or the patches changed (not for the times), so a
commit shows a change of outcome and nothing else. Exit status 1 when an item failed or none ran."""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def outcomes(junit: Path) -> dict:
    """{test id: "passed" | "failed" | "skipped: reason"} of a JUnit XML file."""
    items = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped")
        if failed:
            items[name] = "failed"
        elif skipped is not None:
            items[name] = f"skipped: {skipped.get('message', '')}".strip()
        else:
            items[name] = "passed"
    return items


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default=None, help="the device the tests ran on")
    ap.add_argument("--section", default="",
                    help="write the outcome as this section of OUT (a results file of sections, tools/gpu.sh's), "
                         "keeping its other sections")
    args = ap.parse_args(argv)
    items = outcomes(args.junit)
    patches = sorted(p.stem for p in (ROOT / "patches").glob("*.patch"))
    counts = {k: sum(1 for v in items.values() if v.split(":")[0] == k) for k in ("passed", "failed", "skipped")}
    result = {"device": args.device, "last_patch": patches[-1] if patches else None, "counts": counts, "items": items}
    whole = json.loads(args.out.read_text()) if args.out.exists() else None
    old = (whole or {}).get(args.section) if args.section else whole
    if old != result:
        args.out.write_text(json.dumps({**(whole or {}), args.section: result} if args.section else result,
                                       indent=1) + "\n")
        print(f"{args.out}: written ({counts})")
    else:
        print(f"{args.out}: unchanged ({counts})")
    return 1 if counts["failed"] or not counts["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
