"""Grammar compilation off the request path (issue 17, item 8): a time limit, a bounded pool of
compile threads, a bounded cache, and JSON's strict-whitespace option."""

from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import xgrammar as xgr
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM
from specserve.backends.transformers import TransformersBackend
from specserve.engine.constrain import (
    CompilePool,
    ConstraintError,
    ConstraintFactory,
    GrammarBusy,
    GrammarCache,
    GrammarSpec,
    check_schema,
    exact_pattern,
    optional_groups,
)
from specserve.server.app import ServerOptions, create_app
from specserve.server.structured import json_whitespace
from specserve.server.tools import check_forced_schemas, forced_grammar

# A 185-byte schema that xgrammar needs ~2 s per alternative to compile on the tiny 400-token
# vocabulary (measured: 1 alternative 2.0 s, 3 alternatives 6.2 s; ~4 s each on SmolLM2's 49k):
# nested bounded repetitions expand into a huge automaton.
SLOW_SCHEMA = {"anyOf": [{"type": "string", "pattern": f"((a{i}|b){{1,100}}x){{1,100}}"} for i in range(3)]}
SIMPLE_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
VOCAB = list(string.printable) + ["<eos>"]  # one token per character, for the synthetic tests


def chat(client, **extra):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 8,
        "temperature": 0,
        **extra,
    }
    return client.post("/v1/chat/completions", json=body)


def schema_format(schema) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def wait_for(condition, what: str, limit_s: float = 180.0) -> None:
    """Poll until `condition()` holds (a liveness guard, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)


def limit_slow_only(factory: ConstraintFactory, slow_key: tuple) -> None:
    """Give the slow schema's compilation a 1 s limit and every other one 60 s (a liveness guard).
    The simple schema had the same 1 s: on a loaded machine, compiling beside the slow one, it
    overran it too and was refused. Submits are serialized: each reads the limit it was set."""
    submit, lock = factory.submit, threading.Lock()

    def submit_with_limit(spec: GrammarSpec):
        with lock:
            factory.time_limit_s = 1.0 if spec.cache_key() == slow_key else 60.0
            return submit(spec)

    factory.submit = submit_with_limit


def test_slow_schema_is_a_400_while_other_requests_flow():
    llm = LLM.from_backends(TransformersBackend(tiny_model()), tiny_tokenizer(), name="tiny")
    factory = llm._factory()
    slow_key = GrammarSpec("json_schema", SLOW_SCHEMA).cache_key()
    limit_slow_only(factory, slow_key)
    with TestClient(create_app(llm, "tiny", ServerOptions())) as client, ThreadPoolExecutor(2) as pool:
        slow = pool.submit(chat, client, **schema_format(SLOW_SCHEMA))
        wait_for(lambda: factory.pool.running == 1, "the slow compilation to start")
        plain, simple = chat(client), chat(client, **schema_format(SIMPLE_SCHEMA))
        assert plain.status_code == 200 and simple.status_code == 200, (plain.text, simple.text)
        r = slow.result()
        assert slow_key in factory._inflight  # answered while xgrammar was still compiling it
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "exceeded the server's limit of 1 s" in err["message"]
        assert err["param"] == "response_format.json_schema.schema"
        # The compilation could not be stopped: it finishes in the background, into the cache.
        wait_for(lambda: slow_key in factory.cache, "the overrunning compilation to finish")
        again = chat(client, **schema_format(SLOW_SCHEMA))
        assert again.status_code == 200, again.text


class GatedCompiles:
    """A factory whose compilations wait for `release` (a stand-in for slow schemas)."""

    def __init__(self, workers: int = 2, limit_s: float = 0.2):
        self.factory = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
        self.factory.time_limit_s = limit_s
        self.factory.pool = CompilePool(workers)
        self.release = threading.Event()
        self.started: list[str] = []
        self.at_once = self.max_at_once = 0
        self.lock = threading.Lock()
        real = self.factory.compile

        def gated(spec):
            with self.lock:
                self.started.append(spec.source)
                self.at_once += 1
                self.max_at_once = max(self.max_at_once, self.at_once)
            self.release.wait(60)
            try:
                return real(spec)
            finally:
                with self.lock:
                    self.at_once -= 1

        self.factory.compile = gated


def test_overrunning_compilations_are_bounded_dropped_when_queued_and_cached_when_done():
    g = GatedCompiles(workers=2)
    f = g.factory
    a, b, c = (GrammarSpec("regex", r, param="structured_outputs.regex") for r in ("a+", "b+", "c+"))
    pa, pb = f.submit(a), f.submit(b)
    wait_for(lambda: len(g.started) == 2, "both workers to start")
    pc = f.submit(c)  # both workers are busy: queued
    assert f.submit(a).future is pa.future  # the same grammar joins its running compilation
    for p in (pa, pb):
        with pytest.raises(ConstraintError, match=r"exceeded the server's limit of 0.2 s") as e:
            p.result()
        assert not isinstance(e.value, GrammarBusy) and e.value.param == "structured_outputs.regex"
    with pytest.raises(GrammarBusy, match="busy"):
        pc.result()
    g.release.set()
    wait_for(lambda: a.cache_key() in f.cache and b.cache_key() in f.cache, "the overrunning compilations")
    assert g.started == ["a+", "b+"] and g.max_at_once == 2  # c was dropped unstarted; never more than 2
    assert f.prepare(a).compiled is f.cache.get(a.cache_key()).compiled  # from the cache
    assert f.prepare(c) is not None and g.started == ["a+", "b+", "c+"]  # compiled when asked again


def test_compile_errors_still_name_the_field():
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    with pytest.raises(ConstraintError, match="cannot compile the regex") as e:
        f.prepare(GrammarSpec("regex", "(unclosed", param="structured_outputs.regex"))
    assert e.value.param == "structured_outputs.regex" and len(f.cache) == 0


def test_cache_is_lru_by_bytes():
    cache = GrammarCache(max_bytes=100)
    for key in "abc":
        cache.put((key,), key, 40)  # the third one pushes "a" (least recently used) out
    assert ("a",) not in cache and len(cache) == 2 and cache.bytes == 80
    assert cache.get(("b",)) == "b"  # b is now the most recent: c goes next
    cache.put(("d",), "d", 40)
    assert ("c",) not in cache and ("b",) in cache and ("d",) in cache and cache.bytes == 80
    cache.put(("huge",), "huge", 101)  # larger than the whole budget: not kept, nothing evicted
    assert ("huge",) not in cache and len(cache) == 2


def test_factory_cache_evicts_compiled_grammars():
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    specs = [GrammarSpec("regex", r) for r in ("[a-f]+x", "[g-m]+y", "[n-z]+z")]
    sizes = [f.compile(s).memory_size_bytes for s in specs]
    f.cache = GrammarCache(max_bytes=sizes[0] + sizes[1] + min(sizes) // 2)  # room for two of them
    first = f.prepare(specs[0])
    f.prepare(specs[1])
    assert f.prepare(specs[0]) is first  # a hit (and now the most recent)
    f.prepare(specs[2])
    assert specs[1].cache_key() not in f.cache and specs[0].cache_key() in f.cache
    assert f.cache.bytes <= f.cache.max_bytes


def test_cache_counts_the_schema_text_it_keeps_as_its_key():
    """A cached grammar's key holds the whole schema's text, descriptions included, which xgrammar
    ignores: a schema with a 100 kB description compiled to the same few kB as one without. Only the
    compiled size was counted, so distinct schemas with long descriptions piled up in memory far past
    the budget (each request a new one kept 100 kB more; a 256 MB budget held ~68,000 such keys,
    1 MB each at the body cap). Found by the leak hunt of 2026-12-06."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    f.cache = GrammarCache(max_bytes=1 << 20)
    for i in range(40):  # 40 distinct schemas, 100 kB of description each: 4 MB of keys
        schema = {**SIMPLE_SCHEMA, "description": f"{i} " + "x" * 100_000}
        f.prepare(GrammarSpec("json_schema", schema))
    kept = sum(len(key[1]) for key in f.cache._items)
    assert 0 < kept <= f.cache.max_bytes and f.cache.bytes <= f.cache.max_bytes
    assert len(f.cache) < 40


def accepts(factory: ConstraintFactory, spec: GrammarSpec, text: str) -> bool:
    m = xgr.GrammarMatcher(factory.compile(spec))
    return m.accept_string(text) and m.is_completed()


@pytest.mark.parametrize(
    "kind,schema",
    [
        (
            "json_schema",
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}},
                "required": ["a", "b"],
            },
        ),
        ("json_object", None),
    ],
)
def test_strict_whitespace_rejects_free_whitespace(kind, schema):
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    strict, free = GrammarSpec(kind, schema), GrammarSpec(kind, schema, any_whitespace=True)
    canonical = json.dumps({"a": 1, "b": [2, 3]})  # '{"a": 1, "b": [2, 3]}'
    loose = ['{"a":1,"b":[2,3]}', '{ "a": 1, "b": [2, 3]}', '{"a": 1,\n "b": [2, 3]}', '{"a": 1, "b": [2,   3]}']
    assert accepts(f, strict, canonical) and accepts(f, free, canonical)
    for text in loose:
        assert not accepts(f, strict, text), text
        assert accepts(f, free, text), text
    assert strict.cache_key() != free.cache_key()


def test_strict_whitespace_request_option():
    spec = GrammarSpec("json_schema", SIMPLE_SCHEMA, param="response_format.json_schema.schema")
    assert json_whitespace(spec, None).any_whitespace is False  # the default: strict
    assert json_whitespace(spec, True).any_whitespace is False
    assert json_whitespace(spec, False).any_whitespace is True
    assert json_whitespace(None, None) is None
    for other in (None, GrammarSpec("regex", "a+")):
        with pytest.raises(ConstraintError, match="JSON outputs only") as e:
            json_whitespace(other, False)
        assert e.value.param == "strict_whitespace"


def test_schemas_differing_only_in_property_order_do_not_share_a_grammar():
    """The output writes properties in the schema's order, so {b, a} is a different grammar from
    {a, b}. The cache key used to sort the schema's keys: a request for {b, a} after one for
    {a, b} got the first one's grammar and its answer came back as {"a": ..., "b": ...}."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    ba = {**ab, "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    f.prepare(GrammarSpec("json_schema", ab))
    m = xgr.GrammarMatcher(f.prepare(GrammarSpec("json_schema", ba)).compiled)
    assert m.accept_string('{"b": 1, "a": 2}') and m.is_completed()


def _valid_date(text: str) -> bool:
    try:
        return len(text) == 10 and datetime.date.fromisoformat(text) is not None
    except ValueError:
        return False


def _valid_ipv4(text: str) -> bool:
    try:
        return ipaddress.IPv4Address(text) is not None
    except ValueError:
        return False


def _date_samples(rng: random.Random) -> list[str]:
    fixed = ["2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29", "0400-02-29", "0000-01-01", "2023-04-31"]
    drawn = [f"{rng.randrange(10000):04d}-{rng.randrange(14):02d}-{rng.randrange(33):02d}" for _ in range(150)]
    return fixed + drawn


def _ipv4_samples(rng: random.Random) -> list[str]:
    octets = ["0", "1", "9", "10", "99", "100", "199", "249", "250", "255", "256", "300", "01", "00", "010"]
    return ["1.2.3.4", "01.2.3.4", "1.2.3"] + [".".join(rng.choice(octets) for _ in range(4)) for _ in range(150)]


def test_date_and_ipv4_formats_hold_exactly_what_python_accepts():
    """xgrammar's own `date` let "2023-02-30" and year 0000 through, and `ipv4` "01.2.3.4": values
    pydantic refuses, so `parse(..., response_format=Model)` failed on answers we called valid; and
    `time` a leap second (":60"), which RFC 3339 allows and pydantic refuses.
    Checked nested (properties, items, anyOf), in date-time, and in a forced tool call's grammar."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    rng = random.Random(0)
    nested = {"type": "object", "properties": {"d": {"anyOf": [{"type": "array", "items": {"format": "date"}}]}}}
    nested["properties"]["d"]["anyOf"][0]["items"]["type"] = "string"
    date, stamp, ip = ({"type": "string", "format": name} for name in ("date", "date-time", "ipv4"))
    for text in _date_samples(rng):
        want = _valid_date(text)
        assert accepts(f, GrammarSpec("json_schema", date), json.dumps(text)) == want, text
        assert accepts(f, GrammarSpec("json_schema", nested), json.dumps({"d": [text]})) == want, text
        assert accepts(f, GrammarSpec("json_schema", stamp), json.dumps(text + "T12:00:00Z")) == want, text
    clock = {"type": "string", "format": "time"}
    for text, want in (("12:00:00Z", True), ("23:59:59.5+01:00", True), ("23:59:60Z", False), ("24:00:00Z", False)):
        assert accepts(f, GrammarSpec("json_schema", clock), json.dumps(text)) == want, text
        assert accepts(f, GrammarSpec("json_schema", stamp), json.dumps("2024-02-29T" + text)) == want, text
    for text in _ipv4_samples(rng):
        assert accepts(f, GrammarSpec("json_schema", ip), json.dumps(text)) == _valid_ipv4(text), text
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"d": date}}}}
    call = forced_grammar([tool], "f")
    for text, want in (("2024-02-29", True), ("2023-02-29", False)):
        body = json.dumps({"name": "f", "arguments": {"d": text}})
        assert accepts(f, call, f"<tool_call>\n{body}\n</tool_call>") == want, text


_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _valid_hostname(text: str) -> bool:
    """RFC 1123: dot-separated labels of 1-63 letters, digits and inner hyphens, 253 characters at most."""
    return len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.split("."))


def _hostname_samples(rng: random.Random) -> list[str]:
    def label() -> str:
        n = rng.choice([1, 2, 5, 30, 31, 61, 62, 63, 64])
        inner = "".join(rng.choice("ab9-") for _ in range(max(0, n - 2)))
        ends = "ab9ab9ab9-_"  # mostly valid, sometimes a hyphen or an underscore where none may be
        return (rng.choice(ends) + inner + rng.choice(ends))[:n] if n > 1 else rng.choice(ends)

    return ["a", "a.b", "-a", "a..b", "a.", "x" * 63, "x" * 64] + [
        ".".join(label() for _ in range(rng.randint(1, 9))) for _ in range(400)
    ]


def test_hostname_format_writes_only_rfc_1123_hostnames():
    """xgrammar's own `hostname` let a 64-character label through (found by fuzzing schemas against
    `jsonschema` with an RFC 1123 check). It is now our pattern: every name it takes is valid, and
    every valid name of up to four labels (or eight of at most 30 characters) is taken."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    matcher = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", {"type": "string", "format": "hostname"})))
    valid = 0
    for text in _hostname_samples(random.Random(1)):
        matcher.reset()
        got = matcher.accept_string(json.dumps(text)) and matcher.is_completed()
        labels = text.split(".")
        longest = max(map(len, labels))
        servable = (
            len(labels) <= 3 or (len(labels) == 4 and len(labels[-1]) <= 61) or (len(labels) <= 8 and longest <= 30)
        )
        assert got == (_valid_hostname(text) and servable), text
        valid += got
    assert valid > 30  # the draw holds enough valid names to mean something
    assert not accepts(f, GrammarSpec("json_schema", {"type": "string", "format": "hostname"}), json.dumps("x" * 64))


def _valid_url(text: str, model) -> bool:
    try:
        model.model_validate({"u": text})
        return True
    except ValueError:
        return False


def _url_samples(rng: random.Random) -> list[str]:
    """Typical web URLs, and strings near them that break a rule: a space, a bad escape, a port
    past 65535, no host, a stray '#', an ill-formed scheme, lengths either side of the bounds."""
    parts = [
        "https://",
        "http://",
        "ftp://",
        "h2://",
        "1a://",
        "http:/",
        "://",
        "example.com",
        "a.b-c.io",
        ":8080",
        ":65535",
        ":65536",
        ":99999",
        "/",
        "/path/to",
        "/a b",
        "/%20",
        "?q=1&r=two",
        "#frag",
        "#a#b",
        "@",
        "x",
    ]
    drawn = ["".join(rng.choice(parts) for _ in range(rng.randint(1, 7))) for _ in range(300)]
    return drawn + ["https://example.com/" + "a" * n for n in (8, 9, 10, 11, 60, 180, 181)]


def test_a_length_bounded_uri_format_is_served_and_writes_only_what_pydantic_accepts():
    """pydantic's HttpUrl and AnyUrl write `format: uri` with `maxLength` / `minLength`, which
    xgrammar does not enforce together, so every `parse(response_format=Model)` with a URL field
    was a 400. Such a field is now written as a bounded pattern: each string it allows is a URL
    pydantic's AnyUrl parses (and HttpUrl, an http one) within the bounds; typical URLs are allowed."""
    from pydantic import AnyUrl, BaseModel, HttpUrl

    class Web(BaseModel):
        u: HttpUrl

    class Anything(BaseModel):
        u: AnyUrl

    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    web = Web.model_json_schema()
    check_schema(web)  # a 400 before
    check_schema(Anything.model_json_schema())
    schemas = [
        web,
        *({"type": "string", "format": "uri", "minLength": a, "maxLength": b} for a, b in ((1, 80), (30, 200))),
    ]
    matchers = [xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", schema))) for schema in schemas]
    allowed = 0
    for text in _url_samples(random.Random(0)):
        for schema, matcher in zip(schemas, matchers):
            field = schema["properties"]["u"] if schema is web else schema
            matcher.reset()
            if matcher.accept_string(json.dumps({"u": text} if schema is web else text)) and matcher.is_completed():
                allowed += 1
                assert field["minLength"] <= len(text) <= field["maxLength"] and _valid_url(text, Anything), text
                assert _valid_url(text, Web) or not text.startswith(("http://", "https://")), text
    assert allowed >= 15  # the draw reaches the allowed side too
    for text in ("https://example.com/path/to?q=1&r=two#frag", "http://localhost:8080/", "https://a.b-c.io"):
        assert accepts(f, GrammarSpec("json_schema", web), json.dumps({"u": text})), text
    assert not accepts(f, GrammarSpec("json_schema", web), json.dumps({"u": "https://a.io/" + "x" * 2071}))
    for schema, message in (
        ({**schemas[1], "maxLength": 31}, "maxLength below"),
        ({**schemas[1], "minLength": 79}, "leaves no room"),
        ({**schemas[1], "maxLength": -1}, "non-negative integer"),
        ({**schemas[1], "pattern": "a+"}, "cannot be combined"),
    ):
        with pytest.raises(ConstraintError, match=message):
            check_schema(schema)


ASCII_ATOMS = ["a", "b", "c", "[ab]", "[a-c]", "[^a]", ".", r"\d", "[)?]", r"\)"]
ASCII_QUANTIFIERS = ["", "", "?", "*", "+", "{0,2}", "{1,3}", "{2}"]
# Non-ASCII literals and classes, and classes that span '"' and '\\'.
UNICODE_ATOMS = ["a", "é", "中", "😀", "[é-ê]", "[^é]", "[aé]", ".", "[ -~]", '[^"]', r"\u00e9", "[^\\\\]"]
UNICODE_QUANTIFIERS = ["", "?", "*", "+", "{0,2}", "{2}"]


def _random_pattern(
    rng: random.Random,
    atoms: list[str] = ASCII_ATOMS,
    quantifiers: list[str] = ASCII_QUANTIFIERS,
    branch_counts: tuple[int, ...] = (1, 1, 2),
    depth: int = 0,
) -> str:
    """A small random regex: atoms, quantifiers, groups (up to two deep) and alternation."""
    parts = []
    for _ in range(rng.randint(1, 3)):
        if depth < 2 and rng.random() < 0.3:
            branches = [
                _random_pattern(rng, atoms, quantifiers, branch_counts, depth + 1)
                for _ in range(rng.choice(branch_counts))
            ]
            atom = "(?:" + "|".join(branches) + ")"
        else:
            atom = rng.choice(atoms)
        parts.append(atom + rng.choice(quantifiers))
    return "".join(parts)


def test_json_schema_patterns_hold_exactly_what_python_re_matches():
    """xgrammar 0.2.9 enforces a JSON-schema `pattern` wrongly where an optional group holds a
    repeated element: `[0-9]{3}(?:-[0-9]+)?` let "1234" through, and our own `time` format took
    "12:00:00123Z", so answers broke their schema with finish_reason "stop". Each pattern's
    optional groups are now written `{0,1}`; 300 random patterns against Python's `re`, each
    on 10 random strings (the old code disagreed on 21 of them with this draw)."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    rng = random.Random(3)
    for _ in range(300):
        pattern = _random_pattern(rng)
        matcher = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", {"type": "string", "pattern": pattern})))
        for _ in range(10):
            text = "".join(rng.choice("abcd1)?") for _ in range(rng.randint(0, 6)))
            matcher.reset()
            got = matcher.accept_string(json.dumps(text)) and matcher.is_completed()
            assert got == bool(re.fullmatch(pattern, text)), (pattern, text)
    for text, want in (("1234", False), ("123-4", True), ("123-", False)):
        assert (
            accepts(
                f, GrammarSpec("json_schema", {"type": "string", "pattern": "[0-9]{3}(?:-[0-9]+)?"}), json.dumps(text)
            )
            == want
        )
    clock = {"type": "string", "format": "time"}
    assert not accepts(f, GrammarSpec("json_schema", clock), json.dumps("12:00:00123Z"))
    assert accepts(f, GrammarSpec("json_schema", clock), json.dumps("12:00:00.123Z"))


def test_optional_groups_rewrites_only_group_quantifiers():
    assert optional_groups(r"a(?:b*)?c") == r"a(?:b*){0,1}c"
    assert optional_groups(r"(x)??") == r"(x){0,1}"
    assert optional_groups(r"[)?]\)?(a)?") == r"[)?]\)?(a){0,1}"  # a class and an escaped paren stay
    assert optional_groups(r"[]a)?]b") == r"[]a)?]b" and optional_groups(r"[^]x)?]") == r"[^]x)?]"


def test_non_ascii_patterns_hold_exactly_what_python_re_matches():
    """xgrammar 0.2.9's JSON-string regex mode broke on a non-ASCII character written as it is in
    a pattern: `é?..` accepted the text `"\\q"` (not JSON) and `"\\""` (one character), so the
    answer failed json.loads. Each one is now written as an escape (`\\u00e9`); 250 random patterns
    against Python's `re` on raw-UTF-8 JSON texts (the old code let through invalid ones with this
    draw). A `"` or `\\` is only ever written by `.`, a negated class or a range like `[ -~]`, which
    xgrammar reads without them: those may refuse a matching string, never accept one."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    rng = random.Random(5)
    for _ in range(250):
        pattern = _random_pattern(rng, UNICODE_ATOMS, UNICODE_QUANTIFIERS, (1, 2))
        matcher = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", {"type": "string", "pattern": pattern})))
        for _ in range(8):
            value = "".join(rng.choice('aéê中😀q"\\') for _ in range(rng.randint(0, 4)))
            text = rng.choice([json.dumps(value, ensure_ascii=False), '"' + value + '"', json.dumps(value)])
            matcher.reset()
            got = matcher.accept_string(text) and matcher.is_completed()
            want = text == json.dumps(value, ensure_ascii=False) and bool(re.fullmatch(pattern, value))
            if got:
                assert json.loads(text) == value and want, (pattern, text)
            elif want and not any(c in value for c in '"\\'):
                raise AssertionError(f"{pattern!r} refused {text}")
    assert exact_pattern("é?[^é]😀[é-ê]") == r"\u00e9?[^\u00e9]\u{1f600}[\u00e9-\u00ea]"
    assert exact_pattern(r"[\w\-]+é") == r"[\w\-]+\u00e9"  # only non-ASCII characters change


@pytest.mark.parametrize(
    "pattern,named",
    [
        (r"\\", "\\"),
        (r"[\"]", '"'),
        ('"[^"]*"', '"'),
        (r"a\nb", "\n"),
        (r"\x22", '"'),
        (r"[\x00-\x1f]", "\x00-\x1f"),
        (r"[\t ]", "\t"),
    ],
)
def test_patterns_naming_a_quote_backslash_or_control_character_are_refused(pattern, named):
    """xgrammar 0.2.9 copies a quote, backslash or control character a pattern names into the JSON
    text unescaped: `{"pattern": "\\\\\\\\"}` (one backslash) wrote `"\\"` and `[\\"]` three quotes,
    answers json.loads refuses, served as valid. Matching their escapes instead was tried and is
    unsafe (after `\\\\"`, `[^a]*` took `\\q`), so they are a 400 naming the character."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    with pytest.raises(ConstraintError, match=re.escape(f"a pattern that names {named!r} is not supported")):
        check_schema({"type": "string", "pattern": pattern})
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}}},
        },
    }
    with pytest.raises(ConstraintError, match="not supported"):
        check_forced_schemas([tool], "f")
    for fine, value in (("[ -~]+", "a b"), ('[^"]*', "x'y"), (r"[^\\]+", "ab"), (r"[\w.\-]+", "a.b-c")):
        check_schema({"type": "string", "pattern": fine})  # what they leave out is never written
        assert accepts(f, GrammarSpec("json_schema", {"type": "string", "pattern": fine}), json.dumps(value))
        assert not accepts(f, GrammarSpec("json_schema", {"type": "string", "pattern": fine}), '"a\\"b"')


def _shorthand_pattern(rng: random.Random, depth: int = 0) -> str:
    """A small random regex over `.`, `\\W`, `\\D`, `\\S` and negated `\\w`, `\\d`, `\\s` classes."""
    atoms = ["a", "1", "é", ".", r"\W", r"\D", r"\S", r"[^\d]", r"[^\w-]", r"[\Wa]", r"[^\s]", "[0-9]", r"[]a]", "-"]
    parts = []
    for _ in range(rng.randint(1, 3)):
        if depth < 2 and rng.random() < 0.3:
            atom = "(?:" + "|".join(_shorthand_pattern(rng, depth + 1) for _ in range(rng.choice([1, 2]))) + ")"
        else:
            atom = rng.choice(atoms)
        parts.append(atom + rng.choice(["", "?", "*", "+", "{2}"]))
    return "".join(parts)


def test_dot_and_shorthand_classes_hold_exactly_what_python_re_matches():
    """xgrammar's `\\w`, `\\d`, `\\s` are ASCII, so their complements took what Python's `re` (and
    pydantic's Rust regex, and `jsonschema`) refuse: `\\W` matched "中", `\\D` "٣", `[^\\d]` "٣"; and
    in a plain regex `.` matched a line break ("(.)+" took "\\n-"); `[]a]` did not compile. Found by
    fuzzing `structured_outputs.regex` against `re.fullmatch`. 120 random patterns in both regex
    modes (the old code disagreed with this draw)."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    rng = random.Random(7)
    for _ in range(120):
        pattern = _shorthand_pattern(rng)
        plain = xgr.GrammarMatcher(f.compile(GrammarSpec("regex", pattern)))
        in_json = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", {"type": "string", "pattern": pattern})))
        for _ in range(8):
            value = "".join(rng.choice("a1é中٣\u00a0 -\n") for _ in range(rng.randint(0, 3)))
            want = bool(re.fullmatch(pattern, value))
            for matcher, text in ((plain, value), (in_json, json.dumps(value, ensure_ascii=False))):
                matcher.reset()
                got = matcher.accept_string(text) and matcher.is_completed()
                assert got == (want and (matcher is plain or "\n" not in value)), (pattern, text)
    assert len(exact_pattern(r"\W")) > 5000 and exact_pattern(r"[^\W]") == r"[^\W]"  # the ASCII ones stay


@pytest.mark.parametrize("pattern", ["a^", "$a", "(^a)*", "(a$)?b", "a(^b)?", "a*^b", "(?:a$)*", "a(?:b$|c)d"])
def test_anchors_in_the_middle_of_a_pattern_are_refused(pattern):
    """xgrammar 0.2.9 drops an anchor in the middle of a regex (it only logs "Anchor '^' in the
    middle of regex is ignored"), so `a^` wrote "a" and `(a$)?b` "ab", which the pattern never
    matches (found by fuzzing plain regexes against `re.fullmatch`). Such a pattern is now a 400,
    in a JSON schema and as `structured_outputs.regex`."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    with pytest.raises(ConstraintError, match="anchor in the middle of a pattern"):
        check_schema({"type": "string", "pattern": pattern})
    with pytest.raises(ConstraintError, match="anchor in the middle of a pattern") as raised:
        f.compile(GrammarSpec("regex", pattern, param="structured_outputs.regex"))
    assert raised.value.param == "structured_outputs.regex"


def test_anchors_at_the_ends_of_a_pattern_or_branch_are_kept_and_exact():
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    for pattern in ["a|^b", "(?:^|,)a", "^a$|^b$", "(^a)?b", "^(a|b)+$", "a(?:b$|c)", "^^a$$", r"\^a\$", "[$^]a"]:
        check_schema({"type": "string", "pattern": pattern})
        plain = GrammarSpec("regex", pattern)
        in_json = GrammarSpec("json_schema", {"type": "string", "pattern": pattern})
        for text in ["", "a", "b", "ab", "ba", "aa", ",a", "ac", "^a$", "$a"]:
            want = bool(re.fullmatch(pattern, text))
            assert accepts(f, plain, text) == want, (pattern, text)
            assert accepts(f, in_json, json.dumps(text)) == want, (pattern, text)


def test_integer_schemas_with_fractional_bounds_are_served_exactly():
    """xgrammar 0.2.9 refuses a fractional bound on an integer ("Integer constraint must be a whole
    number"), so `{"type": "integer", "minimum": 0.5}`, valid JSON Schema, was a 400 quoting a C++
    source path (found fuzzing schemas against `jsonschema`). The bounds are now the whole ones
    that allow the same integers; 150 random bound sets against jsonschema's verdict."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    rng = random.Random(11)
    served = 0
    for _ in range(150):
        schema = {"type": "integer"}
        for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if rng.random() < 0.4:
                schema[key] = rng.choice([-2.5, -1, -0.5, 0, 0.5, 1, 2.25, 3, 7.75])
        try:
            matcher = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", schema)))
        except ConstraintError as e:  # only bounds that no integer meets
            assert not any(jsonschema.Draft202012Validator(schema).is_valid(n) for n in range(-10, 11)), (schema, e)
            continue
        served += 1
        for n in range(-6, 10):
            matcher.reset()
            got = matcher.accept_string(str(n)) and matcher.is_completed()
            assert got == jsonschema.Draft202012Validator(schema).is_valid(n), (schema, n)
    assert served > 100


@pytest.mark.parametrize(
    "schema,value",
    [
        ({"oneOf": [{"properties": {"a": {"type": "integer"}}}, {"type": "integer"}]}, 5),
        ({"oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"type": "string"}]}, "x"),
        ({"oneOf": [{"$ref": "#/$defs/A"}, {"type": "integer"}], "$defs": {"A": {"properties": {"x": {}}}}}, 5),
    ],
)
def test_one_of_with_an_untyped_properties_branch_is_refused(schema, value):
    """A branch with `properties` and no `type` matches every value that is not an object (JSON
    Schema applies `properties` to objects only), so next to `{"type": "integer"}` the integer 5
    matches both branches and breaks `oneOf`. check_schema took the branch for an object and
    served it: the grammar wrote 5, which jsonschema refuses (found fuzzing schemas against it)."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    assert not jsonschema.Draft202012Validator(schema).is_valid(value)
    assert accepts(f, GrammarSpec("json_schema", schema), json.dumps(value))  # what the old code served
    with pytest.raises(ConstraintError, match="oneOf branches 0 and 1 may both match one value"):
        check_schema(schema)
    typed = {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "integer"}]}
    check_schema(typed)  # with its type, the branch is told apart


def test_json_object_with_free_whitespace_is_still_an_object():
    """`response_format: json_object` with `strict_whitespace: false` was compiled from xgrammar's
    builtin JSON grammar, which takes any JSON value: the answer could be `[1]` or `true` (found
    by random walks through each grammar, checking what they write)."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    free = GrammarSpec("json_object", any_whitespace=True)
    for text in ["[1]", "true", '"a"', "1", "null", "[ ]"]:
        assert not accepts(f, free, text), text
    for text in ['{ "a" : [1 , {"b": null}] }', "{}", '{\n  "a": "x"\n}']:
        assert accepts(f, free, text), text


@pytest.mark.parametrize("pattern,folded", [("(?i)[^k]", "\u212a"), ("(?i)[^é]", "É"), ("(?i)[^a-z]", "\u017f")])
def test_case_insensitive_negated_classes_are_refused(pattern, folded):
    """xgrammar folds case in a negated class by ASCII only: `(?i)[^k]` wrote the Kelvin sign and
    `(?i)[^é]` "É", which Python's `re` folds into the class and so refuses (found fuzzing inline
    flags against `re.fullmatch`). Such a pattern is now a 400; `(?i)` elsewhere stays served."""
    f = ConstraintFactory.from_vocab(VOCAB, {len(VOCAB) - 1})
    assert not re.fullmatch(pattern, folded)
    assert accepts(f, GrammarSpec("json_schema", {"type": "string", "pattern": pattern}), f'"{folded}"')
    with pytest.raises(ConstraintError, match=r"a case-insensitive pattern \(\(\?i\)\) with a negated class"):
        check_schema({"type": "string", "pattern": pattern})
    check_schema({"type": "string", "pattern": "(?i)^ab[c-e]$"})  # flags are no text before an anchor
    spec = GrammarSpec("json_schema", {"type": "string", "pattern": "(?i)^ab[c-e]$"})
    assert accepts(f, spec, '"ABd"') and not accepts(f, spec, '"abf"')
