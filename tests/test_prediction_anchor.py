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


def _two_helpers():
    """A prediction where `def shared_helper(a):` occurs twice, 3 x FAR_CHARS apart."""
    from tiny import tiny_tokenizer

    from specserve.proposers.prediction import FAR_CHARS, PredictionProposer

    filler = "x = 0\n" * (FAR_CHARS // 2)  # 3 x FAR_CHARS
    text = "import os\ndef shared_helper(a):\n" + filler + "def shared_helper(a):\n"
    drafter = PredictionProposer(tiny_tokenizer(), text, prompt_len=1)
    first, second = text.index("def shared_helper(a):") + 21, text.rindex("def shared_helper(a):") + 21
    return drafter, first, second, FAR_CHARS


def test_an_anchor_far_ahead_loses_to_a_nearer_one_behind():
    """A tail that occurs twice: the drafter resumes at the occurrence nearest where the output
    last followed the prediction, ahead of it unless that is over FAR_CHARS ahead and the one
    behind is nearer."""
    drafter, first, second, far = _two_helpers()
    drafter.sync = (first + far // 2, 0)  # the second is 2.5 x FAR_CHARS ahead, the first nearer behind
    assert drafter._find_anchor("\ndef shared_helper(a):") == (first, 22)
    drafter.sync = (second - 21 - far // 2, 0)  # the one ahead is near: it wins
    assert drafter._find_anchor("\ndef shared_helper(a):") == (second, 22)


def test_an_anchor_the_output_has_not_followed_does_not_move_the_search():
    """A wrong anchor moves the pointer (char_pos) before any output confirms it: the next search
    still starts from the sync point, so the right occurrence, behind the wrong one, is found."""
    drafter, first, second, far = _two_helpers()
    drafter.sync = (first - 21, 0)  # the output last followed just before the first helper
    drafter.char_pos = second + 5  # an unconfirmed anchor took the pointer past both
    assert drafter._find_anchor("\ndef shared_helper(a):") == (first, 22)


def test_a_short_anchor_far_from_the_sync_point_is_refused():
    """A short tail (under TRUST_CHARS) whose only occurrences lie over FAR_CHARS away is most
    often a chance match in new text: no anchor. A long one there is kept."""
    drafter, first, second, far = _two_helpers()
    drafter.sync = (first + far + 10, 0)  # both occurrences over FAR_CHARS away
    assert drafter._find_anchor("(a):") is None
    assert drafter._find_anchor("\ndef shared_helper(a):") is not None
    drafter.sync = (first + 10, 0)  # near the first: the short tail is taken
    assert drafter._find_anchor("(a):") == (first, 4)
