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
