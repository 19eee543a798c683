"""A seeded sampled request continued from the prefix cache, against a cold run, on the SmolLM2
pack in float32 on transformers (docs/design.md, Prefix caching: Exactness).

A CPU's float32 matmuls round with a pass's length, so the row after a reused prefix is not the
cold row bit for bit, and a seeded answer may move where its random number lies within that
rounding of a token's edge. This case (found by a warm-vs-cold fuzz, seed 64 at T = 0.8 after 22
reused tokens) moved on the first answer token. The test checks what makes that allowed: each
run commits `sample_at` of its own row with its position's number (no other stream, step index
or rows), the two runs' rows differ by rounding only, and where the answers part the number lies
between the two rows' cumulative edges (where they do not part on another CPU, they are equal).
"""

from __future__ import annotations

import torch

from specserve import LLM, SamplingParams
from specserve.backends.recording import record_rows
from specserve.config import EngineLimits
from specserve.engine.sampling import Noise, probs_from_logits, sample_at

# fmt: off
PROMPT = [2017, 3378, 198, 2017, 7602, 198, 198, 1710, 1462, 281, 3378, 30, 29922, 1305, 6662, 727, 472, 1628, 24,
          1245, 28, 3378, 30, 1537, 30, 726, 2961, 24, 1245, 1292, 198, 19161, 253, 1890, 8216, 563, 260, 3426, 284,
          260, 2251, 28, 284, 260, 7761, 338, 11930, 826, 260]
FIRST = PROMPT[:22] + [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767]  # turn 1: shares 22 tokens
# fmt: on
PARAMS = SamplingParams(max_tokens=8, temperature=0.8, seed=64)
ROUNDING = 1e-4  # float32 logits of one position across pass lengths: up to 6e-5 measured


def cdf(row: torch.Tensor) -> torch.Tensor:
    """The row's cumulative distribution, normalised as `sample_at` scales its number."""
    c = probs_from_logits(row[None], PARAMS)[0].double().cumsum(0)
    return c / c[-1]


def test_a_reused_prefix_moves_a_seeded_token_only_within_rounding(smol_hf_dir):
    def engine(caching: bool) -> LLM:
        limits = EngineLimits(max_num_seqs=1, prefix_caching=caching)
        return LLM(model=str(smol_hf_dir), dtype="float32", speculation="none", limits=limits)

    warm, cold = engine(True), engine(False)
    warm.generate(FIRST, SamplingParams(max_tokens=2))
    warm_rows, cold_rows = record_rows(warm.engine.core.target), record_rows(cold.engine.core.target)
    w, c = warm.generate(PROMPT, PARAMS), cold.generate(PROMPT, PARAMS)
    assert w.cached_tokens == 22 and c.cached_tokens == 0
    noise = Noise(PARAMS.seed)
    for out, rows in ((w, warm_rows), (c, cold_rows)):
        assert len(rows) == len(out.token_ids)
        for j, (token, row) in enumerate(zip(out.token_ids, rows)):
            assert token == sample_at(probs_from_logits(row[None], PARAMS)[0], noise.u(len(PROMPT) + j))
    part = next((j for j, (a, b) in enumerate(zip(w.token_ids, c.token_ids)) if a != b), None)
    for j in range(len(c.token_ids) if part is None else part + 1):
        assert float((warm_rows[j] - cold_rows[j]).abs().max()) < ROUNDING
    if part is not None:
        u, low = noise.u(len(PROMPT) + part), min(w.token_ids[part], c.token_ids[part])
        edges = sorted((float(cdf(warm_rows[part])[low]), float(cdf(cold_rows[part])[low])))
        assert edges[0] <= u < edges[1] and edges[1] - edges[0] < 1e-5
