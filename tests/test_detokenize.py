"""Incremental detokenization through tokenizers' DecodeStream is exact (issue 17, "Detokenization").

For many random token sequences, the streamed text plus the final flush equals the full decode,
every streamed prefix is a prefix of it, and DecodeStream's chunks are the windowed decode's
chunks one for one (so prediction offsets and stop strings see the same text).
"""

from __future__ import annotations

import json
import random

import pytest
from tiny import CORPUS, tiny_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specserve.engine.detokenize import IncrementalDetokenizer, streams_exactly
from specserve.proposers.prediction import _decode_with_starts

TEXTS = [
    "Le café coûte 3 €. Über naïve façade — 東京 日本語 テキスト ✓ 🎉👍🏽 עברית العربية ½",
    "def get_user(self, user_id):\n    return self.db.find(user_id)  # ✓ → 𝔘\n",
]
CONTEXTS = ["Hello world!", "<|im_start|>assistant\n", "x = 1\n", "x = 1"]


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """A Llama-style tokenizer: Metaspace pieces, byte fallback, and a decoder that strips the
    first space of whatever it decodes (so the prompt context decides an output's leading space)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"]))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte pieces are ordinary tokens, as in Llama's vocabulary
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module", params=["smollm2", "tiny", "sentencepiece"])
def tok(request):
    if request.param == "tiny":
        return tiny_tokenizer()
    if request.param == "sentencepiece":
        return sentencepiece_like()
    return AutoTokenizer.from_pretrained(request.getfixturevalue("smol_model_dir"))


def sequences(tok, count: int, seed: int = 0):
    """(prompt context, output ids): random ids over the whole vocabulary (byte pieces, special
    tokens), spans of encoded multilingual text cut anywhere (characters split across tokens),
    and both mixed."""
    rng = random.Random(seed)
    encoded = [tok.encode(t, add_special_tokens=False) for t in TEXTS + CORPUS[:2]]
    contexts = [tok.encode(c, add_special_tokens=False)[-5:] for c in CONTEXTS]
    for i in range(count):
        kind = i % 3
        if kind == 0:
            out = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        else:
            ids = rng.choice(encoded)
            start = rng.randrange(len(ids))
            out = ids[start : start + rng.randrange(1, 30)]
            if kind == 2:
                out = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 6))] + out
        yield rng.choice(contexts), out


def comparable(tok, out) -> bool:
    """Whether the full decode is a fair reference. Byte-fallback decoders (SentencePiece) turn a
    whole run of byte pieces that is not valid UTF-8 into one U+FFFD per piece, the valid
    characters and ASCII bytes in the run included (measured: a run "🎉👍" + a cut-off character
    decodes to 11 x U+FFFD), so a decode in windows (ours, DecodeStream's) shows more of the text
    than the full decode does. For those tokenizers only valid outputs count; cut-off characters
    are checked on the byte-level ones."""
    model = tok.backend_tokenizer.model
    if type(model).__name__ != "BPE" or not model.byte_fallback:
        return True
    return "\ufffd" not in tok.decode(out, skip_special_tokens=True)


def run(tok, context, out, stream):
    d = IncrementalDetokenizer(tok, context, stream=stream)
    assert (d.stream is not None) == stream
    chunks = [d.add(t) for t in out]
    return chunks, d.flush()


def test_decode_stream_is_used_for_fast_tokenizers(tok):
    assert streams_exactly(tok)


def test_streamed_text_equals_the_full_decode(tok):
    checked = 0
    for context, out in sequences(tok, 400):
        if not comparable(tok, out):
            continue
        checked += 1
        head = tok.decode(context, skip_special_tokens=True)
        full = tok.decode(context + out, skip_special_tokens=True)
        assert full.startswith(head)
        full = full[len(head) :]
        chunks, tail = run(tok, context, out, stream=True)
        text = "".join(chunks)
        assert text + tail == full, (context, out)
        assert (chunks, tail) == run(tok, context, out, stream=False), (context, out)
    assert checked >= 100


def test_prediction_offsets_are_unchanged(tok, monkeypatch):
    rng = random.Random(1)
    for _, out in sequences(tok, 60, seed=2):
        out = out + [rng.randrange(len(tok))]
        if not comparable(tok, out):
            continue
        streamed = _decode_with_starts(tok, out)
        monkeypatch.setattr("specserve.engine.detokenize.DecodeStream", None)
        windowed = _decode_with_starts(tok, out)
        monkeypatch.undo()
        assert streamed == windowed
        assert streamed[0] == tok.decode(out, skip_special_tokens=True)
