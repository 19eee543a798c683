"""The completions endpoint's legacy logprobs object: `text_offset` indexes the choice's text.

A byte-level BPE (GPT-2's, Qwen's, SmolLM2's kind) spells a character its vocabulary lacks as
byte pieces, so offsets must count characters of the text, not token names; and a tokenizer that
puts a BOS in front of a text (Gemma's) adds a token that an echoed text prompt does not hold.
"""

from __future__ import annotations

import copy

from tiny import CORPUS, tiny_model, tiny_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from specserve.engine.stats import TokenLogprob
from specserve.llm import LLM
from specserve.server.logprobs import TokenNamer
from specserve.server.protocol import prepare_completion
from specserve.server.responses import CHAT, COMPLETIONS, ResponseContext
from specserve.server.schemas import CompletionRequest

TEXT = "Le café: 東京 🎉 ok"  # 東, 京 and 🎉 are byte pieces (the corpus below never holds them)


def byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(CORPUS[:4] * 4, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_text_offset_counts_characters_split_across_byte_tokens():
    tok = byte_level()
    ids = tok.encode(TEXT)
    assert len(ids) > len(TEXT.split()) + 6 and tok.decode(ids) == TEXT  # several pieces per CJK character / emoji
    namer = TokenNamer(tok)
    lps = [TokenLogprob(t, -1.0, [(t, -1.0)]) for t in ids]
    for split in (len(ids), 5, 9):  # the whole answer at once, or streamed in two deltas
        ctx = ResponseContext("cmpl-x", "m", namer, logprobs=True)
        first, rest = COMPLETIONS._logprobs(ctx, lps[:split]), COMPLETIONS._logprobs(ctx, lps[split:])
        offsets = first["text_offset"] + rest["text_offset"]
        raw = b"".join(bytes(namer(t)[1]) for t in ids)
        start = 0
        for t, offset in zip(ids, offsets):
            # the token starts in the character its first byte belongs to
            assert offset == len(raw[:start].decode("utf-8", errors="ignore")), (tok.convert_ids_to_tokens(t), offsets)
            start += len(namer(t)[1])
        assert TEXT[offsets[-1] :] == tok.decode(ids[-1:])  # offsets index into the text


def test_text_offset_of_an_echoed_text_prompt_leaves_out_the_bos_the_tokenizer_adds():
    tok = copy.deepcopy(tiny_tokenizer())
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    tok.bos_token = "<|im_start|>"
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[(tok.bos_token, bos)]
    )
    llm = LLM.from_models(tiny_model(vocab_size=len(tok)), tok, speculation="none")
    prompt = "def add(a, b):"
    assert llm.prompt_ids(prompt)[0] == bos  # as Gemma's tokenizer starts every text
    for sent in (prompt, [prompt, "import os"]):
        req = CompletionRequest(model="m", prompt=sent, echo=True, logprobs=1, max_tokens=2, temperature=0)
        job = prepare_completion(req, llm)
        ctx = COMPLETIONS.context("m", TokenNamer(tok), job)
        outputs = [llm.generate(ids, job.params) for ids in job.prompts]
        for choice in COMPLETIONS.response(ctx, outputs)["choices"]:
            text, lp = choice["text"], choice["logprobs"]
            assert lp["tokens"][0] == "<|im_start|>" and lp["text_offset"][:2] == [0, 0]
            for token, offset in zip(lp["tokens"][1:], lp["text_offset"][1:]):
                assert text[offset : offset + len(token)] == token, (text, lp["tokens"], lp["text_offset"])


def test_top_logprobs_hold_the_chosen_token_too():
    """OpenAI: "The API will always return the logprob of the sampled token, so there may be up
    to logprobs+1 elements" (vLLM answers the same); with logprobs 0 that is the token alone."""
    tok = tiny_tokenizer()
    a, b, c = tok.convert_tokens_to_ids(["a", "b", "c"])
    ctx = ResponseContext("cmpl-x", "m", TokenNamer(tok), logprobs=True)
    lps = [TokenLogprob(a, -0.1, [(a, -0.1), (b, -2.5)]), TokenLogprob(c, -4.0, [(a, -0.3), (b, -1.5)])]
    assert COMPLETIONS._logprobs(ctx, lps)["top_logprobs"] == [
        {"a": -0.1, "b": -2.5},
        {"a": -0.3, "b": -1.5, "c": -4.0},
    ]
    assert COMPLETIONS._logprobs(ctx, [TokenLogprob(c, -4.0, [])])["top_logprobs"] == [{"c": -4.0}]  # logprobs: 0


def test_an_echoed_text_prompt_is_tokenized_once(monkeypatch):
    """`echo` encoded each text prompt a second time, without its special tokens, to count the
    BOS its text leaves out; now the prompt's tokens are reused and the answer is the same."""
    tok = copy.deepcopy(tiny_tokenizer())
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    tok.bos_token = "<|im_start|>"
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[(tok.bos_token, bos)]
    )
    plain = LLM.from_models(tiny_model(vocab_size=len(tok)), tiny_tokenizer(), speculation="none")
    with_bos = LLM.from_models(tiny_model(vocab_size=len(tok)), tok, speculation="none")
    prompts = ["def add(a, b):", "import os", "<|im_start|>user"]  # the last begins with the BOS's own text
    for llm, hidden in ((plain, [0, 0, 0]), (with_bos, [1, 1, 1])):
        req = CompletionRequest(model="m", prompt=prompts, echo=True, logprobs=1, max_tokens=2, temperature=0)
        prepare_completion(req, llm)  # the first request also learns what the tokenizer adds
        texts = []
        real = type(tok).encode

        def counted(self, text, *args, real=real, texts=texts, **kw):
            texts.append(text)
            return real(self, text, *args, **kw)

        monkeypatch.setattr(type(tok), "encode", counted)
        job = prepare_completion(req, llm)
        monkeypatch.undo()
        assert texts == prompts  # each prompt once
        assert job.echo_texts == prompts and job.echo_hidden == hidden
        assert job.prompts == [llm.prompt_ids(p) for p in prompts]


def _unescape(name: str) -> bytes:
    """The bytes a legacy token name stands for: its text, or after "bytes:" its \\xNN escapes."""
    if not name.startswith("bytes:"):
        return name.encode("utf-8")
    return name[len("bytes:") :].encode("latin-1").decode("unicode_escape").encode("latin-1")


def test_byte_pieces_of_a_character_keep_distinct_names(smol_tokenizer):
    """Legacy `top_logprobs` is keyed by token text, and every piece of a split character decoded
    to "\\ufffd": 🎉's three pieces (SmolLM2's byte-level BPE) collapsed into one key, so fewer than
    k alternatives came back. OpenAI names such a token by its bytes ("bytes:\\xf0\\x9f"); so do we."""
    tok = smol_tokenizer
    pieces = tok.encode(" 🎉", add_special_tokens=False)
    assert len(pieces) == 3 and tok.decode(pieces) == " 🎉"  # the emoji is split across byte pieces
    head = tok.encode("🎉", add_special_tokens=False)[0]  # "\xf0\x9f" alone, without the space
    namer = TokenNamer(tok)
    ctx = ResponseContext("cmpl-x", "m", namer, logprobs=True)
    top = [(t, -1.0 - i) for i, t in enumerate([*pieces, head])]
    out = COMPLETIONS._logprobs(ctx, [TokenLogprob(pieces[1], -2.0, top)])
    names = list(out["top_logprobs"][0])
    assert len(names) == 4  # none collide
    assert names == ["bytes: \\xf0\\x9f", "bytes:\\x8e", "bytes:\\x89", "bytes:\\xf0\\x9f"]
    assert [_unescape(n) for n in names] == [bytes(namer(t)[1]) for t, _ in top]  # the bytes come back
    assert out["tokens"] == ["bytes:\\x8e"] and out["top_logprobs"][0]["bytes:\\x8e"] == -2.0
    (e,) = tok.encode("é", add_special_tokens=False)  # one token of two bytes: a whole character
    whole = COMPLETIONS._logprobs(ResponseContext("cmpl-y", "m", namer, logprobs=True), [TokenLogprob(e, -0.5, [])])
    assert whole["tokens"] == ["é"] and whole["top_logprobs"] == [{"é": -0.5}]  # keeps its text


def test_chat_logprobs_keep_the_text_and_bytes_of_byte_pieces(smol_tokenizer):
    """Chat's entries carry `bytes`, as OpenAI's do; their `token` stays the decoded text."""
    pieces = smol_tokenizer.encode("🎉", add_special_tokens=False)
    ctx = ResponseContext("chatcmpl-x", "m", TokenNamer(smol_tokenizer), logprobs=True)
    entry = CHAT.entry(ctx, TokenLogprob(pieces[0], -1.0, [(pieces[0], -1.0), (pieces[1], -2.0)]))
    assert entry["token"] == "\ufffd" and entry["bytes"] == [0xF0, 0x9F]
    assert [(t["token"], t["bytes"]) for t in entry["top_logprobs"]] == [("\ufffd", [0xF0, 0x9F]), ("\ufffd", [0x8E])]
