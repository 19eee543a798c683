"""Sampling parameters at the edges of their valid ranges (found by schemathesis as server 500s):
a temperature or top_p so small that float32 rounds it to 0 (or a top_p of 0) must still give a
distribution."""

from __future__ import annotations

import pytest
import torch

from specserve.config import SamplingParams
from specserve.engine.sampling import probs_from_logits


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 5e-324},
        {"temperature": 1e-45},
        {"temperature": 1.0, "top_p": 5e-324},
        {"temperature": 1.0, "top_p": 0.0},  # OpenAI accepts 0: the nucleus's first token only
        {"temperature": 5e-324, "top_p": 5e-324, "top_k": 3},
    ],
)
def test_tiny_temperature_or_top_p_is_the_argmax_distribution(kw):
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.5], [0.5, -1.0, 4.0, 3.9]])  # [T=2, V=4]
    probs = probs_from_logits(logits, SamplingParams(max_tokens=1, **kw))
    assert torch.isfinite(probs).all()
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 4).float())


@pytest.mark.parametrize("temperature", [1e-5, 3e-5, 1e-3, 0.5])
def test_a_small_temperature_is_the_one_asked_for(temperature):
    """temperature 1e-5 was floored at 1e-4: two logits 5e-5 apart came out 38% / 62% where the
    asked law gives 0.7% / 99.3%. The floor is only there to keep logits / T finite."""
    logits = torch.tensor([[1.0, 1.0 - 5e-5, -3.0]])  # [T=1, V=3]
    probs = probs_from_logits(logits, SamplingParams(max_tokens=1, temperature=temperature))
    expected = torch.softmax(logits.double() / temperature, dim=-1)
    assert torch.allclose(probs.double(), expected, atol=1e-3), (probs, expected)  # float32: logits / T rounds


def test_the_temperature_floor_keeps_large_logits_finite():
    """The floor's purpose: logits as large as the penalties and a bias can make them (a frequency
    penalty of 2 over a 128k-token answer, plus a bias of 100) over the smallest temperature
    must not overflow float32 into NaN."""
    logits = torch.tensor([[2.6e5, -2.6e5, 100.0, 0.0]])
    probs = probs_from_logits(logits, SamplingParams(max_tokens=1, temperature=5e-324))
    assert torch.equal(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
