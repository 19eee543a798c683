"""The `auto` governor: a drafter that commits fewer tokens per unit of cost than plain
decoding sits out (with periodic probes); one that pays keeps drafting; outputs never change."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.engine.governor import CostModel, Governor, measure_agreement
from specserve.llm import LLM

# A CPU where each extra verified token costs 0.3 of a plain step and a draft pass 0.4.
PRICES = CostModel.linear(0.3, 0.4)


def drive(gov: Governor, rate: float, steps: int, source: str = "draft", k_max: int = 16) -> list[int]:
    """Simulate steps where `source` drafts what the governor allows and a `rate` share of each
    draft is accepted; returns the K drafted per step (0: a plain step)."""
    ks = []
    for _ in range(steps):
        k = gov.k_cap(source, k_max)
        accepted = int(k * rate)
        gov.record(source if k else "none", 1 + k, accepted + 1)
        ks.append(k)
    return ks


def llm_with_a_spied_draft_model() -> tuple[LLM, list[int]]:
    """Tiny target and draft models; the list collects how many tokens each draft pass is fed."""
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    fed: list[int] = []
    forward = llm.draft_backend.forward
    llm.draft_backend.forward = lambda inputs: fed.append(sum(len(x.token_ids) for x in inputs)) or forward(inputs)
    return llm, fed


def test_prices():
    assert PRICES.step(1, 0) == 1.0
    assert PRICES.step(5, 4) == pytest.approx(1 + 4 * 0.3 + 4 * 0.4)


def test_a_source_that_pays_keeps_drafting():
    ks = drive(Governor(PRICES), rate=1.0, steps=100, source="ngram")
    assert all(k > 0 for k in ks) and ks[-1] == 16  # always right: the longest drafts pay best


def test_a_source_that_is_never_right_sits_out_but_is_probed():
    gov = Governor(PRICES, probe_every=16)
    ks = drive(gov, rate=0.0, steps=100, source="ngram")
    assert ks[0] > 0  # the prior lets it try
    assert 5 <= sum(k > 0 for k in ks[10:]) <= 6 and max(ks[10:]) == gov.probe_k  # one small probe per 16 steps
    assert gov.acceptance("ngram") < 0.1


def test_a_source_comes_back_when_it_pays_again():
    gov = Governor(PRICES, probe_every=4)
    drive(gov, rate=0.0, steps=40, source="ngram")
    ks = drive(gov, rate=1.0, steps=80, source="ngram")
    assert all(k > 0 for k in ks[-20:])


def test_the_prediction_source_is_never_governed():
    assert drive(Governor(PRICES), rate=0.0, steps=20, source="prediction") == [16] * 20


def test_a_source_that_cannot_pay_even_when_always_right_sits_out_from_the_start():
    cpu = CostModel.linear(0.7, 0.4)  # llama.cpp on 2 cores: 8 verified tokens ~ 6 steps
    ks = drive(Governor(cpu, probe_every=16), rate=1.0, steps=64)
    assert ks == [0] * 64  # not even probes: a probe of a draft model that cannot pay could only lose
    # n-gram drafts cost no passes: after a probe shows it right, it drafts again
    assert drive(Governor(cpu), rate=1.0, steps=40, source="ngram")[-1] > 0


def test_a_draft_model_that_cannot_pay_is_never_fed_not_even_the_prompt():
    """`auto` on hardware where the draft model cannot pay: it is dropped from the request when
    it is admitted, so the prompt is not prefilled into it (the first token comes as fast as
    plain decoding's). Where it can pay, it is fed as before."""
    llm, fed = llm_with_a_spied_draft_model()
    prompt = "Le café coûte 3 €. Über " * 4
    base = llm.generate(prompt, SamplingParams(max_tokens=24), speculation="none")
    llm.engine.core._prices = CostModel.linear(0.7, 0.4)  # llama.cpp on 2 cores: the draft model never pays
    out = llm.generate(prompt, SamplingParams(max_tokens=24), speculation="auto")
    assert out.token_ids == base.token_ids and fed == []
    llm.engine.core._prices = CostModel.linear(0.02, 0.05)  # a GPU-like curve: it may pay, so it is fed
    llm.generate(prompt, SamplingParams(max_tokens=24), speculation="auto")
    assert sum(fed) >= len(llm.tokenizer.encode(prompt)) - 1


def test_a_draft_model_that_auto_never_calls_is_never_fed():
    """The draft model reads the prompt on its first proposal, not during prefill: where the
    prediction drafts every step, a draft model that could pay is still never fed at all."""
    llm, fed = llm_with_a_spied_draft_model()
    prompt = "def add(a, b):"
    base = llm.generate(prompt, SamplingParams(max_tokens=24), speculation="none")
    llm.engine.core._prices = CostModel.linear(0.02, 0.05)  # a GPU-like curve: the draft model could pay
    out = llm.generate(prompt, SamplingParams(max_tokens=24), prediction=base.text, speculation="auto")
    assert out.token_ids == base.token_ids
    assert out.stats.by_source["prediction"].accepted == 22 and out.stats.by_source["draft"].steps == 0
    assert fed == []


def test_a_draft_model_reads_a_long_backlog_only_when_the_output_could_repay_it():
    """A draft model that has not read the prompt must feed it first (~10 s for 1k tokens with the
    0.5B draft on 2 cores). The governor allows that read, probes included, only once the output
    so far (the estimate of what is left) times the best-case saving covers it."""
    gov = Governor(CostModel.linear(0.1, 0.3), prompt_len=1000, probe_every=4)
    read = gov.prices.draft * gov.prices.target(1000)  # ~30 units
    assert [gov.k_cap("draft", 64, tokens=1000 + p, backlog=1000 + p) for p in range(0, 40)] == [0] * 40
    assert not gov.worth_reading("draft", 1000, produced=40, room=64)
    assert gov.worth_reading("draft", 1000, produced=400, room=4000)
    assert not gov.worth_reading("draft", 1000, produced=400, room=10)  # max_tokens leaves too little to repay it
    assert gov.worth_reading("draft", 4, produced=10, room=100)  # the usual catch-up after a step
    assert read > 20 and gov.k_cap("draft", 64, tokens=1400, backlog=1000) > 0
    assert gov.k_cap("ngram", 64, tokens=1000, backlog=1000) > 0  # n-gram reads nothing that costs a pass


def test_a_short_answer_never_feeds_the_draft_model_a_long_prompt():
    """End to end: on prices where the draft model could pay (so it is kept at admission), a
    24-token answer is not worth its prompt's read, and the draft model is never fed; a long
    answer is, and then it drafts. Outputs are plain decoding's either way."""
    llm, fed = llm_with_a_spied_draft_model()
    prompt = "Le café coûte 3 €. Über " * 40  # 280 tokens
    llm.engine.core._prices = CostModel.linear(0.1, 0.3)
    for max_tokens in (24, 120):
        base = llm.generate(prompt, SamplingParams(max_tokens=max_tokens), speculation="none")
        out = llm.generate(prompt, SamplingParams(max_tokens=max_tokens), speculation="auto")
        assert out.token_ids == base.token_ids
        if max_tokens == 24:
            assert fed == [] and out.stats.by_source["draft"].steps == 0
    assert sum(fed) >= len(llm.tokenizer.encode(prompt)) and out.stats.by_source["draft"].steps > 0


def test_k_is_priced_up_to_the_proposers_ceiling_not_the_whole_room():
    """A chat request without max_tokens may write the rest of the context. The governor prices
    each K up to the proposer's own ceiling (8 for the draft model, 16 for n-gram), not up to
    that room: pricing 30k values of K had cost ~100 ms a step."""
    from specserve.proposers.base import choose_draft

    priced = []

    class Counting(CostModel):
        def step(self, fed: int, draft_passes: int) -> float:
            priced.append(fed)
            return super().step(fed, draft_passes)

    class Ngram:
        name = "ngram"

        def __init__(self):
            self.k = type("K", (), {"k_max": 16})()

        def propose(self, tokens, max_k):
            return None

    gov = Governor(Counting(CostModel.linear(0.1).curve), prompt_len=100)
    choose_draft([Ngram()], list(range(120)), 30000, gov)
    assert priced and max(priced) <= 17 and len(priced) <= 3 * 16


def test_short_drafts_where_verified_tokens_are_dear():
    cheap, dear = CostModel.linear(0.05), CostModel.linear(0.5)
    gov_cheap, gov_dear = Governor(cheap), Governor(dear)
    for g in (gov_cheap, gov_dear):
        g.counts["ngram"] = [8.0, 10.0]  # 80% accepted so far
    assert gov_dear.k_cap("ngram", 16) < gov_cheap.k_cap("ngram", 16)


def test_auto_benches_a_costly_draft_model_and_output_stays_exact():
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model(), tok, tiny_model(seed=1))  # a draft that is rarely right
    llm.engine.core._prices = CostModel.linear(0.2, 1.5)  # and costs more than the target
    prompt = "Le café coûte 3 €. Über"
    base = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="none")
    out = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
    assert out.token_ids == base.token_ids
    assert out.stats.by_source.get("draft") is None or out.stats.by_source["draft"].steps <= out.stats.steps // 4
    again = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
    strip = lambda o: [(s["source"], s["proposed"], s["accepted"]) for s in o.steps]  # noqa: E731
    assert strip(again) == strip(out)  # decisions do not depend on the clock
    # an explicitly chosen method is not governed: it drafts whenever it may
    forced = llm.generate(prompt, SamplingParams(max_tokens=40), speculation="draft")
    assert forced.stats.by_source["draft"].steps == forced.stats.steps - 1  # the last step has no budget


def test_calibration_on_a_real_runner():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    prices = llm.engine.prices()
    assert prices is llm.engine.prices()  # measured once
    assert prices.per_token >= 0 and prices.draft > 0
    costs = [c for _, c in prices.curve]
    assert costs[0] == 1.0 and costs == sorted(costs)  # one plain pass is the unit; longer never cheaper
    core = llm.engine.core  # the spare sequences it measured on are free again
    assert core.target._lengths == {} and core.draft._lengths == {}


class StallingRunner:
    """A runner whose passes take 1 ms + 0.01 ms per token on a fake clock, except that the
    first pass of `stall_at` tokens stalls for 40 ms (a page fault, another process)."""

    max_context = 4096

    def __init__(self, clock, stall_at: int):
        self.clock, self.stall_at, self.stalled = clock, stall_at, False

    def forward(self, ids, last_only=False):
        self.clock.now += 1e-3 + 1e-5 * len(ids)
        if len(ids) == self.stall_at and not self.stalled:
            self.stalled, self.clock.now = True, self.clock.now + 40e-3

    def truncate(self, n):
        pass

    def reset(self):
        pass


def test_one_stalled_pass_does_not_price_a_small_models_curve(monkeypatch):
    """A small model's passes take a millisecond, so a one-off stall during calibration would
    make every longer pass look 40x dearer (and a prediction draft K = 1); cheap passes are
    timed a few times and the median kept."""
    from specserve.engine import governor

    clock = type("Clock", (), {"now": 0.0})()
    monkeypatch.setattr(governor.time, "perf_counter", lambda: clock.now)
    prices = CostModel.calibrate(StallingRunner(clock, stall_at=64))
    assert prices.target(64) < 1.7, prices.curve  # 1.64 ms / 1.01 ms, not 41.6 ms / 1.01 ms


class CopyingBackend:
    """Saves and restores a sequence at `per_cell` seconds a cell on the fake clock."""

    def __init__(self, clock, per_cell: float):
        self.clock, self.per_cell, self.length = clock, per_cell, 0

    def save_sequence(self, seq):
        self.clock.now += self.per_cell * self.length
        return ("copy", self.length)

    def truncate(self, seq, length):
        self.length = length

    def restore_sequence(self, seq, saved):
        self.length = saved[1]
        self.clock.now += self.per_cell * self.length
        return True


class CopyingRunner(StallingRunner):
    """Passes as StallingRunner's (1 ms + 0.01 ms a token, no stall), over a backend that copies."""

    seq = 0

    def __init__(self, clock, per_cell: float):
        super().__init__(clock, stall_at=-1)
        self.backend = CopyingBackend(clock, per_cell)

    @property
    def length(self) -> int:
        return self.backend.length

    def forward(self, ids, last_only=False):
        super().forward(ids, last_only)
        self.backend.length += len(ids)

    def truncate(self, n):
        self.backend.length = min(n, self.backend.length)

    def reset(self):
        self.backend.length = 0


@pytest.mark.parametrize(("per_cell", "pays"), [(2e-6, True), (1e-4, False)])
def test_the_price_of_copying_cells_out_and_back_is_measured(monkeypatch, per_cell, pays):
    """calibrate times a save and a restore of a sequence (the host tier's copy) per cell, in
    plain passes. Prefilling a token of a 128-token pass costs 0.018 here, and a copy pays at a
    quarter of that: on a CPU a copy is a memcpy (here 2 us a cell each way: 0.004 passes), on a
    GPU it crosses the bus (here 100 us each way: 0.2 passes). A runner whose backend cannot copy
    has no such price."""
    from specserve.engine import governor

    clock = type("Clock", (), {"now": 0.0})()
    monkeypatch.setattr(governor.time, "perf_counter", lambda: clock.now)
    prices = CostModel.calibrate(CopyingRunner(clock, per_cell))
    assert prices.copy == pytest.approx(2 * per_cell / 1.01e-3)
    assert prices.copy_pays is pays
    assert CostModel.calibrate(StallingRunner(clock, stall_at=-1)).copy is None
    assert not CostModel(prices.curve).copy_pays  # unmeasured: not known to pay


def test_the_copy_price_is_measured_on_both_backends_and_the_sequence_left_empty(tmp_path):
    """On the real backends the calibration saves and restores through llama.cpp's state API, or
    transformers' cache tensors (`save_sequence`, `restore_sequence`): it gets a price, and
    leaves its sequence empty."""
    from tiny_gguf import write_tiny_gguf

    from specserve.backends.base import SequenceRunner
    from specserve.backends.llamacpp import LlamaCppBackend
    from specserve.backends.transformers import TransformersBackend

    for backend in (
        LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf", 0), max_sequences=2),
        TransformersBackend(tiny_model("qwen2"), max_sequences=2),  # safetensors bytes in host memory
    ):
        runner = SequenceRunner(backend)
        prices = CostModel.calibrate(runner)
        assert prices.copy is not None and prices.copy > 0, backend.name
        assert runner.length == 0
        runner.close()
        getattr(backend, "close", lambda: None)()  # llama.cpp frees its context


def test_cost_curve_interpolates_and_extrapolates():
    prices = CostModel(((1, 1.0), (8, 6.0), (128, 45.0)))
    assert prices.target(1) == 1.0 and prices.target(8) == 6.0
    assert abs(prices.target(68) - 25.5) < 1e-9  # halfway between 8 and 128
    assert abs(prices.target(248) - 84.0) < 1e-9  # the last segment's slope continues
    assert prices.batch([1, 1, 1]) == prices.target(3)
    per_seq = CostModel(((1, 1.0), (8, 6.0), (128, 45.0)), batched=False)
    assert per_seq.batch([1, 1, 1]) == 3.0


def test_a_sampled_requests_draft_backlog_ignores_what_the_prefix_cache_shared():
    """Whether the draft model drafts changes what a sampled request commits, so its backlog is
    priced as if no prefix were shared (a seeded request: the same text cold or warm); a greedy
    request's commits never change, so it may count the shared prefix as read."""
    from specserve.config import SamplingParams
    from specserve.engine.sampling import Noise
    from specserve.proposers.draft_model import DraftModelProposer

    tokens = list(range(300))
    for params, expected in ((SamplingParams(temperature=0.9, seed=7), 300), (SamplingParams(temperature=0), 20)):
        p = DraftModelProposer(None, params, Noise(7))
        p.adopt_prefix(tokens[:280])  # what DraftPrefixes.share does
        assert p.backlog(tokens) == expected


class ArgmaxRunner:
    """A runner whose logits put each position's greedy next token where `choose(i, ids)` says."""

    max_context, vocab_size = 4096, 50

    def __init__(self, choose):
        self.choose, self.calls = choose, 0

    def forward(self, ids, last_only=False):
        self.calls += 1
        logits = torch.zeros(len(ids), self.vocab_size)  # [T, V]
        for i in range(len(ids)):
            logits[i, self.choose(i, ids)] = 1.0
        return logits[-1:] if last_only else logits

    def truncate(self, n):
        pass

    def reset(self):
        pass


def test_agreement_is_the_share_of_positions_where_the_greedy_tokens_match():
    ids = list(range(1, 42))  # 40 positions that have a next token
    target = ArgmaxRunner(lambda i, ids: ids[i] + 1)
    draft = ArgmaxRunner(lambda i, ids: ids[i] + 1 if i % 4 else 0)  # wrong at positions 0, 4, ..., 36
    assert measure_agreement(target, draft, ids) == pytest.approx(30 / 40)
    assert measure_agreement(target, ArgmaxRunner(lambda i, ids: ids[i] + 1), ids) == 1.0
    assert measure_agreement(target, draft, ids[:1]) is None  # no position to compare: not measured


def test_the_measured_agreement_decides_whether_a_draft_model_may_read():
    """Xeon prices (a draft pass 0.47 of a target step; it breaks even near 0.77 acceptance): a
    46-token chat answer used to let the draft model read a 65-token prompt, priced as if every
    draft were accepted, and then lost 0.6 of its 3.6 s. At the measured agreement the read is
    repaid only by a long answer where the draft model saves more per token than reading a token
    costs it, and a draft model that cannot pay at its agreement never reads."""
    curve = ((1, 1.0), (2, 1.34), (4, 1.49), (8, 2.7), (16, 3.42), (32, 6.05), (64, 12.5), (128, 22.3))
    unmeasured, code, mixed, prose = (
        Governor(CostModel(curve, 0.47, True, a), prompt_len=65) for a in (None, 0.9, 0.83, 0.68)
    )
    assert unmeasured.worth_reading("draft", 65 + 46, produced=46, room=210)
    for gov in (code, mixed, prose):
        assert not gov.worth_reading("draft", 65 + 46, produced=46, room=210)
    assert code.worth_reading("draft", 65 + 400, produced=400, room=2000)  # saves 0.15 a token, reads at 0.07
    assert not mixed.worth_reading("draft", 65 + 400, produced=400, room=2000)  # saves 0.06 a token: never repaid
    assert not prose.worth_reading("draft", 65 + 400, produced=400, room=2000)  # no K pays at 0.68
    assert mixed.k_cap("draft", 8, tokens=65 + 46, backlog=65 + 46, room=210) == 0
    assert mixed.k_cap("ngram", 8, tokens=65 + 46, backlog=65 + 46, room=210) > 0  # n-gram reads nothing


def test_calibration_measures_the_draft_models_agreement_on_the_reference_text():
    same = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model())
    other = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    assert same.engine.prices().agreement == 1.0  # the draft model is the target
    assert 0.0 <= other.engine.prices().agreement < 1.0
    assert LLM.from_models(tiny_model(), tiny_tokenizer()).engine.prices().agreement is None  # no draft model
    core = other.engine.core  # the spare sequences it measured on are free again
    assert core.target._lengths == {} and core.draft._lengths == {}


def test_a_draft_model_whose_agreement_cannot_repay_the_prompt_is_never_fed():
    """End to end on the tiny models: the same 120-token answer that lets the draft model read
    the prompt when no agreement was measured keeps it unfed at an agreement of 0.3."""
    llm, fed = llm_with_a_spied_draft_model()
    prompt = "Le café coûte 3 €. Über " * 40
    base = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="none")
    for agreement, feeds in ((None, True), (0.3, False)):
        fed.clear()
        llm.engine.core._prices = CostModel(CostModel.linear(0.1, 0.3).curve, 0.3, True, agreement)
        out = llm.generate(prompt, SamplingParams(max_tokens=120), speculation="auto")
        assert out.token_ids == base.token_ids
        assert bool(fed) == feeds and (out.stats.by_source["draft"].steps > 0) == feeds
