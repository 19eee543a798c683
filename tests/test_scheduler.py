"""The scheduler's load decisions, on fake requests and made-up price curves.

trim_drafts must keep drafts that pay and drop those that do not, leave sampled requests' drafts
alone and let probes through, never plan a step whose expected tokens per unit of cost fall
below the step without trimmable drafts, and on a batched backend plan the best step there is:
checked against brute force over every combination of draft prefixes in small batches.
prefill_allowance must keep a step within prefill_slowdown times its cost.
"""

from __future__ import annotations

import itertools
import random

import pytest

from specserve.config import EngineLimits
from specserve.engine import scheduler
from specserve.engine.governor import CostModel
from specserve.engine.request import PROBE_TOKENS
from specserve.engine.scheduler import CorrectedCosts, prefill_allowance, trim_drafts

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
    """Large batches (too many plans to enumerate): never below the step with every trimmable
    draft dropped, which is plain batched decoding here (no sampled request, no probe)."""
    rng = random.Random(0)
    for _ in range(300):
        reqs = [FakeRequest(rng.choice([0, 2, 8, 32, 128]), rng.random()) for _ in range(rng.randint(2, 16))]
        plain = expected_per_cost([1.0] * len(reqs), [1] * len(reqs), prices)
        trim_drafts(reqs, [], prices, budget=2048)
        assert (
            expected_per_cost(
                [1 + r.acceptance() * len(r.draft_ids) for r in reqs], [1 + len(r.draft_ids) for r in reqs], prices
            )
            >= plain - 1e-9
        )


# -- brute force --------------------------------------------------------------------------------
# Small random batches with sampled requests and probes among them: every combination of draft
# prefix lengths the step could verify is enumerated and valued independently of trim_drafts'
# greedy scan, with the same prices. What is checked is the guarantee docs/design.md states:
#   - sampled requests keep their drafts, greedy probes keep min(K, PROBE_TOKENS), every other
#     draft is a prefix of what was proposed, and the trimmable tokens fit the budget;
#   - never below the step with every trimmable draft dropped (plain batched decoding when no
#     sampled request and no probe carries a draft);
#   - on a batched backend (a step's cost depends on its total tokens only, the curve or the
#     curve scaled by StepTimes' factors), the best of all those plans (up to float rounding).
CORRECTED = CorrectedCosts(CPU, {1: 1.0, 3: 1.3, 4: 0.8, 6: 2.0})  # StepTimes' factors, per log2 bucket
BRUTE_PRICES = [CPU, GPU, CostModel.linear(0.7), CostModel.linear(0.05), CORRECTED, CostModel(CPU.curve, batched=False)]
KINDS = ("greedy", "greedy", "greedy", "sampled", "probe", "sampled probe")


def expected_per_cost(values: list[float], sizes: list[int], prices, prefill: list[int] = ()) -> float:
    """Expected committed tokens (pending 1 + acceptance per verified draft token) per unit of cost."""
    return sum(values) / prices.batch(list(sizes) + list(prefill))


def random_batch(rng: random.Random) -> tuple[list[FakeRequest], list[int], int]:
    reqs = []
    for _ in range(rng.randint(2, 4)):
        kind = rng.choice(KINDS)
        a = rng.choice([0.05, 0.5, 0.9, rng.random()])  # repeated values make ties
        reqs.append(
            FakeRequest(
                rng.randint(0, 10 if "probe" in kind else 5), a, greedy="sampled" not in kind, probing="probe" in kind
            )
        )
    prefill = [rng.randint(1, 40)] if rng.random() < 0.3 else []
    budget = rng.choice([2048, rng.randint(0, 12)])
    return reqs, prefill, budget


def check_plan(reqs: list[FakeRequest], proposed: list[int], prefill: list[int], budget: int, prices) -> list[str]:
    """What is wrong with the plan trim_drafts left in `reqs` (drafts of `proposed` lengths before)."""
    wrong = []
    fixed = [None if r.trimmable else (min(k, PROBE_TOKENS) if r.params.greedy else k) for r, k in zip(reqs, proposed)]
    kept = [len(r.draft_ids) for r in reqs]
    if any(f is not None and k != f for k, f in zip(kept, fixed)):
        wrong.append(f"a sampled request's or a probe's draft was changed: {kept} from {proposed}")
    if any(r.draft_ids != list(range(k)) for r, k in zip(reqs, kept)) or any(k > p for k, p in zip(kept, proposed)):
        wrong.append("a draft is not a prefix of the proposed one")
    room = max(budget - sum(f for f in fixed if f is not None), 0)
    if sum(k for k, f in zip(kept, fixed) if f is None) > room:
        wrong.append(f"{kept} exceeds the budget {budget}")

    def value(lengths):
        return expected_per_cost(
            [1 + r.acceptance() * k for r, k in zip(reqs, lengths)], [1 + k for k in lengths], prices, prefill
        )

    got = value(kept)
    floor = value([0 if f is None else f for f in fixed])
    if got < floor - 1e-9:
        wrong.append(f"below the step without trimmable drafts: {got:.6f} < {floor:.6f}")
    choices = [range(p + 1) if f is None else (f,) for p, f in zip(proposed, fixed)]
    best = max(value(c) for c in itertools.product(*choices) if sum(k for k, f in zip(c, fixed) if f is None) <= room)
    if getattr(prices, "batched", True) and got < best - 1e-9:
        wrong.append(f"not the best plan: {got:.6f} < {best:.6f}")
    return wrong


def brute_force_failures(trim, prices, batches: int = 150, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    failures = []
    for _ in range(batches):
        reqs, prefill, budget = random_batch(rng)
        proposed = [len(r.draft_ids) for r in reqs]
        trim(reqs, prefill, prices, budget)
        failures += [
            f"{w} (acceptance {[round(r.acceptance(), 3) for r in reqs]}, prefill {prefill})"
            for w in check_plan(reqs, proposed, prefill, budget, prices)
        ]
    return failures


@pytest.mark.parametrize("prices", BRUTE_PRICES, ids=["cpu", "gpu", "linear", "cheap", "corrected", "unbatched"])
def test_trim_drafts_against_brute_force(prices):
    failures = brute_force_failures(trim_drafts, prices)
    assert not failures, failures[:5]


def keep_every_draft(decode, prefill, prices, budget):
    """A scheduler without the guard: probes cut to size, every other draft verified."""
    for r in decode:
        if r.params.greedy and r.probing:
            r.trim_draft(PROBE_TOKENS)


def least_valuable_first(decode, prefill, prices, budget):
    """trim_drafts' scan with the candidates in the wrong order."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler, "sorted", lambda items, key: sorted(items, key=lambda c: c[0]), raising=False)
        trim_drafts(decode, prefill, prices, budget)


def test_the_brute_force_check_catches_broken_planners():
    """The check above fails when the guard is gone or when the scan takes the wrong tokens."""
    assert brute_force_failures(keep_every_draft, CPU)
    failures = brute_force_failures(least_valuable_first, GPU)
    assert any("not the best plan" in f for f in failures)


def test_prefill_allowance_keeps_the_step_within_the_slowdown():
    limits = EngineLimits(max_num_seqs=16, prefill_slowdown=2.0, min_prefill_chunk=4)
    for decoding in (1, 4, 8, 16):
        chunk = prefill_allowance(decoding, CPU, limits)
        base = CPU.batch([1] * decoding)
        assert CPU.batch([1] * decoding + [chunk]) <= 2.0 * base + 1e-9 or chunk == limits.min_prefill_chunk
        assert CPU.batch([1] * decoding + [chunk + 1]) > 2.0 * base  # and it is the largest such chunk


@pytest.mark.parametrize("chunk", [0, -4])
def test_a_prompt_joining_a_batch_is_always_given_a_chunk(chunk):
    """min_prefill_chunk is the floor that keeps a joining prompt moving: with 0, and a slowdown of
    1 (no chunk fits it), a prompt joining two decoding streams was given no tokens at all, step
    after step, until every stream had finished. Such limits are refused when built."""
    with pytest.raises(ValueError, match="min_prefill_chunk must be at least 1"):
        EngineLimits(min_prefill_chunk=chunk)
