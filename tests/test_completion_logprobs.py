"""The completions endpoint's legacy logprobs object, built from token ids without a model.

A byte-level BPE (GPT-2's, Qwen's, SmolLM2's kind) spells a character its vocabulary lacks as
byte pieces, so `text_offset` must count characters of the answer's text, not token names.
"""

from __future__ import annotations

from tiny import CORPUS
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specserve.engine.stats import TokenLogprob
from specserve.server.logprobs import TokenNamer
from specserve.server.responses import COMPLETIONS, ResponseContext

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
