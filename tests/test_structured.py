"""Structured outputs with speculation: 20 JSON schemas on tiny f32 models.

For every schema the greedy output must (1) parse as JSON and validate against the schema and
(2) be token-for-token the same with speculation off and with each drafter on. A prediction
that itself follows the schema (plain decoding's own output) must be accepted in bulk. A
deliberately broken mask (row 0's mask applied to every verified row) must break exactness,
which shows the test can fail.
"""

import json
import string
from typing import Literal

import jsonschema
import pytest
import xgrammar as xgr
from pydantic import BaseModel, Field
from tiny import tiny_model, tiny_tokenizer

import specserve.engine.constrain as constrain
from specserve import SamplingParams
from specserve.engine.constrain import ConstraintError, ConstraintFactory, GrammarSpec, check_schema
from specserve.llm import LLM

INT = {"type": "integer", "minimum": 0, "maximum": 999}
STR = {"type": "string", "maxLength": 6}
SCHEMAS = [
    {"type": "object", "properties": {"name": STR, "age": INT}, "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": STR, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}}, "required": ["x"]},
    {"type": "object", "properties": {"kind": {"const": "user"}, "id": INT}, "required": ["kind", "id"]},
    {"type": "object", "properties": {"v": {"anyOf": [INT, {"type": "null"}]}}, "required": ["v"]},
    {
        "type": "object",
        "properties": {"p": {"type": "object", "properties": {"a": INT, "b": STR}, "required": ["a", "b"]}},
        "required": ["p"],
    },
    {"type": "array", "items": INT, "minItems": 1, "maxItems": 4},
    {"type": "array", "prefixItems": [STR, INT], "items": False},
    {"type": "string", "pattern": "^[a-c]{2,5}$"},
    {"type": "string", "enum": ["yes", "no"]},
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
        "required": ["code"],
    },
    {
        "type": "object",
        "properties": {
            "points": {
                "type": "array",
                "maxItems": 2,
                "items": {"type": "object", "properties": {"x": INT, "y": INT}, "required": ["x", "y"]},
            }
        },
        "required": ["points"],
    },
    {
        "$defs": {"leaf": {"type": "object", "properties": {"n": INT}, "required": ["n"]}},
        "type": "object",
        "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}},
        "required": ["left", "right"],
    },
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["s"]},
    {
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "count": INT, "label": STR},
        "required": ["flag", "count", "label"],
    },
    {"type": "integer", "minimum": 10, "maximum": 20},
    {
        "type": "object",
        "properties": {"m": {"type": "array", "items": {"type": "array", "items": INT, "maxItems": 2}, "maxItems": 2}},
        "required": ["m"],
    },
    {"type": "object", "properties": {"u": {"oneOf": [{"type": "boolean"}, STR]}, "opt": INT}, "required": ["u"]},
]
PROMPTS = ("def add(a, b):", "class UserController:\n", "Le café coûte 3 €.")
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def llm():
    return LLM.from_models(tiny_model("llama", seed=0), tiny_tokenizer(), tiny_model("llama", seed=1), name="llama")


def run(llm, i, method, prediction=None, temperature=0.0):
    prompt = PROMPTS[i % len(PROMPTS)]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=i)
    return llm.generate(
        prompt, params, prediction=prediction, speculation=method, guide=GrammarSpec("json_schema", SCHEMAS[i])
    )


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_schema_valid_and_identical_across_methods(llm, i):
    base = run(llm, i, "none")
    assert base.finish_reason == "stop", base.text  # the grammar completed and forced EOS
    jsonschema.validate(json.loads(base.text), SCHEMAS[i])
    for method in ("ngram", "draft", "prediction"):
        out = run(llm, i, method, prediction=base.text)
        assert out.token_ids == base.token_ids, (method, out.text, base.text)
    pred = out.stats.by_source["prediction"]  # the last run: a prediction that follows the schema
    assert pred.accepted >= len(base.token_ids) - 2 * out.stats.steps, out.stats.to_dict()


@pytest.mark.parametrize("i", [0, 7, 13])
def test_sampled_output_is_valid(llm, i):
    """Bounded schemas (strings of at most 6 characters, integers below 1000, at most 2 items):
    the seeded samples complete well within MAX_TOKENS, so every run validates."""
    for method in ("none", "draft"):
        out = run(llm, i, method, temperature=1.0)
        assert out.finish_reason == "stop", (method, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMAS[i])


def test_json_object_is_valid_json(llm):
    """json_object bounds nothing (the tiny model loops on whitespace after most prompts); after
    this one its greedy output closes the object in 64 tokens."""
    out = llm.generate(
        "def get_user(self, user_id):",
        SamplingParams(max_tokens=96),
        speculation="ngram",
        guide=GrammarSpec("json_object"),
    )
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict), out.text


def test_regex_constraint(llm):
    for method in ("none", "draft"):
        out = llm.generate(
            PROMPTS[1],
            SamplingParams(max_tokens=32),
            speculation=method,
            guide=GrammarSpec("regex", r"(cat|dog)-[0-9]{3}"),
        )
        assert out.finish_reason == "stop"
        assert out.text[:4] in ("cat-", "dog-") and out.text[4:].isdigit() and len(out.text) == 7


def test_bulk_acceptance_of_a_schema_following_prediction(llm):
    """A long schema-valid prediction is verified in few steps, not one token per step."""
    base = run(llm, 13, "none")
    out = run(llm, 13, "prediction", prediction=base.text)  # re-tokenized: some segmentations differ
    assert out.token_ids == base.token_ids
    assert out.stats.steps <= max(4, len(base.token_ids) // 4), out.stats.to_dict()
    exact = run(llm, 13, "prediction", prediction=base.token_ids)  # the same tokens: nothing rejected
    assert exact.token_ids == base.token_ids and exact.stats.by_source["prediction"].rejected == 0
    assert exact.stats.steps <= 5, exact.steps  # K = 8, 16, 32, 64


def test_broken_row_masks_break_exactness(llm, monkeypatch):
    """Masking every verified row with row 0's mask (ignoring draft[:i]) must be caught."""
    real_cut = constrain.Constraint.cut

    def broken_cut(self, draft_ids, sampled=False):
        kept = real_cut(self, draft_ids, sampled)
        self._rows = self._rows[:1].expand(len(kept) + 1, -1).clone()  # [K+1, W]: row 0 everywhere
        return kept

    monkeypatch.setattr(constrain.Constraint, "cut", broken_cut)
    failures = 0
    for i in (0, 3, 7):
        base = run(llm, i, "none")
        try:
            out = run(llm, i, "prediction", prediction=base.text)
            failures += out.token_ids != base.token_ids
        except RuntimeError:  # the matcher refused a token the broken mask let through
            failures += 1
    assert failures > 0


@pytest.mark.parametrize(
    "schema,word",
    [
        ({"type": "object", "not": {"type": "null"}}, "not"),
        ({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}, "multipleOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "credit-card"}, "credit-card"),
    ],
)
def test_unsupported_keywords_are_refused(schema, word):
    with pytest.raises(ConstraintError, match=word):
        check_schema(schema)


# Schemas xgrammar compiles but does not enforce: each compiled, and plain decoding wrote output
# the schema rejects (`{"minimum": 5}` gave -0, an external $ref any value, `required: ["b"]`
# with no property b an object without it, a maxLength next to a pattern was dropped, ...).
# Malformed ones (`properties` a list, `anyOf` a number) raised AttributeError/TypeError: a 500.
IGNORED_BY_THE_GRAMMAR = [
    ({"minimum": 5}, "needs a 'type'"),
    ({"type": "array", "items": {"maxLength": 1}}, "needs a 'type'"),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "'pattern' cannot be combined with 'maxLength'"),
    ({"type": "string", "format": "email", "maxLength": 8}, "'format' cannot be combined with 'maxLength'"),
    ({"type": "string", "pattern": "^b$", "format": "date"}, "'pattern' cannot be combined with 'format'"),
    ({"type": "string", "enum": ["a", "abcdef"], "maxLength": 3}, "'enum' cannot be combined with 'maxLength'"),
    ({"type": "string", "enum": ["a", 1]}, "the enum value 1 is not of type 'string'"),
    ({"type": "string", "const": 5}, "the const value 5 is not of type 'string'"),
    ({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2}, "'\\$ref' cannot be combined"),
    ({"type": "object", "properties": {"a": INT}, "anyOf": [INT]}, "'anyOf' cannot be combined"),
    ({"type": "object", "properties": {"a": INT}, "required": ["a", "b"]}, "required property 'b' is not in"),
    ({"type": "object", "properties": {"a": {"$ref": "http://example.com/a.json"}}}, "only references inside"),
    ({"type": "string", "pattern": "(?=a)b"}, "lookahead"),
    ({"type": "object", "properties": [1]}, "properties must be an object"),
    ({"anyOf": 5}, "anyOf must be an array"),
    ({"type": [{}], "enum": [1]}, None),  # no usable type: nothing to check the values against
]


@pytest.mark.parametrize("schema,message", IGNORED_BY_THE_GRAMMAR)
def test_schemas_the_grammar_would_not_enforce_are_refused(schema, message):
    if message is None:
        check_schema(schema)
        return
    with pytest.raises(ConstraintError, match=message):
        check_schema(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"title": "Color", "type": "string", "enum": ["red", "green"]},  # pydantic's Enum
        {"type": "integer", "const": 3, "description": "x"},
        {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Opt"},  # Optional
        {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "description": "ref with a note"},
        {"properties": {"a": INT}, "required": ["a"]},  # an object by its properties
        {"items": INT, "maxItems": 2},  # an array by its items
        {"type": ["string", "null"], "maxLength": 3},
    ],
)
def test_schemas_the_grammar_enforces_are_accepted(schema):
    check_schema(schema)


@pytest.mark.parametrize("spec", [GrammarSpec("ebnf", "root ::= root"), GrammarSpec("regex", r"[^\s\S]")])
def test_a_grammar_that_no_text_satisfies_is_refused_before_it_runs(llm, spec):
    """It allows no first token: a ConstraintError (a 400) while the request is prepared. It used
    to run, sample from an all-masked row, and fail in the engine as a 500."""
    with pytest.raises(ConstraintError, match="no text satisfies") as e:
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=8), guide=spec)
    assert not isinstance(e.value, constrain.GrammarDeadEnd)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_that_dead_ends_fails_as_the_callers_error(llm, temperature):
    """After "a" the grammar allows nothing (`b` never ends): the request fails with the
    grammar's own error, which the server answers 400, not an EngineFault (a 500)."""
    from specserve.server.app import request_error

    spec = GrammarSpec("ebnf", 'root ::= "a" b\nb ::= b "x"')
    with pytest.raises(constrain.GrammarDeadEnd) as e:
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=8, temperature=temperature, seed=0), guide=spec)
    assert request_error(e.value).status == 400
    assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=4)).finish_reason == "length"  # the engine serves on


class _Cat(BaseModel):
    kind: Literal["cat"]
    meows: int


class _Dog(BaseModel):
    kind: Literal["dog"]
    barks: float


class _Pet(BaseModel):
    pet: _Cat | _Dog = Field(discriminator="kind")


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},  # 1 matches both
        {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
        {"oneOf": [{"const": 1}, {"enum": [2, 1]}]},
        {"oneOf": [{"const": 1}, {"const": 1.0}]},  # one JSON number
        {"oneOf": [{"type": "object", "properties": {"a": INT}}, {"type": "object", "properties": {"b": INT}}]},
        {"oneOf": [{"$ref": "#/$defs/missing"}, {"type": "string"}]},
    ],
)
def test_one_of_whose_branches_can_overlap_is_refused(schema):
    """xgrammar enforces oneOf as anyOf: a value two branches match was written and called valid."""
    with pytest.raises(ConstraintError, match="may both match one value"):
        check_schema(schema)


def test_disjoint_one_of_and_pydantic_discriminated_unions_are_served():
    """pydantic writes a discriminated union as oneOf + OpenAPI's `discriminator`: a 400 before.
    Its branches are told apart by a const both require, so oneOf is exactly anyOf there."""
    from openai.lib._pydantic import to_strict_json_schema

    f = ConstraintFactory.from_vocab(list(string.printable) + ["<eos>"], {100})
    for schema in (_Pet.model_json_schema(), to_strict_json_schema(_Pet)):
        check_schema(schema)
        matcher = xgr.GrammarMatcher(f.compile(GrammarSpec("json_schema", schema)))
        text = _Pet(pet=_Cat(kind="cat", meows=3)).model_dump_json()
        assert matcher.accept_string(json.dumps(json.loads(text))) and matcher.is_completed()
        assert _Pet.model_validate_json(text).pet.meows == 3
    check_schema({"oneOf": [{"type": "string"}, {"type": "integer"}, {"const": None}]})
    check_schema({"oneOf": [{"const": 1}, {"const": True}, {"enum": ["1", 2]}]})


def test_ignore_eos_with_a_grammar_is_refused(llm):
    """A complete grammar ends the answer with EOS; ignoring it ran on past the grammar's end with
    every token allowed (`cat-866ckEû...` for the regex below). The server refused the pair with a
    400, the Python API served it: now both refuse, before anything runs."""
    from specserve.errors import InvalidRequestError

    spec = GrammarSpec("regex", r"(cat|dog)-[0-9]{3}")
    with pytest.raises(InvalidRequestError, match="ignore_eos") as e:
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True), speculation="ngram", guide=spec)
    assert e.value.param == "ignore_eos"
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=40), speculation="ngram", guide=spec)
    assert out.finish_reason == "stop" and len(out.text) == 7, out.text


def _odd_predictions(ids: list[int], eos: int) -> list[list[int]]:
    """Token-id predictions around plain decoding's own answer `ids` (which ends with EOS): a
    token the grammar forbids midway, an EOS while the grammar is incomplete, the answer twice
    (EOS inside the draft once the grammar is complete, text after it), and a deleted span."""
    k = len(ids) // 2
    return [ids[:k] + [ids[k] + 1] + ids[k:], ids[:k] + [eos] + ids[k:], ids + ids, ids[: k // 2] + ids[k:]]


def _odd_prediction_mismatches(llm, schemas) -> list:
    """(schema, max_tokens, stop, prediction) whose output differs from plain decoding's."""
    (eos,) = llm.engine.eos_token_ids
    bad = []
    for i in schemas:
        base = run(llm, i, "none")
        cut_at = base.text[len(base.text) // 2 :][:2]
        for max_tokens, stop in ((MAX_TOKENS, ()), (len(base.token_ids) // 2, ()), (MAX_TOKENS, (cut_at,))):
            params = SamplingParams(max_tokens=max_tokens, stop=list(stop))
            guide = GrammarSpec("json_schema", SCHEMAS[i])
            plain = llm.generate(PROMPTS[i % 3], params, speculation="none", guide=guide)
            for j, pred in enumerate(_odd_predictions(base.token_ids, eos)):
                out = llm.generate(PROMPTS[i % 3], params, prediction=pred, speculation="prediction", guide=guide)
                s = out.stats.by_source["prediction"]
                if (out.token_ids, out.text, out.finish_reason) != (plain.token_ids, plain.text, plain.finish_reason):
                    bad.append((i, max_tokens, stop, j))
                assert s.accepted <= out.stats.output_tokens and s.accepted + s.rejected == s.proposed
    return bad


def test_predictions_that_break_the_grammar_or_carry_eos_give_plain_output(llm):
    """Drafts the grammar cuts midway (a forbidden token, an early EOS), EOS inside a draft once
    the grammar is complete, a prediction that diverges and re-anchors, each also cut short by
    max_tokens and by a stop string: the output is plain constrained decoding's, token for token."""
    assert _odd_prediction_mismatches(llm, (0, 3, 8, 16)) == []


def test_a_matcher_rolled_back_short_breaks_odd_predictions(llm, monkeypatch):
    """The test above can fail: rolling the matcher back one token short after a walked draft
    (its state then runs ahead of the output) is caught."""
    real = xgr.GrammarMatcher.rollback
    monkeypatch.setattr(xgr.GrammarMatcher, "rollback", lambda self, n=1: real(self, max(0, n - 1)))
    try:
        bad = _odd_prediction_mismatches(llm, (0,))
    except RuntimeError:  # the matcher refused a committed token
        bad = ["refused"]
    assert bad
