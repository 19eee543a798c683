"""`specserve bench --concurrency`: the load benchmark on a tiny random model, in process and
through a `specserve serve` subprocess; bad flags give one line and a non-zero exit."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny

from specserve.bench import load as bench_load
from specserve.bench.load import (
    LoadRow,
    RequestTiming,
    parse_concurrency,
    percentile,
    summarize,
)
from specserve.cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"
TINY = ["--draft-model", "none", "--dtype", "float32"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("load-models") / "target", seed=0)


def _rows(out) -> list[dict]:
    return json.loads((out / "load.json").read_text())["rows"]


def _check_row(r: dict, max_tokens: int) -> None:
    c = r["concurrency"]
    assert r["requests"] == c
    assert r["output_tokens"] == c * max_tokens  # EOS ignored: every request runs to max_tokens
    assert r["finish_reasons"] == {"length": c}
    assert r["prompt_tokens"] > 0 and r["wall_s"] > 0 and r["aggregate_tok_s"] > 0
    assert abs(r["aggregate_tok_s"] - r["output_tokens"] / r["wall_s"]) < 1e-6 * r["aggregate_tok_s"]
    assert 0 < r["ttft_p50"] <= r["ttft_p99"] <= r["wall_s"]
    assert 0 <= r["itl_p50"] <= r["itl_p99"] <= r["wall_s"]
    assert r["per_request_tok_s_p50"] is not None and r["per_request_tok_s_p50"] > 0
    if r["mode"] == "plain":
        assert r["acceptance_rate"] is None and r["proposed"] == 0
    elif r["proposed"]:
        assert r["acceptance_rate"] == pytest.approx(r["accepted"] / r["proposed"])
    if c == 1:
        assert r["speedup_vs_c1"] == pytest.approx(1.0)


def test_inproc_load_run_writes_results(tiny_target, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--model",
            tiny_target,
            *TINY,
            "--concurrency",
            "2,1",
            "--load-max-tokens",
            "8",
            "--modes",
            "plain,prediction,ngram",
            "--scenarios",
            "py-rename,ts-rename",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "ignoring mode(s) ngram" in err
    data = json.loads((out / "load.json").read_text())
    rows = data["rows"]
    assert [(r["via"], r["mode"], r["concurrency"]) for r in rows] == [
        ("inproc", "plain", 1),
        ("inproc", "plain", 2),
        ("inproc", "prediction", 1),
        ("inproc", "prediction", 2),
    ]
    for r in rows:
        _check_row(r, 8)
    env = data["environment"]
    assert env["backend"] == "transformers" and env["dtype"] == "float32"
    assert env["concurrency"] == [1, 2] and env["load_max_tokens"] == 8 and env["max_num_seqs"] >= 2
    assert env["scenarios"] == ["py-rename", "ts-rename"]
    md = (out / "load.md").read_text()
    assert "| inproc | plain | 2 | 16 |" in md and "| inproc | prediction | 1 | 8 |" in md
    assert "- plain (inproc): aggregate tok/s vs C=1: 1.00x at C=1, " in md
    assert "- prediction (inproc): aggregate tok/s vs C=1: 1.00x at C=1, " in md
    png = (out / "load.png").read_bytes()
    assert png[:8] == PNG and len(png) > 5000


@pytest.mark.parametrize("value", ["0", "x", "1,,x", "2,-4", "", "1.5"])
def test_bad_concurrency_is_one_line(tiny_target, tmp_path, capsys, value):
    rc = main(["bench", "--model", tiny_target, *TINY, "--concurrency", value, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert err.startswith("specserve: error: --concurrency takes comma-separated positive integers")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "load.json").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--modes", "ngram,auto"], "runs modes plain, prediction"),
        (["--load-max-tokens", "0"], "argument --load-max-tokens: must be >= 1"),
        (["--max-num-seqs", "1", "--max-num-batched-tokens", "3"], "--max-num-batched-tokens must exceed 4"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
    ],
)
def test_bad_load_flags_are_one_line(tiny_target, tmp_path, capsys, flags, message):
    rc = main(["bench", "--model", tiny_target, *TINY, "--concurrency", "1,4", *flags, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and err.startswith("specserve: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_server_load_run_end_to_end(tiny_target, tmp_path, monkeypatch):
    """Both paths at C=2: the server subprocess (its log in --out) streams as many tokens as the
    engine run in process, with prediction stats from the SSE finish chunk."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the server subprocess, on a 2-core machine
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--model",
            tiny_target,
            *TINY,
            "--concurrency",
            "2",
            "--load-max-tokens",
            "6",
            "--load-via",
            "both",
            "--modes",
            "plain,prediction",
            "--scenarios",
            "py-rename",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = _rows(out)
    assert [(r["via"], r["mode"]) for r in rows] == [
        ("inproc", "plain"),
        ("inproc", "prediction"),
        ("server", "plain"),
        ("server", "prediction"),
    ]
    for r in rows:
        _check_row(r, 6)
        assert r["speedup_vs_c1"] is None  # no C=1 run
    inproc, server = rows[:2], rows[2:]
    assert [r["prompt_tokens"] for r in server] == [r["prompt_tokens"] for r in inproc]
    assert (out / "server.log").exists()
    md = (out / "load.md").read_text()
    assert "| server | prediction | 2 | 12 |" in md and "- plain (server): no C=1 run to compare with" in md


def test_statistics():
    assert parse_concurrency(" 16,1,4,4 ") == (1, 4, 16)
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    t = RequestTiming(submit=0.0, output_tokens=5)
    for time, n in [(0.5, 1), (0.7, 1), (1.3, 3), (1.3, 0)]:
        t.emitted(n, time)
    t.finish = 1.3
    assert t.ttft == 0.5
    assert t.itl_samples() == pytest.approx([0.2, 0.2, 0.2, 0.2])
    assert t.decode_rate() == pytest.approx(4 / 0.8)
    other = RequestTiming(submit=0.1, output_tokens=5, emissions=[(0.2, 5)], finish=2.1, proposed=4, accepted=3)
    row = summarize("inproc", "prediction", 2, [t, other])
    assert isinstance(row, LoadRow)
    assert row.wall_s == pytest.approx(2.1) and row.output_tokens == 10
    assert row.aggregate_tok_s == pytest.approx(10 / 2.1)
    assert row.ttft_p50 == pytest.approx(0.3) and row.acceptance_rate == pytest.approx(0.75)
    assert row.per_request_tok_s_p50 == pytest.approx(4 / 0.8)  # `other` came in one emission: no rate
    bench_load.add_speedups([row])
    assert row.speedup_vs_c1 is None


def test_ctrl_c_keeps_the_load_runs_that_finished(tiny_target, tmp_path, monkeypatch, capsys):
    """Ctrl+C during --concurrency lost every row measured before it; now they are written with
    load.md saying so, and the exit is 130."""
    real = bench_load.run_inproc

    def run_inproc(llm, prompts, mode, concurrency, max_tokens):
        if concurrency == 2:
            raise KeyboardInterrupt
        return real(llm, prompts, mode, concurrency, max_tokens)

    monkeypatch.setattr(bench_load, "run_inproc", run_inproc)
    monkeypatch.setattr(bench_load, "warm_up_inproc", lambda *args: None)
    argv = ["bench", "--model", tiny_target, *TINY, "--concurrency", "1,2", "--load-max-tokens", "4"]
    assert main([*argv, "--modes", "plain", "--scenarios", "py-rename", "--out", str(tmp_path)]) == 130
    report = json.loads((tmp_path / "load.json").read_text())
    assert report["environment"]["interrupted"] is True
    assert [(r["mode"], r["concurrency"]) for r in report["rows"]] == [("plain", 1)]
    assert "**Interrupted** (Ctrl+C)" in (tmp_path / "load.md").read_text()
    assert f"interrupted: {tmp_path} holds the 1 run(s) that finished" in capsys.readouterr().err


def test_the_chart_leaves_out_a_per_request_rate_that_was_not_measured():
    """A run whose every answer came in one emission has no per-request rate (load.md says –):
    the chart drew it as 0 tok/s, as if its requests had not decoded at all."""
    rows = [
        LoadRow("inproc", "prediction", 1, 1, aggregate_tok_s=40.0, per_request_tok_s_p50=None),
        LoadRow("inproc", "prediction", 4, 4, aggregate_tok_s=90.0, per_request_tok_s_p50=30.0),
        LoadRow("inproc", "plain", 1, 1, aggregate_tok_s=10.0, per_request_tok_s_p50=10.0),
    ]
    series = bench_load.chart_series(rows)
    assert series["prediction (inproc)"] == ([(1, 40.0), (4, 90.0)], [(4, 30.0)])
    assert series["plain (inproc)"] == ([(1, 10.0)], [(1, 10.0)])
