"""generate's range errors name the flag the user typed, not the config field behind it."""

from __future__ import annotations

import pytest

from specserve.cli.main import main
from specserve.config import SamplingParams

CASES = [
    (["--top-p", "2"], "--top-p must be in [0, 1], got 2.0"),
    (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    (["--temperature", "-1"], "--temperature must be in [0, 100], got -1.0"),
    (["--top-k", "-5"], "--top-k must be >= 0 (0 or -1: off), got -5"),
    (["--seed", str(2**64)], f"--seed must be in [{-(2**63)}, {2**63 - 1}] (a 64-bit integer), got {2**64}"),
    (["--stop", ""], "--stop strings must be non-empty"),
    (["-k", "0"], "-k/--num-speculative-tokens must be in [1, 256], got 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--gpu-layers", "-2"], "--gpu-layers must be 0 or more (leave it out for all), got -2"),
    (["--max-context", "10"], "--max-context must be at least 256 tokens, got 10"),
    (["--device", "foo"], "--device must be cpu, cuda, cuda:N or mps, got 'foo'"),
]


@pytest.mark.parametrize("flags,message", CASES, ids=[flags[0] for flags, _ in CASES])
def test_generate_range_errors_name_the_flag(flags, message, capsys):
    """Checked before the model path (and before any model loads): the mistyped value is the first error."""
    code = main(["generate", "hello", "--model", "/nonexistent/model", *flags])
    assert code == 2
    assert capsys.readouterr().err == f"specserve: error: {message}\n"


@pytest.mark.parametrize("ray", [[], ["--ray"]])
def test_serve_names_both_flags_of_a_two_flag_error(ray, capsys):
    """A second config field in the message is named as its flag too: it said "... must exceed max_num_seqs"."""
    code = main(["serve", "--model", "no-such-pack", "--port", "0", *ray, "--max-num-batched-tokens", "8"])
    assert code == 2
    assert capsys.readouterr().err == (
        "specserve: error: --max-num-batched-tokens must exceed --max-num-seqs "
        "(one pending token each, plus room for prefill)\n"
    )


def test_the_python_api_keeps_its_field_names():
    """The mapping lives in the CLI: the engine (and so the server's 400s) still says top_p."""
    with pytest.raises(ValueError, match=r"^top_p must be in \[0, 1\]"):
        SamplingParams(top_p=2)
