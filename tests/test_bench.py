"""`specserve bench --quick` on tiny random models in float32: every speculative output must equal
plain greedy decoding, and the JSON / Markdown / PNG / HTML outputs must be written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny import save_tiny
from tqdm import tqdm

from specserve.bench import runner as bench
from specserve.bench.curves import parse_curve
from specserve.bench.peers import LLAMACPP_PEERS, TRANSFORMERS_PEERS
from specserve.bench.replay_check import check_report
from specserve.bench.runner import (
    MODES,
    Run,
    Scenario,
    build_prompt,
    load_scenarios,
    markdown_table,
)
from specserve.cli.main import main
from specserve.cli.replay import load_tokenizer


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-models")
    return save_tiny(root / "target", seed=0), save_tiny(root / "draft", seed=1)


@pytest.fixture(scope="module")
def quick_run(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    target, draft = tiny_pair
    rc = main(
        [
            "bench",
            "--quick",
            "--model",
            target,
            "--draft-model",
            draft,
            "--max-tokens",
            "24",
            "--out",
            str(out),
            "--html",
            str(out / "report.html"),
        ]
    )
    return rc, out


def test_quick_bench_outputs_equal_plain(quick_run):
    rc, out = quick_run
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    runs = data["runs"]
    assert [r["mode"] for r in runs] == list(MODES) + list(TRANSFORMERS_PEERS)
    assert not [r for r in runs if r["skipped"]]
    for r in runs:
        assert r["equal_to_plain"] is True, (r["mode"], r["first_difference"])
        assert r["output_tokens"] > 0 and r["latency"] > 0
        assert r["speedup"] is not None and r["speedup"] > 0
    env = data["environment"]
    assert env["dtype"] == "float32" and env["backend"] == "transformers" and env["cpu"] and env["cores"] >= 1
    ours = [r for r in runs if r["engine"] == "specserve"]
    assert all(r["stats"]["output_tokens"] == r["output_tokens"] for r in ours)
    assert next(r for r in ours if r["mode"] == "plain")["tokens_per_step"] == 1.0


def test_a_bench_report_replays_with_the_drafter_that_ran(quick_run, tiny_pair, capsys):
    """`specserve replay --bench`: each prediction run's own output, replayed with the cost curve
    the bench drafted with (recorded in its environment), takes the steps the run took and accepts
    what it accepted. The replay simulates the drafter that ran, with its prices."""
    _, out = quick_run
    report = json.loads((out / "bench.json").read_text())
    ours = [r for r in report["runs"] if r["engine"] == "specserve"]
    assert all(len(r["output_ids"]) == r["output_tokens"] for r in ours)
    # the prices the engine drafted with are recorded: a curve from one token up, never falling
    # (on the tiny model an 8-token pass may cost no more than one: timing decides, not the test)
    curve = parse_curve(report["environment"]["cost_curve"]).curve
    sizes, costs = [n for n, _ in curve], [c for _, c in curve]
    assert sizes[0] == 1 and costs[0] == 1.0 and len(curve) >= 4
    assert sizes == sorted(set(sizes)) and costs == sorted(costs)
    checks = check_report(report, load_tokenizer(tiny_pair[0]))  # the report names the folder, not its path
    pred = next(r for r in ours if r["mode"] == "prediction")
    assert [c.scenario for c in checks] == ["py-rename"]
    c = checks[0]
    assert c.exact and c.output_tokens == pred["output_tokens"]
    assert c.replay_steps == c.bench_steps == pred["stats"]["steps"]
    assert c.replay_acceptance == pytest.approx(pred["stats"]["acceptance_rate"], abs=1e-4)
    assert c.measured == pred["speedup"] and c.projected > 0
    # the bench timed what a long cache adds (a prediction mode ran), and the replay priced with it
    cc = report["environment"]["context_cost"]
    assert set(cc) == {"per_pair", "per_cached", "cached"} and cc["cached"] > 32
    assert cc["per_pair"] >= 0 and cc["per_cached"] >= 0 and c.projected_curve is not None
    assert main(["replay", "--bench", str(out / "bench.json"), "--model", tiny_pair[0]]) == 0
    table = capsys.readouterr().out
    assert f"| py-rename | {c.output_tokens} | {c.bench_steps} / {c.replay_steps} |" in table


def test_quick_bench_files_written(quick_run):
    _, out = quick_run
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    md = (out / "bench.md").read_text()
    assert "| py-rename | prediction | specserve |" in md and "hf-assisted" in md
    html = (out / "report.html").read_text()
    assert "equal to plain decoding" in html and "yes, token for token" in html
    assert html.startswith("<!doctype html>") and "py-rename / prediction" in html
    # the page quotes the table's rate for the run it shows (not the engine's, timed from the prefill's end)
    pred = next(r for r in json.loads((out / "bench.json").read_text())["runs"] if r["mode"] == "prediction")
    assert f"<td>output tokens/s</td><td>{pred['tokens_per_second']:.2f} (after the first token" in html
    assert f"| {pred['tokens_per_second']:.2f} |" in md


def test_quick_bench_on_llamacpp_with_its_peers(tmp_path):
    """The llama.cpp backend in the benchmark: our runs equal plain bit for bit (batch-invariant
    kernels), llama-cpp-python's plain and prompt-lookup peers run on the same GGUF."""
    from tiny_gguf import save_tiny_gguf

    target, draft = save_tiny_gguf(tmp_path / "t"), save_tiny_gguf(tmp_path / "d", seed=1)
    rc = main(
        [
            "bench",
            "--quick",
            "--model",
            target,
            "--draft-model",
            draft,
            "--max-tokens",
            "24",
            "--exact",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["environment"]["backend"] == "llama.cpp" and data["environment"]["batch_invariant"] is True
    runs = data["runs"]
    assert [r["mode"] for r in runs] == list(MODES) + list(LLAMACPP_PEERS)
    for r in runs:
        assert not r["skipped"] and r["output_tokens"] > 0
        if r["engine"] == "specserve":
            assert r["equal_to_plain"] is True, (r["mode"], r["first_difference"])
            assert r["of_prefill"] is not None and r["of_prefill"] > 0
        else:
            assert r["engine"] == "llama-cpp-python"
        assert r["vs_peer"] is not None and r["vs_peer"] > 0  # against the peer's plain decoding
    assert next(r for r in runs if r["mode"] == "llama.cpp")["vs_peer"] == 1.0
    assert "llama-cpp-python" in (tmp_path / "out" / "bench.md").read_text()


def test_ratios_against_the_peer_and_the_headline():
    """vs_peer divides by the peer's plain decoding of the same scenario; the headline quotes it."""
    runs = [
        Run("a", "plain", "specserve", tokens_per_second=20.0, speedup=1.0),
        Run("a", "prediction", "specserve", tokens_per_second=60.0, speedup=3.0, of_prefill=0.5),
        Run("a", "llama.cpp", "llama-cpp-python", tokens_per_second=25.0),
        Run("b", "prediction", "specserve", tokens_per_second=60.0),  # no peer ran for b
        Run("b", "llama.cpp", "llama-cpp-python", skipped="no GGUF"),
    ]
    bench.against_peer(runs[:3])
    bench.against_peer(runs[3:])
    assert [r.vs_peer for r in runs] == [0.8, 2.4, 1.0, None, None]
    assert bench.headlines(runs) == [
        "a/prediction: 60.0 tok/s = 2.40x llama-cpp-python's plain decoding on the same weights "
        "(3.00x ours, 50% of the prefill rate)"
    ]


def test_scenarios_bundled():
    system, scenarios = load_scenarios()
    kinds = {s.kind for s in scenarios}
    assert kinds == {"edit", "chat"} and "complete updated file" in system
    files = {s.file for s in scenarios if s.file}
    assert files == {"users_controller.py", "orders_controller.ts"}
    for s in scenarios:
        if s.kind == "edit":
            assert 350 <= len(s.code.splitlines()) <= 500
    with pytest.raises(ValueError, match="unknown scenario"):
        load_scenarios(("nope",))


def test_an_unknown_scenario_fails_before_a_model_loads(monkeypatch, capsys, tmp_path):
    from specserve.llm import LLM

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the scenarios were checked")

    monkeypatch.setattr(LLM, "from_options", load)
    assert main(["bench", "--scenarios", "py-rename,nope", "--out", str(tmp_path)]) == 2
    assert "unknown scenario(s) nope" in capsys.readouterr().err


def test_prompt_trimmed_to_fit_context(tiny_pair):
    from specserve.llm import LLM

    llm = LLM(model=tiny_pair[0], draft_model="none", dtype="float32")
    _, (s, *_) = load_scenarios(("py-rename",))
    ids, prediction, trimmed = build_prompt(llm, s, 64)
    assert len(ids) + 64 < llm.max_context  # the tiny model has 512 positions: the file must be cut
    assert trimmed > 0 and s.code.startswith(prediction) and prediction.endswith("\n")
    short, short_pred, more = build_prompt(llm, s, 64, max_prompt_tokens=300)
    assert len(short) <= 300 and more > trimmed and prediction.startswith(short_pred)
    chat = Scenario("c", "chat", "Write a haiku.")
    ids, prediction, trimmed = build_prompt(llm, chat, 64)
    assert prediction is None and trimmed == 0


def test_markdown_marks_near_tie_and_bug():
    env = {
        "model": "m",
        "draft_model": None,
        "dtype": "bfloat16",
        "device": "cpu",
        "threads": 2,
        "max_tokens": 8,
        "torch": "t",
        "transformers": "x",
        "date": "d",
    }
    tie = Run(
        "s",
        "ngram",
        "specserve",
        output_tokens=8,
        latency=1.0,
        equal_to_plain=False,
        first_difference={"position": 3, "top2_gap": 0.06, "near_tie": True},
    )
    bug = Run(
        "s",
        "draft",
        "specserve",
        output_tokens=8,
        latency=1.0,
        equal_to_plain=False,
        first_difference={"position": 5, "top2_gap": 4.0, "near_tie": False},
    )
    skipped = Run("s", "hf-assisted", "transformers", skipped="no draft model loaded")
    md = markdown_table([tie, bug, skipped], env)
    assert "near-tie @3 (gap 0.06)" in md and "DIFFERS @5 (gap 4.0)" in md and "skipped: no draft model" in md
    row = bench.divergence_row(tie)["equal to plain decoding"]
    assert "is 0.06 below the target's best logit there, a near-tie" in row
    assert "NOT a near-tie" in bench.divergence_row(bug)["equal to plain decoding"]


def test_first_difference_reports_gap(tiny_pair):
    from specserve.llm import LLM

    llm = LLM(model=tiny_pair[0], draft_model="none", dtype="float32")
    prompt = llm.encode("def add(a, b):")
    plain = llm.generate(prompt, bench.SamplingParams(max_tokens=6)).token_ids
    assert bench.first_difference(llm, prompt, plain, list(plain)) is None
    other = plain[:2] + [(plain[2] + 1) % 300] + plain[3:]
    d = bench.first_difference(llm, prompt, plain, other)
    assert d["position"] == 2 and d["plain_token"] == plain[2] and d["top2"][0] == plain[2]
    assert d["top2_gap"] >= 0


def test_a_run_token_far_below_the_top_is_not_a_near_tie():
    """The top two logits are 0.1 apart, but the run wrote a token 6 below them: not a rounding
    near-tie (it was reported as one from the top-2 gap alone), and the gap shown is the 6."""
    import contextlib
    from types import SimpleNamespace

    import torch

    logits = torch.zeros(1, 8)
    logits[0, 1], logits[0, 2], logits[0, 5] = 10.0, 9.9, 4.0

    class Target:
        def forward(self, ids, last_only=False):
            return logits

    llm = SimpleNamespace(
        engine=SimpleNamespace(scratch=lambda: contextlib.nullcontext(Target())),
        tokenizer=SimpleNamespace(decode=lambda ids: f"<{ids[0]}>"),
    )
    far = bench.first_difference(llm, [0], [7, 1], [7, 5])
    assert far["position"] == 1 and far["top2_gap"] == pytest.approx(0.1) and far["pair_gap"] == pytest.approx(6.0)
    assert far["near_tie"] is False and far["gap"] == pytest.approx(6.0)
    run = Run("s", "draft", "specserve", output_tokens=2, equal_to_plain=False, first_difference=far)
    assert bench._equal_cell(run) == "DIFFERS @1 (gap 6.0)"
    tie = bench.first_difference(llm, [0], [7, 1], [7, 2])  # the top two: a near-tie
    assert tie["near_tie"] is True and tie["gap"] == pytest.approx(0.1)


def test_a_run_that_fails_is_a_failed_row_and_the_others_are_written(tiny_pair, tmp_path, monkeypatch, capsys):
    """One peer raising (out of memory, a crashing build) used to end the whole bench with an error
    and no report: every finished run was lost. Now its row says FAILED with the error, the other
    runs are written, and the bench exits 1."""
    target, _ = tiny_pair
    real = bench.run_peer

    def run_peer(llm, prompt_ids, max_tokens, peer, clock):
        if peer == "hf-prompt-lookup" and max_tokens == 8:  # the scenario's run, not the 4-token warm-up
            raise MemoryError("no room for the scores")
        return real(llm, prompt_ids, max_tokens, peer, clock)

    monkeypatch.setattr(bench, "run_peer", run_peer)
    rc = main(
        ["bench", "--quick", "--model", target, "--draft-model", "none", "--modes", "plain,prediction"]
        + ["--max-tokens", "8", "--peers", "hf,hf-prompt-lookup", "--out", str(tmp_path)]
    )
    assert rc == 1
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [(r["mode"], r["skipped"]) for r in runs] == [
        ("plain", None),
        ("prediction", None),
        ("hf", None),
        ("hf-prompt-lookup", "FAILED: MemoryError: no room for the scores"),
    ]
    assert (
        "| hf-prompt-lookup | transformers | FAILED: MemoryError: no room for the scores |"
        in (tmp_path / "bench.md").read_text()
    )
    assert "1 run(s) failed: py-rename/hf-prompt-lookup" in capsys.readouterr().err


def test_ctrl_c_keeps_the_runs_that_finished(tiny_pair, tmp_path, monkeypatch, capsys):
    """Ctrl+C in the last run of a bench lost every figure measured before it: nothing was written.
    Now the finished runs are written, bench.md says the bench was interrupted, and the exit is 130."""
    target, _ = tiny_pair
    real = bench.run_peer

    def run_peer(llm, prompt_ids, max_tokens, peer, clock):
        if max_tokens == 8:  # the scenario's run, not the 4-token warm-up
            raise KeyboardInterrupt
        return real(llm, prompt_ids, max_tokens, peer, clock)

    monkeypatch.setattr(bench, "run_peer", run_peer)
    rc = main(
        ["bench", "--quick", "--model", target, "--draft-model", "none", "--modes", "plain,prediction"]
        + ["--max-tokens", "8", "--peers", "hf", "--out", str(tmp_path), "--html", str(tmp_path / "r.html")]
    )
    assert rc == 130
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["environment"]["interrupted"] is True
    assert [(r["mode"], r["skipped"]) for r in report["runs"]] == [("plain", None), ("prediction", None)]
    assert "**Interrupted** (Ctrl+C)" in (tmp_path / "bench.md").read_text()
    assert "py-rename / prediction" in (tmp_path / "r.html").read_text()
    assert f"interrupted: {tmp_path} holds the 2 run(s) that finished" in capsys.readouterr().err


def test_ctrl_c_before_any_run_finished_leaves_an_earlier_report_alone(tiny_pair, tmp_path, monkeypatch):
    """Nothing measured: nothing written over the report already in --out."""
    target, _ = tiny_pair
    (tmp_path / "bench.json").write_text("earlier")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_ours", interrupted)
    monkeypatch.setattr(bench, "warm_up", lambda llm, opts: None)
    cli_main = sys.modules["specserve.cli.main"]  # the package's `main` attribute is the function
    monkeypatch.setattr(cli_main, "_exit_on_next_interrupt", lambda: None)  # pytest's own Ctrl+C stays as it was
    rc = main(
        ["bench", "--quick", "--model", target, "--draft-model", "none", "--peers", "none", "--out", str(tmp_path)]
    )
    assert rc == 130 and (tmp_path / "bench.json").read_text() == "earlier"


def test_auto_without_prediction_is_a_mode_on_request(tiny_pair, tmp_path):
    """`--modes auto-no-prediction` runs `auto` on the edit scenario without its prediction (what
    an agent that never sends one gets); it is not among the default modes."""
    target, _ = tiny_pair
    rc = main(
        ["bench", "--quick", "--model", target, "--draft-model", "none", "--modes", "plain,auto-no-prediction"]
        + ["--max-tokens", "16", "--peers", "none", "--out", str(tmp_path)]
    )
    assert rc == 0
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [r["mode"] for r in runs] == ["plain", "auto-no-prediction"]
    blind = runs[1]
    assert blind["equal_to_plain"] is True and "prediction" not in blind["stats"]["by_source"]
    assert "auto-no-prediction" not in MODES


def test_an_answer_that_came_in_one_emission_has_no_rate_and_no_ratios(monkeypatch):
    """Its rate used to be tokens / latency, the prefill counted as decoding: a number no other
    row's compares with, and a speedup and a peer ratio from it. Now it is '–' and so are they."""
    ticks = iter([0.0, 2.0, 2.0, 0.0, 1.0, 3.0])  # one run: start, one emission, end; then plain's
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(ticks))
    with tqdm(disable=True) as bar:
        whole = bench._Clock(bar)
        whole.emitted(40)  # all 40 tokens in the first emission
        whole.stop()
        plain = bench._Clock(bar)
        plain.emitted(1)
        plain.stop()
    assert whole.decode_rate(40) is None and plain.decode_rate(41) == 20.0
    runs = [
        Run("a", "plain", "specserve", tokens_per_second=20.0, prefill_rate=100.0),
        Run("a", "prediction", "specserve", tokens_per_second=whole.decode_rate(40), latency=2.0, output_tokens=40),
        Run("a", "llama.cpp", "llama-cpp-python", tokens_per_second=25.0),
    ]
    bench.compare(_NoLLM(), runs[1], runs[0], [1, 2], [1, 2], [0])
    bench.against_peer(runs)
    assert runs[1].speedup is None and runs[1].of_prefill is None and runs[1].vs_peer is None
    assert bench.headlines(runs) == []
    env = {"model": "m", "draft_model": None, "dtype": "f32", "device": "cpu", "threads": 1, "max_tokens": 64}
    env |= {"torch": "t", "transformers": "t", "date": "d"}
    row = next(line for line in bench.markdown_table(runs, env).splitlines() if "| prediction |" in line)
    assert "| 40 | 2.00 | – | – |" in row, row
    assert bench.html_rows(runs[1])["output tokens/s"].startswith("– ")


def test_the_chart_draws_no_bar_for_a_figure_that_was_not_measured():
    """bench.png drew a run with no rate as a 0x speedup (and a peer as 0 tokens/step), where
    bench.md, bench.json and the HTML page say '–'."""
    runs = [
        Run("a", "plain", "specserve", tokens_per_second=20.0, speedup=1.0, tokens_per_step=1.0),
        Run("a", "prediction", "specserve", tokens_per_second=None, speedup=None, tokens_per_step=40.0),
        Run("a", "llama.cpp", "llama-cpp-python", tokens_per_second=25.0, speedup=1.25),
    ]
    scenarios, series = bench.chart_series(runs)
    assert scenarios == ["a"]
    assert [y for _, y in series["plain"][0]] == [1.0] and series["prediction"][0] == []
    assert [y for _, y in series["prediction"][1]] == [40.0]
    assert [y for _, y in series["llama.cpp"][0]] == [1.25] and series["llama.cpp"][1] == []


class _NoLLM:
    """compare() needs the LLM only when the outputs differ."""


def test_html_with_no_run_to_show_replaces_an_old_report(tiny_pair, tmp_path, capsys):
    """The report of an earlier bench at the --html path was left in place when this bench had no
    run to render (here: its only prediction run fails), and read as this bench's."""
    target, _ = tiny_pair
    page = tmp_path / "report.html"
    page.write_text("<p>an old report: 9.99x</p>")
    rc = main(
        ["bench", "--quick", "--model", target, "--draft-model", "none", "--modes", "plain,prediction"]
        + ["--max-tokens", "8", "--peers", "none", "--out", str(tmp_path), "--html", str(page)]
        + ["--html-run", "chat-lru/prediction", "--scenarios", "chat-lru"]
    )
    assert rc == 0
    assert "9.99x" not in page.read_text() and "no report" in page.read_text()
    assert f"{page} says so" in capsys.readouterr().err


def test_demo_makes_its_folder_and_checks_its_report_before_a_model_loads(monkeypatch, tmp_path):
    """--demo's report path was set after the output checks, so its folder was never checked; and
    without --out its runs went to bench-results/ while its report went to bench-out/demo/."""
    from specserve.cli import bench as bench_cli
    from specserve.cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    for argv, out in ((["bench", "--demo"], "bench-out/demo"), (["bench", "--demo", "--out", "mine"], "mine")):
        args = build_parser().parse_args(argv)
        bench_cli.apply_demo(args)
        bench_cli.make_out_folder(args)
        bench_cli.check_outputs(args)
        assert args.out == Path(out) and args.html == Path(out) / "report.html" and Path(out).is_dir()
    args = build_parser().parse_args(["bench", "--demo", "--html", "elsewhere/r.html"])
    bench_cli.apply_demo(args)
    bench_cli.make_out_folder(args)
    with pytest.raises(ValueError, match="the folder elsewhere does not exist"):
        bench_cli.check_outputs(args)


def test_help_says_a_second_run_into_the_same_folder_replaces_the_first_s_results(capsys):
    """`bench --out DIR` twice replaces the first run's bench.json/md/png, and --html FILE replaces
    FILE, as a build's output does; --help said neither, so a user comparing runs lost the first
    without being told. The help now says so, and how to keep both."""
    assert main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "replaces the bench.json, bench.md and bench.png of an earlier run" in text
    assert "a folder per run keeps each" in text
    assert "replaces FILE" in text


def test_a_report_that_cannot_be_written_whole_leaves_the_earlier_one(tmp_path):
    """save_report wrote bench.json and bench.md with Path.write_text, which empties the file before
    writing: a full disk (here a file size limit, which fails the same way) left the earlier run's
    results truncated and this run's half written. Each file is now written whole or not at all."""
    import subprocess
    import textwrap

    (tmp_path / "bench.md").write_text("earlier results\n")
    (tmp_path / "bench.json").write_text('{"earlier": true}\n')
    script = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from specserve.bench.runner import save_report
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
        try:
            save_report(Path({str(tmp_path)!r}), "bench", {{"x": "y" * 500}}, "runs", [], "z" * 500)
        except OSError as e:
            print("failed:", e.strerror)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "failed:" in done.stdout, done.stderr
    assert (tmp_path / "bench.md").read_text() == "earlier results\n"
    assert (tmp_path / "bench.json").read_text() == '{"earlier": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]
