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


def smol_tokenizer(folder):
    from specserve.models import loader, packs

    return loader.load_tokenizer(
        packs.ModelSource(path=str(folder), pack=packs.TEST_PACK, gguf_file=packs.PACKS[packs.TEST_PACK].gguf_name)
    )


def test_no_draft_from_inside_a_prediction_token(smol_model_dir):
    """The output writes ` cookie` where the prediction has the one token ` cookies`: the anchor
    ends inside that token, and the rest of it (`s`) would be the draft's first token. Had the
    output gone on with `cookies`, the model would have written that token whole, so such a draft
    is almost surely rejected at once (97-100% on the replay corpus); the drafter waits a token."""
    tok = smol_tokenizer(smol_model_dir)
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
