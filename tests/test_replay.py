"""The replay estimator: the real engine + prediction drafter against an oracle target."""

from __future__ import annotations

import json

import pytest
from tiny import tiny_tokenizer
from transformers import AutoTokenizer

from specserve.bench.curves import LLAMACPP_2CORE_CURVE
from specserve.bench.replay import (
    OracleRunner,
    aggregate,
    projected_speedup,
    replay,
    replay_ids,
    step_cost,
)
from specserve.cli.main import main
from specserve.engine.governor import CostModel
from specserve.proposers.base import REGISTRY
from specserve.proposers.prediction import PredictionProposer

BEFORE = "".join(
    f"def handler_{i}(request):\n    user = load_user(request.user_id)\n    return render(user, page={i})\n\n"
    for i in range(40)
)


def edited(text: str) -> str:
    """Insert a line in the middle and change another one further down."""
    lines = text.splitlines(True)
    lines.insert(60, "    audit(request, 'viewed')\n")
    lines[100] = lines[100].replace("load_user", "fetch_user")
    return "".join(lines)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny tokenizer, saved to a folder and loaded back the way `specserve replay` loads one."""
    folder = tmp_path_factory.mktemp("tok")
    tiny_tokenizer().save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.folder = str(folder)
    return tok


def check_stats_add_up(tokenizer, prediction: str, output: str) -> None:
    ids = tokenizer.encode(output, add_special_tokens=False)
    out = replay_ids(tokenizer, prediction, ids)
    s = out.stats
    assert out.token_ids == ids and out.finish_reason == "length"
    assert s.proposed == s.accepted + s.rejected
    assert s.output_tokens == len(ids) == s.accepted + s.steps  # each step adds one target token
    assert sum(st["committed"] for st in out.steps) == len(ids)
    by_source = {k: v.accepted for k, v in s.by_source.items() if v.steps}
    assert set(by_source) <= {"prediction", "ngram", "none"}  # the prediction, and lookups where it has no anchor
    assert sum(st["accepted"] for st in out.steps) == s.accepted == sum(by_source.values())
    for source, accepted in by_source.items():
        assert out.token_sources.count(source) == accepted
    assert out.token_sources.count("target") == s.steps


def test_oracle_logits_point_at_the_output():
    oracle = OracleRunner(prompt_len=2, output_ids=[5, 7, 3])
    assert oracle.forward([9], last_only=True).shape == (1, 8)  # prefill of prompt[:-1]
    logits = oracle.forward([9, 5, 1])  # [3, V]: pending prompt token, then a right and a wrong draft token
    assert logits.argmax(-1).tolist() == [5, 7, 3]  # position-only: the wrong token does not matter
    oracle.truncate(2)
    assert oracle.length == 2 and oracle.forward([5]).argmax(-1).tolist() == [7]


def test_perfect_prediction_accepts_everything_but_bonus_tokens(tokenizer):
    r = replay(tokenizer, BEFORE, BEFORE)
    assert r.exact and r.rejected == 0 and r.acceptance_rate == 1.0
    assert r.accepted == r.output_tokens - r.steps  # every token but one bonus token per step
    assert r.tokens_per_step > 20  # K doubles up to the engine's prediction_k_max
    check_stats_add_up(tokenizer, BEFORE, BEFORE)


def test_a_file_that_spells_a_control_token_replays_as_text(tokenizer):
    """A model writes `<|im_end|>` in a file with the characters' tokens (the control token would
    end its turn, and the detokenizer skips it): the replay's output is tokenized so, as the
    prediction drafter tokenizes the prediction, and a perfect prediction still accepts everything."""
    text = BEFORE + 'END = "<|im_end|>"\n' + BEFORE
    r = replay(tokenizer, text, text)
    assert r.exact and r.rejected == 0 and r.acceptance_rate == 1.0
    assert r.prediction_tokens == r.output_tokens == len(tokenizer.encode(text, split_special_tokens=True))


def test_edit_in_the_middle_reanchors(tokenizer, monkeypatch):
    after = edited(BEFORE)
    r = replay(tokenizer, BEFORE, after)
    assert r.exact
    assert r.accepted >= 0.85 * r.output_tokens, r
    assert r.acceptance_rate >= 0.9 and r.tokens_per_step > 8
    check_stats_add_up(tokenizer, BEFORE, after)

    # The same edit with re-anchoring disabled: after the first divergence the drafter goes
    # quiet for good, so far fewer tokens are accepted. This gives the threshold above meaning.
    class NoReanchor(PredictionProposer):
        def _reanchor(self, tokens):
            self.anchored = False

    def no_reanchor(ctx):
        return NoReanchor(ctx.tokenizer, ctx.prediction, ctx.prompt_len, 8, 96)

    monkeypatch.setitem(REGISTRY, "prediction", no_reanchor)
    blind = replay(tokenizer, BEFORE, after)
    assert blind.accepted < 0.6 * r.accepted


def test_unrelated_output_gains_nothing(tokenizer):
    # (text that does not repeat itself either: a repeat is drafted by lookup, as it should be)
    unrelated = "The quick brown fox jumps over a lazy dog. Pack my box with five dozen liquor jugs!\n"
    r = replay(tokenizer, BEFORE, unrelated)
    assert r.accepted <= 0.2 * r.output_tokens
    assert r.projected_speedup < 1.2


def test_new_text_that_repeats_itself_is_drafted_by_lookup_where_it_pays(tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.\n" * 5, add_special_tokens=False)
    out = replay_ids(tokenizer, BEFORE, ids)  # no prices: lookups draft
    assert out.token_ids == ids and out.stats.by_source["ngram"].accepted >= 0.5 * len(ids), out.stats.to_dict()
    # on the 2-core CPU's curve a 2-token pass costs 1.8 plain steps: at the prior acceptance
    # (1 in 2) a lookup cannot pay, so it sits out
    dear = replay_ids(tokenizer, BEFORE, ids, prices=CostModel(LLAMACPP_2CORE_CURVE))
    assert dear.token_ids == ids and dear.stats.by_source["ngram"].proposed == 0


def test_cost_model():
    assert step_cost(1, 1.16) == 1.0 and step_cost(8, 1.16) == pytest.approx(1.16)
    assert projected_speedup(10, [1] * 10, 1.16) == pytest.approx(1.0)
    assert projected_speedup(16, [8, 8], 1.16) == pytest.approx(16 / 2.32)
    assert projected_speedup(16, [8, 8], 1.0) == pytest.approx(8.0)


def test_aggregate_is_ratio_of_sums(tokenizer):
    a, b = replay(tokenizer, BEFORE, BEFORE), replay(tokenizer, BEFORE, edited(BEFORE))
    agg = aggregate([a, b])
    assert agg["output_tokens"] == a.output_tokens + b.output_tokens
    assert agg["tokens_per_step"] == pytest.approx(agg["output_tokens"] / (a.steps + b.steps))
    assert agg["rejected"] == a.rejected + b.rejected


def test_cli_replay(tokenizer, tmp_path, capsys):
    (tmp_path / "before.py").write_text(BEFORE)
    (tmp_path / "after.py").write_text(edited(BEFORE))
    rc = main(
        [
            "replay",
            "--prediction",
            str(tmp_path / "before.py"),
            "--output",
            str(tmp_path / "after.py"),
            "--model",
            tokenizer.folder,
            "--cost-ratio",
            "1.5",
            "--json",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cost_ratio"] == 1.5 and d["exact"] and d["accepted"] + d["rejected"] == d["proposed"]
    assert d["projected_speedup"] > 1.0
    rc = main(
        [
            "replay",
            "--prediction",
            str(tmp_path / "before.py"),
            "--output",
            str(tmp_path / "after.py"),
            "--model",
            tokenizer.folder,
        ]
    )
    assert rc == 0 and "tokens per step" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags",
    [
        ["--cost-ratio", "nan"],
        ["--cost-ratio", "inf"],
        ["--curve", "1:1,8:inf"],
        ["--curve", "1:1,8:6,8:7"],  # one count twice: a ZeroDivisionError traceback
        ["--curve", "2:1,8:6"],
    ],
)
def test_cli_replay_refuses_numbers_that_are_not_finite(tokenizer, tmp_path, capsys, flags):
    """They used to print a `nanx` speedup and exit 0, or a traceback."""
    (tmp_path / "before.py").write_text(BEFORE)
    (tmp_path / "after.py").write_text(edited(BEFORE))
    files = ["--prediction", str(tmp_path / "before.py"), "--output", str(tmp_path / "after.py")]
    assert main(["replay", *files, "--model", tokenizer.folder, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specserve: error:") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--bench", "bench.json"],
            "--bench replays a bench report's own runs with its own prices: it does not take --prediction, --output",
        ),
        (["--bench", "bench.json", "--cost-ratio", "2"], "does not take --prediction, --output, --cost-ratio"),
        (["--cost-ratio", "2", "--curve", "1:1,8:2"], "--curve and --cost-ratio each set the cost of verifying"),
        (["--cost-ratio", "2", "--measure-cost"], "--cost-ratio and --measure-cost each set the cost of verifying"),
    ],
)
def test_cli_replay_refuses_flags_it_would_ignore(tokenizer, tmp_path, capsys, flags, message):
    """--bench silently replayed the report and not the files given beside it, and --curve (or
    --cost-ratio) silently won over the other cost flags, --measure-cost loading a model for nothing."""
    (tmp_path / "before.py").write_text(BEFORE)
    files = ["--prediction", str(tmp_path / "before.py"), "--output", str(tmp_path / "before.py")]
    assert main(["replay", *files, "--model", tokenizer.folder, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_cli_replay_names_the_file_it_cannot_read(tokenizer, tmp_path, capsys):
    """A binary --prediction was "'utf-8' codec can't decode byte ...", naming no file."""
    (tmp_path / "binary").write_bytes(b"\x00\xcc\xff" * 10)
    (tmp_path / "after.py").write_text(BEFORE)
    for flag, path, message in [
        ("--prediction", tmp_path / "binary", f"--prediction {tmp_path / 'binary'}: not UTF-8 text (byte 1)"),
        ("--prediction", tmp_path / "missing.py", f"cannot read --prediction {tmp_path / 'missing.py'}: No such file"),
    ]:
        assert (
            main(["replay", flag, str(path), "--output", str(tmp_path / "after.py"), "--model", tokenizer.folder]) == 2
        )
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "runs, message",
    [
        ([{"mode": "prediction"}], "not a bench report this version reads (no 'skipped' in it)"),
        (5, "not a bench report this version reads ('int' object is not iterable)"),
        (
            [{"mode": "prediction", "skipped": None, "output_ids": [1], "speedup": 2.0, "scenario": "gone"}],
            "its scenario 'gone' is not one of this version's",
        ),
        (
            [{"mode": "prediction", "skipped": None, "output_ids": [1], "speedup": None, "scenario": "py-rename"}],
            "no prediction run with its output ids and a measured speedup",
        ),
    ],
)
def test_cli_replay_bench_refuses_a_report_it_cannot_read(tokenizer, tmp_path, capsys, runs, message):
    """A run missing a field or from a scenario this version lacks was a KeyError traceback, and a
    report whose only prediction run had no speedup (one emission) was said to have no output ids."""
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"environment": {"model": tokenizer.folder, "cost_curve": "1:1,8:2"}, "runs": runs}))
    assert main(["replay", "--bench", str(report)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_auto_is_priced_by_the_cost_ratio_not_by_timing_the_oracle(tokenizer):
    """`auto` needs prices; replay gives it the linear model of the cost ratio. Timing the oracle
    instead (its cost grows with every row it fills) cut its drafts short."""
    from specserve.bench.replay import linear_prices
    from specserve.config import SpeculationConfig

    after = edited(BEFORE)
    auto = replay(tokenizer, BEFORE, after, cost_ratio=1.16, spec=SpeculationConfig("auto"))
    given = replay(tokenizer, BEFORE, after, spec=SpeculationConfig("auto"), prices=linear_prices(1.16))
    assert auto.exact and auto.step_sizes == given.step_sizes
    assert max(auto.step_sizes) > 64
    assert auto.cost_ratio == pytest.approx(1.16)


def test_copy_ceiling_copies_runs_from_anywhere_in_the_prediction():
    import random

    from specserve.bench.replay import _longest_matches, copy_ceiling

    pred = list(range(100))
    out = pred[:40] + [500, 501, 502] + pred[40:70] + pred[75:]  # 3 tokens inserted, 5 deleted
    # steps: 40 copied + 500 | 501 | 502 | 30 copied + 75 | 24 copied (the last run)
    assert copy_ceiling(pred, out) == 5
    assert copy_ceiling(pred, out, k_max=9) == 4 + 3 + 3 + 3  # 10 a step; the new tokens one each
    assert copy_ceiling(pred, pred) == 1 and copy_ceiling([], [7, 8]) == 2
    moved = pred[50:] + pred[:50]  # a moved block is copied, not written anew
    assert copy_ceiling(pred, moved) == 2
    rng = random.Random(0)  # matching statistics against brute force
    for _ in range(50):
        text = [rng.randrange(3) for _ in range(rng.randrange(0, 30))]
        query = [rng.randrange(3) for _ in range(rng.randrange(1, 30))]

        def occurs(run, text=text):
            return any(text[i : i + len(run)] == run for i in range(len(text) - len(run) + 1))

        brute = [max(n for n in range(len(query) - j + 1) if occurs(query[j : j + n])) for j in range(len(query))]
        assert _longest_matches(text, query) == brute


def test_a_bench_report_is_replayed_with_the_curve_it_drafted_with(tokenizer):
    """`replay --bench` drafts with the report's own cost curve: a report made by an engine that
    drafted with one curve is replayed step for step, and the same output under another curve
    takes other steps (so the curve is read, not assumed)."""
    from specserve.bench.curves import format_curve
    from specserve.bench.replay_check import check_report, prediction_of
    from specserve.bench.runner import load_scenarios

    scenario = next(s for s in load_scenarios()[1] if s.name == "py-rename")
    prediction = prediction_of(scenario.code, 200)  # the bench cut the file's last 200 lines
    output = prediction.replace("UserService", "UserRepository").replace("user_service", "user_repository")
    ids = tokenizer.encode(output, add_special_tokens=False)

    def report(curve: CostModel, measured_with: CostModel) -> dict:
        ran = replay_ids(tokenizer, prediction, ids, prices=measured_with)  # stands in for the bench's engine
        run = {
            "scenario": "py-rename",
            "mode": "prediction",
            "skipped": None,
            "trimmed_lines": 200,
            "output_ids": ids,
            "speedup": 2.0,
            "acceptance_rate": ran.stats.acceptance_rate,
            "stats": {"steps": ran.stats.steps},
        }
        return {"environment": {"cost_curve": format_curve(curve)}, "runs": [run]}

    steep, flat = CostModel(LLAMACPP_2CORE_CURVE), CostModel.linear(0.02)
    [same] = check_report(report(steep, steep), tokenizer)
    assert same.exact and same.replay_steps == same.bench_steps
    assert same.projected == pytest.approx(projected_speedup_of(tokenizer, prediction, ids, steep))
    assert same.error == pytest.approx(same.projected / 2.0 - 1)
    [other] = check_report(report(flat, steep), tokenizer)
    assert other.replay_steps != other.bench_steps
    with pytest.raises(ValueError, match="cost_curve"):
        check_report({"environment": {"cost_curve": None}, "runs": []}, tokenizer)


def test_a_report_with_a_context_cost_prices_each_pass_at_the_context_it_read(tokenizer):
    """Every pass is priced at the cache it read (the bench's prompt plus what was committed
    before it), plain decoding at the middle of its own timed tokens, and the curve alone is
    still shown: checked against the sums done here by hand."""
    from dataclasses import asdict

    from specserve.bench.curves import format_curve
    from specserve.bench.replay_check import check_report, prediction_of
    from specserve.bench.runner import load_scenarios
    from specserve.engine.governor import ContextCost

    scenario = next(s for s in load_scenarios()[1] if s.name == "py-rename")
    prediction = prediction_of(scenario.code, 200)
    ids = tokenizer.encode(prediction.replace("UserService", "UserRepository"), add_special_tokens=False)
    prices = CostModel(LLAMACPP_2CORE_CURVE)
    cc = ContextCost(per_pair=3e-5, per_cached=6e-5, cached=2048)
    run = {
        "scenario": "py-rename",
        "mode": "prediction",
        "skipped": None,
        "trimmed_lines": 200,
        "prompt_tokens": 3000,
        "output_ids": ids,
        "speedup": 2.0,
        "acceptance_rate": None,
        "stats": {"steps": 0},
    }
    plain = {"scenario": "py-rename", "mode": "plain", "output_tokens": 128}
    env = {"cost_curve": format_curve(prices), "context_cost": asdict(cc)}
    [c] = check_report({"environment": env, "runs": [plain, run]}, tokenizer)
    steps = replay_ids(tokenizer, prediction, ids, prices=prices).steps
    cost, cached = 0.0, 3000
    for st in steps:
        n = st["proposed"] + 1
        cost += prices.target(n) + (6e-5 * (cached - 32) if n == 1 else 3e-5 * n * (cached - 32))
        cached += st["committed"]
    assert c.projected == pytest.approx(len(ids) * (1 + 6e-5 * (3000 + 64 - 32)) / cost)
    assert c.projected_curve == pytest.approx(projected_speedup_of(tokenizer, prediction, ids, prices))
    assert c.projected < c.projected_curve  # these passes read 3k+ tokens; plain's one-token steps pay less for it
    [bare] = check_report({"environment": {"cost_curve": env["cost_curve"]}, "runs": [plain, run]}, tokenizer)
    assert bare.projected == pytest.approx(c.projected_curve) and bare.projected_curve is None


def test_the_context_cost_is_what_a_long_cache_adds_per_cached_token(monkeypatch):
    """measure_context_cost's arithmetic on timed passes given here (no clock in a unit test):
    a one-token step 31 ms after 32 cached tokens and 41 ms after 2048; a 64-token pass 580 and
    720 ms. A long cache that times faster (noise) costs nothing, never less."""
    from specserve.engine import governor

    times = {32: [0.031, 0.580], 2048: [0.041, 0.720]}
    monkeypatch.setattr(governor, "_time_passes", lambda runner, sizes, context: times[context])
    cc = governor.measure_context_cost(object(), 2048)
    assert cc.per_cached == pytest.approx(0.010 / 0.031 / 2016)
    assert cc.per_pair == pytest.approx(0.140 / 0.031 / (64 * 2016))
    assert cc.extra(1, 1032) == pytest.approx(cc.per_cached * 1000)
    assert cc.extra(10, 1032) == pytest.approx(cc.per_pair * 10 * 1000) and cc.extra(10, 20) == 0
    times[2048] = [0.030, 0.500]
    assert governor.measure_context_cost(object(), 2048) == governor.ContextCost(0.0, 0.0, 2048)
    assert governor.measure_context_cost(object(), 32) == governor.ContextCost(0.0, 0.0, 32)


def projected_speedup_of(tokenizer, prediction: str, ids: list[int], prices: CostModel) -> float:
    """Plain passes over priced speculative passes, straight from a replay's step trace."""
    out = replay_ids(tokenizer, prediction, ids, prices=prices)
    return len(ids) / sum(prices.target(st["proposed"] + 1) for st in out.steps)


def test_input_files_are_read_byte_for_byte(tmp_path):
    """A CRLF edit is replayed on the CRLF text (read_text made its line ends '\n')."""
    from specserve.cli.replay import read_input

    path = tmp_path / "before.py"
    path.write_bytes(b"a = 1\r\nb = 2\r\n")
    assert read_input(path, "--prediction") == "a = 1\r\nb = 2\r\n"


def test_cli_replay_offers_no_draft_method(tokenizer, tmp_path, capsys):
    """replay loads only a tokenizer and has no --draft-model, yet its --method listed `draft`; chosen, it
    failed with "load one with draft_model=...", an argument of the Python API the command does not take."""
    (tmp_path / "before.py").write_text(BEFORE)
    files = ["--prediction", str(tmp_path / "before.py"), "--output", str(tmp_path / "before.py")]
    assert main(["replay", *files, "--model", tokenizer.folder, "--method", "draft"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'draft'" in err and "draft_model" not in err and len(err.splitlines()) == 1, err


def test_a_pack_pulled_for_its_tokenizer_is_announced_with_its_size(tmp_path, monkeypatch, capsys):
    """Replay loads only a tokenizer, but a pack that is not cached is pulled whole for it: the
    default 1.5B pack was 1 GB downloaded without a word of why. A cached pack, or a folder, is
    read as before, without the line."""
    import specserve.models.packs as packs
    from specserve.cli.replay import pull_notice
    from specserve.errors import ModelLoadError

    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "home"))  # nothing cached there
    pulled = []

    def offline(name, *args, **kwargs):
        pulled.append(name)
        raise ModelLoadError(f"cannot download {name}: offline")

    monkeypatch.setattr(packs, "pull", offline)
    files = [tmp_path / "before.py", tmp_path / "after.py"]
    for f in files:
        f.write_text("def f():\n    return 1\n")
    assert main(["replay", "--prediction", str(files[0]), "--output", str(files[1])]) == 2
    err = capsys.readouterr().err
    assert pulled == ["qwen2.5-coder-1.5b-instruct"]
    assert "replay reads only qwen2.5-coder-1.5b-instruct's tokenizer" in err and "1066 MiB" in err
    assert err.index("1066 MiB") < err.index("offline")  # said before the pull starts
    monkeypatch.setattr(packs, "is_cached", lambda name, home=None: tmp_path)
    assert pull_notice(None) is None and pull_notice("smollm2-135m-instruct") is None
    assert pull_notice(str(tmp_path)) is None  # a folder is no pack
