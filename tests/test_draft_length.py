"""Prediction draft length from prices: the measured cost curve and the request's own history.

The replay oracle plays a target that writes a known output; `prices` is the llama.cpp 2-core
curve from docs/benchmarks.md, so K follows the same prices the projected speedup is paid in.
"""

from __future__ import annotations

from pathlib import Path

from tiny import tiny_tokenizer

from specserve.bench.curves import LLAMACPP_2CORE_CURVE
from specserve.bench.replay import projected_speedup, replay, replay_ids
from specserve.config import SpeculationConfig
from specserve.engine.governor import CostModel
from specserve.proposers import prediction
from specserve.proposers.prediction import PROBE_COST, PredictionProposer, priced_k, probe_length

CURVE = CostModel(LLAMACPP_2CORE_CURVE)
SAMPLES = Path(__file__).resolve().parents[1] / "src" / "specserve" / "bench" / "samples"
BEFORE = "".join(
    f"def handler_{i}(request):\n    user = load_user(request.user_id)\n    return render(user, page={i})\n\n"
    for i in range(60)
)
AFTER = BEFORE.replace("    return render(user, page=30)\n", "    audit(request)\n    return render(user, page=30)\n")


def test_priced_k_follows_the_curve_and_the_odds():
    # a long pass is cheaper per token on this curve: with a reliable prediction K passes 128
    assert priced_k(CURVE, 0.999, 1024) > 128
    # ... capped by the budget it is given
    assert priced_k(CURVE, 0.999, 100) == 100
    # the likelier a divergence, the shorter the draft
    ks = [priced_k(CURVE, f, 1024) for f in (0.9995, 0.999, 0.995, 0.98, 0.9)]
    assert ks == sorted(ks, reverse=True) and ks[-1] < 32
    # where every verified token costs nearly a step, drafts stay short
    assert priced_k(CostModel.linear(0.9), 0.999, 1024) < priced_k(CostModel.linear(0.02), 0.999, 1024) // 4


def test_an_unconfirmed_anchor_is_probed_with_what_a_few_steps_buy():
    """The first draft from an anchor not yet confirmed is right about 40% of the time: on the
    2-core CPU curve (8 tokens cost 6.6 steps) it is 2 tokens, where verifying is nearly free the
    full k_init; a confirmed anchor still drafts the priced K."""
    assert probe_length(CURVE, 8) == 2  # target(3) = 2.6 <= PROBE_COST, target(4) = 3.4 is not
    assert CURVE.target(3) <= PROBE_COST < CURVE.target(4)
    assert probe_length(CostModel.linear(0.02), 8) == 8
    assert probe_length(CostModel.linear(5.0), 8) == 1  # never below one token
    drafter = PredictionProposer(tiny_tokenizer(), BEFORE, prompt_len=1, prices=lambda: CURVE)
    drafter.trusted = False
    assert drafter.draft_length(1024) == 2
    drafter.trusted = True
    assert drafter.draft_length(1024) > 64


def test_a_young_run_has_its_own_odds():
    """Edits cluster: the output that just came back to the prediction often leaves it again a
    few tokens on. A run younger than YOUNG_RUN tokens since its anchor is priced with the odds
    counted over young runs (a prior of 1 divergence in 16 tokens), so its draft is shorter than
    one from an older run, and grows back where this request's young runs keep being followed."""
    drafter = PredictionProposer(tiny_tokenizer(), BEFORE, prompt_len=1, prices=lambda: CURVE)
    drafter.trusted, drafter.old = True, [0, 2000]
    drafter.age = prediction.YOUNG_RUN
    old = drafter.draft_length(1024)
    drafter.age = 0
    young = drafter.draft_length(1024)
    assert young < old // 4
    drafter.young = [0, 4000]  # this request's young runs were followed a long way
    assert drafter.draft_length(1024) > 4 * young
    drafter.age = prediction.YOUNG_RUN - 1
    drafter.old = [40, 2000]  # older runs have left often: the young odds still decide
    assert drafter.draft_length(1024) > 4 * young


def speedup(out, ids: list[int]) -> float:
    """Plain decoding's cost over the drafted steps', both paid at CURVE."""
    assert out.token_ids == ids
    return projected_speedup(len(ids), [s["proposed"] + 1 for s in out.steps], 1.0, CURVE)


INSERTED = "".join(  # three new functions written like the handlers: every line re-anchors, then leaves
    f"def restore_{i}(request):\n"
    f"    user = load_user(request.user_id)\n"
    f"    user.deleted_at = None\n"
    f"    user = load_user(request.user_id, fresh=True)\n"
    f"    return render(user, page={i}, restored=True)\n\n"
    for i in (3, 4, 5)
)
HOPPING = BEFORE.replace("def handler_3(", INSERTED + "def handler_3(")


def test_hops_inside_new_code_do_not_shorten_the_drafts_after_it(monkeypatch):
    """New code written like the old (a route modelled on its neighbour) re-anchors inside the
    old code at every line and leaves again: a dozen divergences in a few hundred tokens. Counted
    at the young age they happen, they leave the odds of older runs alone, so the unchanged rest
    of the file is drafted long again; pooled into one count (YOUNG_RUN = 0) they would price
    every later draft short."""
    tok = tiny_tokenizer()
    ids = tok.encode(HOPPING, add_special_tokens=False)
    spec = SpeculationConfig("prediction")
    aged = replay_ids(tok, BEFORE, ids, spec, CURVE)
    assert max(prediction_drafts(aged)[-10:]) > 128  # the unchanged tail
    monkeypatch.setattr(prediction, "YOUNG_RUN", 0)
    pooled = replay_ids(tok, BEFORE, ids, spec, CURVE)
    assert max(prediction_drafts(pooled)[-10:]) < 128
    assert speedup(aged, ids) > 1.1 * speedup(pooled, ids)


def prediction_drafts(out) -> list[int]:
    return [s["proposed"] for s in out.steps if s["source"] == "prediction"]


def test_no_blind_restart_after_a_reanchor_and_drafts_past_128():
    tok = tiny_tokenizer()
    ids = tok.encode(AFTER, add_special_tokens=False)
    spec = SpeculationConfig("prediction")
    priced = replay_ids(tok, BEFORE, ids, spec, CURVE)
    unpriced = replay_ids(tok, BEFORE, ids, spec)
    assert priced.token_ids == unpriced.token_ids == ids

    # after a divergence, once the run from a confirmed anchor is YOUNG_RUN tokens old, K goes
    # straight to a priced length (one step from <= 16 to > 64); without prices K climbs back
    # 8 -> 16 -> 32 -> ... after every re-anchor
    def jumps(out):
        first = next(i for i, s in enumerate(out.steps) if s["accepted"] < s["proposed"])
        after = [s["proposed"] for s in out.steps[first + 1 :] if s["proposed"]]
        return any(a <= 16 and b > 64 for a, b in zip(after, after[1:]))

    assert jumps(priced) and not jumps(unpriced)
    assert max(prediction_drafts(priced)) > 128
    drafts = prediction_drafts(unpriced)
    assert max(drafts) == 128 and drafts[0] == 8
    assert speedup(priced, ids) > speedup(unpriced, ids)  # paid at the curve: what the prices optimise


def test_auto_prices_a_prediction_past_128_too():
    """`auto` asks the prediction for up to its own ceiling (prediction_k_max), as the
    prediction method does: it used to cap it at the adaptive K's 128, so on a curve where long
    passes pay, `auto` with a prediction took more steps than the prediction alone."""
    tok = tiny_tokenizer()
    ids = tok.encode(AFTER, add_special_tokens=False)
    alone = replay_ids(tok, BEFORE, ids, SpeculationConfig("prediction"), CURVE)
    auto = replay_ids(tok, BEFORE, ids, SpeculationConfig("auto"), CURVE)
    assert auto.token_ids == alone.token_ids == ids
    assert max(prediction_drafts(auto)) == max(prediction_drafts(alone)) > 128
    assert auto.stats.steps <= alone.stats.steps


def test_prices_pay_on_the_sample_renames(smol_tokenizer):
    """py-rename and ts-rename (bench/samples, renamed as the scenario asks), SmolLM2's tokenizer:
    drafting with the prices beats the same drafter blind to them, both paid at the curve."""
    tok = smol_tokenizer
    py = (SAMPLES / "users_controller.py").read_text(encoding="utf-8")
    ts = (SAMPLES / "orders_controller.ts").read_text(encoding="utf-8")
    pairs = [
        (py, py.replace("UserService", "UserRepository").replace("user_service", "user_repository")),
        (ts, ts.replace("toView", "serializeOrder")),
    ]
    spec = SpeculationConfig("prediction")
    for before, after in pairs:
        priced = replay(tok, before, after, spec=spec, prices=CURVE)
        ids = tok.encode(after, add_special_tokens=False)
        blind = replay_ids(tok, before, ids, spec)  # no prices: K doubles 8 -> 128, as before
        assert priced.exact and priced.projected_speedup > speedup(blind, ids)
