"""Fill-in-the-middle: the prompt layout per model family, generation from it (lossless with every
drafter, like any prompt), and the completions endpoint's `suffix` (fim.py, server/protocol.py).

The tiny tokenizer gets the FIM marker tokens of one family added; the real Qwen2.5-Coder 1.5B
pack's infilling was checked by hand (docs/server.md).
"""

import copy

import openai
import pytest
from server_proc import ServerProcess
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.errors import InvalidRequestError
from specserve.fim import FORMATS, fim_format, fim_prompt_ids
from specserve.llm import LLM
from specserve.server.errors import APIError
from specserve.server.protocol import prepare_completion
from specserve.server.schemas import CompletionRequest

QWEN, STARCODER = FORMATS[0], FORMATS[1]
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\n\nprint(add(1, 2))\n"


def fim_tokenizer(fmt=QWEN):
    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": [fmt.prefix, fmt.suffix, fmt.middle]})
    return tok


@pytest.fixture(scope="module")
def fim_llm():
    tok = fim_tokenizer()
    target = tiny_model("qwen2", seed=0, vocab_size=len(tok))
    (llm,) = steady_prices(LLM.from_models(target, tok, tiny_model("qwen2", seed=0, vocab_size=len(tok))))
    return llm


@pytest.mark.parametrize("fmt", [QWEN, STARCODER])
def test_the_prompt_is_prefix_suffix_middle_with_the_families_markers(fmt):
    tok = fim_tokenizer(fmt)
    assert fim_format(tok) == fmt
    marker = tok.convert_tokens_to_ids
    expected = [
        marker(fmt.prefix),
        *tok.encode(PREFIX, add_special_tokens=False),
        marker(fmt.suffix),
        *tok.encode(SUFFIX, add_special_tokens=False),
        marker(fmt.middle),
    ]
    assert fim_prompt_ids(tok, PREFIX, SUFFIX) == expected
    # the gap at the top of the file: nothing before it
    assert fim_prompt_ids(tok, "", SUFFIX)[:2] == [marker(fmt.prefix), marker(fmt.suffix)]


def test_a_model_without_fim_tokens_is_refused():
    assert fim_format(tiny_tokenizer()) is None
    with pytest.raises(ValueError, match="no fill-in-the-middle tokens"):
        fim_prompt_ids(tiny_tokenizer(), PREFIX, SUFFIX)


def test_infilling_is_lossless_with_every_drafter(fim_llm):
    ids = fim_llm.fim_prompt_ids(PREFIX, SUFFIX)
    base = fim_llm.generate(ids, SamplingParams(max_tokens=40), speculation="none")
    for method, prediction in (("prediction", base.text), ("ngram", None), ("draft", None), ("auto", None)):
        out = fim_llm.generate(ids, SamplingParams(max_tokens=40), prediction=prediction, speculation=method)
        assert out.token_ids == base.token_ids, method


def _completion(**body):
    return CompletionRequest.model_validate({"model": "tiny", "max_tokens": 8, **body})


def test_the_suffix_field_makes_an_infilling_prompt(fim_llm):
    job = prepare_completion(_completion(prompt=PREFIX, suffix=SUFFIX), fim_llm)
    assert job.prompt_ids == fim_llm.fim_prompt_ids(PREFIX, SUFFIX)
    job = prepare_completion(_completion(prompt="", suffix=SUFFIX), fim_llm)  # the gap at the top
    assert job.prompt_ids == fim_llm.fim_prompt_ids("", SUFFIX)
    no_suffix = prepare_completion(_completion(prompt=PREFIX, suffix=""), fim_llm)
    assert no_suffix.prompt_ids == fim_llm.prompt_ids(PREFIX)  # an empty suffix is a plain completion


def test_bad_infilling_requests_are_400s_naming_the_field(fim_llm):
    with pytest.raises(APIError) as e:
        prepare_completion(_completion(prompt=[1, 2, 3], suffix=SUFFIX), fim_llm)
    assert (e.value.status, e.value.param) == (400, "prompt")
    plain_llm = LLM.from_models(tiny_model("qwen2"), tiny_tokenizer())
    with pytest.raises(APIError) as e:
        prepare_completion(_completion(prompt=PREFIX, suffix=SUFFIX), plain_llm)
    assert (e.value.status, e.value.param) == (400, "suffix") and "fill-in-the-middle" in e.value.message
    with pytest.raises(InvalidRequestError, match="fill-in-the-middle"):
        plain_llm.fim_prompt_ids(PREFIX, SUFFIX)


def test_the_openai_sdk_fills_a_gap_through_the_server(tmp_path):
    """The SDK's `suffix`, sent as an editor sends it: the text is the middle, alone or streamed,
    and it is what the engine writes from the infilling prompt."""
    tok = fim_tokenizer()
    tiny_model("qwen2", seed=0, vocab_size=len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), dtype="float32", speculation="none")  # the folder, as the server loads it
    expected = llm.generate(llm.fim_prompt_ids(PREFIX, SUFFIX), SamplingParams(max_tokens=12)).text
    with ServerProcess(str(tmp_path), "--served-model-name", "tiny", "--draft-model", "none") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        kw = dict(model="tiny", prompt=PREFIX, suffix=SUFFIX, max_tokens=12, temperature=0)
        assert client.completions.create(**kw).choices[0].text == expected
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
        assert streamed == expected
