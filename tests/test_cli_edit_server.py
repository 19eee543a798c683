"""`specserve edit` when the server it needs is not there, or its URL is not one: the error
says what to do (start a server, or point --base-url at one), before the file is sent."""

from __future__ import annotations

import pytest

from specserve.cli.main import main


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "f.py"
    path.write_text("def f():\n    return 1\n")
    return path


def test_an_unreachable_server_says_how_to_reach_one(src, capsys):
    """It said "cannot reach the server at http://127.0.0.1:9/v1/: Connection error." and no more."""
    assert main(["edit", str(src), "-i", "x", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the server at http://127.0.0.1:9/v1" in err
    assert "specserve serve" in err and "--base-url" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "notaurl", "ftp://host/v1"])
def test_a_base_url_without_http_is_refused_in_words(url, src, capsys, monkeypatch):
    """`--base-url localhost:8000/v1` was a bare "Connection error." after the client tried it."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["edit", str(src), "-i", "x", "--base-url", url, "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert f"--base-url {url} is not an http:// or https:// URL" in err and len(err.splitlines()) == 1


def test_a_bad_url_in_the_environment_names_the_variable(src, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8000")
    assert main(["edit", str(src), "-i", "x", "--model", "m"]) == 2
    assert "$OPENAI_BASE_URL localhost:8000 is not an http:// or https:// URL" in capsys.readouterr().err
