"""Predicted Outputs through the HTTP API, in-process on a tiny float32 model: a bad `prediction`
is a 400 naming the field on every endpoint that takes one (chat, completions, Responses), a good
one is served losslessly with every field it may come with, and the usage's accepted / rejected
prediction tokens add up (n > 1, streams, stop strings, max_tokens) and agree with /metrics."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from server_proc import metric_value
from tiny import steady_prices, tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

ASK = "def get_user(self, user_id):"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": ASK}], "max_tokens": 32, "temperature": 0}
CMPL = {"model": "tiny", "prompt": ASK, "max_tokens": 32, "temperature": 0}
RESP = {"model": "tiny", "input": ASK, "max_output_tokens": 32, "temperature": 0}
BODIES = {"/v1/chat/completions": CHAT, "/v1/completions": CMPL, "/v1/responses": RESP}


@pytest.fixture(scope="module")
def client():
    llm = steady_prices(LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="auto"))[0]
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def pred(content) -> dict:
    return {"type": "content", "content": content}


BAD = [  # (prediction, param, code)
    ("text", "prediction", "invalid_type"),
    (["x"], "prediction", "invalid_type"),
    ({"content": "x"}, "prediction.type", "missing_required_parameter"),
    ({"type": "content"}, "prediction.content", "missing_required_parameter"),
    ({"type": "diff", "content": "x"}, "prediction.type", "invalid_value"),
    (pred(5), "prediction.content", "invalid_type"),
    (pred(None), "prediction.content", "invalid_type"),
    (pred([{"type": "image_url", "image_url": {"url": "x"}}]), "prediction.content[0]", "unsupported_parameter"),
    # a text part without text: was "content part type 'text' (only 'text' parts) is not supported"
    (pred([{"type": "text"}]), "prediction.content[0].text", "missing_required_parameter"),
    # a text part whose text is a number: was "prediction.content: Input should be a valid string"
    (pred([{"type": "text", "text": 5}]), "prediction.content[0].text", "invalid_type"),
    (pred(["x"]), "prediction.content[0]", "invalid_type"),
    (pred("x y z " * 2000), "prediction.content", "context_length_exceeded"),
]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("prediction,param,code", BAD)
def test_a_bad_prediction_is_a_400_naming_the_field(client, path, prediction, param, code):
    r = client.post(path, json={**BODIES[path], "prediction": prediction})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert "only 'text' parts) is not supported" not in err["message"] or err["code"] == "unsupported_parameter"


def _metric(client, name: str) -> float:
    return metric_value(client.get("/metrics").text, name, source="prediction")


def _by_prediction(spec: dict | list[dict]) -> tuple[int, int]:
    """(accepted, proposed) prediction tokens of a `speculation` object or list of them."""
    specs = spec if isinstance(spec, list) else [spec]
    counts = [s["by_source"].get("prediction", {"accepted": 0, "proposed": 0}) for s in specs]
    return sum(c["accepted"] for c in counts), sum(c["proposed"] for c in counts)


def _stream(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _check_usage(usage: dict, spec) -> tuple[int, int]:
    """accepted + rejected = the prediction tokens proposed, accepted <= the completion tokens."""
    d = usage["completion_tokens_details"]
    accepted, proposed = _by_prediction(spec)
    assert (d["accepted_prediction_tokens"], d["rejected_prediction_tokens"]) == (accepted, proposed - accepted)
    assert accepted <= usage["completion_tokens"]
    return accepted, proposed


def test_usage_adds_up_and_agrees_with_the_metrics(client):
    """n > 1 sums the choices; a stream's usage chunk says what the answer would; a stop string or
    max_tokens inside an accepted run counts the tokens after the cut as rejected, never accepted;
    the per-source counters of /metrics move by the usage summed over the requests."""
    base = client.post("/v1/chat/completions", json={**CHAT, "speculation": "none"}).json()
    text = base["choices"][0]["message"]["content"]
    edited = text[:10] + "\n    inserted = line()\n" + text[10:]
    before = (
        _metric(client, "specserve_spec_accepted_tokens_total"),
        _metric(client, "specserve_spec_proposed_tokens_total"),
    )
    totals = [0, 0]
    cases = [
        ("/v1/chat/completions", {**CHAT, "n": 2, "prediction": pred(edited)}, text),
        (
            "/v1/chat/completions",
            {**CHAT, "prediction": pred(text), "stop": [text[12:15]]},
            text[: text.index(text[12:15])],
        ),
        ("/v1/chat/completions", {**CHAT, "prediction": pred(text), "max_tokens": 5}, None),
        ("/v1/completions", {**CMPL, "n": 2, "prediction": pred(edited)}, None),
    ]
    for path, body, want in cases:
        r = client.post(path, json=body).json()
        got = [c.get("message", {}).get("content", c.get("text")) for c in r["choices"]]
        if want is not None:
            assert got == [want] * len(got)
        counts = _check_usage(r["usage"], r["speculation"])
        chunks = _stream(client, path, {**body, "stream_options": {"include_usage": True}})
        last = chunks[-1]
        streamed = _check_usage(last["usage"], last["speculation"])
        finishes = [c["speculation"] for c in chunks[:-1] if c.get("speculation")]  # each choice's finish chunk
        assert _by_prediction(finishes) == streamed
        for i, n in enumerate(counts + streamed):
            totals[i % 2] += n
    assert totals[0] > 0
    # the worker counts a step's drafts just after the step's answers go out: wait for the last one
    deadline = time.monotonic() + 10
    while True:
        after = (
            _metric(client, "specserve_spec_accepted_tokens_total"),
            _metric(client, "specserve_spec_proposed_tokens_total"),
        )
        delta = after[0] - before[0], after[1] - before[1]
        if delta == tuple(totals) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert delta == tuple(totals)


def test_a_prediction_is_served_with_every_field_it_may_come_with(client):
    """n > 1, logprobs, tools, response_format, stop on chat; logprobs and echo on completions; the
    Responses API: each answered as without the prediction, and its usage adds up."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    cases = [
        ("/v1/chat/completions", {**CHAT, "n": 2, "logprobs": True, "top_logprobs": 2}),
        ("/v1/chat/completions", {**CHAT, "tools": tools}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "max_tokens": 8}),
        ("/v1/completions", {**CMPL, "logprobs": 2, "echo": True}),
        ("/v1/responses", {**RESP}),
    ]
    for path, body in cases:
        plain = client.post(path, json={**body, "speculation": "none"}).json()
        answer = _answer(plain)
        r = client.post(path, json={**body, "prediction": pred(answer[0])})
        assert r.status_code == 200, r.text
        assert _answer(r.json()) == answer
        if path != "/v1/responses":
            _check_usage(r.json()["usage"], r.json()["speculation"])


def _answer(body: dict) -> list[str]:
    if body.get("object") == "response":
        return [body["output"][0]["content"][0]["text"]]
    return [c.get("message", {}).get("content") or c.get("text") or "" for c in body["choices"]]


@pytest.mark.parametrize(
    "part,code",
    [({"type": "input_text"}, "missing_required_parameter"), ({"type": "input_text", "text": 5}, "invalid_type")],
)
def test_a_responses_text_part_without_text_names_its_text(client, part, code):
    """Was "content part type 'input_text' (only text parts) is not supported", naming the part."""
    body = {**RESP, "input": [{"role": "user", "content": [part]}]}
    err = client.post("/v1/responses", json=body).json()["error"]
    assert (err["param"], err["code"]) == ("input[0].content[0].text", code), err


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("content", ["", [], [{"type": "text", "text": ""}]])
def test_an_empty_prediction_is_served_as_none_with_no_prediction_tokens(client, path, content):
    plain = client.post(path, json={**BODIES[path], "speculation": "none"}).json()
    r = client.post(path, json={**BODIES[path], "prediction": pred(content)}).json()
    assert _answer(r) == _answer(plain)
    usage = r["usage"]
    details = usage.get("completion_tokens_details") or usage["output_tokens_details"]
    assert (details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]) == (0, 0)
    assert "prediction" not in r["speculation"]["by_source"]


@pytest.fixture(scope="module")
def drafted():
    """A server with a draft model, so that every method can be asked for."""
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1), speculation="auto")
    with TestClient(create_app(steady_prices(llm)[0], "tiny")) as c:
        yield c


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("method", ["ngram", "draft", "none"])
def test_a_prediction_under_another_method_is_unused_and_counted_as_such(drafted, path, method):
    """A prediction drafts only under `auto` and `prediction` (docs/server.md): under ngram, draft
    or none it is not used, and usage says so honestly, 0 accepted and 0 rejected, on every
    endpoint, streamed too, with n > 1; the text is that method's without a prediction. The
    prediction here is the answer itself, which `prediction` takes whole (checked first)."""
    plain = drafted.post(path, json={**BODIES[path], "speculation": "none"}).json()
    prediction = pred(_answer(plain)[0])
    used = drafted.post(path, json={**BODIES[path], "prediction": prediction, "speculation": "prediction"}).json()
    assert _details(used)[0] > 0  # the same prediction is taken when asked for
    for extra in ({}, {"n": 2}, {"stream": True, "stream_options": {"include_usage": True}}):
        if path == "/v1/responses" and extra:
            continue  # no n; a stream's usage is checked on chat and completions
        body = {**BODIES[path], "speculation": method, **extra}
        without = _final(drafted.post(path, json=body))
        r = _final(drafted.post(path, json={**body, "prediction": prediction}))
        assert _details(r) == (0, 0), (method, extra)
        specs = r["speculation"] if isinstance(r["speculation"], list) else [r["speculation"]]
        assert all("prediction" not in s["by_source"] for s in specs)
        assert _answer(r) == _answer(without)


def _details(body: dict) -> tuple[int, int]:
    """Accepted / rejected prediction tokens of an answer's usage (chat, completions, Responses)."""
    usage = body["usage"]
    details = usage.get("completion_tokens_details") or usage["output_tokens_details"]
    return details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]


def _final(r) -> dict:
    """The answer's body, or a stream's usage chunk with its text put together."""
    assert r.status_code == 200, r.text
    if not r.headers["content-type"].startswith("text/event-stream"):
        return r.json()
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    firsts = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(c.get("text") or c.get("delta", {}).get("content") or "" for c in firsts)
    return {**chunks[-1], "choices": [{"text": text}]}
