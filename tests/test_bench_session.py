"""`specserve bench --session` on the SmolLM2-135M pack: a 4-turn conversation run with the prefix
cache, without it, and by llama-cpp-python's `Llama` (llama.cpp). The cache must reuse exactly the
prefix the conversation shares with the earlier turns, the answers must not depend on the cache on
exact settings, and the JSON / Markdown / PNG must carry every turn's figures. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from specserve.bench.session import (
    RUNS,
    SYSTEM,
    SessionOptions,
    code_of,
    first_message,
    fit_file,
    run_session,
    sample_file,
    script,
)
from specserve.cli.main import main
from specserve.errors import InvalidRequestError
from specserve.llm import LLM

# Small enough for CI: a first prompt of under 100 tokens (300 by the last turn), 8 output tokens per turn.
SMALL = ["--quick", "--threads", "1", "--max-prompt-tokens", "96", "--max-tokens", "8"]


def _session(args: list[str], out) -> tuple[int, dict]:
    rc = main(["bench", "--session", *SMALL, *args, "--out", str(out)])
    return rc, json.loads((out / "session.json").read_text())


def _run(data: dict, name: str) -> dict:
    return next(r for r in data["runs"] if r["name"] == name)


@pytest.fixture(scope="module")
def llamacpp_session(smol_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("session-llamacpp")
    rc, data = _session(["--model", str(smol_gguf), "--exact"], out)
    return rc, data, out


@pytest.fixture(scope="module")
def transformers_session(smol_hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("session-hf")
    rc, data = _session(["--model", str(smol_hf_dir), "--dtype", "float32"], out)
    return rc, data, out


def _check_reuse(data: dict) -> None:
    on, off = _run(data, "cache on"), _run(data, "cache off")
    assert [t["kind"] for t in on["turns"]] == ["question", "edit", "edit", "question"]
    assert on["prefix_cache"] is True and off["prefix_cache"] is False
    assert on["turns"][0]["cached_tokens"] == 0
    for prev, t in zip(on["turns"], on["turns"][1:]):
        # the template keeps the earlier turn's prompt and answer at the start of this one: the
        # reusable prefix covers them, and the cache reuses all of it (but the last output token,
        # which is fed back only when a draft pass verified it)
        assert t["reusable_tokens"] >= prev["prompt_tokens"] + prev["completion_tokens"] - 1
        assert t["reusable_tokens"] - 1 <= t["cached_tokens"] <= t["reusable_tokens"], t["turn"]
    assert all(t["cached_tokens"] == 0 for t in off["turns"])
    assert [t["prompt_tokens"] for t in off["turns"]] == [t["prompt_tokens"] for t in on["turns"]]


def _check_equal(data: dict) -> None:
    on, off = _run(data, "cache on"), _run(data, "cache off")
    for a, b in zip(on["turns"], off["turns"], strict=True):
        assert b["token_ids"] == a["token_ids"] and b["text"] == a["text"], a["turn"]
        assert b["same_as_cache_on"] is True
        assert a["completion_tokens"] == len(a["token_ids"]) > 0


def test_llamacpp_cache_reuses_the_conversation(llamacpp_session):
    rc, data, _ = llamacpp_session
    assert rc == 0
    assert data["environment"]["backend"] == "llama.cpp" and data["environment"]["batch_invariant"] is True
    _check_reuse(data)


def test_llamacpp_answers_do_not_depend_on_the_cache(llamacpp_session):
    _, data, _ = llamacpp_session
    _check_equal(data)


def test_llamacpp_peer_keeps_its_previous_prompt(llamacpp_session):
    """The peer's row: four turns on the same conversation script, never reset between turns, so it
    keeps the whole prefix it shares with the previous turn."""
    _, data, _ = llamacpp_session
    peer = _run(data, "llama-cpp-python")
    assert peer["engine"] == "llama-cpp-python" and peer["skipped"] is None
    assert [t["kind"] for t in peer["turns"]] == ["question", "edit", "edit", "question"]
    assert peer["turns"][0]["cached_tokens"] == 0
    for t in peer["turns"][1:]:  # `generate` keeps what it evaluated: not its last sampled token
        assert t["reusable_tokens"] - 1 <= t["cached_tokens"] <= t["reusable_tokens"], t["turn"]
        assert t["cached_tokens"] > 0
    assert all(t["completion_tokens"] > 0 and t["latency"] > 0 for t in peer["turns"])


def test_outputs_carry_every_turn(llamacpp_session):
    _, data, out = llamacpp_session
    assert [r["name"] for r in data["runs"]] == list(RUNS)
    md = (out / "session.md").read_text()
    for r in data["runs"]:
        tot = r["totals"]
        assert tot["prompt_tokens"] == sum(t["prompt_tokens"] for t in r["turns"])
        assert tot["cached_tokens"] == sum(t["cached_tokens"] for t in r["turns"])
        assert tot["completion_tokens"] == sum(t["completion_tokens"] for t in r["turns"])
        assert tot["time"] == pytest.approx(sum(t["latency"] for t in r["turns"]), abs=1e-3)
        for t in r["turns"]:
            assert t["ttft"] is not None and 0 < t["ttft"] <= t["latency"]
            row = (
                f"| {r['name']} | {t['turn']} | {t['kind']} | {t['prompt_tokens']} | {t['cached_tokens']} | "
                f"{t['reusable_tokens']} | {t['completion_tokens']} | {t['finish_reason']} | {t['ttft']:.2f} | "
                f"{t['latency']:.2f} |"
            )
            assert row in md, row
        assert f"| {r['name']} | {tot['time']:.2f} | {tot['ttft']:.2f} | {tot['prompt_tokens']} | " in md
    png = (out / "session.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_transformers_float32_session(transformers_session):
    """On transformers in float32 the cache copies exact KV slices: same reuse, same answers; the
    llama-cpp-python peer does not apply and says why."""
    rc, data, _ = transformers_session
    assert rc == 0
    assert data["environment"]["backend"] == "transformers" and data["environment"]["dtype"] == "float32"
    _check_reuse(data)
    _check_equal(data)
    peer = _run(data, "llama-cpp-python")
    assert peer["skipped"] == "runs on the llama.cpp backend only" and peer["turns"] == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--concurrency", "1,2"], "--session runs its own script: it does not take --concurrency"),
        (["--scenarios", "py-rename"], "it does not take --scenarios"),
        (["--no-prefix-cache"], "it does not take --no-prefix-cache"),
        (["--peers", "hf"], "--session has one peer, llama.cpp"),
        (["--session", "nope"], "unknown session 'nope'; choose from users, orders"),
    ],
)
def test_bad_combinations_fail_in_one_line(extra, message, capsys, tmp_path):
    rc = main(["bench", "--session", *extra, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and message in err and "\n" not in err
    assert not (tmp_path / "session.json").exists()


def test_code_of_an_edit_answer():
    assert code_of("```python\nx = 1\n```") == "x = 1\n"
    assert code_of("Here it is:\n```ts\nlet a = 1;\n```\nDone.") == "let a = 1;\n"
    assert code_of("```python\nx = 1\ny = 2") == "x = 1\ny = 2\n"  # capped: the fence never closes
    assert code_of("x = 1") == "x = 1\n"


class _FirstTurnDone(Exception):
    pass


def _first_turn(llm, opts: SessionOptions, name: str, code: str):
    """Turn 1 of the session (the later turns, with longer prompts, are not run)."""

    def stop(run):
        raise _FirstTurnDone(run.turns)

    with pytest.raises(_FirstTurnDone) as done:
        run_session(llm, opts, name, code, stop)
    return done.value.args[0][0]


def test_a_turn_that_fills_the_context_exactly_runs(smol_gguf, capsys, tmp_path):
    """The check before each turn refused prompt + max_tokens == the context, which the engine (and
    the server, and the peer's `Llama`) serve: the last token written is never fed back. Now a turn
    that fits exactly runs, and one token more is refused in one line before anything runs."""
    opts = SessionOptions(max_tokens=8)
    s = script(opts.script)
    with LLM(model=str(smol_gguf), threads=1, exact=True, max_context=512) as probe:
        code = fit_file(probe, s, sample_file(s), 300)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first_message(s, code)}]
        prompt = len(probe.apply_chat_template(messages))
    fits = prompt + opts.cap("question")
    with LLM(model=str(smol_gguf), threads=1, exact=True, max_context=fits) as llm:
        assert llm.max_context == fits
        for name in (RUNS[0], RUNS[2]):  # ours and the peer, each sized to the context
            turn = _first_turn(llm, opts, name, code)
            assert turn.prompt_tokens == prompt
            assert turn.completion_tokens == opts.cap("question") and turn.finish_reason == "length"  # to the last cell
    too_small = (
        rf"^session turn 1: the prompt \({prompt} tokens\) \+ max_tokens 8 do not fit the context \({fits - 1}\)"
    )
    small = LLM(model=str(smol_gguf), threads=1, exact=True, max_context=fits - 1)
    with small, pytest.raises(InvalidRequestError, match=too_small):
        run_session(small, opts, RUNS[0], code)
    flags = [
        "--quick",
        "--threads",
        "1",
        "--exact",
        "--max-prompt-tokens",
        "300",
        "--max-tokens",
        "8",
        "--peers",
        "none",
    ]
    rc = main(
        [
            "bench",
            "--session",
            *flags,
            "--model",
            str(smol_gguf),
            "--max-context",
            str(fits - 1),
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and err[-1].startswith("specserve: error: session turn 1: ") and "Traceback" not in "".join(err)
