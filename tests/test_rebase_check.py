"""tools/rebase_check.py on small synthetic trees: what applies, what applies only loosely, what fails."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import rebase_check  # noqa: E402

BASE = "".join(f"int upstream_{i}(void) {{ return {i}; }}\n" for i in range(40))


def make_tree(path: Path, text: str) -> Path:
    (path / "include").mkdir(parents=True)
    (path / "include" / "llama.h").write_text("// llama.h\n")
    (path / "src").mkdir()
    (path / "src" / "llama-graph.cpp").write_text(text)
    return path


def diff_of(tmp: Path, before: str, after: str, new_file: str = "") -> str:
    """A git diff from src/llama-graph.cpp = before to after (plus an optional new file of ours)."""
    repo = tmp / "diffrepo"
    if repo.exists():
        subprocess.run(["rm", "-rf", str(repo)], check=True)
    make_tree(repo, before)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (repo / "src" / "llama-graph.cpp").write_text(after)
    if new_file:
        (repo / "src" / "llama-ours.cpp").write_text(new_file)
    subprocess.run([*git, "add", "-A"], check=True)
    return subprocess.run([*git, "diff", "--cached"], check=True, capture_output=True, text=True).stdout


def write_patch(dir_: Path, name: str, diff: str) -> None:
    dir_.mkdir(exist_ok=True)
    (dir_ / name).write_text(f"Description: {name}\nAuthor: test\n---\n{diff}")


@pytest.fixture
def series(tmp_path):
    after = BASE.replace("return 5;", "return ours_5();").replace("return 30;", "return ours_30();")
    patches = tmp_path / "patches"
    write_patch(patches, "0001-hooks.patch", diff_of(tmp_path, BASE, after, new_file="int ours_5(void);\n"))
    after2 = after.replace("return 20;", "return ours_20();")
    write_patch(patches, "0002-more.patch", diff_of(tmp_path, after, after2))
    return patches


def test_pinned_tree_applies(tmp_path, series, capsys):
    tree = make_tree(tmp_path / "pinned", BASE)
    reports = rebase_check.check(tree, sorted(series.glob("*.patch")))
    assert [r.status for r in reports] == ["applies", "applies"]
    first = reports[0]
    assert (first.hunks, first.hunks_upstream, first.added_new_files) == (3, 2, 1)
    assert (first.added_upstream, first.removed_upstream) == (2, 2)
    assert not (tree / "src" / "llama-ours.cpp").exists(), "the given tree must not be modified"


def test_moved_code_still_applies(tmp_path, series):
    tree = make_tree(tmp_path / "newer", "// a new header line\n" * 7 + BASE)
    assert [r.status for r in rebase_check.check(tree, sorted(series.glob("*.patch")))] == ["applies", "applies"]


def test_changed_context_fails_and_names_the_hunk(tmp_path, series):
    changed = BASE.replace("return 29;", "return 29 + 0;").replace("return 31;", "return 31 + 0;")
    changed = changed.replace("return 30;", "return 30 + 0;")
    tree = make_tree(tmp_path / "newer", changed)
    reports = rebase_check.check(tree, sorted(series.glob("*.patch")))
    assert reports[0].status == "fails"
    assert reports[0].rejected == ["src/llama-graph.cpp hunk 2"]
    assert reports[1].status == "applies", "the hunks that did apply stay in for the later patches"


def test_command_line_exit_code_and_json(tmp_path, series, capsys):
    tree = make_tree(tmp_path / "newer", BASE.replace("return 20;", "return 20 + 0;"))
    out = tmp_path / "report.json"
    rc = rebase_check.main([str(tree), "--patches", str(series), "--json", str(out)])
    assert rc == 1
    printed = capsys.readouterr().out
    assert "0002-more.patch" in printed and "fails" in printed
    data = json.loads(out.read_text())
    assert [p["status"] for p in data["patches"]] == ["applies", "fails"]
    assert rebase_check.main([str(make_tree(tmp_path / "pinned", BASE)), "--patches", str(series)]) == 0


def test_not_a_tree(tmp_path):
    with pytest.raises(SystemExit, match="no llama.cpp tree found"):
        rebase_check.check(tmp_path, [])
