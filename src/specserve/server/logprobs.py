"""Token names as OpenAI's logprobs show them: the token's text and its UTF-8 bytes.

Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) spell tokens with GPT-2's printable stand-ins
for bytes; SentencePiece ones fall back to `<0xNN>` pieces. Both are turned back into raw bytes, so
a token that is half of a UTF-8 character still reports its true bytes.

The legacy completions shape has no `bytes` and keys `top_logprobs` by name, so there such a token
is named by its bytes, as OpenAI names it ("bytes:\\xe9\\x80"): the pieces of a split character all
decode to "\\ufffd" and would otherwise collapse into one key.
"""

from __future__ import annotations


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


class TokenNamer:
    """Token id -> (text, UTF-8 bytes) as OpenAI's logprobs show them; cached per id."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None) if backend is not None else None
        self.byte_level = decoder is not None and b"ByteLevel" in decoder.__getstate__()
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        if tid not in self.cache:
            self.cache[tid] = self._name(tid)
        return self.cache[tid]

    def legacy(self, tid: int) -> str:
        """The token's name in the legacy completions shape: its text when its bytes are whole UTF-8,
        else "bytes:" and its bytes, printable ASCII as is and the rest (and "\\") as \\xNN escapes."""
        text, raw = self(tid)
        try:
            bytes(raw).decode("utf-8")
            return text
        except UnicodeDecodeError:
            return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)

    def _name(self, tid: int) -> tuple[str, list[int]]:
        piece = self.tok.convert_ids_to_tokens(tid)
        if self.byte_level and piece and all(c in _BYTE_OF_CHAR for c in piece):
            raw = bytes(_BYTE_OF_CHAR[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        if piece and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            raw = bytes([int(piece[3:5], 16)])  # SentencePiece byte fallback
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self.tok.decode([tid])
        return text, list(text.encode("utf-8"))
