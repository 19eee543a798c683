"""`auto` without a prediction drafts from the prompt's code once the output copies it.

The replay oracle plays a target that answers an edit request with the whole updated file (as
aider's "whole" format asks); the tiny f32 models show the path lossless.
"""

from __future__ import annotations

import statistics

import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.bench.curves import LLAMACPP_2CORE_CURVE
from specserve.bench.replay import replay
from specserve.config import SpeculationConfig
from specserve.engine.governor import CostModel
from specserve.llm import LLM
from specserve.proposers.prompt import prompt_code

CURVE = CostModel(LLAMACPP_2CORE_CURVE)
BEFORE = "".join(
    f"def handler_{i}(request):\n    svc = UserService(request.db)\n"
    f"    data = svc.load(request.user_id, page={i})\n    return render(data)\n\n"
    for i in range(30)
)
AFTER = BEFORE.replace("UserService", "UserRepository")
PROMPT = (
    "<|im_start|>user\nRename UserService to UserRepository. Reply with the whole file.\n\n"
    f"```python\n{BEFORE}```<|im_end|>\n<|im_start|>assistant\n"
)
ANSWER = f"```python\n{AFTER}```"


def test_prompt_code():
    assert prompt_code("Fix it:\n```py\nx = 1\n```\nand\n```\ny = 2\n```") == "x = 1\n\ny = 2\n"
    assert prompt_code("no code here, just a question") == ""
    long = "".join(f"line {i}\n" for i in range(30))
    assert prompt_code(long) == long  # no fence, but a long run of lines
    assert prompt_code("```\nunterminated\n") == "unterminated\n"


def test_whole_file_answer_without_prediction_reaches_the_prediction_speed():
    tok = tiny_tokenizer()
    with_prediction = replay(tok, BEFORE, ANSWER, spec=SpeculationConfig("prediction"), prices=CURVE, prompt=PROMPT)
    auto = replay(tok, None, ANSWER, spec=SpeculationConfig("auto"), prices=CURVE, prompt=PROMPT)
    ngram = replay(tok, None, ANSWER, spec=SpeculationConfig("ngram"), prices=CURVE, prompt=PROMPT)
    assert with_prediction.exact and auto.exact and ngram.exact
    assert auto.projected_speedup >= 0.8 * with_prediction.projected_speedup  # the target
    assert auto.projected_speedup > 1.5 * ngram.projected_speedup  # what `auto` did before: n-gram lookup


def test_prompt_source_counts_apart_and_steps_aside_for_a_prediction():
    tok = tiny_tokenizer()
    from specserve.bench.replay import replay_ids

    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    ids = tok.encode(ANSWER, add_special_tokens=False)
    auto = replay_ids(tok, None, ids, SpeculationConfig("auto"), CURVE, prompt_ids)
    s = auto.stats.by_source
    assert s["prompt"].accepted > 0.8 * len(ids) and s["prediction"].proposed == 0
    given = replay_ids(tok, BEFORE, ids, SpeculationConfig("auto"), CURVE, prompt_ids)
    assert given.stats.by_source["prompt"].proposed == 0 and given.stats.by_source["prediction"].accepted > 0
    # an explicit method never drafts from the prompt
    assert (
        replay_ids(tok, None, ids, SpeculationConfig("ngram"), CURVE, prompt_ids).stats.by_source["prompt"].proposed
        == 0
    )


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_prompt_drafting_is_lossless_f32(kind):
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model(kind, seed=0), tok, name=kind)
    params = SamplingParams(max_tokens=120)
    earlier = llm.generate("import os\n", params, speculation="none").text  # text the model tends to write
    drafted = 0
    for prompt in (f"Copy this:\n```python\n{earlier}\n```\n", f"```\n{earlier}\n```\nimport os\n", "What is 2 + 2?"):
        base = llm.generate(prompt, params, speculation="none")
        out = llm.generate(prompt, params, speculation="auto")
        assert out.token_ids == base.token_ids and out.text == base.text
        drafted += out.stats.by_source["prompt"].proposed
    assert drafted > 0  # the prompt path was exercised


GAPS = [  # short new code that reuses bits of BEFORE and then leaves them, as an infilled gap does
    "    svc = UserService(request.db)\n    return svc\n",
    "    data = svc.load(request.user_id, page=0)\n    return data\n",
    "def handler_99(request):\n    return None\n",
    "    return render(data, status=404)\n",
    "    svc = UserService(request.db, cache=True)\n",
    "def handler_7(request, user):\n    svc = UserService(user.db)\n",
]


def test_short_new_code_that_echoes_the_prompt_costs_no_more_than_plain():
    """Each echo anchors the prompt drafter, and a long draft from it is wasted. Priced by the
    2-core CPU's curve (a 16-token pass costs about 5 plain steps), `auto` must not lose to plain
    decoding on such gaps (issue 15: `auto` never loses). The prompt drafter that drafted like a
    caller's prediction (probing every short anchor, a young run priced at one divergence in 16
    tokens) projected 0.96x here."""
    tok = tiny_tokenizer()
    runs = [replay(tok, None, gap, spec=SpeculationConfig("auto"), prices=CURVE, prompt=PROMPT) for gap in GAPS]
    assert all(r.exact for r in runs)
    assert statistics.geometric_mean(r.projected_speedup for r in runs) >= 0.98


def test_the_prompt_code_is_read_when_the_request_is_made_not_on_the_worker():
    """The server makes engine requests on its prep thread; reading a long prompt's code there
    keeps that work (about 10 ms for 3.5k tokens) from stalling every request in a step."""
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model("qwen2", seed=0), tok, name="qwen2")
    code = "".join(BEFORE.splitlines(keepends=True)[:10])
    req = llm.request(f"Fix this:\n```python\n{code}```\n", SamplingParams(max_tokens=8), speculation="auto")
    (source,) = [p for p in req.chain if p.name == "prompt"]
    assert source.text == code  # read before any step ran
