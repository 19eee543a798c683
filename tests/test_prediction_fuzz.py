"""Predicted Outputs, fuzzed: whatever the prediction, the output is plain decoding's.

Predictions are made from the plain greedy output by seeded random edits (insertions, deletions,
substitutions, a rename repeated at every site, truncation, junk or a repeat appended, unicode
spliced in) or are empty, unrelated or the output followed by more. Each case is checked greedy
in float32 token for token (logprobs to rounding), with stop strings and max_tokens that end
inside accepted runs, streamed and not, in one batch with other predictions, and at temperature
> 0 with a seed, where the design promises the same text with or without a prediction. The
usage counts are checked too: accepted prediction tokens never exceed the output, and accepted +
rejected = the prediction tokens proposed.
"""

from __future__ import annotations

import random

import pytest
from tiny import steady_prices, tiny_model, tiny_tokenizer
from tiny_gguf import llamacpp_llms

from specserve import SamplingParams
from specserve.llm import LLM

PROMPTS = ("def add(a, b):", "Le café coûte 3 €. 東京", "class UserController:\n    def get_user(self", "import os\n")
PIECES = ("foo", "user_id", "self", "return", "東京", "é", "\n", "    ", "✓", "café", "(", ":", "日本語テキスト€ü")
EDITS = ("insert", "delete", "substitute", "rename", "truncate", "junk", "unicode", "repeat")


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama.cpp"])
def llm(request, tmp_path_factory):
    """The tiny model on transformers (f32) or as an f32 GGUF on llama.cpp (batch-invariant kernels)."""
    if request.param == "llama.cpp":
        return steady_prices(llamacpp_llms(tmp_path_factory.mktemp("gguf"))[0])[0]
    return steady_prices(LLM.from_models(tiny_model(request.param, seed=0), tiny_tokenizer(), name=request.param))[0]


def edited(rng: random.Random, text: str, edits: int) -> str:
    """`text` with `edits` random edits applied."""
    for _ in range(edits):
        op, n = rng.choice(EDITS), len(text)
        i = rng.randint(0, n)
        j = min(n, i + rng.randint(1, 10))
        if op == "insert":
            text = text[:i] + rng.choice(PIECES) + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "substitute":
            text = text[:i] + rng.choice(PIECES) + text[j:]
        elif op == "rename" and text[i:j].strip():
            text = text.replace(text[i:j], rng.choice(PIECES))  # at every site
        elif op == "truncate":
            text = text[:i]
        elif op == "junk":
            text += "".join(rng.choice(PIECES) for _ in range(4))
        elif op == "unicode":
            text = text[:i] + "日本語テキスト€ü✓🙂" + text[i:]
        elif op == "repeat":
            text += text
    return text


def predictions(rng: random.Random, full: str) -> list[str]:
    """Predictions for an output whose plain continuation (longer than asked) is `full`."""
    return [
        edited(rng, full, 1),
        edited(rng, full, 3),
        full,  # the output and more
        "",
        "zzzz qqqq something unrelated entirely " * 3,
        "🙂✓€ü 日本語テキスト" * 4,
    ]


def check(llm, prompt, params, prediction, method):
    """The output with `prediction` is plain decoding's; the usage counts are consistent."""
    base = llm.generate(prompt, params, speculation="none")
    out = llm.generate(prompt, params, prediction=prediction, speculation=method)
    assert (out.token_ids, out.text, out.finish_reason) == (base.token_ids, base.text, base.finish_reason), prediction
    if params.logprobs is not None:
        for a, b in zip(out.logprobs, base.logprobs, strict=True):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    p = out.stats.by_source["prediction"]
    assert 0 <= p.accepted <= out.stats.output_tokens and p.accepted + p.rejected == p.proposed
    return out


@pytest.mark.parametrize("seed", range(2))
def test_random_predictions_greedy(llm, seed):
    rng = random.Random(seed)
    prompt = PROMPTS[seed]
    full = llm.generate(prompt, SamplingParams(max_tokens=48), speculation="none").text
    for i, prediction in enumerate(predictions(rng, full)):
        params = SamplingParams(max_tokens=rng.randint(1, 40), logprobs=2 if i % 2 else None)
        check(llm, prompt, params, prediction, ("prediction", "auto")[i % 2])


def test_random_predictions_with_stop_strings(llm):
    rng = random.Random(7)
    full = llm.generate(PROMPTS[2], SamplingParams(max_tokens=48), speculation="none").text
    for prediction in (full, edited(rng, full, 2)):
        a = rng.randint(4, len(full) - 6)
        stop = full[a : a + rng.randint(1, 4)]  # ends inside what a good prediction drafts in one step
        out = check(llm, PROMPTS[2], SamplingParams(max_tokens=48, stop=(stop,)), prediction, "prediction")
        assert out.finish_reason == "stop" and out.text == full[: full.index(stop)]


def test_different_predictions_in_one_batch_and_streamed(llm):
    rng = random.Random(3)
    params = SamplingParams(max_tokens=30)
    fulls = [llm.generate(p, SamplingParams(max_tokens=40), speculation="none") for p in PROMPTS]
    preds = [edited(rng, f.text, 2) for f in fulls]
    outs = llm.generate(list(PROMPTS), params, prediction=preds, speculation="prediction")
    for out, full in zip(outs, fulls, strict=True):
        assert out.token_ids == full.token_ids[:30]
    events = list(llm.stream(PROMPTS[1], params, prediction=preds[1], speculation="prediction"))
    assert [t for e in events for t in e.token_ids] == outs[1].token_ids
    assert "".join(e.text for e in events) == outs[1].text
    stop = fulls[3].text[8:11]
    params = SamplingParams(max_tokens=30, stop=(stop,), logprobs=1)
    base = llm.generate(PROMPTS[3], params, speculation="none")
    events = list(llm.stream(PROMPTS[3], params, prediction=fulls[3].text, speculation="prediction"))
    assert "".join(e.text for e in events) == base.text == fulls[3].text[: fulls[3].text.index(stop)]
    assert [lp.token_id for e in events for lp in e.logprobs] == [lp.token_id for lp in base.logprobs]


def test_a_cancelled_request_counts_only_what_it_committed(llm):
    full = llm.generate(PROMPTS[0], SamplingParams(max_tokens=40), speculation="none")
    steps = []
    gen = llm.stream(
        PROMPTS[0], SamplingParams(max_tokens=40), full.text, "prediction", should_cancel=lambda: len(steps) >= 1
    )
    for event in gen:
        steps.append(event)
    out = gen.output
    assert out.finish_reason == "abort" and out.token_ids == full.token_ids[: len(out.token_ids)]
    p = out.stats.by_source["prediction"]
    assert 0 < p.accepted <= len(out.token_ids) and p.accepted + p.rejected == p.proposed


def test_seeded_sampling_gives_the_same_text_with_any_prediction(llm):
    """Temperature > 0 with a seed: each token's random number is fixed by (seed, position), so a
    prediction changes how many passes the text takes, never the text (docs/server.md, seeds)."""
    rng = random.Random(11)
    for seed in range(3):
        params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.95, seed=seed)
        base = llm.generate(PROMPTS[seed], params, speculation="none")
        for prediction in (base.text, edited(rng, base.text, 2), "zzzz unrelated"):
            out = llm.generate(PROMPTS[seed], params, prediction=prediction, speculation="prediction")
            assert out.token_ids == base.token_ids
        assert out.stats.by_source["prediction"].accepted <= len(out.token_ids)
