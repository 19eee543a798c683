"""Backend conformance: one suite, run against the transformers and the llama.cpp backend.

Both hold the same seeded tiny Qwen2 model in float32 (the llama.cpp one as a GGUF written by
tests/tiny_gguf.py). What the engine relies on: rows asked for come back and nothing else;
rolling back and re-feeding reproduces the logits exactly; a sequence's logits do not depend on
what else shares the forward; sequences are isolated, freed and reused.
"""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer
from tiny_gguf import HIDDEN, write_tiny_gguf

from specserve.backends import SeqInput, SequenceRunner
from specserve.backends.llamacpp import LlamaCppBackend
from specserve.backends.row_buffers import MIN_ROWS
from specserve.backends.transformers import TransformersBackend

TEXT = "def add(a, b):\n    return a + b\nclass UserController:\n    def get_user(self, user_id):"


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def backend(request, tmp_path_factory):
    if request.param == "llama.cpp":
        return LlamaCppBackend(
            write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), max_sequences=4, batch_invariant=True
        )
    return TransformersBackend(tiny_model("qwen2", hidden=HIDDEN), max_sequences=4)


@pytest.fixture
def ids():
    return tiny_tokenizer().encode(TEXT)


def fresh(backend, n: int = 1) -> list[int]:
    """n new sequences; freed again by the caller's `free`."""
    return [backend.new_sequence() for _ in range(n)]


def free(backend, seqs) -> None:
    for s in seqs:
        backend.free_sequence(s)


def assert_same_rows(backend, got: torch.Tensor, want: torch.Tensor) -> None:
    """Logits of the same tokens from passes of different shapes: bit-identical on llama.cpp
    (batch-invariant kernels), equal up to float32 rounding on transformers."""
    if backend.name == "llama.cpp":
        assert torch.equal(got, want)
    else:
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_shapes_and_rows_asked_for(backend, ids):
    a, b, c = fresh(backend, 3)
    try:
        full, last, none = backend.forward(
            [SeqInput(a, ids, "all"), SeqInput(b, ids, "last"), SeqInput(c, ids, "none")]
        )
        assert full.shape == (len(ids), backend.vocab_size) and full.dtype == torch.float32
        assert last.shape == (1, backend.vocab_size) and none is None
        assert_same_rows(backend, last[0], full[-1])
        assert [backend.length(s) for s in (a, b, c)] == [len(ids)] * 3
    finally:
        free(backend, (a, b, c))


def test_rows_a_caller_holds_are_not_overwritten_by_later_passes(backend, ids):
    """The llama.cpp backend writes rows into memory reused from earlier passes
    (backends/row_buffers.py): only memory nobody holds may be reused."""
    assert len(ids) >= MIN_ROWS  # long enough to take the reused path
    (s,) = fresh(backend)
    try:
        held = backend.forward([SeqInput(s, ids)])[0]  # [T, V]
        kept = held.clone()
        for _ in range(3):  # passes of the same size, which would take the same block if it were free
            backend.truncate(s, 0)
            other = backend.forward([SeqInput(s, ids[::-1])])[0]
            assert not torch.equal(other, kept)
            del other
        assert torch.equal(held, kept)
    finally:
        free(backend, (s,))


def test_truncate_then_refeed_is_bit_identical(backend, ids):
    (s,) = fresh(backend)
    try:
        cut = len(ids) // 2
        backend.forward([SeqInput(s, ids[:cut], "none")])
        tail = backend.forward([SeqInput(s, ids[cut:])])[0]  # [T - cut, V]
        backend.truncate(s, cut)
        assert backend.length(s) == cut
        assert torch.equal(backend.forward([SeqInput(s, ids[cut:])])[0], tail)
        backend.truncate(s, cut + 2)  # a rejected draft: keep two, re-feed the rest (a pass of another shape)
        assert_same_rows(backend, backend.forward([SeqInput(s, ids[cut + 2 :])])[0], tail[2:])
        backend.truncate(s, 0)
        first = backend.forward([SeqInput(s, ids)])[0]
        backend.truncate(s, 0)
        assert torch.equal(backend.forward([SeqInput(s, ids)])[0], first)
    finally:
        free(backend, (s,))


def test_llamacpp_chunk_equals_token_by_token(backend, ids):
    """Batch invariance: a verified chunk sees the numbers plain decoding sees (llama.cpp only;
    torch's matmuls round by shape, which is why the f32 tests compare outputs, not logits)."""
    if backend.name != "llama.cpp":
        pytest.skip("transformers makes no batch-invariance promise")
    (s,) = fresh(backend)
    try:
        chunk = backend.forward([SeqInput(s, ids)])[0]
        backend.truncate(s, 0)
        steps = torch.cat([backend.forward([SeqInput(s, [t])])[0] for t in ids])
        assert torch.equal(chunk, steps)
    finally:
        free(backend, (s,))


def test_two_sequences_in_one_forward_equal_each_alone(backend, ids):
    a, b = fresh(backend, 2)
    try:
        other = list(reversed(ids))
        alone_a = backend.forward([SeqInput(a, ids)])[0]
        alone_b = backend.forward([SeqInput(b, other[:7])])[0]
        backend.truncate(a, 0)
        backend.truncate(b, 0)
        together = backend.forward([SeqInput(b, other[:7]), SeqInput(a, ids)])
        assert torch.equal(together[1], alone_a) and torch.equal(together[0], alone_b)
        # ragged continuation: different new-token counts per sequence in one pass
        more = backend.forward([SeqInput(a, ids[:3]), SeqInput(b, other[7:8])])
        backend.truncate(a, len(ids))
        backend.truncate(b, 7)
        assert torch.equal(more[0], backend.forward([SeqInput(a, ids[:3])])[0])
        assert torch.equal(more[1], backend.forward([SeqInput(b, other[7:8])])[0])
    finally:
        free(backend, (a, b))


def test_sequences_are_isolated_freed_and_reused(backend, ids):
    a, b = fresh(backend, 2)
    ref = backend.forward([SeqInput(a, ids)])[0]
    backend.forward([SeqInput(b, ids[::-1])])
    free(backend, (a,))
    (c,) = fresh(backend)  # may reuse a's slot: it must start empty
    try:
        assert backend.length(c) == 0
        assert torch.allclose(backend.forward([SeqInput(c, ids)])[0], ref, atol=1e-5)
    finally:
        free(backend, (b, c))


def test_too_many_sequences_and_context_overflow_are_errors(backend, ids):
    seqs = fresh(backend, 4)
    try:
        with pytest.raises(RuntimeError, match="sequences are in use"):
            backend.new_sequence()
        with pytest.raises(ValueError, match="context length"):
            backend.forward([SeqInput(seqs[0], [ids[0]] * (backend.max_context + 1))])
        assert backend.length(seqs[0]) == 0  # a refused forward changes nothing
    finally:
        free(backend, seqs)


def test_sequence_runner_view(backend, ids):
    runner = SequenceRunner(backend)
    try:
        full = runner.forward(ids)
        runner.truncate(3)
        assert runner.length == 3
        last = runner.forward(ids[3:], last_only=True)[0]
        assert_same_rows(backend, last, full[-1])
        runner.reset()
        assert runner.length == 0 and runner.vocab_size == backend.vocab_size
    finally:
        runner.close()


def test_backends_agree_on_the_same_weights(tmp_path, ids):
    """The GGUF writer and the llama.cpp path compute the same model as transformers (the q8_0
    KV cache of the batch-invariant setting rounds keys and values, hence the tolerance)."""
    hf = TransformersBackend(tiny_model("qwen2", hidden=HIDDEN))
    cpp = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf"), batch_invariant=True)
    a = hf.forward([SeqInput(hf.new_sequence(), ids)])[0]
    b = cpp.forward([SeqInput(cpp.new_sequence(), ids)])[0]
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (a - b).abs().max() < 0.1 < a.abs().max()


def test_exact_mode_is_needed_and_sufficient_on_a_quantized_pack(smol_gguf):
    """SmolLM2 Q4_1 with a 300-token cache: llama.cpp's default kernels do not give a 32-token
    chunk the logits of 32 one-token steps in every batch shape (on this build they differ when
    the chunk shares its pass with another sequence); this is what `exact` is for. The
    batch-invariant kernels give the same logits, alone or shared."""
    torch.manual_seed(0)
    prompt = torch.randint(100, 10_000, (332,)).tolist()
    differs = {}
    for exact in (False, True):
        b = LlamaCppBackend(smol_gguf, max_context=1024, max_sequences=2, batch_invariant=exact)
        s, other = b.new_sequence(), b.new_sequence()
        b.forward([SeqInput(s, prompt[:300], "none"), SeqInput(other, prompt[:40], "none")])
        chunk = b.forward([SeqInput(s, prompt[300:])])[0]  # [32, V]
        b.truncate(s, 300)
        steps = torch.cat([b.forward([SeqInput(s, [t])])[0] for t in prompt[300:]])
        b.truncate(s, 300)
        shared = b.forward([SeqInput(other, [7]), SeqInput(s, prompt[300:])])[1]
        differs[exact] = not (torch.equal(chunk, steps) and torch.equal(shared, steps))
        b.close()
    assert differs == {False: True, True: False}
