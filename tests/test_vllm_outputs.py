"""vLLM-shaped outputs: code ported from vLLM reads `out[0].outputs[0].text`, `.token_ids`,
`.finish_reason`, `.logprobs` ({token id: Logprob} per token), `.cumulative_logprob`, `.index`,
and `out[0].prompt`, `.prompt_token_ids`, `.request_id`, `.finished`. Our RequestOutput is flat
(`out.text`): these tests hold the vLLM view to the flat fields it is built from, on the SmolLM2 pack."""

from __future__ import annotations

import pytest

from specserve import LLM, CompletionOutput, InvalidRequestError, SamplingParams
from specserve.engine.completion import Logprob

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def smol(smol_gguf):
    """exact: a seeded sample alone repeats its run in a batch (by default llama.cpp rounds by batch)."""
    with LLM(model=str(smol_gguf), speculation="none", max_model_len=512, exact=True) as model:
        yield model


def test_each_logprob_carries_the_tokens_rank_in_the_vocabulary(smol):
    """vLLM's Logprob has the token's rank (1 = the most probable). The engine computed only the
    chosen token's logprob and the top alternatives, so a chosen token outside them had no rank."""
    greedy = smol.generate(PROMPT, SamplingParams(max_tokens=8, logprobs=2))
    assert [lp.rank for lp in greedy.logprobs] == [1] * 8  # greedy picks the most probable token
    sampled = smol.generate(PROMPT, SamplingParams(max_tokens=24, logprobs=3, temperature=1.5, seed=11))
    for lp in sampled.logprobs:
        above = [v for _, v in lp.top if v > lp.logprob]
        assert lp.rank >= len(above) + 1 and (lp.rank > len(lp.top) or lp.rank == len(above) + 1)
    assert any(lp.rank > 1 for lp in sampled.logprobs)  # a hot sample leaves the top token somewhere
    scored = smol.generate(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert scored.prompt_logprobs[0] is None
    assert all(lp.rank >= 1 for entry in scored.prompt_logprobs[1:] for lp in entry.values())


def test_prompt_logprobs_are_vllms_dicts_one_per_prompt_token(smol):
    """vLLM's RequestOutput.prompt_logprobs: one entry per prompt token, None for the first, then
    {token_id: Logprob} holding the prompt's own token first and the top k after it. Ours held a
    TokenLogprob per token (`.token_id`, `.top`), so a ported `entry[token].logprob` failed."""
    ids = smol.prompt_ids(PROMPT)
    scored = smol.generate(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=2))
    lps = scored.prompt_logprobs
    assert len(lps) == len(ids) and lps[0] is None
    for token, entry, flat in zip(ids[1:], lps[1:], scored.prompt_token_logprobs[1:], strict=True):
        assert isinstance(entry, dict) and next(iter(entry)) == token  # the prompt's token first
        assert entry[token] == Logprob(flat.logprob, flat.rank, smol.tokenizer.decode([token]))
        top = [t for t, _ in flat.top]
        assert set(entry) == {token, *top} and len(top) == 2
        assert [entry[t].rank for t in top] == [1, 2] and entry[top[0]].logprob >= entry[top[1]].logprob
    alone = smol.generate(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=0)).prompt_logprobs
    assert [list(e) for e in alone[1:]] == [[t] for t in ids[1:]]  # k = 0: the prompt's token alone
    assert smol.generate(PROMPT, SamplingParams(max_tokens=1)).prompt_logprobs is None  # only when asked


def test_outputs_is_vllms_view_of_the_flat_fields(smol):
    """`out.outputs[0]` was an AttributeError: a ported vLLM script failed on its first read."""
    out = smol.generate([PROMPT], SamplingParams(max_tokens=8, logprobs=2))[0]
    (one,) = out.outputs
    assert (one.index, one.text, one.token_ids, one.finish_reason) == (0, out.text, out.token_ids, "length")
    assert isinstance(one, CompletionOutput) and one.finished()
    assert out.outputs is out.outputs  # one view, as vLLM's list is one list
    assert one.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in out.logprobs))
    assert len(one.logprobs) == len(one.token_ids)
    for token, ours, theirs in zip(one.token_ids, out.logprobs, one.logprobs):
        assert next(iter(theirs)) == token  # vLLM lists the chosen token first, then the top ones
        assert set(theirs) == {token} | {t for t, _ in ours.top}
        assert (theirs[token].logprob, theirs[token].rank) == (ours.logprob, ours.rank)
        for rank, (t, value) in enumerate(ours.top, 1):
            assert theirs[t].logprob == value and (theirs[t].rank == rank or t == token)
        assert all(lp.decoded_token == smol.tokenizer.decode([t]) for t, lp in theirs.items())


def test_without_logprobs_the_view_has_none_as_vllm_has(smol):
    (one,) = smol.generate(PROMPT, SamplingParams(max_tokens=4)).outputs
    assert one.logprobs is None and one.cumulative_logprob is None and len(one.token_ids) == 4
    (chosen,) = smol.generate(PROMPT, SamplingParams(max_tokens=4, logprobs=0)).outputs
    assert [list(d) for d in chosen.logprobs] == [[t] for t in chosen.token_ids]  # logprobs=0: the token alone


CONV = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add two numbers"}]


def test_request_level_fields_are_vllms(smol):
    """prompt, request_id, finished and num_cached_tokens were AttributeErrors. As in vLLM: prompt
    is the text given (None for token ids), the rendered template for chat; ids are distinct strings."""
    ids = smol.prompt_ids(PROMPT)
    outs = smol.generate([PROMPT, {"prompt": "class Stack:"}, {"prompt_token_ids": ids}], SamplingParams(max_tokens=3))
    assert [o.prompt for o in outs] == [PROMPT, "class Stack:", None]
    assert all(isinstance(o.request_id, str) and o.finished for o in outs)
    assert len({o.request_id for o in outs}) == 3
    assert [o.num_cached_tokens for o in outs] == [o.cached_tokens for o in outs]
    assert smol.generate(PROMPT, SamplingParams(max_tokens=3)).prompt == PROMPT
    for out in (smol.chat(CONV, SamplingParams(max_tokens=3)), smol.chat([CONV], SamplingParams(max_tokens=3))[0]):
        assert "add two numbers" in out.prompt and smol.encode(out.prompt) == out.prompt_token_ids


def test_a_streams_output_has_the_prompt_and_decoded_tokens_as_generates_has(smol):
    """LLM.stream's `.output` had prompt None (and no decoded_token in its logprobs) where
    generate's has the text given: the same request read two ways gave two answers."""
    ids = smol.prompt_ids(PROMPT)
    params = SamplingParams(max_tokens=3, logprobs=1)
    for given, prompt in (
        (PROMPT, PROMPT),
        ({"prompt": PROMPT}, PROMPT),
        (ids, None),
        ({"prompt_token_ids": ids}, None),
    ):
        gen = smol.stream(given, params)
        for _ in gen:
            pass
        assert gen.output.prompt == prompt == smol.generate(given, params).prompt
        assert all(lp.decoded_token is not None for entry in gen.output.outputs[0].logprobs for lp in entry.values())
    assert smol.stream(PROMPT, params).run().prompt == PROMPT


def test_stop_reason_names_the_stop_string_that_ended_the_answer(smol):
    """vLLM's stop_reason is the stop string matched (None at EOS or length); ours had none, so a
    script could not tell which of its stop strings ended an answer."""
    whole = smol.generate(PROMPT, SamplingParams(max_tokens=16))
    assert whole.stop_reason is None and whole.outputs[0].stop_reason is None  # length
    stop = whole.text[6:8]
    out = smol.generate(PROMPT, SamplingParams(max_tokens=16, stop=["never-there", stop]))
    assert (out.finish_reason, out.stop_reason, out.outputs[0].stop_reason) == ("stop", stop, stop)
    assert out.text == whole.text[: whole.text.index(stop)]


def test_n_samples_fill_outputs_each_with_its_own_text(smol):
    """vLLM's SamplingParams(n=3) gives three CompletionOutputs per prompt. Ours had no `n` (a
    TypeError), so a ported script had to be rewritten; it must never quietly give one."""
    hot = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8)
    outs = smol.generate([PROMPT, "class Stack:"], hot)
    assert [len(o.outputs) for o in outs] == [3, 3]
    for out in outs:
        assert [s.index for s in out.outputs] == [0, 1, 2] and len({s.text for s in out.outputs}) > 1
        first = out.outputs[0]
        assert (out.text, out.token_ids, out.finish_reason) == (first.text, first.token_ids, first.finish_reason)
    again = smol.generate(PROMPT, hot)  # seeded: the same samples, alone as in a batch
    assert [s.token_ids for s in again.outputs] == [s.token_ids for s in outs[0].outputs]
    (chat,) = smol.chat([CONV], SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4, logprobs=1))
    assert len(chat.outputs) == 2 and all(len(s.logprobs) == len(s.token_ids) for s in chat.outputs)


def test_n_other_than_a_count_of_samples_is_refused_by_name(smol):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be"):
            SamplingParams(n=bad)
    with pytest.raises(InvalidRequestError, match="n=2") as e:  # a stream is one sample
        smol.stream(PROMPT, SamplingParams(n=2))
    assert e.value.param == "n"
    assert len(smol.generate(PROMPT, SamplingParams(n=1, max_tokens=2)).outputs) == 1


# A script written for vLLM, as its docs show it; only the import line names us.
VLLM_SCRIPT = """
from specserve import LLM, SamplingParams

llm = LLM(model=MODEL, max_model_len=1024, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
prompts = ["def add(a, b):", "The capital of France is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, seed=0, n=2, logprobs=2, stop=["\\n\\n"])
outputs = llm.generate(prompts, sampling_params, use_tqdm=False)
conversation = [{"role": "user", "content": "Write a haiku about tests."}]
outputs += llm.chat(conversation, sampling_params=SamplingParams(max_tokens=8, temperature=0))
for output in outputs:
    print(f"{output.request_id} {output.prompt!r} {len(output.prompt_token_ids)} {output.finished}")
    for completion in output.outputs:
        print(completion.index, repr(completion.text), completion.token_ids, completion.finish_reason,
              completion.stop_reason, completion.cumulative_logprob)
        for position in completion.logprobs or []:
            for token_id, logprob in position.items():
                print(" ", token_id, logprob.logprob, logprob.rank, repr(logprob.decoded_token))
llm.close()
"""


def test_a_vllm_script_runs_unchanged(smol_gguf, capsys):
    namespace = {"MODEL": str(smol_gguf)}
    exec(VLLM_SCRIPT, namespace)
    outputs = namespace["outputs"]
    printed = capsys.readouterr().out
    assert [len(o.outputs) for o in outputs] == [2, 2, 1]
    assert [o.prompt for o in outputs[:2]] == ["def add(a, b):", "The capital of France is"]
    assert "Write a haiku about tests." in outputs[2].prompt
    for out in outputs:
        assert f"{out.request_id} {out.prompt!r} {len(out.prompt_token_ids)} True" in printed
        for c in out.outputs:
            assert f"{c.index} {c.text!r} {c.token_ids} {c.finish_reason} {c.stop_reason}" in printed
            assert c.finish_reason in ("stop", "length") and c.text.find("\n\n") == -1
    sampled = [c for o in outputs[:2] for c in o.outputs]
    assert all(len(c.logprobs) == len(c.token_ids) and c.cumulative_logprob <= 0 for c in sampled)
    assert outputs[2].outputs[0].logprobs is None and outputs[2].outputs[0].cumulative_logprob is None


def test_one_prompts_output_reads_as_vllms_list_of_one(smol):
    """vLLM's generate and chat return a list even for one prompt or conversation, so a port reads
    `out[0].outputs[0].text`: ours gave the RequestOutput alone ("not subscriptable"). It is now also
    a list of one (itself), and `out.text` reads as before."""
    for out in (smol.generate(PROMPT, SamplingParams(max_tokens=3)), smol.chat(CONV, SamplingParams(max_tokens=3))):
        assert out[0] is out and out[-1] is out and len(out) == 1 and list(out) == [out]
        assert out[0].outputs[0].text == out.text
        with pytest.raises(IndexError, match="one prompt"):
            out[1]
