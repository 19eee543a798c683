"""Re-anchoring: what the prediction drafter drafts after the output leaves the prediction.

The replay oracle plays a target that writes a known output, with SmolLM2's real BPE tokenizer
(its tokens span several characters, so an anchor can end inside one).
"""

from __future__ import annotations

from specserve.bench.replay import replay_ids
from specserve.config import SpeculationConfig
from specserve.proposers import base, prediction  # noqa: F401 - prediction registers its factory

BEFORE = (
    "def load(path):\n    cookies = read(path)\n    return cookies\n\n\ndef save(path, data):\n    write(path, data)\n"
)
AFTER = BEFORE.replace("return cookies\n", "return cookie_list\n")


def test_no_draft_from_inside_a_prediction_token(smol_tokenizer):
    """The output writes ` cookie` where the prediction has the one token ` cookies`: the anchor
    ends inside that token, and the rest of it (`s`) would be the draft's first token. Had the
    output gone on with `cookies`, the model would have written that token whole, so such a draft
    is almost surely rejected at once (97-100% on the replay corpus); the drafter waits a token."""
    tok = smol_tokenizer
    ids = tok.encode(AFTER, add_special_tokens=False)
    seen = []  # (bridge, draft) at each step where the anchor ends inside a prediction token
    factory = base.REGISTRY["prediction"]

    def recording(ctx):
        proposer = factory(ctx)
        propose = proposer.propose

        def spy(tokens, max_k):
            draft = propose(tokens, max_k)
            if proposer.bridge:
                seen.append((list(proposer.bridge), draft))
            return draft

        proposer.propose = spy
        return proposer

    try:
        base.REGISTRY["prediction"] = recording
        out = replay_ids(tok, BEFORE, ids, SpeculationConfig("prediction"))
    finally:
        base.REGISTRY["prediction"] = factory
    assert out.token_ids == ids
    assert seen, "the pair no longer puts an anchor inside a token: the test checks nothing"
    assert all(draft is None or draft.source != "prediction" for _, draft in seen), seen


def test_an_anchor_far_ahead_loses_to_a_nearer_one_behind():
    """A tail that occurs twice: the drafter resumes at the occurrence nearest where the output
    was, ahead of it unless that is over FAR_CHARS ahead and the one behind is nearer."""
    from tiny import tiny_tokenizer

    from specserve.proposers.prediction import FAR_CHARS, PredictionProposer

    filler = "x = 0\n" * (FAR_CHARS // 2)  # 3 x FAR_CHARS
    text = "import os\ndef shared_helper(a):\n" + filler + "def shared_helper(a):\n"
    drafter = PredictionProposer(tiny_tokenizer(), text, prompt_len=1)
    first, second = text.index("def shared_helper(a):") + 21, text.rindex("def shared_helper(a):") + 21
    drafter.char_pos = first + FAR_CHARS // 2  # the second is 2.5 x FAR_CHARS ahead, the first nearer behind
    assert drafter._find_anchor("\ndef shared_helper(a):") == (first, 22)
    drafter.char_pos = second - 21 - FAR_CHARS // 2  # the one ahead is near: it wins
    assert drafter._find_anchor("\ndef shared_helper(a):") == (second, 22)
