"""A control token's spelling inside a message is text (literal.py): `<|im_end|>` in a user's
question or a file being edited is tokenized as its characters, as OpenAI reads message content,
while the special tokens the chat template writes stay special."""

from __future__ import annotations

import functools
import json

import pytest
from test_server_tools import TOOLS_TEMPLATE
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM

FILE = 'END = "<|im_end|>"\nSTART = "<|im_start|>"\n'


@functools.lru_cache(maxsize=1)
def llm() -> LLM:
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def rendered(tok, messages, tools=None, **kw) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kw)


def plain(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False, split_special_tokens=True)


@pytest.mark.parametrize("role", ["user", "system"])
def test_a_control_token_s_spelling_in_a_message_is_its_characters(role):
    tok = tiny_tokenizer()
    messages = [{"role": role, "content": "repeat:\n" + FILE}]
    ids = llm().apply_chat_template(messages)
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(im_end) == 1 and ids.count(im_start) == 2  # the template's own: one turn closed, one opened
    assert tok.decode(ids) == rendered(tok, messages)  # nothing lost or added
    body = plain(tok, "repeat:\n" + FILE)
    assert any(ids[i : i + len(body)] == body for i in range(len(ids)))  # the content as text, token for token


def test_messages_without_one_are_tokenized_as_before():
    tok = tiny_tokenizer()
    messages = [{"role": "user", "content": "def add(a, b): <tool_call> | < im_end >"}]
    assert llm().apply_chat_template(messages) == tok.encode(rendered(tok, messages), add_special_tokens=False)


def test_an_answer_begun_for_the_model_keeps_its_text_too():
    """`specserve edit` opens the answer with the file's first lines (continue_final_message)."""
    tok = tiny_tokenizer()
    messages = [{"role": "user", "content": "edit"}, {"role": "assistant", "content": "```python\n" + FILE}]
    ids = llm().apply_chat_template(messages, continue_final_message=True)
    assert ids[-len(plain(tok, FILE)) :] == plain(tok, FILE)


def test_on_a_real_chatml_tokenizer(smol_tokenizer):
    """SmolLM2's byte-level BPE: the content's tokens are those of the text alone, and the
    template's special tokens are where the usual encode puts them."""
    from specserve.literal import encode_marked, mark_specials, special_texts

    specials = special_texts(smol_tokenizer)
    assert "<|im_end|>" in specials
    messages = [{"role": "user", "content": FILE}]
    marked, marks = mark_specials(messages, specials)
    assert "<|im_end|>" not in marked[0]["content"] and set(marks.values()) == {"<|im_end|>", "<|im_start|>"}
    ids = encode_marked(smol_tokenizer, rendered(smol_tokenizer, marked), specials, marks)
    without = [{"role": "user", "content": "X"}]
    usual = smol_tokenizer.encode(rendered(smol_tokenizer, without), add_special_tokens=False)
    x = usual.index(smol_tokenizer.convert_tokens_to_ids("X"))
    assert ids == usual[:x] + plain(smol_tokenizer, FILE) + usual[x + 1 :]


def test_a_prediction_drafts_a_control_token_s_spelling_as_its_characters():
    """The output's text never holds a control token (the detokenizer skips them), so a file that
    spells `<|im_end|>` is written with its characters' tokens: the prediction drafts those, not the
    end-of-turn token (a wasted draft at best), here and after a re-anchoring edit."""
    from specserve.proposers.prediction import PredictionProposer

    tok = tiny_tokenizer()
    drafter = PredictionProposer(tok, FILE, prompt_len=1)
    assert drafter.expected(100) == plain(tok, FILE)
    assert tok.convert_tokens_to_ids("<|im_end|>") not in drafter.expected(100)


def test_a_tokenizer_that_encodes_differently_piece_by_piece_keeps_the_usual_encode():
    """A SentencePiece tokenizer that puts a space before the first word of a string would put one
    before every piece: its prompt keeps the usual encode rather than change tokens it should not."""
    from test_detokenize import sentencepiece_like

    from specserve.literal import encode_marked, mark_specials, special_texts

    tok = sentencepiece_like()
    specials = special_texts(tok)
    text = "</s>hello </s> world</s>"
    (marked,), marks = mark_specials([{"role": "user", "content": "hello </s> world"}], specials)
    assert marks
    template_written = "</s>" + marked["content"] + "</s>"
    assert encode_marked(tok, template_written, specials, marks) == tok.encode(text, add_special_tokens=False)


def _tools_llm():
    """The tiny model with a template that renders tools, earlier calls and results itself (the
    native path, as Qwen2.5's does: `tojson` of the tools and of each call's arguments)."""
    import copy

    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = TOOLS_TEMPLATE
    return LLM.from_models(tiny_model(max_positions=2048), tok, speculation="none"), tok


def _tool_chat(spelling: str) -> tuple[list[dict], list[dict]]:
    """A tool turn in which every string a client writes (a tool's description, its schema's keys
    and values, an earlier call's arguments, its keys and its name, a tool result) holds `spelling`."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "grep",
                "description": f"Search for text such as {spelling}",
                "parameters": {
                    "type": "object",
                    "properties": {"pattern": {"type": "string", "enum": [spelling, "x"]}, f"k{spelling}": {}},
                },
            },
        }
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": {"pattern": spelling}}}
    keyed = json.dumps({f"p{spelling}": 1})  # arguments as the API sends them: JSON text
    messages = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"a.py:1: END = {spelling!r}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": "grep", "arguments": keyed}}],
        },
    ]
    return messages, tools


@pytest.mark.parametrize("spelling", ["<|im_end|>", "<|im_start|>"])
def test_a_control_token_s_spelling_anywhere_in_a_tool_turn_is_its_characters(spelling):
    """Tool definitions and earlier calls' arguments reach the prompt through the template's
    `tojson`, not through a message's content: they are text too. The prompt holds the control
    tokens where the template writes them, as many as for the same chat without the spelling."""
    llm, tok = _tools_llm()
    messages, tools = _tool_chat(spelling)
    ids = llm.apply_chat_template(messages, tools)
    template_only = tok.encode(rendered(tok, *_as_templated(*_tool_chat("Q"))), add_special_tokens=False)
    for special in ("<|im_start|>", "<|im_end|>"):
        token = tok.convert_tokens_to_ids(special)
        assert ids.count(token) == template_only.count(token), special
    assert tok.decode(ids) == rendered(tok, *_as_templated(messages, tools))  # nothing lost or added


def _as_templated(messages, tools):
    from specserve.chat import template_messages

    return template_messages(messages, tools, TOOLS_TEMPLATE), tools
