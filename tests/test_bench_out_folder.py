"""`specserve bench` refused after its --out folder was checked leaves no empty folder behind,
and never removes a folder the user had."""

from __future__ import annotations

from specserve.cli.main import main


def bench_error(out, capsys, *flags) -> str:
    code = main(["bench", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_a_later_refusal_removes_the_folders_bench_made(tmp_path, capsys):
    out = tmp_path / "new" / "results"
    err = bench_error(out, capsys, "--scenarios", "no-such-scenario")
    assert err.startswith("specserve: error: ") and "no-such-scenario" in err, err
    assert not (tmp_path / "new").exists()  # both levels were made by bench, and hold nothing
    assert tmp_path.is_dir()


def test_a_folder_the_user_had_stays_even_when_empty(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    bench_error(out / "results", capsys, "--html-run", "nope/plain")
    assert out.is_dir() and not (out / "results").exists()
    bench_error(out, capsys, "--html-run", "nope/plain")
    assert out.is_dir()


def test_a_made_folder_that_got_files_stays(tmp_path, capsys, monkeypatch):
    """Whatever was written is kept: only empty folders that bench made go."""
    import specserve.cli.bench as bench

    out = tmp_path / "made"

    def write_then_fail(args):
        (args.out / "partial.txt").write_text("x")
        raise ValueError("failed after writing")

    monkeypatch.setattr(bench, "resolve_options", write_then_fail)
    bench_error(out, capsys)
    assert (out / "partial.txt").read_text() == "x"


def test_a_refusal_of_html_takes_back_the_out_folder(tmp_path, capsys):
    """--out is made before --html is checked: a missing --html folder leaves no --out behind."""
    out = tmp_path / "made"
    err = bench_error(out, capsys, "--html", str(tmp_path / "missing" / "report.html"))
    assert "does not exist" in err, err
    assert not out.exists()


def test_a_deeper_level_that_cannot_be_made_takes_back_the_levels_above_it(tmp_path, capsys):
    """--out NEW/NAME with a NAME the system refuses (longer than its limit on a name) made NEW, then
    failed on NAME: taking back began at NAME, which was never made, stopped at its error, and NEW
    was left behind, empty. The levels bench made still go when a deeper one was never made."""
    err = bench_error(tmp_path / "new" / ("x" * 300), capsys)
    assert "cannot create the folder" in err, err
    assert list(tmp_path.iterdir()) == []
