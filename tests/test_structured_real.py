"""Structured outputs and a forced tool call on real weights: SmolLM2-135M-Instruct, float32.

A byte-level BPE vocabulary (49k tokens) and a real model that writes JSON on its own: the
output must validate, be identical with speculation off and on, and a prediction that is the
answer itself must be accepted in bulk. SmolLM2's template has no tools support, so the forced
call also exercises the fallback templating.
"""

import json

import jsonschema
import pytest

from specserve import SamplingParams
from specserve.engine.constrain import GrammarSpec
from specserve.llm import LLM
from specserve.server.structured import tool_guide, tool_setup
from specserve.server.tools import parse_tool_calls

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Ada, a 36 year old programmer who knows Python and C, as JSON."}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def llm(smol_model_dir):
    return LLM(model=str(smol_model_dir), dtype="float32")


def test_json_schema_exact_across_drafters_and_bulk_prediction(llm):
    prompt = llm.apply_chat_template(ASK)
    guide = llm.compile_guide(GrammarSpec("json_schema", SCHEMA))
    params = SamplingParams(max_tokens=80)
    base = llm.generate(prompt, params, speculation="none", guide=guide)
    assert base.finish_reason == "stop", base.text
    jsonschema.validate(json.loads(base.text), SCHEMA)
    for method in ("ngram", "prediction"):
        out = llm.generate(prompt, params, prediction=base.text, speculation=method, guide=guide)
        assert out.token_ids == base.token_ids, (method, out.text)
    # The text re-tokenizes canonically ('{"' as one token) where the constrained model wrote '{' '"':
    # those few positions are rejected. The same tokens as ids are accepted whole (K = 8, 16, 32).
    exact = llm.generate(prompt, params, prediction=base.token_ids, speculation="prediction", guide=guide)
    assert exact.token_ids == base.token_ids and exact.stats.by_source["prediction"].rejected == 0
    assert exact.stats.steps <= 4, exact.steps


def test_forced_tool_call_with_fallback_template(llm):
    setup = tool_setup([TOOL], "required", None)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = llm.apply_chat_template(msgs, setup.tools)
    out = llm.generate(
        prompt, SamplingParams(max_tokens=60), speculation="ngram", guide=llm.compile_guide(tool_guide(setup))
    )
    _, calls = parse_tool_calls(out.text)
    assert out.finish_reason == "stop" and len(calls) == 1, out.text
    jsonschema.validate(json.loads(calls[0].arguments), TOOL["function"]["parameters"])
