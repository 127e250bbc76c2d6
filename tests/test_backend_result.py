"""tools/backend_result.py: the backend tests' outcome from pytest's JUnit XML, as a whole file (the Vulkan check)
or as a section of a results file of sections (tools/gpu.sh), rewritten only when an outcome changed."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_backends" name="test_lambda[gpu]" time="0.1"/>
<testcase classname="tests.test_backends" name="test_memory[gpu]" time="0.1"><skipped message="no GPU"/></testcase>
{extra}</testsuite></testsuites>"""


def load():
    spec = importlib.util.spec_from_file_location("backend_result", ROOT / "tools" / "backend_result.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_section_keeps_the_files_other_sections(tmp_path, capsys):
    tool = load()
    junit = tmp_path / "tests.xml"
    junit.write_text(JUNIT.format(extra=""))
    out = tmp_path / "gpu.json"
    out.write_text(json.dumps({"stream_gpu": {"tok_s": 1.0}}))
    args = [str(junit), str(out), "--section", "backend_tests", "--device", "GPU0: test"]
    assert tool.main(args) == 0
    d = json.loads(out.read_text())
    assert d["stream_gpu"] == {"tok_s": 1.0}
    section = d["backend_tests"]
    assert section["counts"] == {"passed": 1, "failed": 0, "skipped": 1} and section["device"] == "GPU0: test"
    assert section["items"]["tests.test_backends::test_memory[gpu]"] == "skipped: no GPU"
    assert tool.main(args) == 0 and "unchanged" in capsys.readouterr().out
    junit.write_text(JUNIT.format(extra='<testcase classname="tests.test_backends" name="test_top_k[gpu]">'
                                        '<failure message="x"/></testcase>'))
    assert tool.main(args) == 1  # a failed item
    assert json.loads(out.read_text())["backend_tests"]["counts"]["failed"] == 1
