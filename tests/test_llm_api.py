"""The Python API as a vLLM user meets it: vLLM's prompt and chat shapes, bad arguments refused
by name (never a deep TypeError from inside the engine), and what an LLM holds once a call ends,
however it ends (an interrupt, close(), a `with` block)."""

from __future__ import annotations

import functools

import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM, SamplingParams

PROMPT = "def add(a, b):"
CONV = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "add two numbers"},
]
FEW = SamplingParams(max_tokens=6)


@functools.lru_cache(maxsize=1)
def llm() -> LLM:
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def held(model: LLM) -> tuple[int, int, int, int]:
    """(running, waiting, queued, reserved cells): all 0 when no request holds anything."""
    core = model.engine.core
    return len(core.scheduler.running), len(core.scheduler.waiting), len(core._incoming), core.scheduler.reserved


# -- sampling parameters ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,words",
    [
        ({"stop": 5}, "stop must be a string or a list of strings"),
        ({"logit_bias": {"a": 1}}, "logit_bias must map token ids to numbers"),
        ({"logit_bias": [1, 2]}, "logit_bias must map token ids to numbers"),
        ({"logit_bias": {5: "x"}}, "logit_bias must map token ids to numbers"),
        ({"logit_bias": {1.5: 1}}, "logit_bias must map token ids to numbers"),
        ({"ignore_eos": "false"}, "ignore_eos must be True or False"),
    ],
)
def test_sampling_params_of_a_wrong_shape_say_which(kw, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kw)


def test_sampling_params_still_take_openais_string_ids_and_pairs():
    assert SamplingParams(logit_bias={"5": 2}).logit_bias == ((5, 2.0),)
    assert SamplingParams(logit_bias=[(7, -1), (3, 1)]).logit_bias == ((3, 1.0), (7, -1.0))
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop=["a", "b"]).stop == ("a", "b")


# -- what a call leaves behind ----------------------------------------------------------------
def test_an_interrupted_generate_frees_its_requests(monkeypatch):
    core, steps = llm().engine.core, []
    step = core.step

    def interrupted():
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt  # Ctrl-C in a notebook, mid-batch
        step()

    monkeypatch.setattr(core, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm().generate([PROMPT, "class Stack:"], SamplingParams(max_tokens=50))
    monkeypatch.undo()
    assert held(llm()) == (0, 0, 0, 0)  # they held their cells, and ran on inside later calls
    alone = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none").generate("import os", FEW)
    out = llm().generate("import os", FEW)
    assert out.token_ids == alone.token_ids and held(llm()) == (0, 0, 0, 0)


def test_an_error_in_the_users_stream_loop_frees_the_request_and_the_llm_goes_on():
    with pytest.raises(RuntimeError):
        for i, _ in enumerate(llm().stream(PROMPT, SamplingParams(max_tokens=50))):
            if i == 2:
                raise RuntimeError("the user's own bug")
    assert held(llm()) == (0, 0, 0, 0)
    with pytest.raises(ValueError):
        llm().generate(PROMPT, SamplingParams(max_tokens=50, logit_bias={10**6: 1}))
    assert llm().generate(PROMPT, FEW).finish_reason == "length" and held(llm()) == (0, 0, 0, 0)
