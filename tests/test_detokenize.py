"""Incremental detokenization through tokenizers' DecodeStream is exact (issue 17, "Detokenization").

For many random token sequences, the streamed text plus the final flush equals the full decode,
every streamed prefix is a prefix of it, and DecodeStream's chunks are the windowed decode's
chunks one for one (so prediction offsets and stop strings see the same text).
"""

from __future__ import annotations

import random

import pytest
from tiny import CORPUS, tiny_tokenizer
from transformers import AutoTokenizer

from specserve.engine.detokenize import IncrementalDetokenizer, streams_exactly
from specserve.proposers.prediction import _decode_with_starts

TEXTS = ["Le café coûte 3 €. Über naïve façade — 東京 日本語 テキスト ✓ 🎉👍🏽 עברית العربية ½",
         "def get_user(self, user_id):\n    return self.db.find(user_id)  # ✓ → 𝔘\n"]
CONTEXTS = ["Hello world!", "<|im_start|>assistant\n", "x = 1\n"]


@pytest.fixture(scope="module", params=["smollm2", "tiny"])
def tok(request):
    if request.param == "tiny":
        return tiny_tokenizer()
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


def run(tok, context, out, stream):
    d = IncrementalDetokenizer(tok, context, stream=stream)
    assert (d.stream is not None) == stream
    chunks = [d.add(t) for t in out]
    return chunks, d.flush()


def test_decode_stream_is_used_for_fast_tokenizers(tok):
    assert streams_exactly(tok)


def test_streamed_text_equals_the_full_decode(tok):
    for context, out in sequences(tok, 400):
        head = tok.decode(context, skip_special_tokens=True)
        full = tok.decode(context + out, skip_special_tokens=True)
        assert full.startswith(head)
        full = full[len(head):]
        chunks, tail = run(tok, context, out, stream=True)
        text = "".join(chunks)
        assert text + tail == full, (context, out)
        assert (chunks, tail) == run(tok, context, out, stream=False), (context, out)


def test_prediction_offsets_are_unchanged(tok, monkeypatch):
    rng = random.Random(1)
    for _, out in sequences(tok, 60, seed=2):
        out = out + [rng.randrange(len(tok))]
        streamed = _decode_with_starts(tok, out)
        monkeypatch.setattr("specserve.engine.detokenize.DecodeStream", None)
        windowed = _decode_with_starts(tok, out)
        monkeypatch.undo()
        assert streamed == windowed
        assert streamed[0] == tok.decode(out, skip_special_tokens=True)
