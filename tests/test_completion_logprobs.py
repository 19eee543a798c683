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
from specserve.server.responses import COMPLETIONS, ResponseContext
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
