"""The Python API as a vLLM user meets it: vLLM's prompt and chat shapes, bad arguments refused
by name (never a deep TypeError from inside the engine), and what an LLM holds once a call ends,
however it ends (an interrupt, close(), a `with` block)."""

from __future__ import annotations

import copy
import functools

import pytest
from tiny import save_tiny, tiny_model, tiny_tokenizer
from tiny_gguf import write_tiny_gguf

from specserve import LLM, SamplingParams
from specserve.config import LoadOptions
from specserve.errors import InvalidRequestError

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


# -- prompts ----------------------------------------------------------------------------------
def test_dict_prompts_are_vllms_text_and_tokens_prompts():
    ids = llm().prompt_ids(PROMPT)
    by_text = llm().generate(PROMPT, FEW)
    assert llm().generate({"prompt": PROMPT}, FEW).token_ids == by_text.token_ids
    assert llm().generate({"prompt_token_ids": ids}, FEW).token_ids == by_text.token_ids
    outs = llm().generate([{"prompt": PROMPT}, {"prompt_token_ids": ids[:3]}, "class Stack:"], FEW)
    assert [o.prompt_token_ids for o in outs] == [ids, ids[:3], llm().prompt_ids("class Stack:")]
    assert outs[0].token_ids == by_text.token_ids


def test_vllms_sampling_params_and_use_tqdm_keywords_are_taken():
    """A vLLM script calls generate(prompts, sampling_params=..., use_tqdm=False): both were a
    TypeError. sampling_params is our params under vLLM's name; use_tqdm changes no output."""
    few = SamplingParams(max_tokens=3)
    by_position = llm().generate(PROMPT, few).token_ids
    assert len(by_position) == 3
    assert llm().generate(PROMPT, sampling_params=few, use_tqdm=False).token_ids == by_position
    assert [o.token_ids for o in llm().generate([PROMPT], sampling_params=few, use_tqdm=True)] == [by_position]
    assert llm().chat(CONV, sampling_params=few, use_tqdm=False).token_ids == llm().chat(CONV, few).token_ids
    for call in (llm().generate, llm().chat):
        with pytest.raises(InvalidRequestError, match="sampling_params") as e:
            call(CONV if call == llm().chat else PROMPT, FEW, sampling_params=few)
        assert e.value.param == "sampling_params"


def test_an_empty_list_of_prompts_is_an_empty_list_of_outputs():
    """vLLM's generate([]) returns []: ours read the list as one prompt of no token ids and
    raised "the prompt is empty". A batch built by a filter may well come out empty."""
    assert llm().generate([], FEW) == []
    assert llm().generate((), FEW, use_tqdm=False) == []
    with pytest.raises(InvalidRequestError, match="empty"):
        llm().generate({"prompt_token_ids": []}, FEW)  # one prompt of no tokens is still refused


def test_vllms_dtype_auto_is_our_default_choice(smol_gguf):
    """dtype="auto" is vLLM's default and what its scripts write: it was refused as an unknown
    dtype. It now means what leaving dtype out means (a .gguf file stays on llama.cpp)."""
    assert LoadOptions(dtype="auto") == LoadOptions()
    with LLM(model=str(smol_gguf), dtype="auto", speculation="none") as model:
        assert model.backend_name == "llama.cpp"
        assert model.generate(PROMPT, SamplingParams(max_tokens=2)).finish_reason == "length"


def test_vllms_max_model_len_is_our_max_context(smol_gguf):
    """LLM(max_model_len=...) is how a vLLM script caps the context: it was a TypeError. It is
    max_context under vLLM's name; both at once are refused by name."""
    with LLM(model=str(smol_gguf), max_model_len=512, speculation="none") as model:
        assert model.max_context == 512
    with pytest.raises(InvalidRequestError, match="max_model_len") as e:
        LLM(model=str(smol_gguf), max_model_len=512, max_context=1024, speculation="none")
    assert e.value.param == "max_model_len"


@pytest.mark.parametrize(
    "prompt,words",
    [
        (None, "got NoneType"),
        (5, "got int"),
        (["abc", 5], "got int"),
        ({"text": PROMPT}, "got keys ['text']"),
        ({"prompt": PROMPT, "multi_modal_data": {}}, "got keys ['multi_modal_data', 'prompt']"),
    ],
)
def test_a_prompt_of_another_shape_is_refused_by_name(prompt, words):
    with pytest.raises(InvalidRequestError, match="prompt") as e:
        llm().generate(prompt, FEW)
    assert words in str(e.value) and e.value.param == "prompt"


@pytest.mark.parametrize("where", ["prompt", "prediction", "messages"])
def test_a_lone_surrogate_is_refused_by_name(where):
    """Text with a lone surrogate (Python's reading of a "\\ud800" escape, or of bytes that are
    not UTF-8) has no UTF-8 form: the tokenizer raised "TextEncodeInput must be Union[...]"."""
    bad = "def add(a, b):\ud800"
    with pytest.raises(InvalidRequestError, match="lone surrogate U\\+D800 at character 14") as e:
        if where == "prompt":
            llm().generate(bad, FEW)
        elif where == "prediction":
            llm().generate(PROMPT, FEW, prediction=bad, speculation="prediction")
        else:
            llm().chat(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": bad}]}],
                FEW,
                continue_final_message=True,
            )
    assert e.value.param == where
    assert where != "messages" or str(e.value).startswith("messages[1].content[0].text is not valid")
    assert held(llm()) == (0, 0, 0, 0)


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
        ({"seed": 2**64}, r"seed must be in \[-9223372036854775808, 9223372036854775807\]"),  # sampled as seed 0
        ({"seed": -(2**63) - 1}, "seed must be in"),
    ],
)
def test_sampling_params_of_a_wrong_shape_say_which(kw, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kw)


def test_sampling_params_still_take_openais_string_ids_and_pairs():
    assert SamplingParams(logit_bias={"5": 2}).logit_bias == ((5, 2.0),)
    assert SamplingParams(logit_bias=[(7, -1), (3, 1)]).logit_bias == ((3, 1.0), (7, -1.0))
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_the_ends_of_the_64_bit_seed_range_are_taken():
    assert (SamplingParams(seed=2**63 - 1).seed, SamplingParams(seed=-(2**63)).seed) == (2**63 - 1, -(2**63))


def test_top_k_minus_one_is_vllms_off():
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's default value; it was a ValueError here
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        SamplingParams(top_k=-2)
    sampled = [SamplingParams(max_tokens=6, temperature=1.0, seed=3, top_k=k) for k in (0, -1)]
    assert llm().generate(PROMPT, sampled[0]).token_ids == llm().generate(PROMPT, sampled[1]).token_ids


# -- speculation, the vLLM way ----------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def load(folder, **kw) -> LLM:
    return LLM(folder, backend="transformers", dtype="float32", **kw)


def test_vllms_speculative_config_drafts_as_ours_and_stays_exact(folder):
    plain = load(folder, speculation="none").generate(PROMPT, SamplingParams(max_tokens=40, logprobs=2))
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    cases = [(ngram, "ngram", None), ({"model": folder, "num_speculative_tokens": 4}, "draft", "model")]
    for config, method, draft in cases:
        llm_ = load(folder, speculative_config=config)
        assert llm_.speculation.method == method and llm_.draft_model_name == draft
        out = llm_.generate(PROMPT, SamplingParams(max_tokens=40, logprobs=2))
        assert out.token_ids == plain.token_ids and out.stats.by_source[method].accepted > 0
        assert [lp.logprob for lp in out.logprobs] == pytest.approx([lp.logprob for lp in plain.logprobs], abs=1e-4)
    assert load(folder, speculative_config=ngram).speculation.ngram_n_max == 3


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"speculative_config": {"method": "eagle", "model": "x"}}, "method 'eagle' not supported"),
        ({"speculative_config": {"method": "ngram", "prompt_lookup": 3}}, "prompt_lookup not supported"),
        ({"speculative_config": {"method": "ngram", "model": "x"}}, "takes no 'model'"),
        ({"speculative_config": {"num_speculative_tokens": 3}}, "method None not supported"),
        ({"speculative_config": {"method": "ngram"}, "speculation": "draft"}, "not both"),
    ],
)
def test_a_speculative_config_we_cannot_follow_is_refused_by_name(folder, kw, words):
    with pytest.raises(InvalidRequestError, match=words) as e:
        load(folder, **kw)
    assert e.value.param == "speculative_config"


# -- chat -------------------------------------------------------------------------------------
def test_chat_takes_a_batch_of_conversations_in_order():
    one, two = CONV, CONV[:2]
    outs = llm().chat([one, two], FEW)
    assert [o.token_ids for o in outs] == [llm().chat(one, FEW).token_ids, llm().chat(two, FEW).token_ids]
    assert outs[0].prompt_token_ids == llm().apply_chat_template(one)


def test_chat_takes_vllms_add_generation_prompt_where_it_agrees():
    opened = llm().chat(CONV, FEW, add_generation_prompt=True)
    assert opened.token_ids == llm().chat(CONV, FEW).token_ids
    go_on = llm().chat(CONV[:3], FEW, continue_final_message=True, add_generation_prompt=False)
    assert go_on.prompt_token_ids == llm().apply_chat_template(CONV[:3], continue_final_message=True)
    for kw in ({"add_generation_prompt": False}, {"add_generation_prompt": True, "continue_final_message": True}):
        with pytest.raises(InvalidRequestError, match="add_generation_prompt") as e:
            llm().chat(CONV[:3], FEW, **kw)
        assert e.value.param == "add_generation_prompt"


def test_chat_template_kwargs_reach_the_template_as_at_vllm():
    """vLLM's chat(..., chat_template_kwargs={...}) hands extra variables to the template (as
    enable_thinking): it was a TypeError. Keys that are the renderer's own arguments are refused."""
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = "{% if lang %}[{{ lang }}]{% endif %}" + tok.chat_template
    model = LLM.from_models(tiny_model(), tok, speculation="none")
    plain = model.apply_chat_template(CONV)
    marked = model.apply_chat_template(CONV, chat_template_kwargs={"lang": "py"})
    assert marked[: len(model.encode("[py]"))] == model.encode("[py]") and marked[len(model.encode("[py]")) :] == plain
    out = model.chat([CONV, CONV[:2]], FEW, chat_template_kwargs={"lang": "py"})
    assert out[0].prompt_token_ids == marked
    for bad, words in (("py", "must be a dict"), ({"tools": []}, "tools"), ({1: 2}, "string keys")):
        with pytest.raises(InvalidRequestError, match=words) as e:
            model.chat(CONV, FEW, chat_template_kwargs=bad)
        assert e.value.param == "chat_template_kwargs"


def test_chat_template_kwargs_for_a_model_without_a_template_are_refused():
    """A base model without a chat template gets a plain transcript, which has no variables:
    its chat_template_kwargs were dropped without a word, so an answer ignored what they asked."""
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = None
    model = LLM.from_models(tiny_model(), tok, speculation="none")
    assert model.chat(CONV, FEW).finish_reason == "length"
    with pytest.raises(InvalidRequestError, match="no chat template") as e:
        model.chat(CONV, FEW, chat_template_kwargs={"lang": "py"})
    assert e.value.param == "chat_template_kwargs"


def test_chat_takes_vllms_chat_template_in_place_of_the_models():
    """vLLM's chat(..., chat_template=...) renders with the template given: it was a TypeError.
    It also gives a model without a template one; a template that is not text is refused."""
    joined = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    out = llm().chat(CONV, FEW, chat_template=joined)
    assert out.prompt_token_ids == llm().encode("be brief|hi|hello|add two numbers|")
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = None
    bare = LLM.from_models(tiny_model(), tok, speculation="none")
    assert bare.chat([CONV], FEW, chat_template=joined)[0].prompt_token_ids == out.prompt_token_ids
    with pytest.raises(InvalidRequestError, match="chat_template must be") as e:
        llm().chat(CONV, FEW, chat_template=["x"])
    assert e.value.param == "chat_template"


@pytest.mark.parametrize(
    "tools,words",
    [
        ("get_weather", "tools must be a list of tool definitions, got str"),
        (["get_weather"], "tools[0] must be {'type': 'function'"),
        ([{"name": "get_weather"}], "tools[0] must be {'type': 'function'"),
        ([{"type": "function", "function": {"parameters": {}}}], "tools[0] must be"),
    ],
)
def test_malformed_tools_are_refused_by_name(tools, words):
    with pytest.raises(InvalidRequestError) as e:
        llm().chat(CONV, FEW, tools=tools)
    assert words in str(e.value) and e.value.param == "tools"


def test_a_malformed_earlier_tool_call_is_refused_by_name():
    calls = CONV + [{"role": "assistant", "content": None, "tool_calls": [{"id": "1", "name": "f"}]}]
    with pytest.raises(InvalidRequestError, match=r"messages\[4\].tool_calls\[0\] must be") as e:
        llm().chat(calls + [{"role": "user", "content": "and?"}], FEW)
    assert e.value.param == "messages"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert llm().chat(CONV, FEW, tools=[tool]).finish_reason == "length"  # a good one still runs


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


def test_close_and_with_free_an_llm_and_leave_another_working(tmp_path):
    from specserve.backends.llamacpp import LlamaCppBackend

    path, tok = write_tiny_gguf(tmp_path / "tiny.gguf"), tiny_tokenizer()
    other = LLM.from_backends(LlamaCppBackend(path), tok, name="other", speculation="none")
    with LLM.from_backends(LlamaCppBackend(path), tok, name="first", speculation="none") as first:
        assert first.generate(PROMPT, FEW).token_ids == other.generate(PROMPT, FEW).token_ids
        gen = first.stream(PROMPT, SamplingParams(max_tokens=50))
        next(iter(gen))
    assert gen.output.finish_reason == "abort" and held(first) == (0, 0, 0, 0)
    assert first.target_backend._ctx is None  # the llama.cpp context is freed, not left for the collector
    with pytest.raises(InvalidRequestError, match="closed"):
        first.generate(PROMPT, FEW)
    first.close()  # twice is harmless
    del gen
    assert other.generate(PROMPT, FEW).finish_reason == "length"
    other.close()
