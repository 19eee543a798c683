"""OpenAI's stored chat completions (`store: true`), driven by the official `openai` SDK.

The SDK talks to the app in this process (FastAPI's TestClient is an httpx client), over the tiny
test model: what it stores (plain and streamed answers, their metadata and messages), how it
lists, updates and deletes them, and every 4xx of the five routes, read as raw HTTP.
"""

from __future__ import annotations

import itertools
import random

import openai
import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app
from specserve.server.chat_store import ChatCompletionStore
from specserve.server.ray_serve import SharedChatStore

MODEL = "tiny"
ASK = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def http():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, MODEL)) as c:
        yield c


@pytest.fixture()
def client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def make(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0, **kw)


def test_a_stored_completion_is_retrieved_as_answered_with_its_metadata(client):
    answer = make(client, store=True, metadata={"topic": "add"})
    kept = client.chat.completions.retrieve(answer.id)
    assert kept.model_dump(exclude={"metadata"}) == answer.model_dump(exclude={"metadata"})
    assert kept.metadata == {"topic": "add"}


def test_without_store_nothing_is_kept(client):
    answer = make(client, metadata={"topic": "unkept"})
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.retrieve(answer.id)
    assert e.value.body["param"] == "completion_id"
    assert answer.id not in {c.id for c in client.chat.completions.list(limit=100)}


def test_a_streamed_answer_is_stored_as_the_body_it_adds_up_to(client):
    stream = make(client, store=True, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    kept = client.chat.completions.retrieve(chunks[0].id)
    assert kept.object == "chat.completion" and kept.id == chunks[0].id and kept.created == chunks[0].created
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert kept.choices[0].message.content == text
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [kept.choices[0].finish_reason] == finished
    assert kept.usage == chunks[-1].usage
    assert kept.choices[0].message.content == make(client).choices[0].message.content  # greedy: the same answer


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 6}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_streamed_tool_call_is_stored_with_the_id_it_was_streamed_with():
    """The stored body is built from the stream's outputs; its call ids are those the client saw
    (parsing the text again would have given each call a new id)."""
    llm = LLM.from_models(tiny_model(max_positions=2048), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, MODEL)) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)
        named = {"type": "function", "function": {"name": "get_weather"}}
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[WEATHER],
                tool_choice=named,
                max_tokens=200,
                temperature=0,
                stream=True,
                store=True,
            )
        )
        streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
        kept = client.chat.completions.retrieve(chunks[0].id).choices[0].message.tool_calls
        assert [c.id for c in kept] == [streamed[0].id] and streamed[0].id.startswith("call_")
        assert kept[0].function.arguments == "".join(t.function.arguments or "" for t in streamed)


def test_its_messages_are_listed_with_ids_and_paged(client):
    parts = [{"type": "text", "text": "def "}, {"type": "text", "text": "sub(a, b):"}]
    messages = [*ASK, {"role": "assistant", "content": "ok"}, {"role": "user", "content": parts, "name": "ann"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, store=True)
    listed = list(client.chat.completions.messages.list(answer.id, limit=3))  # the SDK pages on by `after`
    assert [m.id for m in listed] == [f"{answer.id}-{i}" for i in range(4)]
    assert [m.role for m in listed] == ["system", "user", "assistant", "user"]
    assert listed[0].content == "You write Python." and listed[0].content_parts is None
    assert listed[3].content == "def sub(a, b):" and listed[3].name == "ann"
    assert [p.model_dump(exclude_none=True) for p in listed[3].content_parts] == parts
    newest = client.chat.completions.messages.list(answer.id, limit=1, order="desc")
    assert [m.id for m in newest.data] == [f"{answer.id}-3"] and newest.has_more


def test_the_list_filters_by_metadata_and_model_and_pages_in_order(client):
    made = [make(client, store=True, metadata={"run": "list", "i": str(i)}).id for i in range(3)]
    assert [c.id for c in client.chat.completions.list(metadata={"run": "list"}, limit=2)] == made  # oldest first
    assert [c.id for c in client.chat.completions.list(metadata={"run": "list", "i": "1"})] == [made[1]]
    desc = client.chat.completions.list(metadata={"run": "list"}, order="desc", limit=2)
    assert [c.id for c in desc.data] == made[:0:-1] and desc.has_more
    assert desc.model_dump()["first_id"] == made[2] and desc.model_dump()["last_id"] == made[1]
    after = client.chat.completions.list(metadata={"run": "list"}, after=made[0])
    assert [c.id for c in after.data] == made[1:] and not after.has_more
    assert list(client.chat.completions.list(metadata={"run": "list"}, model="other")) == []
    assert len(list(client.chat.completions.list(metadata={"run": "list"}, model=MODEL))) == 3


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("how", ["deleted", "updated out of the filter"])
def test_a_page_walk_goes_on_when_its_cursor_is_deleted_or_leaves_the_filter(client, order, how):
    """The SDK's next page asks for the items after the last id it saw. When another client had
    deleted that completion (or updated its metadata out of the list's filter) in between, the
    page was a 400 (`after: no stored chat completion ...`), so auto-pagination over a store in
    use failed mid-way (found by a soak walking pages while other workers deleted). It now goes
    on from where the cursor was made: no id skipped, none repeated."""
    made = [make(client, store=True, metadata={"run": f"walk-{order}-{how}"}).id for _ in range(4)]
    query = {"metadata": {"run": f"walk-{order}-{how}"}, "order": order, "limit": 2}
    first = client.chat.completions.list(**query)
    cursor = first.data[-1].id
    if how == "deleted":
        client.chat.completions.delete(cursor)
    else:
        client.chat.completions.update(cursor, metadata={"run": "elsewhere"})
    rest = client.chat.completions.list(**query, after=cursor)
    walked = [c.id for c in first.data] + [c.id for c in rest.data]
    assert walked == (made if order == "asc" else made[::-1]) and not rest.has_more


def test_update_replaces_the_metadata_and_delete_drops_it(client):
    answer = make(client, store=True, metadata={"a": "1"})
    updated = client.chat.completions.update(answer.id, metadata={"b": "2"})
    assert updated.metadata == {"b": "2"} and updated.choices == answer.choices
    assert client.chat.completions.retrieve(answer.id).metadata == {"b": "2"}
    assert [c.id for c in client.chat.completions.list(metadata={"b": "2"})] == [answer.id]
    deleted = client.chat.completions.delete(answer.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (answer.id, "chat.completion.deleted", True)
    for call in (
        lambda: client.chat.completions.retrieve(answer.id),
        lambda: client.chat.completions.delete(answer.id),
        lambda: client.chat.completions.update(answer.id, metadata={}),
        lambda: client.chat.completions.messages.list(answer.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()


def _error(r, status: int, param: str | None) -> dict:
    err = r.json()["error"]
    assert r.status_code == status and set(err) == {"message", "type", "param", "code"}, r.text
    assert err["param"] == param and err["message"], r.text
    return err


@pytest.mark.parametrize(
    "metadata,param",
    [
        ({f"k{i}": "v" for i in range(17)}, "metadata"),  # 17 pairs
        ({"k" * 65: "v"}, "metadata"),  # a key over 64
        ({"k": "v" * 513}, "metadata.k"),  # a value over 512
        ({"k": 5}, "metadata.k"),  # not a string
        ("tags", "metadata"),
    ],
)
def test_bad_metadata_is_a_400_naming_the_field(http, metadata, param):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, "store": True, "metadata": metadata}
    _error(http.post("/v1/chat/completions", json=body), 400, param)
    stored = http.post("/v1/chat/completions", json={**body, "metadata": {"k": "v"}}).json()
    _error(http.post(f"/v1/chat/completions/{stored['id']}", json={"metadata": metadata}), 400, param)


def test_store_must_be_a_boolean(http):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, "store": "yes"}
    _error(http.post("/v1/chat/completions", json=body), 400, "store")


@pytest.mark.parametrize(
    "query,param",
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("order=newest", "order"),
        ("after=chatcmpl-none", "after"),
    ],
)
def test_bad_list_queries_are_400s_naming_them(http, query, param):
    stored = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 2, "store": True})
    _error(http.get(f"/v1/chat/completions?{query}"), 400, param)
    _error(http.get(f"/v1/chat/completions/{stored.json()['id']}/messages?{query}"), 400, param)


def test_unknown_ids_and_bad_update_bodies(http):
    for method, path in (
        ("GET", "/v1/chat/completions/chatcmpl-none"),
        ("DELETE", "/v1/chat/completions/chatcmpl-none"),
        ("GET", "/v1/chat/completions/chatcmpl-none/messages"),
    ):
        assert _error(http.request(method, path), 404, "completion_id")["code"] == "not_found"
    _error(http.post("/v1/chat/completions/chatcmpl-none", json={"metadata": {}}), 404, "completion_id")
    stored = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 2, "store": True})
    path = f"/v1/chat/completions/{stored.json()['id']}"
    _error(http.post(path, json={}), 400, "metadata")  # metadata is required
    _error(http.post(path, content=b"{not json"), 400, None)
    assert http.post(path, json={"metadata": None}).json()["metadata"] == {}


def test_the_store_drops_the_least_recently_used_beyond_its_size():
    probe = ChatCompletionStore()
    probe.put({"id": "c0", "model": "m"}, [{"role": "user", "content": "x" * 100}], {"i": "0"})
    store = ChatCompletionStore(max_bytes=probe._kept.size * 5 // 2)  # two of these, not three
    for i in range(3):
        store.put({"id": f"c{i}", "model": "m"}, [{"role": "user", "content": "x" * 100}], {"i": str(i)})
    assert store.get("c0") is None and store.get("c2") is not None  # c0 went first
    store.get("c1")  # used: c2 is now the oldest
    store.put({"id": "c3", "model": "m"}, [{"role": "user", "content": "x" * 100}], None)
    assert store.get("c2") is None and [b["id"] for b in store.listing()] == ["c1", "c3"]  # listed as made


class InProcess(SharedChatStore):
    """A Ray replica's client of the chat store actor, whose calls reach a store in this process;
    `crossed` counts the rows of every list it got back (what would cross from the actor)."""

    def __init__(self):
        super().__init__()
        self.store, self.crossed = ChatCompletionStore(), []

    def _call(self, method, *args):
        answer = getattr(self.store, method)(*args)
        if isinstance(answer, list):
            self.crossed.append(len(answer))
        return answer


def test_a_ray_replica_s_shared_store_forwards_every_route_to_the_one_store():
    """Under Ray a replica's app gets SharedChatStore (ray_serve.SpecServeReplica), whose methods
    run in the app's one ChatCompletionStore actor; here its calls go to a store in this process
    instead of an actor, so every route is seen to reach the store with its arguments in order.
    Until today a replica's store refused store: true with a 400 (it was not shared)."""
    shared = InProcess()
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    with TestClient(create_app(llm, MODEL, chat_store=shared)) as c:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 2, "store": True, "metadata": {"k": "v"}}
        made = [c.post("/v1/chat/completions", json=body).json()["id"] for _ in range(2)]
        assert [b["id"] for b in shared.store.listing()] == made
        listed = c.get("/v1/chat/completions", params={"after": made[0], "metadata[k]": "v", "model": MODEL})
        assert [b["id"] for b in listed.json()["data"]] == made[1:]
        assert c.get(f"/v1/chat/completions/{made[0]}").json()["metadata"] == {"k": "v"}
        messages = c.get(f"/v1/chat/completions/{made[0]}/messages").json()["data"]
        assert [m["content"] for m in messages] == [m["content"] for m in ASK]
        updated = c.post(f"/v1/chat/completions/{made[0]}", json={"metadata": {"k": "w"}}).json()
        assert updated["metadata"] == shared.store.get(made[0])["metadata"] == {"k": "w"}
        assert c.delete(f"/v1/chat/completions/{made[0]}").status_code == 200
        assert shared.store.get(made[0]) is None


def test_the_openapi_document_has_the_five_operations(http):
    paths = http.get("/openapi.json").json()["paths"]
    one = "/v1/chat/completions/{completion_id}"
    for path, method, statuses in (
        ("/v1/chat/completions", "get", {"200", "400", "401"}),
        (one, "get", {"200", "401", "404"}),
        (one, "post", {"200", "400", "401", "404"}),
        (one, "delete", {"200", "401", "404"}),
        (one + "/messages", "get", {"200", "400", "401", "404"}),
    ):
        assert statuses <= set(paths[path][method]["responses"]), (path, method)
    assert "metadata" in {p["name"] for p in paths["/v1/chat/completions"]["get"]["parameters"]}
    assert paths[one]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ChatCompletionUpdateRequest"
    )


def test_the_routes_need_the_api_key_and_keep_the_body_cap():
    from specserve.server.app import ServerOptions

    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    options = ServerOptions(api_key="k", max_body_bytes=4000)
    with TestClient(create_app(llm, MODEL, options)) as c:
        key = {"Authorization": "Bearer k"}
        for method, path in (
            ("GET", "/v1/chat/completions"),
            ("GET", "/v1/chat/completions/chatcmpl-x"),
            ("POST", "/v1/chat/completions/chatcmpl-x"),
            ("DELETE", "/v1/chat/completions/chatcmpl-x"),
            ("GET", "/v1/chat/completions/chatcmpl-x/messages"),
        ):
            assert _error(c.request(method, path), 401, None)["code"] == "invalid_api_key"
        assert c.get("/v1/chat/completions", headers=key).status_code == 200
        big = {"metadata": {"k": "v" * 5000}}
        _error(c.post("/v1/chat/completions/chatcmpl-x", json=big, headers=key), 413, None)


def test_the_store_remembers_the_place_of_dropped_ids_only():
    """A deleted or evicted id keeps its place for list cursors; an updated one is still kept, so
    it takes none of the bounded memory of dropped ones."""
    store = ChatCompletionStore(max_bytes=500)  # two of these, not three
    for i in range(3):
        store.put({"id": f"c{i}", "model": "m"}, [{"role": "user", "content": "x" * 100}], None)
    store.update("c2", {"a": "b"})
    store.delete("c1")
    assert [store.place(f"c{i}") for i in range(3)] == [0, 1, 2] and store.place("c9") is None
    assert sorted(store._places) == ["c0", "c1"]  # evicted and deleted; c2 updated, still kept
    assert [b["id"] for b in store.listing(after="c0")] == ["c2"] and store.listing(after="c2", desc=True) == []


def _made_at_random(store: ChatCompletionStore, seed: int) -> tuple[list[str], dict[str, dict]]:
    """Completions put in, their metadata updated and some deleted, at random: the ids in the order
    they were made, and the bodies kept (as the test tracks them, not as the store does)."""
    rng = random.Random(seed)
    made, kept = [], {}
    for i in range(40):
        cid = f"chatcmpl-{i:03d}"
        body, metadata = {"id": cid, "model": rng.choice("ab")}, {"k": rng.choice("xy")}
        store.put(body, [{"role": "user", "content": "hi"}], metadata)
        made.append(cid)
        kept[cid] = {**body, "metadata": metadata}
        if rng.random() < 0.3:  # an earlier one's metadata changes (it keeps its place in the list)
            cid = rng.choice(sorted(kept))
            kept[cid] = store.update(cid, {"k": rng.choice("xy")})
        if rng.random() < 0.3:  # an earlier one goes (its id still names its place for a cursor)
            cid = rng.choice(sorted(kept))
            store.delete(cid)
            del kept[cid]
    return made, kept


def _page_as_before(made: list[str], kept: dict[str, dict], query: dict) -> dict | None:
    """The page the route answered until today: every match oldest first, paged after the cursor's
    place in the order completions were made; None for a cursor never made."""
    model, want, after = query.get("model"), query.get("metadata[k]"), query.get("after")
    desc, limit = query.get("order") == "desc", query["limit"]
    rows = [kept[c] for c in made if c in kept and model in (None, kept[c]["model"])]
    rows = [r for r in rows if want in (None, r["metadata"]["k"])]
    if after is not None:
        if after not in made:
            return None
        place = made.index(after)
        rows = [r for r in rows if (made.index(r["id"]) < place if desc else made.index(r["id"]) > place)]
    rows = rows[::-1] if desc else rows
    data = rows[:limit]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(rows) > limit}


def test_a_ray_replica_s_list_pages_in_the_store_and_answers_as_before():
    """Under Ray the list route moved every matching body from the store's actor to the replica,
    which then paged them: 40 stored completions crossed for a page of 1. The store now pages
    (ChatCompletionStore.listing) and only `limit` + 1 rows cross; every page (each filter, order,
    limit and cursor: kept, deleted, updated or never made) is the one the route answered before."""
    shared = InProcess()
    made, kept = _made_at_random(shared.store, seed=7)
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    cursors = [None, made[0], made[17], made[-1], *[c for c in made if c not in kept][:3], "chatcmpl-never"]
    with TestClient(create_app(llm, MODEL, chat_store=shared)) as c:
        for model, want, order, limit, after in itertools.product(
            (None, "a"), (None, "x"), ("asc", "desc"), (1, 3, 7, 100), cursors
        ):
            query = {"model": model, "metadata[k]": want, "order": order, "limit": limit, "after": after}
            query = {k: v for k, v in query.items() if v is not None}
            shared.crossed.clear()
            answer, expected = c.get("/v1/chat/completions", params=query), _page_as_before(made, kept, query)
            if expected is None:
                assert (
                    _error(answer, 400, "after")["message"]
                    == f"after: no stored chat completion with id {after!r} in this list"
                )
            else:
                assert answer.status_code == 200 and answer.json() == expected, query
            assert max(shared.crossed, default=0) <= limit + 1, (query, shared.crossed)
