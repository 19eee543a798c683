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
