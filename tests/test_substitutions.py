"""Edit-aware prediction drafting: substitutions learned at a divergence draft the later sites.

The replay oracle (bench/replay.py) plays a target that writes a known output, so a rename
at N sites can be counted exactly: with the edit learned at site 1, sites 2..N are drafted
right and accepted in bulk, and every rejected draft token belongs to site 1. The tiny f32
model then shows the path lossless: outputs equal plain decoding.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.bench.replay import replay_ids
from specserve.config import SpeculationConfig
from specserve.llm import LLM
from specserve.proposers import base
from specserve.proposers.substitutions import learn, rewrite

N_SITES = 6
BEFORE = "".join(
    f"def handler_{i}(request):\n    svc = UserService(request.db)\n"
    f"    data = svc.load(request.user_id, page={i})\n    return render(data)\n\n"
    for i in range(N_SITES)
)
AFTER = BEFORE.replace("UserService", "UserRepository")


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer(request):
    """The tiny test tokenizer (character-level BPE) and SmolLM2's real 49k-token BPE."""
    if request.param == "tiny":
        return tiny_tokenizer()
    return request.getfixturevalue("smol_tokenizer")


def test_learn_reduces_a_diverged_span_to_words():
    text, out = "x = 1\nclass UserService:\n    pass\n", "x = 1\nclass UserRepository:\n    pass\n"
    assert learn(text, 6, len(text), out, 6, len(out)) == [("UserService", "UserRepository")]
    # a short change grows over the shared context of its line until it is specific enough
    text, out = "@app.route('/a')\n", "@bp.route('/a')\n"
    assert learn(text, 0, len(text), out, 0, len(out)) == [("@app.route", "@bp.route")]
    # an inserted line is no substitution, nor is a region that shares too little
    assert learn("a\nb\n", 0, 4, "a\nnew line\nb\n", 0, 13) == []
    assert learn("alpha beta gamma delta", 0, 22, "one two three four five", 0, 23) == []


def test_a_changed_indentation_is_learned_as_a_shift_of_the_lines_below():
    text, out = "def f():\n        a = 1\n", "def f():\n    a = 1\n"
    assert learn(text, 9, len(text), out, 9, len(out)) == [("\n        ", "\n    ")]
    # the shift applies to every later line indented at least as deep, and to no other
    rest, _ = rewrite("x\n        b = 2\n            c = 3\n    d = 4\n", 0, {"\n        ": "\n    "})
    assert rest == "x\n    b = 2\n        c = 3\n    d = 4\n"
    # a line that was not indented gives nothing (the shift would touch every line), nor does a
    # whitespace change inside a line
    assert learn("a = 1\nb = 2\n", 6, 12, "a = 1\n    b = 2\n", 6, 16) == []
    assert not [old for old, _ in learn("f(a,  b)\n", 0, 9, "f(a, b)\n", 0, 8) if "\n" in old]


def test_rewrite_matches_whole_words_only():
    text = "UserService(x); UserServiceError; my_UserService; UserService.get()"
    rest, spans = rewrite(text, 0, {"UserService": "UserRepository"})
    assert rest == "UserRepository(x); UserServiceError; my_UserService; UserRepository.get()"
    assert [rest[s.w0 : s.w1] for s in spans] == ["UserRepository"] * 2
    assert [text[s.o0 : s.o1] for s in spans] == ["UserService"] * 2
    assert rewrite(text, 16, {})[0] == text[16:]


def site_tokens(tokenizer, output: str, word: str) -> list[list[int]]:
    """For each occurrence of `word` in output: the indices of the output tokens that overlap it."""
    enc = tokenizer(output, add_special_tokens=False, return_offsets_mapping=True)
    sites = []
    for m in re.finditer(word, output):
        sites.append([i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < m.end() and e > m.start()])
    return sites


def rejected_from(out, first_token: int) -> int:
    """Draft tokens rejected in the steps that began at or after output token `first_token`."""
    done, rejected = 0, 0
    for step in out.steps:
        if done >= first_token:
            rejected += step["proposed"] - step["accepted"]
        done += step["committed"]
    return rejected


def steps_from(out, first_token: int) -> int:
    """Steps that began at or after output token `first_token`."""
    done, steps = 0, 0
    for step in out.steps:
        steps += done >= first_token
        done += step["committed"]
    return steps


@pytest.mark.parametrize("learn_edits", [True, False])
def test_rename_at_n_sites_is_accepted_in_bulk_after_the_first(tokenizer, learn_edits):
    ids = tokenizer.encode(AFTER, add_special_tokens=False)
    out = replay_ids(tokenizer, BEFORE, ids, SpeculationConfig("prediction", prediction_learn_edits=learn_edits))
    assert out.token_ids == ids  # the oracle target decides every token either way
    sites = site_tokens(tokenizer, AFTER, "UserRepository")
    assert len(sites) == N_SITES
    # token 0 is the replay's one-token prompt: output token i is tokens[i] of AFTER
    drafted = [all(out.token_sources[i] == "prediction" for i in site) for site in sites[1:]]
    late_rejections = rejected_from(out, sites[1][0])
    if learn_edits:
        assert all(drafted), drafted  # sites 2..N: every token of the new name came from the draft
        assert late_rejections == 0 and out.stats.rejected > 0  # only site 1 cost rejected drafts
    else:  # without learning every site diverges again: the assertions above have teeth
        assert not any(drafted) and late_rejections > 0


N_LINES = 8
WITH_BLOCK = (
    "def handler(request):\n    with lock:\n"
    + "".join(f"        value_{i} = compute(request, {i})\n" for i in range(N_LINES))
    + "    return value_0\n"
)
UNWRAPPED = WITH_BLOCK.replace("    with lock:\n", "").replace("\n        ", "\n    ")


@pytest.mark.parametrize("learn_edits", [True, False])
@pytest.mark.parametrize("before, after", [(WITH_BLOCK, UNWRAPPED), (UNWRAPPED, WITH_BLOCK)], ids=["dedent", "indent"])
def test_a_block_taken_out_of_or_put_in_a_with_is_drafted_at_its_new_indentation(tokenizer, learn_edits, before, after):
    """Line 1 diverges where the `with` line went (or came), line 2 where its indentation
    changed; from there the drafter has learned the shift, and lines 3..N are drafted as the
    output writes them."""
    ids = tokenizer.encode(after, add_special_tokens=False)
    spec = SpeculationConfig("prediction", prediction_learn_edits=learn_edits)
    out = replay_ids(tokenizer, before, ids, spec)
    assert out.token_ids == ids
    lines = site_tokens(tokenizer, after, r"(?<=\n) +value_\d")
    assert len(lines) == N_LINES
    later, rejected = steps_from(out, lines[2][0]), rejected_from(out, lines[2][0])
    # Indenting, the shift is drafted on the `return` line after the block too, once: it is
    # rejected there and dropped. That line's tokens bound what may be rejected from line 3 on.
    last_line = len(tokenizer.encode("    return value_0\n", add_special_tokens=False))
    if learn_edits:  # lines 3..N: drafted right, in a few long steps (K doubling from 8)
        assert later <= 5 and rejected <= (last_line if before == UNWRAPPED else 0), (later, rejected)
    else:  # every line diverges at its indentation again
        assert later >= N_LINES - 2 and rejected > 0, (later, rejected)


def test_a_substitution_the_output_does_not_follow_is_dropped(tokenizer):
    """Renamed at sites 1 and 2 only: the learned rename is drafted at site 3, rejected there and
    dropped, so the unrenamed sites after it are drafted from the prediction again."""
    parts = BEFORE.split("UserService")
    after = "".join(p + ("UserRepository" if i < 2 else "UserService") for i, p in enumerate(parts[:-1])) + parts[-1]
    ids = tokenizer.encode(after, add_special_tokens=False)
    made = []
    factory = base.REGISTRY["prediction"]
    try:
        base.REGISTRY["prediction"] = lambda ctx: made.append(factory(ctx)) or made[-1]
        out = replay_ids(tokenizer, BEFORE, ids, SpeculationConfig("prediction"))
    finally:
        base.REGISTRY["prediction"] = factory
    assert out.token_ids == ids
    assert made[0].subs == {}  # dropped
    sites = site_tokens(tokenizer, after, "UserService")
    assert len(sites) == N_SITES - 2
    assert all(out.token_sources[i] == "prediction" for site in sites[1:] for i in site)
    assert rejected_from(out, sites[1][0]) == 0


def test_learned_edits_are_lossless_on_a_real_model():
    """tiny f32 Llama: the prediction is the plain output with a recurring word renamed, so the
    drafter learns the rename back at its first site; the output equals plain decoding."""
    tok = tiny_tokenizer()
    llm = LLM.from_models(tiny_model("llama", seed=0), tok, name="llama")
    params = SamplingParams(max_tokens=160)
    prompt = "import os\n"
    base_out = llm.generate(prompt, params, speculation="none")
    word, count = Counter(re.findall(r"[A-Za-z_]{3,}", base_out.text)).most_common(1)[0]
    assert count >= 3
    prediction = re.sub(rf"(?<![A-Za-z_]){word}(?![A-Za-z_])", "Zqx" + word[::-1], base_out.text)
    results = {}
    for learn_edits in (True, False):
        spec = SpeculationConfig("prediction", prediction_learn_edits=learn_edits)
        out = llm.generate(prompt, params, prediction=prediction, speculation=spec)
        assert out.token_ids == base_out.token_ids and out.text == base_out.text
        results[learn_edits] = out.stats.by_source["prediction"]
    assert results[True].accepted > results[False].accepted  # the learned edit was drafted (and verified)
