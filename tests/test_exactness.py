"""Greedy exactness: every speculation method gives token-for-token the plain output (float32).

Tiny random-weight Llama- and Qwen2-shaped models on the transformers backend, and the tiny
Qwen2 model written as an f32 GGUF on the llama.cpp backend; the drafts are made to be accepted for long
stretches (perfect or edited predictions, a draft model with the target's own weights), so that
EOS, stop strings and max_tokens land inside accepted drafts.
"""

import pytest
from tiny import steady_prices, tiny_model, tiny_tokenizer
from tiny_gguf import llamacpp_llms

from specserve import SamplingParams
from specserve.errors import InvalidRequestError
from specserve.llm import LLM

METHODS = ("prediction", "ngram", "draft", "auto")
PROMPTS = ("def add(a, b):", "Le café coûte 3 €. 東京", "class UserController:\n    def get_user(self")


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama.cpp"])
def llms(request, tmp_path_factory):
    """(llm with a different-seed draft model, llm whose draft model is the target itself), with
    steady prices: the drafts' lengths, which some tests count steps by, never depend on timing."""
    kind = request.param
    if kind == "llama.cpp":
        return steady_prices(*llamacpp_llms(tmp_path_factory.mktemp("gguf")))
    tok = tiny_tokenizer()
    target = tiny_model(kind, seed=0)
    other = LLM.from_models(target, tok, tiny_model(kind, seed=1), name=kind)
    same = LLM.from_models(target, tok, tiny_model(kind, seed=0), name=kind)
    return steady_prices(other, same)


def plain(llm, prompt, **kw):
    return llm.generate(prompt, SamplingParams(**({"max_tokens": 48} | kw)), speculation="none")


def check_same(llm, prompt, method, prediction=None, **kw):
    base = plain(llm, prompt, **kw)
    out = llm.generate(prompt, SamplingParams(**({"max_tokens": 48} | kw)), prediction=prediction, speculation=method)
    assert out.token_ids == base.token_ids
    assert out.text == base.text
    assert out.finish_reason == base.finish_reason
    return base, out


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_methods_match_plain(llms, method, prompt):
    other, same = llms
    for llm in (other, same):
        base, out = check_same(llm, prompt, method, prediction=plain(llm, prompt).text)
        assert out.stats.output_tokens == len(base.token_ids)
        assert sum(out.stats.tokens_per_step_hist.values()) == out.stats.steps


def test_perfect_prediction_is_accepted_in_bulk(llms):
    llm, _ = llms
    base = plain(llm, PROMPTS[0], max_tokens=40)
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=40), prediction=base.text, speculation="prediction")
    assert out.token_ids == base.token_ids
    pred = out.stats.by_source["prediction"]
    assert pred.accepted >= len(base.token_ids) - out.stats.steps
    assert out.stats.steps <= 5  # K = 8 at the start, then priced (~96): a 40-token output needs few passes
    assert set(out.token_sources) <= {"prediction", "target"}


def test_draft_model_with_target_weights_accepts_everything(llms):
    _, same = llms
    base, out = check_same(same, PROMPTS[0], "draft")
    d = out.stats.by_source["draft"]
    assert d.proposed > 0 and d.accepted == d.proposed


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13, 29])
def test_max_tokens_inside_accepted_draft(llms, max_tokens):
    llm, same = llms
    full = plain(llm, PROMPTS[1], max_tokens=48).text
    for m in ("prediction", "auto"):
        base, out = check_same(llm, PROMPTS[1], m, prediction=full, max_tokens=max_tokens)
        assert len(out.token_ids) == max_tokens or out.finish_reason == "stop"
    check_same(same, PROMPTS[1], "draft", max_tokens=max_tokens)


def test_stop_string_inside_accepted_draft(llms):
    llm, same = llms
    full = plain(llm, PROMPTS[0], max_tokens=48)
    stop = full.text[20:24]  # ends well inside what a perfect prediction drafts in one step
    assert stop.strip(), "the tiny model produced whitespace; pick another slice"
    for m in METHODS:
        target = same if m == "draft" else llm
        base, out = check_same(target, PROMPTS[0], m, prediction=full.text, stop=(stop, "zzzz-never"))
        assert out.finish_reason == "stop"
        assert stop not in out.text and out.text == full.text[: full.text.index(stop)]


def test_eos_inside_accepted_draft(llms):
    llm, same = llms
    full = plain(llm, PROMPTS[2], max_tokens=40)
    eos = full.token_ids[17]
    for model in (llm, same):
        saved = model.engine.eos_token_ids
        model.engine.eos_token_ids = {eos}
        try:
            for m in METHODS:
                base, out = check_same(model, PROMPTS[2], m, prediction=full.text, max_tokens=40)
                assert out.finish_reason == "stop"
                assert out.token_ids[-1] == eos and eos not in out.token_ids[:-1]
        finally:
            model.engine.eos_token_ids = saved


@pytest.mark.parametrize("prediction", ["", "zzzz totally different text zzzz", None])
def test_useless_predictions(llms, prediction):
    llm, _ = llms
    check_same(llm, PROMPTS[0], "prediction", prediction=prediction)
    check_same(llm, PROMPTS[0], "auto", prediction=prediction)


def test_new_text_is_drafted_by_lookup_and_stays_exact(llms):
    """A prediction that holds none of the output: `prediction` drafts the output's own repeats
    by n-gram lookup (PredictionLookup), and the output is still plain decoding's."""
    llm, _ = llms
    _, out = check_same(llm, PROMPTS[0], "prediction", prediction="zzzz totally different text zzzz")
    lookup = out.stats.by_source["ngram"]
    assert lookup.proposed > 0 and lookup.accepted > 0, out.stats.to_dict()
    assert out.stats.by_source["prediction"].accepted == 0


def test_prediction_diverging_at_first_token_then_reanchoring(llms):
    llm, _ = llms
    base = plain(llm, PROMPTS[0], max_tokens=48)
    edited = "XYZ inserted line\n" + base.text  # diverges at the very first token
    _, out = check_same(llm, PROMPTS[0], "prediction", prediction=edited)
    assert out.stats.by_source["prediction"].accepted > len(base.token_ids) // 2


def test_prediction_with_edit_in_the_middle_reanchors(llms):
    llm, _ = llms
    base = plain(llm, PROMPTS[0], max_tokens=48)
    cut = len(base.text) // 3
    edited = base.text[:cut] + " EDITED wrong words " + base.text[cut + 3 :]
    _, out = check_same(llm, PROMPTS[0], "prediction", prediction=edited)
    accepted = out.stats.by_source["prediction"].accepted
    assert accepted > len(base.token_ids) // 2, out.stats.to_dict()


def test_prediction_longer_than_max_tokens(llms):
    llm, _ = llms
    long = plain(llm, PROMPTS[0], max_tokens=48).text * 3
    base, out = check_same(llm, PROMPTS[0], "prediction", prediction=long, max_tokens=10)
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_prediction_as_token_ids(llms):
    llm, _ = llms
    base = plain(llm, PROMPTS[0], max_tokens=30)
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=30), prediction=base.token_ids, speculation="prediction")
    assert out.token_ids == base.token_ids
    assert out.stats.by_source["prediction"].accepted >= 30 - out.stats.steps


def test_context_length_limit(llms):
    llm, _ = llms
    ids = llm.encode("def add(a, b):")
    ctx = llm.max_context
    out = llm.generate(ids * ((ctx - 5) // len(ids)), SamplingParams(max_tokens=100), speculation="auto")
    assert out.finish_reason == "length" and len(out.prompt_token_ids) + len(out.token_ids) <= ctx
    from specserve.errors import ContextLengthError

    with pytest.raises(ContextLengthError, match="context length"):
        llm.generate(ids * (ctx // len(ids) + 1), SamplingParams(max_tokens=4))


def test_penalties_and_logprobs_identical_with_speculation(llms):
    llm, same = llms
    kw = dict(max_tokens=40, presence_penalty=0.5, frequency_penalty=0.7, logprobs=3)
    for model, m in ((llm, "prediction"), (llm, "ngram"), (same, "draft")):
        base = plain(model, PROMPTS[0], **kw)
        out = model.generate(PROMPTS[0], SamplingParams(**kw), prediction=base.text, speculation=m)
        assert out.token_ids == base.token_ids
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        for a, b in zip(out.logprobs, base.logprobs):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    penalised = plain(llm, PROMPTS[0], max_tokens=40, frequency_penalty=2.0)
    assert penalised.token_ids != plain(llm, PROMPTS[0], max_tokens=40).token_ids  # the penalty is applied


def test_logit_bias_is_applied_and_lossless_with_speculation(llms):
    llm, same = llms
    base = plain(llm, PROMPTS[2], max_tokens=40)
    seen = list(dict.fromkeys(base.token_ids))  # distinct tokens, in order of appearance
    boosted = next(t for t in range(3, 100) if t not in seen)
    banned = {seen[0]: -100.0, seen[-1]: -100.0, boosted: 3.0}
    biased = plain(llm, PROMPTS[2], max_tokens=40, logit_bias=banned)
    assert biased.token_ids[0] != base.token_ids[0]  # the bias is applied
    assert not {t for t, b in banned.items() if b < 0} & set(biased.token_ids)
    forced = plain(llm, PROMPTS[2], max_tokens=6, logit_bias={base.token_ids[3]: 100.0}, ignore_eos=True)
    assert forced.token_ids == [base.token_ids[3]] * 6
    # The unbiased answer as the prediction: its banned tokens are drafted and must be rejected.
    for model, m, pred in ((llm, "prediction", base.text), (llm, "ngram", None), (same, "draft", None)):
        out = model.generate(
            PROMPTS[2], SamplingParams(max_tokens=40, logit_bias=banned), prediction=pred, speculation=m
        )
        assert out.token_ids == plain(model, PROMPTS[2], max_tokens=40, logit_bias=banned).token_ids
        if m == "draft":  # the target's own weights, biased alike, draft nothing it rejects
            assert out.stats.by_source["draft"].accepted == out.stats.by_source["draft"].proposed > 0
    kw = dict(max_tokens=40, temperature=0.9, seed=7, logit_bias=banned)
    sampled = plain(llm, PROMPTS[2], **kw)
    out = llm.generate(PROMPTS[2], SamplingParams(**kw), prediction=base.text, speculation="prediction")
    assert out.token_ids == sampled.token_ids and base.token_ids[0] not in out.token_ids


def test_logit_bias_outside_the_vocabulary_is_refused(llms):
    llm, _ = llms
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, logit_bias={llm.vocab_size: 1.0}))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={3: 101.0})


def test_prompt_logprobs_score_a_text_as_generating_it_did(llms):
    """Generate G from P with logprobs; then score P + G: the prompt logprobs of G's tokens are
    those its generation gave. P is long enough (> 256 tokens) to be prefilled in two chunks."""
    llm, _ = llms
    p = llm.encode(PROMPTS[2]) * (300 // len(llm.encode(PROMPTS[2])) + 1)
    gen = llm.generate(p, SamplingParams(max_tokens=30, logprobs=3), speculation="none")
    scored = llm.generate(p + gen.token_ids, SamplingParams(max_tokens=1, prompt_logprobs=3), speculation="none")
    lps = scored.prompt_token_logprobs
    assert len(lps) == len(p) + len(gen.token_ids) and lps[0] is None
    assert [lp.token_id for lp in lps[1:]] == (p + gen.token_ids)[1:]
    for a, b in zip(lps[len(p) :], gen.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top] and len(a.top) == 3
    again = llm.generate(p + gen.token_ids, SamplingParams(max_tokens=1, prompt_logprobs=3), speculation="none")
    assert again.cached_tokens == 0  # the prefix cache holds no logits: scored again in full
    assert [lp.logprob for lp in again.prompt_token_logprobs[1:]] == pytest.approx(
        [lp.logprob for lp in lps[1:]], abs=1e-5
    )
    assert plain(llm, PROMPTS[0], max_tokens=4).prompt_logprobs is None  # only when asked


def test_prompt_scores_are_the_model_s_own_whatever_shapes_the_completion(llms):
    """logit_bias and the penalties shape what is generated, not how the prompt is scored: OpenAI's
    logit_bias changes "the likelihood of specified tokens appearing in the completion", and vLLM
    scores prompt tokens from the model's logits, before its logits processors (logit_bias among
    them) run. Pinned: prompt tokens banned at -100 and a token forced at +100 score as without any,
    while the completion is the forced token."""
    llm, _ = llms
    p = llm.encode(PROMPTS[2])
    forced = next(t for t in range(3, 100) if t not in p)
    bias = {p[3]: -100.0, p[5]: -100.0, forced: 100.0}
    shaping = dict(logit_bias=bias, frequency_penalty=2.0, presence_penalty=1.5, ignore_eos=True)
    base = llm.generate(p, SamplingParams(max_tokens=1, prompt_logprobs=3), speculation="none")
    shaped = llm.generate(p, SamplingParams(max_tokens=3, prompt_logprobs=3, **shaping), speculation="none")
    assert shaped.token_ids == [forced] * 3  # the completion is biased
    assert shaped.prompt_token_logprobs[0] is None and len(shaped.prompt_token_logprobs) == len(p)
    for a, b in zip(shaped.prompt_token_logprobs[1:], base.prompt_token_logprobs[1:], strict=True):
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5) and a.logprob > -50
        assert [t for t, _ in a.top] == [t for t, _ in b.top] and forced not in [t for t, _ in a.top]


def test_streamed_text_adds_up(llms):
    llm, _ = llms
    base = plain(llm, PROMPTS[1], max_tokens=40, stop=("zz",))
    gen = llm.stream(PROMPTS[1], SamplingParams(max_tokens=40, stop=("zz",)), prediction=base.text)
    events = list(gen)
    assert "".join(e.text for e in events) == gen.output.text == base.text
    assert events[-1].finish_reason == gen.output.finish_reason
    assert sum(len(e.token_ids) for e in events) == len(gen.output.token_ids)
