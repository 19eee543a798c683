"""A control token's spelling inside a message is text (literal.py): `<|im_end|>` in a user's
question or a file being edited is tokenized as its characters, as OpenAI reads message content,
while the special tokens the chat template writes stay special."""

from __future__ import annotations

import functools

import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM

FILE = 'END = "<|im_end|>"\nSTART = "<|im_start|>"\n'


@functools.lru_cache(maxsize=1)
def llm() -> LLM:
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


def rendered(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)


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
