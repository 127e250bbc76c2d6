"""patches/ is a series in final form: one feature per patch, none rewriting an earlier one, all applying in order to
the pinned llama.cpp, and docs/patches.md describing exactly that series."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import patch_doc  # noqa: E402
import series_check  # noqa: E402
import upstream  # noqa: E402

PATCHES = sorted((ROOT / "patches").glob("*.patch"))
HEADER = "Description: a feature\n Why.\nAuthor: us\nForwarded: not-needed\n---\n"


def file_diff(path: str, minus: list, plus: list, start: int = 1) -> str:
    body = "".join(f"-{line}\n" for line in minus) + "".join(f"+{line}\n" for line in plus)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{start},{len(minus)} +{start},{len(plus)} @@\n{body}")


def test_the_series_is_in_final_form():
    assert 1 <= len(PATCHES) <= 16, [p.name for p in PATCHES]
    assert series_check.check(ROOT / "patches") == []


def test_the_series_applies_in_order_to_the_pinned_tree():
    assert series_check.check(ROOT / "patches", upstream.unpatched_tree()) == []


def test_a_patch_that_rewrites_an_earlier_one_is_named(tmp_path):
    (tmp_path / "0001-one.patch").write_text(HEADER + file_diff("src/a.cpp", [], ["int llama_ext_one(void) { return 1; }"]))
    (tmp_path / "0002-two.patch").write_text(
        HEADER + file_diff("src/a.cpp", ["int llama_ext_one(void) { return 1; }"], ["int llama_ext_one(void) { return 2; }"]))
    (tmp_path / "0004-gap.patch").write_text(file_diff("src/b.cpp", [], ["int llama_ext_other(void);"]))
    problems = series_check.check(tmp_path)
    assert any("0002-two.patch deletes a line 0001-one.patch added in src/a.cpp" in p for p in problems), problems
    assert any("0004-gap.patch: numbered 0004, expected 0003" in p for p in problems), problems
    assert any("0004-gap.patch: DEP-3 header lacks Description:, Author:, Forwarded:" in p for p in problems), problems
    # deleting an upstream line, or a short one like "}", is no rewrite
    (tmp_path / "0002-two.patch").write_text(HEADER + file_diff("src/a.cpp", ["int upstream_function(void);"], []))
    (tmp_path / "0004-gap.patch").unlink()
    assert series_check.check(tmp_path) == []


def test_a_patch_that_does_not_apply_is_named(tmp_path):
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.cpp").write_text("int upstream_function(void);\n")
    series = tmp_path / "patches"
    series.mkdir()
    (series / "0001-one.patch").write_text(
        HEADER + file_diff("src/a.cpp", ["int upstream_function(void);"], ["int upstream_function(int);"]))
    assert series_check.check(series, tree) == []
    (series / "0002-two.patch").write_text(
        HEADER + file_diff("src/a.cpp", ["int upstream_function(void);"], ["long upstream_function(void);"]))
    problems = series_check.check(series, tree)
    assert len(problems) == 1 and problems[0].startswith("0002-two.patch does not apply"), problems


def test_docs_describe_the_series_as_built():
    """docs/patches.md has one section per patch, in apply order, titled with the patch's name."""
    doc = (ROOT / "docs" / "patches.md").read_text()
    sections = re.findall(r"^## (\d{4}-[a-z0-9-]+)$", doc, flags=re.M)
    assert sections == [p.stem for p in PATCHES]


def test_docs_hold_each_patchs_header_and_file_counts():
    """Each section's description is its patch's DEP-3 header and its file lines count the patch's diff, and the
    net line sums the series: an amended patch whose page was not rewritten (tools/patch_doc.py) fails here."""
    assert patch_doc.main(["--check"]) == 0
    doc = (ROOT / "docs" / "patches.md").read_text()
    broken = doc.replace("`llama-kv-store.h` +", "`llama-kv-store.h` +1", 1)
    assert broken != doc and patch_doc.rewrite(broken) == doc

