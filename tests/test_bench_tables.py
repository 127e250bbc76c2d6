"""The tables of README.md and docs/results.md are the ones tools/tables.py prints from bench/results/*.json.

Each table in the documents sits under a marker ``<!-- tools/tables.py NAME -->``; the table that follows
must be exactly what ``python tools/tables.py NAME`` prints, every table tables.py knows must appear, and
no markdown table may stand without a marker: README's status table is generated too (``status``).
JSON only: no library, no model (``pytest --noconftest tests/test_bench_tables.py`` runs it without the package).
"""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", ROOT / "docs" / "results.md")
SCRIPT = ROOT / "tools" / "tables.py"
# tables of words, no figures, may stand without a marker (none in these two documents today)
UNMARKED_OK: tuple = ()
MARK = re.compile(r"^<!-- tools/tables\.py (\S+) -->$")


def _tables():
    spec = importlib.util.spec_from_file_location("doc_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tables = _tables()


def doc_tables(text: str):
    """(marker name or None, table text) for every markdown table of a document (outside code blocks)."""
    lines = text.splitlines()
    out, i, fence = [], 0, False
    while i < len(lines):
        if lines[i].startswith("```"):
            fence = not fence
        if not fence and lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            m = MARK.match(lines[i - 1]) if i else None
            out.append((m.group(1) if m else None, "\n".join(lines[i:j])))
            i = j
            continue
        i += 1
    return out


def all_doc_tables():
    return [(p.name, name, t) for p in DOCS for name, t in doc_tables(p.read_text())]


def mismatches(results: Path = tables.RESULTS):
    """Every table of the documents that is not what tables.py prints from `results`."""
    bad = []
    for doc, name, text in all_doc_tables():
        if name is None:
            if not text.startswith(UNMARKED_OK):
                bad.append(f"{doc}: a table without a tools/tables.py marker: {text.splitlines()[0]}")
        elif name not in tables.TABLES:
            bad.append(f"{doc}: marker names an unknown table {name!r}")
        elif text != tables.render(name, results):
            bad.append(f"{doc}: table {name!r} differs from `python tools/tables.py {name}`")
    return bad


def test_script_runs_on_the_committed_json():
    out = subprocess.run([sys.executable, str(SCRIPT), "all"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in tables.TABLES:
        assert tables.marker(name) in out.stdout


@pytest.mark.parametrize("name", list(tables.TABLES))
def test_every_table_is_in_the_docs(name):
    printed = tables.render(name)
    where = [doc for doc, n, text in all_doc_tables() if n == name and text == printed]
    assert where, f"`python tools/tables.py {name}` prints a table that neither README.md nor docs/results.md holds"


def test_every_doc_table_comes_from_tables_py():
    assert mismatches() == []


def test_a_changed_figure_is_caught(tmp_path):
    """The check can fail: alter one number in a copy of the JSON and the docs no longer match."""
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results, ignore=shutil.ignore_patterns("*.png"))
    path = results / "lambda_ablation.json"
    data = json.loads(path.read_text())
    data["configs"]["window-only"]["n_ctx"] = 8960
    path.write_text(json.dumps(data))
    bad = mismatches(results)
    assert any("'ablation'" in b for b in bad), bad


def test_the_readme_status_table_is_generated():
    """README's status table holds the headline figures: it is the generated one, not a hand-written table."""
    names = [name for name, _ in doc_tables((ROOT / "README.md").read_text())]
    assert "status" in names


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_a_changed_status_figure_is_caught(tmp_path):
    """README's status table is checked like the others: a second question's time changed in a copy of the JSON."""
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results, ignore=shutil.ignore_patterns("*.png"))
    path = results / "server_ttft.json"
    data = json.loads(path.read_text())
    data["questions"][-1]["first_token_s"] += 1.0
    path.write_text(json.dumps(data))
    bad = mismatches(results)
    assert any("README.md" in b and "'status'" in b for b in bad), bad
