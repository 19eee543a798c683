"""The OpenAI-compatible server, driven by the official `openai` SDK against a real server process.

One tiny random-weight model (float32, greedy exactness holds) plus a tiny draft model of
another seed, served once on each backend (HF folders on transformers, f32 GGUFs on
llama.cpp); every request is small, so the whole file runs in about a minute.
"""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from server_proc import ServerProcess, metric_value
from tiny import save_tiny, tiny_tokenizer
from tiny_gguf import save_tiny_gguf

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny"
MSGS = [{"role": "user", "content": "def get_user(self, user_id):"}]
GREEDY = {"temperature": 0, "max_tokens": 48}


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    if request.param == "llama.cpp":
        target, draft, dtype = save_tiny_gguf(root / "target"), save_tiny_gguf(root / "draft", seed=1), None
    else:
        target, draft, dtype = save_tiny(root / "target"), save_tiny(root / "draft", seed=1), "float32"
    exact = ("--exact",) if request.param == "llama.cpp" else ()
    with ServerProcess(
        target,
        "--draft-model",
        draft,
        "--served-model-name",
        MODEL,
        "--max-queue",
        "4",
        *exact,
        api_key=API_KEY,
        dtype=dtype,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60)


def chat(client, **kw):
    kw = {"model": MODEL, "messages": MSGS, **GREEDY, **kw}
    return client.chat.completions.create(**kw)


def stream_chat(client, **kw):
    """Stream a chat completion; returns (text, chunks)."""
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def spec(resp) -> dict:
    """Our non-standard `speculation` stats object on a response or chunk."""
    return resp.model_extra["speculation"]


def with_inserted_line(text: str) -> str:
    """A prediction that differs from the real output: a line inserted in the middle."""
    mid = len(text) // 2
    return text[:mid] + "\n    inserted = line()\n" + text[mid:]


# -- basics -------------------------------------------------------------------------------------
def test_models_and_health(server, client, request):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = server.health()
    assert health["status"] == "ok" and health["worker_alive"] and health["active"] == 0
    exact = request.node.callspec.params["server"] == "llama.cpp"  # served with --exact: out-of-order passes counted
    assert ("exact_cells_out_of_order" in health) == exact and health.get("exact_cells_out_of_order", 0) == 0


def test_chat_stream_equals_nonstream(client):
    full = chat(client)
    text, chunks = stream_chat(client)
    assert text == full.choices[0].message.content and text
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == full.choices[0].finish_reason
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    u = full.usage
    assert u.prompt_tokens + u.completion_tokens == u.total_tokens
    assert usage_chunk.usage.completion_tokens == u.completion_tokens
    assert spec(full)["output_tokens"] == u.completion_tokens


def test_continue_final_message_goes_on_with_the_answer_begun(client):
    """vLLM's continue_final_message: the model writes on from the last, assistant, message (not
    closed, no new turn), exactly as a completion of that rendered text would, and the response
    holds only what follows it. The tiny template renders `<|im_start|>role\ncontent<|im_end|>\n`."""
    begun = "    return"
    messages = [*MSGS, {"role": "assistant", "content": begun}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    went_on = chat(client, messages=messages, extra_body=extra)
    rendered = f"<|im_start|>user\n{MSGS[0]['content']}<|im_end|>\n<|im_start|>assistant\n{begun}"
    completed = client.completions.create(model=MODEL, prompt=rendered, **GREEDY)
    assert went_on.choices[0].message.content == completed.choices[0].text
    assert went_on.usage.prompt_tokens == completed.usage.prompt_tokens
    plain = chat(client, max_tokens=1)  # the answer opened empty: the begun text is the difference
    assert went_on.usage.prompt_tokens > plain.usage.prompt_tokens
    with_only_flag = chat(client, messages=messages, extra_body={"continue_final_message": True})
    assert with_only_flag.choices[0].message.content == went_on.choices[0].message.content


def test_completions_stream_equals_nonstream(client):
    kw = {"model": MODEL, "prompt": "import os\nimport", "temperature": 0, "max_tokens": 40}
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert full.object == "text_completion" and text == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens <= 40


def test_max_completion_tokens_and_length(client):
    resp = chat(client, max_tokens=None, max_completion_tokens=7, extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 7 and resp.choices[0].finish_reason == "length"


def test_text_part_arrays_equal_strings(client):
    plain = dict(prediction={"type": "content", "content": "return self.db.find(user_id)"})
    chat(client, **plain)  # the prompt in the prefix cache, whatever ran before: both below reuse it alike
    plain = chat(client, **plain)
    parts = chat(
        client,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "def get_user(self, "}, {"type": "text", "text": "user_id):"}],
            }
        ],
        prediction={
            "type": "content",
            "content": [{"type": "text", "text": "return self.db"}, {"type": "text", "text": ".find(user_id)"}],
        },
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage == plain.usage


# -- Predicted Outputs ------------------------------------------------------------------------
def test_prediction_is_lossless_and_usage_adds_up(client):
    base = chat(client, max_tokens=64, extra_body={"speculation": {"method": "none"}})
    reference = base.choices[0].message.content
    prediction = {"type": "content", "content": with_inserted_line(reference)}
    resp = chat(client, max_tokens=64, prediction=prediction)
    assert resp.choices[0].message.content == reference
    details = resp.usage.completion_tokens_details
    pred = spec(resp)["by_source"]["prediction"]
    assert details.accepted_prediction_tokens > 0
    assert details.accepted_prediction_tokens == pred["accepted"]
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == pred["proposed"]
    text, chunks = stream_chat(client, max_tokens=64, prediction=prediction)
    assert text == reference
    assert chunks[-1].usage.completion_tokens_details == details


def test_completions_accept_prediction(client):
    kw = {"model": MODEL, "prompt": "def add(a, b):", "temperature": 0, "max_tokens": 40}
    plain = client.completions.create(**kw).choices[0].text
    pred = client.completions.create(**kw, extra_body={"prediction": {"type": "content", "content": plain}})
    assert pred.choices[0].text == plain
    assert pred.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_logprobs_with_prediction_equal_logprobs_without(client):
    base = chat(client, logprobs=True, top_logprobs=3, extra_body={"speculation": {"method": "none"}})
    prediction = {"type": "content", "content": with_inserted_line(base.choices[0].message.content)}
    pred = chat(client, logprobs=True, top_logprobs=3, prediction=prediction)
    a, b = base.choices[0].logprobs.content, pred.choices[0].logprobs.content
    assert [t.token for t in a] == [t.token for t in b] and len(a) == base.usage.completion_tokens
    for x, y in zip(a, b):
        assert math.isclose(x.logprob, y.logprob, abs_tol=1e-4)
        assert x.bytes == list(x.token.encode()) and len(x.top_logprobs) == 3
        assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
    _, chunks = stream_chat(client, logprobs=True, top_logprobs=3, prediction=prediction)
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in a]


def test_penalties_with_prediction_are_lossless(client):
    kw = {"presence_penalty": 0.8, "frequency_penalty": 0.5}
    base = chat(client, extra_body={"speculation": {"method": "none"}}, **kw).choices[0].message.content
    pred = chat(client, prediction={"type": "content", "content": base}, **kw)
    assert pred.choices[0].message.content == base
    assert pred.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_logit_bias_through_the_sdk_is_applied_and_lossless(client):
    tok = tiny_tokenizer()
    base = chat(client, max_tokens=24, extra_body={"speculation": {"method": "none"}}).choices[0].message.content
    bias = {str(t): -100 for t in set(tok.encode(base[:8]))}  # the tokens the answer begins with
    plain = chat(client, max_tokens=24, logit_bias=bias, extra_body={"speculation": {"method": "none"}})
    text = plain.choices[0].message.content
    assert not text.startswith(base[:8])  # the bias changed the answer
    pred = chat(client, max_tokens=24, logit_bias=bias, prediction={"type": "content", "content": base})
    assert pred.choices[0].message.content == text  # the prediction's banned tokens were rejected
    forced = tok.encode("add")[0]
    comp = client.completions.create(
        model=MODEL,
        prompt="x",
        max_tokens=4,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert comp.choices[0].text == tok.decode([forced] * 4)


def test_echo_scores_the_prompt_as_evaluations_ask(client):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs and one token. The answer
    begins with the prompt, and its logprobs cover every prompt token (the first has none)."""
    prompt = "def add(a, b):\n    return a + b\n"
    r = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=1, temperature=0)
    choice, lp = r.choices[0], r.choices[0].logprobs
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == r.usage.prompt_tokens + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:]) and all(len(t) <= 3 for t in lp.top_logprobs[1:])
    assert all(t[tok] == x for tok, x, t in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # position k of an echoed prompt is scored as generating after its first k tokens is
    ids = [5, 17, 30, 41, 12]
    echoed = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=2, max_tokens=1, temperature=0)
    for k in range(1, len(ids)):
        step = client.completions.create(model=MODEL, prompt=ids[:k], logprobs=2, max_tokens=1, temperature=0)
        want, got = step.choices[0].logprobs.top_logprobs[0], echoed.choices[0].logprobs.top_logprobs[k]
        got = {t: x for t, x in got.items() if t in want or t != echoed.choices[0].logprobs.tokens[k]}
        assert got.keys() == want.keys() and list(got.values()) == pytest.approx(list(want.values()), abs=1e-4)
    plain = client.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=3, temperature=0)
    assert plain.choices[0].text.startswith(prompt) and plain.choices[0].logprobs is None
    # max_tokens 0 (OpenAI's legacy scoring request, as HELM sends it): the prompt and its scores alone
    scored = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=0)
    choice = scored.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length" and scored.usage.completion_tokens == 0
    assert choice.logprobs.token_logprobs == lp.token_logprobs[:-1] and choice.logprobs.tokens == lp.tokens[:-1]
    assert scored.usage.prompt_tokens == r.usage.prompt_tokens


def test_a_batch_of_prompts_answers_each_as_alone(client):
    """OpenAI's legacy batch: a list of prompts (text or token ids), n choices each, numbered
    prompt by prompt; each answer is what the prompt alone gets, and usage counts each prompt
    once. Echo and logprobs follow each choice's own prompt; streamed chunks carry the index."""
    prompts = ["def add(a, b):", "import os\nimport", "class UserController:"]
    alone = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=12) for p in prompts]
    r = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=12)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    ids = [[5, 17, 30], [41, 12]]
    r = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1, temperature=0, max_tokens=2)
    for choice, prompt in zip(r.choices, ids):
        one = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, temperature=0, max_tokens=2)
        assert choice.text == one.choices[0].text and choice.logprobs.tokens == one.choices[0].logprobs.tokens
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompts,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = ["", "", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts == [a.choices[0].text for a in alone]
    assert chunks[-1].usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=["a", ""], max_tokens=1)
    assert e.value.body["param"] == "prompt[1]"
    with pytest.raises(openai.BadRequestError, match="65 choices"):
        client.completions.create(model=MODEL, prompt=["a"] * 13, n=5, max_tokens=1)


def test_tokenize_counts_what_a_request_is_billed(server, client):
    """/tokenize and /detokenize (vLLM's shapes): a chat's count is the prompt_tokens its request
    reports, a prompt's ids come back as its text."""
    r = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": MSGS}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) == chat(client).usage.prompt_tokens
    assert body["max_model_len"] > body["count"]
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "def add(a, b):"}, headers=AUTH, timeout=30)
    ids = r.json()["tokens"]
    assert client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=1).usage.prompt_tokens == len(ids)
    r = httpx.post(f"{server.url}/detokenize", json={"model": MODEL, "tokens": ids}, headers=AUTH, timeout=30)
    assert r.json() == {"prompt": "def add(a, b):"}
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "def add", "return_token_strs": True}, headers=AUTH)
    assert r.json()["token_strs"] == tiny_tokenizer().convert_ids_to_tokens(r.json()["tokens"])  # vLLM's option
    for path, bad, param in [
        ("tokenize", {"prompt": "x", "messages": MSGS}, "prompt"),
        ("tokenize", {}, "messages"),
        ("detokenize", {"tokens": [10**9]}, "tokens"),
        ("detokenize", {"tokens": "abc"}, "tokens"),
    ]:
        r = httpx.post(f"{server.url}/{path}", json=bad, headers=AUTH, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
    info = httpx.get(f"{server.url}/tokenizer_info", headers=AUTH, timeout=30).json()  # lm-eval's remote tokenizer
    tok = tiny_tokenizer()
    assert (info["eos_token"], info["bos_token"], info["chat_template"]) == (tok.eos_token, None, tok.chat_template)
    assert info["model_max_length"] == body["max_model_len"]
    assert info["tokenizer_class"] == type(tok).__name__  # the tokenizer's own class, not the per-thread wrapper
    assert httpx.get(f"{server.url}/tokenizer_info", timeout=30).status_code == 401
    r = httpx.post(f"{server.url}/tokenize", json={"model": "other", "prompt": "x"}, headers=AUTH, timeout=30)
    assert r.status_code == 404
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "x"}, timeout=30).status_code == 401


def test_completions_logprobs_shape(client):
    resp = client.completions.create(model=MODEL, prompt="def add", temperature=0, max_tokens=6, logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens).startswith(resp.choices[0].text) and lp.text_offset[0] == 0
    assert all(len(top) <= 2 for top in lp.top_logprobs)


# -- speculation and sampling options ---------------------------------------------------------
@pytest.mark.parametrize("method", ["ngram", "draft", "auto"])
def test_speculation_per_request(client, method):
    plain = chat(client, extra_body={"speculation": {"method": "none"}}).choices[0].message.content
    resp = chat(client, extra_body={"speculation": {"method": method, "num_speculative_tokens": 4}})
    assert resp.choices[0].message.content == plain
    sources = set(spec(resp)["by_source"]) - {"none"}
    assert sources <= ({"ngram", "draft"} if method == "auto" else {method})
    if method == "draft":
        assert sources == {"draft"}


def test_seeded_sampling_is_reproducible(client):
    kw = {"temperature": 0.9, "top_p": 0.95, "seed": 7, "extra_body": {"top_k": 50}}
    first = chat(client, **kw).choices[0].message.content
    assert chat(client, **kw).choices[0].message.content == first
    assert stream_chat(client, **kw)[0] == first


def test_top_p_zero_keeps_only_the_most_probable_token(client):
    """OpenAI accepts top_p 0; it keeps the nucleus's first token, so sampling writes the greedy
    answer, speculation included (the draft model drafts; its tokens are verified by sampling)."""
    greedy = chat(client).choices[0].message.content
    for seed in (1, 2, 3):
        assert chat(client, temperature=1.0, top_p=0, seed=seed).choices[0].message.content == greedy
    sampled = {chat(client, temperature=1.0, seed=seed).choices[0].message.content for seed in (1, 2, 3)}
    assert sampled != {greedy}  # without top_p the same seeds do sample away from it


def test_stop_string(client):
    reference = chat(client).choices[0].message.content
    stop = reference[10:13]
    resp = chat(client, stop=[stop, "never-appears"])
    assert resp.choices[0].message.content == reference[: reference.index(stop)]
    assert resp.choices[0].finish_reason == "stop"


# -- errors -----------------------------------------------------------------------------------
LONG = "The quick brown fox jumps over the lazy dog. " * 120  # > 512 tokens
OK_CHAT = {"model": MODEL, "messages": MSGS, "max_tokens": 4}
BAD = [  # (endpoint, body, status, param)
    ("chat/completions", b"{not json", 400, None),
    ("chat/completions", b"", 400, None),
    ("chat/completions", b"[1, 2]", 400, None),
    ("chat/completions", {"messages": MSGS}, 400, "model"),
    ("chat/completions", {"model": MODEL}, 400, "messages"),
    ("chat/completions", {**OK_CHAT, "model": "gpt-9"}, 404, "model"),
    ("chat/completions", {**OK_CHAT, "continue_final_message": True}, 400, "continue_final_message"),
    (
        "chat/completions",
        {
            **OK_CHAT,
            "messages": [*MSGS, {"role": "assistant", "content": "x"}],
            "continue_final_message": True,
            "add_generation_prompt": True,
        },
        400,
        "add_generation_prompt",
    ),
    ("chat/completions", {**OK_CHAT, "add_generation_prompt": False}, 400, "add_generation_prompt"),
    ("chat/completions", {**OK_CHAT, "messages": []}, 400, "messages"),
    ("chat/completions", {**OK_CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("chat/completions", {**OK_CHAT, "temperature": "hot"}, 400, "temperature"),
    ("chat/completions", {**OK_CHAT, "temperature": 2.5}, 400, "temperature"),
    ("chat/completions", {**OK_CHAT, "top_p": -0.1}, 400, "top_p"),
    ("chat/completions", {**OK_CHAT, "top_p": 1.01}, 400, "top_p"),
    ("chat/completions", {**OK_CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("chat/completions", {**OK_CHAT, "presence_penalty": 3}, 400, "presence_penalty"),
    ("chat/completions", {**OK_CHAT, "stream": "yes"}, 400, "stream"),
    ("chat/completions", {**OK_CHAT, "stop": 5}, 400, "stop"),
    ("chat/completions", {**OK_CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),  # OpenAI: up to 4
    ("chat/completions", {**OK_CHAT, "top_logprobs": 50, "logprobs": True}, 400, "top_logprobs"),
    ("chat/completions", {**OK_CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {**OK_CHAT, "max_tokens": 100_000}, 400, "max_tokens"),
    ("chat/completions", {**OK_CHAT, "messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("chat/completions", {**OK_CHAT, "prediction": {"type": "content", "content": LONG}}, 400, "prediction.content"),
    ("chat/completions", {**OK_CHAT, "prediction": {"type": "diff", "content": "x"}}, 400, "prediction.type"),
    ("chat/completions", {**OK_CHAT, "n": 9}, 400, "n"),
    ("completions", {"model": MODEL, "prompt": "x", "best_of": 2}, 400, "best_of"),
    (
        "chat/completions",
        {**OK_CHAT, "tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        400,
        "tools[0].function.name",
    ),
    (
        "chat/completions",
        {
            **OK_CHAT,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
            "tool_choice": "required",  # forced: its schema must be enforceable (under "auto" it is only described)
        },
        400,
        "tools[0].function.parameters",
    ),
    ("chat/completions", {**OK_CHAT, "tools": [{"function": {"name": "f"}}]}, 400, "tools[0]"),
    ("chat/completions", {**OK_CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    (
        "chat/completions",
        {
            **OK_CHAT,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
    ),
    (
        "chat/completions",
        {**OK_CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"},
        400,
        "tool_choice",
    ),
    ("chat/completions", {**OK_CHAT, "audio": {"voice": "alloy", "format": "wav"}}, 400, "audio"),
    ("chat/completions", {**OK_CHAT, "response_format": {"type": "yaml"}}, 400, "response_format.type"),
    (
        "chat/completions",
        {
            **OK_CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            },
        },
        400,
        "response_format.json_schema.schema",
    ),
    ("chat/completions", {**OK_CHAT, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
    ("chat/completions", {**OK_CHAT, "structured_outputs": {"regex": "(unclosed"}}, 400, "structured_outputs.regex"),
    ("chat/completions", {**OK_CHAT, "structured_outputs": {"choice": []}}, 400, "structured_outputs.choice"),
    (  # both would constrain the answer: one used to be dropped without a word
        "chat/completions",
        {**OK_CHAT, "structured_outputs": {"choice": ["yes", "no"]}, "response_format": {"type": "json_object"}},
        400,
        "structured_outputs.choice",
    ),
    (
        "chat/completions",
        {**OK_CHAT, "structured_outputs": {"grammar": "root ::= root"}},  # no text satisfies it
        400,
        "structured_outputs.grammar",
    ),
    (
        "chat/completions",
        {**OK_CHAT, "ignore_eos": True, "response_format": {"type": "json_object"}},
        400,
        "ignore_eos",
    ),
    ("completions", {"model": MODEL, "prompt": "x", "n": 9}, 400, "n"),
    (
        "chat/completions",
        {
            **OK_CHAT,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        },
        400,
        "messages[0].content[0]",
    ),
    ("chat/completions", {**OK_CHAT, "speculation": {"method": "magic"}}, 400, "speculation.method"),
    (
        "chat/completions",
        {**OK_CHAT, "speculation": {"num_speculative_tokens": 0}},
        400,
        "speculation.num_speculative_tokens",
    ),
    ("completions", {"model": MODEL, "prompt": ["a", ""]}, 400, "prompt[1]"),
    ("completions", {"model": MODEL, "prompt": [1, 2, 99999]}, 400, "prompt"),
    ("completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),  # 0 only scores (echo)
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "x", "echo": True, "suffix": "y"}, 400, "echo"),
    ("completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("no/such/route", {}, 404, None),
]


def _post(server, path, body, headers=None):
    headers = {"Authorization": f"Bearer {API_KEY}", **(headers or {})}
    if isinstance(body, bytes):
        return httpx.post(
            f"{server.base_url}/{path}",
            content=body,
            timeout=30,
            headers={**headers, "Content-Type": "application/json"},
        )
    return httpx.post(f"{server.base_url}/{path}", json=body, timeout=30, headers=headers)


def test_bad_input_matrix(server, client):
    assert len(BAD) >= 15
    failures = []
    for path, body, status, param in BAD:
        r = _post(server, path, body)
        err = r.json().get("error", {})
        shaped = set(err) == {"message", "type", "param", "code"} and err["message"]
        if r.status_code != status or not shaped or err.get("param") != param:
            failures.append((path, str(body)[:80], r.status_code, r.text[:200]))
    assert not failures, failures
    assert chat(client, max_tokens=4).choices[0].message.content is not None  # still serving
    assert server.health()["status"] == "ok"


def test_wrong_method_is_openai_shaped(server):
    r = httpx.put(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 405 and r.json()["error"]["message"] == "Method not allowed (PUT /v1/chat/completions)"
    r = httpx.post(f"{server.base_url}/chat/complete", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404 and r.json()["error"] == {
        "message": "Invalid URL (POST /v1/chat/complete)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_api_key(server):
    text = httpx.get(f"{server.url}/metrics").text
    before = metric_value(text, "specserve_requests_total", endpoint="chat", status="401")  # other routes' count too
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key"}):
        r = httpx.post(f"{server.base_url}/chat/completions", json=OK_CHAT, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # the refused requests are counted like any other answer (they were not: only 400s and later were)
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "specserve_requests_total", endpoint="chat", status="401") - before == 3
    bad = openai.OpenAI(base_url=server.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200  # health and metrics stay open
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_sdk_raises_on_errors(client):
    with pytest.raises(openai.NotFoundError):
        chat(client, model="gpt-9")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, n=9)
    assert e.value.body["param"] == "n"


# -- metrics ----------------------------------------------------------------------------------
def test_metrics(server, client):
    chat(client, prediction={"type": "content", "content": "return self.db.find(user_id)\n"})
    with pytest.raises(openai.BadRequestError):  # this test's own 400: it may run first (pytest -n)
        chat(client, n=9)
    text = server.metrics()
    assert metric_value(text, "specserve_requests_total", endpoint="chat", status="200") > 0
    assert metric_value(text, "specserve_requests_total", endpoint="chat", status="400") > 0
    assert metric_value(text, "specserve_spec_proposed_tokens_total", source="prediction") > 0
    assert metric_value(text, "specserve_spec_steps_total", source="prediction") > 0
    accepted = metric_value(text, "specserve_spec_accepted_tokens_total")
    assert 0 < accepted <= metric_value(text, "specserve_spec_proposed_tokens_total")
    for name in (
        "specserve_time_to_first_token_seconds_count",
        "specserve_time_per_output_token_seconds_count",
        "specserve_e2e_request_latency_seconds_count",
        "specserve_prompt_tokens_total",
        "specserve_completion_tokens_total",
    ):
        assert metric_value(text, name) > 0, name
    assert "specserve_queue_depth 0.0" in text


def test_token_counters_move_by_the_answers_usage(server, client):
    """Two prompts with n=2 and a scored prompt: the counters used to add each prompt once per
    choice and the scored prompt's hidden token, drifting from what `usage` billed."""
    names = (
        "specserve_prompt_tokens_total",
        "specserve_completion_tokens_total",
        "specserve_prompt_tokens_cached_total",
    )
    before = [metric_value(server.metrics(), name) for name in names]
    batch = client.completions.create(model=MODEL, prompt=["def add(a, b):", "class User:"], n=2, max_tokens=5)
    scored = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=0, echo=True, logprobs=1)
    assert scored.usage.completion_tokens == 0 and batch.usage.completion_tokens > 0
    after = [metric_value(server.metrics(), name) for name in names]
    details = [
        u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0 for u in (batch.usage, scored.usage)
    ]
    assert [a - b for a, b in zip(after, before)] == [
        batch.usage.prompt_tokens + scored.usage.prompt_tokens,
        batch.usage.completion_tokens,
        sum(details),
    ]
