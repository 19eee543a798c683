"""Logprobs end where a stop string cuts the text: the tokens wholly inside the cut-off stop
string are not listed, in the engine's output and stream, and in completions' and chat's
logprobs, streamed or not (the Responses API has no `stop`; it shares the engine's lists).

A token that straddles the cut (its text starts in the answer and runs into the stop string)
is kept: it wrote part of the answer. vLLM keeps every token up to the one that completes the
stop string; we drop the ones whose text lies wholly inside it, so logprobs cover the returned
text and nothing more.
"""

from __future__ import annotations

import functools
import json

from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.llm import LLM
from specserve.server.app import create_app

PROMPT = "def add(a, b):"
MAX = 20
COMMON = {"model": "tiny", "max_tokens": MAX, "temperature": 0}


@functools.lru_cache(maxsize=1)
def llm() -> LLM:
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, temperature=0, logprobs=0, **kw)


def stop_cases(texts: list[str]) -> list[tuple[str, int]]:
    """(stop string, how many tokens have text in the answer it leaves) for an answer whose tokens
    read `texts`: stops that begin where a token begins (that token is cut) and stops that begin
    inside a token (that token straddles the cut and is kept)."""
    text = "".join(texts)
    starts = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    at_start = [(text[s : s + 3], k) for k, s in enumerate(starts) if k >= 2 and text.find(text[s : s + 3]) == s]
    inside = [
        (text[s + 1 : s + 4], k + 1)
        for k, s in enumerate(starts)
        if k >= 2 and len(texts[k]) > 1 and text.find(text[s + 1 : s + 4]) == s + 1
    ]
    assert len(at_start) >= 2 and len(inside) >= 1, texts
    return at_start[:2] + inside[:2]


def test_the_engine_lists_only_the_tokens_of_the_returned_text():
    tok = tiny_tokenizer()
    base = llm().generate(PROMPT, params())
    texts = [tok.decode([t]) for t in base.token_ids]
    assert "".join(texts) == base.text and len(texts) == MAX
    for stop, kept in stop_cases(texts):
        out = llm().generate(PROMPT, params(stop=(stop,)))
        assert out.text == base.text[: base.text.find(stop)] and out.finish_reason == "stop"
        assert [lp.token_id for lp in out.logprobs] == base.token_ids[:kept], (stop, texts)
        streamed = [lp.token_id for e in llm().stream(PROMPT, params(stop=(stop,))) for lp in e.logprobs or ()]
        assert streamed == base.token_ids[:kept]


def _chunks(r) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def _completion_tokens(chunks: list[dict]) -> list[str]:
    return [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]


def _chat_tokens(chunks: list[dict]) -> list[str]:
    lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"]]
    return [e["token"] for lp in lps if lp for e in lp["content"]]


def test_completions_list_only_the_tokens_of_the_returned_text():
    with TestClient(create_app(llm(), "tiny")) as client:
        body = {**COMMON, "prompt": PROMPT, "logprobs": 0}
        base = client.post("/v1/completions", json=body).json()["choices"][0]
        texts = base["logprobs"]["tokens"]
        for stop, kept in stop_cases(texts):
            text = base["text"][: base["text"].find(stop)]
            choice = client.post("/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
            lp = choice["logprobs"]
            assert choice["text"] == text and lp["tokens"] == texts[:kept], (stop, texts)
            assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == kept
            assert lp["text_offset"] == base["logprobs"]["text_offset"][:kept]
            assert all(offset < len(text) for offset in lp["text_offset"])
            chunks = _chunks(client.post("/v1/completions", json={**body, "stop": stop, "stream": True}))
            assert _completion_tokens(chunks) == texts[:kept]
            assert "".join(c["choices"][0]["text"] for c in chunks) == text


def test_chat_lists_only_the_tokens_of_the_returned_text():
    with TestClient(create_app(llm(), "tiny")) as client:
        body = {**COMMON, "messages": [{"role": "user", "content": PROMPT}], "logprobs": True}
        base = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        texts = [e["token"] for e in base["logprobs"]["content"]]
        for stop, kept in stop_cases(texts):
            answer = client.post("/v1/chat/completions", json={**body, "stop": stop}).json()["choices"][0]
            assert answer["message"]["content"] == base["message"]["content"][: "".join(texts).find(stop)]
            assert [e["token"] for e in answer["logprobs"]["content"]] == texts[:kept], (stop, texts)
            chunks = _chunks(client.post("/v1/chat/completions", json={**body, "stop": stop, "stream": True}))
            assert _chat_tokens(chunks) == texts[:kept]


def stopped_runs():
    """(stop, kept, way, kw, plain answer) for every stop case, plain and under each speculation
    method: kw are the generate/stream keywords of the way (a prediction of the whole answer)."""
    tok = tiny_tokenizer()
    base = llm().generate(PROMPT, params())
    predicted = {"prediction": base.text, "speculation": "prediction"}
    ways = {"plain": {}, "ngram": {"speculation": "ngram"}, "prediction": predicted}
    for stop, kept in stop_cases([tok.decode([t]) for t in base.token_ids]):
        for way, kw in ways.items():
            yield stop, kept, way, kw, base


def test_token_ids_and_logprobs_list_the_same_tokens_plain_and_speculative():
    """token_ids kept the tokens of the cut-off stop string while logprobs dropped them (found
    reading RequestOutput: logprobs were cut to kept_tokens, token_ids and token_sources not).
    All three now list the tokens of the returned text, with or without speculation."""
    tok = tiny_tokenizer()
    for stop, kept, way, kw, base in stopped_runs():
        out = llm().generate(PROMPT, params(stop=(stop,)), **kw)
        assert out.finish_reason == "stop" and len(out.token_ids) == len(out.logprobs), (way, stop)
        assert out.token_ids == [lp.token_id for lp in out.logprobs] == base.token_ids[:kept], (way, stop)
        assert len(out.token_sources) == kept and tok.decode(out.token_ids).startswith(out.text)
        if way == "prediction":
            assert out.stats.accepted > 0  # the stop was reached inside accepted draft tokens


def test_streamed_events_list_only_the_tokens_of_the_returned_text():
    """A stream's events carried every committed token (the cut stop string's too, and a held-back
    tail before its text was released) while their logprobs and text did not: joined, the events'
    token_ids disagreed with RequestOutput.token_ids after a stop cut (found checking the stream
    against the output the last fix cut). Each event now carries the tokens whose text it releases."""
    for stop, kept, way, kw, base in stopped_runs():
        gen = llm().stream(PROMPT, params(stop=(stop,)), **kw)
        events = list(gen)
        assert [t for e in events for t in e.token_ids] == gen.output.token_ids == base.token_ids[:kept], way
        assert [s for e in events for s in e.sources] == gen.output.token_sources, (way, stop)
        for e in events:  # each event's tokens are those of its logprobs
            assert e.token_ids == [lp.token_id for lp in e.logprobs] and len(e.sources) == len(e.token_ids)
