"""The scheduler's load decisions, on fake requests and made-up price curves.

trim_drafts must keep drafts that pay and drop those that do not, never plan a step whose
expected tokens per unit of cost fall below plain batched decoding (pending tokens only), leave
sampled requests' drafts alone, and let probes through; prefill_allowance must keep a step
within prefill_slowdown times its cost.
"""

from __future__ import annotations

import random

import pytest

from specserve.config import EngineLimits
from specserve.engine.governor import CostModel
from specserve.engine.request import PROBE_TOKENS
from specserve.engine.scheduler import prefill_allowance, trim_drafts

CPU = CostModel(((1, 1.0), (2, 1.6), (4, 2.6), (8, 6.0), (16, 8.5), (32, 13.0), (64, 24.0), (128, 45.0)))
GPU = CostModel(((1, 1.0), (128, 1.3)))  # weight-bound: a wide pass costs about one narrow one


class FakeRequest:
    def __init__(self, k: int, acceptance: float, greedy: bool = True, probing: bool = False):
        self.draft_ids = list(range(k))
        self._a, self.probing = acceptance, probing
        self.params = type("P", (), {"greedy": greedy})()

    @property
    def trimmable(self) -> bool:
        return self.params.greedy and not self.probing

    def acceptance(self) -> float:
        return self._a

    def trim_draft(self, n: int) -> None:
        self.draft_ids = self.draft_ids[:n]


def ratio(reqs, prices) -> float:
    """Expected committed tokens per unit of cost of a planned step."""
    value = sum(1 + r.acceptance() * len(r.draft_ids) for r in reqs)
    return value / prices.batch([1 + len(r.draft_ids) for r in reqs])


def test_a_poor_draft_is_dropped_and_a_good_one_kept():
    poor, good = FakeRequest(16, 0.2), FakeRequest(64, 0.95)
    plain = [FakeRequest(0, 0.0) for _ in range(6)]
    trim_drafts([poor, good, *plain], [], CPU, budget=2048)
    assert poor.draft_ids == [] and len(good.draft_ids) == 64


def test_on_a_weight_bound_device_every_draft_token_pays():
    reqs = [FakeRequest(8, 0.3) for _ in range(4)]
    trim_drafts(reqs, [], GPU, budget=2048)
    assert all(len(r.draft_ids) == 8 for r in reqs)


def test_sampled_requests_keep_their_drafts_and_probes_are_cut_to_size():
    sampled = FakeRequest(16, 0.1, greedy=False)  # its random stream depends on its draft lengths
    probe = FakeRequest(32, 0.1, probing=True)  # verified whatever the load, PROBE_TOKENS of it
    poor = FakeRequest(32, 0.1)
    trim_drafts([sampled, probe, poor, FakeRequest(0, 0.0)], [], CPU, budget=2048)
    assert len(sampled.draft_ids) == 16 and len(probe.draft_ids) == PROBE_TOKENS and poor.draft_ids == []


def test_the_token_budget_is_respected():
    reqs = [FakeRequest(100, 0.99) for _ in range(4)]
    trim_drafts(reqs, [], GPU, budget=50)
    assert sum(len(r.draft_ids) for r in reqs) <= 50


@pytest.mark.parametrize("prices", [CPU, GPU, CostModel.linear(0.7), CostModel(CPU.curve, batched=False)])
def test_never_worse_than_plain_batched_decoding(prices):
    rng = random.Random(0)
    for _ in range(300):
        reqs = [FakeRequest(rng.choice([0, 2, 8, 32, 128]), rng.random()) for _ in range(rng.randint(2, 16))]
        plain = ratio([FakeRequest(0, 0.0) for _ in reqs], prices)
        trim_drafts(reqs, [], prices, budget=2048)
        assert ratio(reqs, prices) >= plain - 1e-9


def test_prefill_allowance_keeps_the_step_within_the_slowdown():
    limits = EngineLimits(max_num_seqs=16, prefill_slowdown=2.0, min_prefill_chunk=4)
    for decoding in (1, 4, 8, 16):
        chunk = prefill_allowance(decoding, CPU, limits)
        base = CPU.batch([1] * decoding)
        assert CPU.batch([1] * decoding + [chunk]) <= 2.0 * base + 1e-9 or chunk == limits.min_prefill_chunk
        assert CPU.batch([1] * decoding + [chunk + 1]) > 2.0 * base  # and it is the largest such chunk
