"""Environment variables with bad values, as a careless user sets them: SPECSERVE_HOME naming a
file was "[Errno 20] Not a directory: '.../packs'" (generate) or "Not a directory (.../packs)"
(models pull), which never named the variable."""

from __future__ import annotations

import pytest

from specserve.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [["models", "pull", "smollm2-135m-instruct", "--quiet"], ["generate", "hi", "--model", "smollm2-135m-instruct"]],
)
def test_a_specserve_home_that_is_a_file_is_named_in_one_line(argv, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home.txt"
    home.write_text("not a folder\n")
    monkeypatch.setenv("SPECSERVE_HOME", str(home))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"SPECSERVE_HOME={home} is a file, not a folder" in err and "unset it" in err
    assert len(err.splitlines()) == 1
    assert home.read_text() == "not a folder\n"


def test_a_specserve_home_that_is_a_folder_or_missing_is_fine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "not-made-yet"))
    assert main(["models", "list", "--json"]) == 0
    assert capsys.readouterr().err == ""
