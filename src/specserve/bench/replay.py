"""Replay estimator: what would the prediction drafter achieve on a known (prediction, output) pair?

No model runs. An `OracleRunner` stands in for the target: at every position its logits put all
the mass on the known next output token, so the real `Engine` with the real
`PredictionProposer` accepts exactly the draft tokens a target that writes `output` would
accept. The counts therefore come from the production loop, not from a re-implementation.

A cost model turns the step trace into a projected speedup: plain decoding costs one target
pass per token; a speculative step that verifies K + 1 tokens costs c(K + 1) passes, with
c(n) = 1 + (r - 1) (n - 1) / 7, where r is the measured (or given) cost of verifying 8 tokens
relative to 1 (DESIGN.md: 1.16 for the 1.5B target in bf16 on CPU). Given a backend's measured
cost curve instead (`prices`, a governor.CostModel), the engine drafts with those prices, as
it would on that backend (the prediction drafter picks K from them), and c(n) is the curve.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from ..config import SamplingParams, SpeculationConfig
from ..engine import Engine
from ..engine.governor import CostModel
from ..engine.stats import RequestOutput
from .curves import COST_REF_TOKENS, DEFAULT_COST_RATIO


class OracleRunner:
    """A runner whose "model" knows the answer: logits one-hot on the next output token.

    Logits depend only on the position, never on the fed tokens: verification stops at the
    first draft token that differs from the output, so what the oracle says after a wrong
    token is never used. vocab_size only needs to cover the output's ids (argmax is all
    greedy verification reads), which keeps each [T, V] logits tensor small.
    """

    def __init__(self, prompt_len: int, output_ids: list[int], max_context: int | None = None):
        self.prompt_len = prompt_len
        self.output_ids = list(output_ids)
        self.vocab_size = max(self.output_ids, default=0) + 1
        self.max_context = max_context or (prompt_len + len(self.output_ids) + 1024)
        self.length = 0
        self._buf = torch.zeros(0, self.vocab_size)  # [rows, V], reused: fresh [T, V] zeros per step cost
        self._hot: list[tuple[int, int]] = []  # (row, token) entries set to 1 by the last forward

    def reset(self) -> None:
        self.length = 0

    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Float32 logits [T, V] ([1, V] if last_only); row i predicts the token after position length + i.

        The tensor is a view of a buffer reused by the next call: the engine reads a step's
        logits only within that step.
        """
        positions = range(self.length, self.length + len(token_ids))
        if last_only:
            positions = positions[-1:]
        if len(positions) > self._buf.shape[0]:
            self._buf = torch.zeros(max(len(positions), 2 * self._buf.shape[0]), self.vocab_size)
            self._hot = []
        for row, tok in self._hot:
            self._buf[row, tok] = 0.0
        self._hot = []
        for row, p in enumerate(positions):
            j = p + 1 - self.prompt_len  # index in output of the token that follows position p
            if 0 <= j < len(self.output_ids):
                self._buf[row, self.output_ids[j]] = 1.0
                self._hot.append((row, self.output_ids[j]))
        self.length += len(token_ids)
        return self._buf[: len(positions)]  # [T, V]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


@dataclass
class ReplayResult:
    """What the prediction drafter achieves on one (prediction, output) pair."""

    output_tokens: int
    prediction_tokens: int
    steps: int
    proposed: int
    accepted: int
    rejected: int
    tokens_per_step: float
    acceptance_rate: float
    cost_ratio: float
    projected_speedup: float
    exact: bool  # the engine's output text equals the given output (tokenization round-trips)
    step_sizes: list[int] = field(default_factory=list, repr=False)  # tokens verified per step (K + 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("step_sizes")
        return d


def step_cost(n_verified: int, cost_ratio: float) -> float:
    """Cost of one target pass over n_verified tokens, in units of a one-token pass (linear model)."""
    return 1.0 + (cost_ratio - 1.0) * (n_verified - 1) / (COST_REF_TOKENS - 1)


def linear_prices(cost_ratio: float) -> CostModel:
    """The linear cost model of `step_cost` as a CostModel: the same price for every pass size."""
    return CostModel.linear((cost_ratio - 1.0) / (COST_REF_TOKENS - 1))


def projected_speedup(
    output_tokens: int, step_sizes: list[int], cost_ratio: float, prices: CostModel | None = None
) -> float:
    """Plain decoding cost (one pass per token) over the speculative steps' cost (the linear
    model of cost_ratio, or the measured curve of `prices`)."""
    cost = sum(prices.target(n) if prices is not None else step_cost(n, cost_ratio) for n in step_sizes)
    return output_tokens / cost if cost else 0.0


def projected_at_context(
    output_tokens: int, steps: list[tuple[int, int]], prices: CostModel, context_cost, reference_context: int
) -> float:
    """The projected speedup with every pass priced at the context it reads (`steps`: tokens
    verified, tokens cached before the pass), against plain decoding's one-token steps at
    `reference_context` (where the bench timed them): the curve alone is timed after 32 cached
    tokens, and attention over a 3-8k cache adds a third or more to a long edit's passes.
    context_cost: a governor.ContextCost."""
    plain = output_tokens * (1.0 + context_cost.extra(1, reference_context))
    spec = sum(prices.target(n) + context_cost.extra(n, c) for n, c in steps)
    return plain / spec if spec else 0.0


def replay_ids(
    tokenizer,
    prediction: str | None,
    output_ids: list[int],
    spec: SpeculationConfig | None = None,
    prices: CostModel | None = None,
    prompt_ids: list[int] | None = None,
    cost_ratio: float = DEFAULT_COST_RATIO,
) -> RequestOutput:
    """Run the real engine with an oracle target that writes exactly `output_ids` (after
    `prompt_ids`, by default one token: no prefill), drafting with `prices` when given.

    `auto` always drafts with prices (its governor needs them): without `prices` it gets the
    linear model of `cost_ratio`. Left to itself the engine would time the oracle, whose cost
    grows with every row it fills, and cap each draft at a few tokens."""
    prompt = list(prompt_ids) if prompt_ids else [output_ids[0] if output_ids else 0]
    oracle = OracleRunner(len(prompt), output_ids)
    engine = Engine(oracle, tokenizer)
    spec = spec or SpeculationConfig("prediction")
    if prices is None and spec.method == "auto":
        prices = linear_prices(cost_ratio)
    if prices is not None:
        engine.use_prices(prices)
    params = SamplingParams(max_tokens=max(1, len(output_ids)), temperature=0.0, ignore_eos=True)
    return engine.generate(prompt, params, spec, prediction=prediction).run()


def replay(
    tokenizer,
    prediction: str,
    output: str,
    cost_ratio: float = DEFAULT_COST_RATIO,
    spec: SpeculationConfig | None = None,
    prices: CostModel | None = None,
    prompt: str | None = None,
) -> ReplayResult:
    """Replay the prediction drafter against `output`; see the module docstring. prompt: a
    prompt the oracle target reads first (what `auto`'s prompt drafting can copy from)."""
    # as a model writes text (a control token's spelling is its characters), and as the drafter tokenizes the prediction
    output_ids = tokenizer.encode(output, add_special_tokens=False, split_special_tokens=True)
    if not output_ids:
        raise ValueError("the output is empty: nothing to replay")
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False) if prompt else None
    out = replay_ids(tokenizer, prediction, output_ids, spec, prices, prompt_ids, cost_ratio)
    s = out.stats
    sizes = [st["proposed"] + 1 for st in out.steps]
    return ReplayResult(
        output_tokens=s.output_tokens,
        prediction_tokens=len(tokenizer.encode(prediction, add_special_tokens=False, split_special_tokens=True))
        if prediction
        else 0,
        steps=s.steps,
        proposed=s.proposed,
        accepted=s.accepted,
        rejected=s.rejected,
        tokens_per_step=s.tokens_per_step,
        acceptance_rate=s.acceptance_rate,
        cost_ratio=prices.target(COST_REF_TOKENS) if prices is not None else cost_ratio,
        projected_speedup=projected_speedup(s.output_tokens, sizes, cost_ratio, prices),
        exact=out.token_ids == output_ids,
        step_sizes=sizes,
    )


def copy_ceiling(prediction_ids: list[int], output_ids: list[int], k_max: int | None = None) -> int:
    """The fewest steps a drafter that copies runs of the prediction could take to write the output.

    A step verifies a draft copied from anywhere in the prediction (at most k_max tokens) and
    commits it plus one token of the target's own. Taking at each position the longest run of
    the output that occurs in the prediction is optimal: the longest match from position j+1 is
    at least the one from j less one token, so the furthest reach never shrinks. Output
    tokens / this = the ceiling on tokens per step for such a drafter, however it anchors and
    sizes its drafts. Only drafting text the prediction does not hold can pass it: learned
    edits (a rename drafted at later sites), n-gram lookup, a draft model."""
    longest = _longest_matches(prediction_ids, output_ids)
    cap = len(output_ids) if k_max is None else k_max
    steps = j = 0
    while j < len(output_ids):
        j += min(longest[j], cap) + 1
        steps += 1
    return steps


def _longest_matches(text: list[int], query: list[int]) -> list[int]:
    """For each j, the length of the longest query[j:j+L] that occurs in `text` (matching
    statistics, from a suffix automaton of the reversed text read along the reversed query)."""
    nxt: list[dict[int, int]] = [{}]
    link, size = [-1], [0]  # suffix link and longest length of each state
    last = 0
    for tok in reversed(text):
        cur = len(nxt)
        nxt.append({})
        link.append(-1)
        size.append(size[last] + 1)
        p = last
        while p != -1 and tok not in nxt[p]:
            nxt[p][tok] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][tok]
            if size[p] + 1 == size[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                size.append(size[p] + 1)
                while p != -1 and nxt[p].get(tok) == q:
                    nxt[p][tok] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        last = cur
    out = [0] * len(query)
    state = length = 0
    for i, tok in enumerate(reversed(query)):
        while state and tok not in nxt[state]:
            state = link[state]
            length = size[state]
        if tok in nxt[state]:
            state, length = nxt[state][tok], length + 1
        else:
            length = 0
        out[len(query) - 1 - i] = length
    return out


def aggregate(
    results: list[ReplayResult], cost_ratio: float = DEFAULT_COST_RATIO, prices: CostModel | None = None
) -> dict:
    """Corpus totals: sums of counts, ratios of sums (long files weigh more, as in real time)."""
    tokens = sum(r.output_tokens for r in results)
    steps = sum(r.steps for r in results)
    proposed = sum(r.proposed for r in results)
    accepted = sum(r.accepted for r in results)
    sizes = [n for r in results for n in r.step_sizes]
    return {
        "pairs": len(results),
        "output_tokens": tokens,
        "steps": steps,
        "proposed": proposed,
        "accepted": accepted,
        "rejected": proposed - accepted,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "tokens_per_step": tokens / steps if steps else 0.0,
        "median_pair_tokens_per_step": statistics.median(r.tokens_per_step for r in results) if results else 0.0,
        "projected_speedup": projected_speedup(tokens, sizes, cost_ratio, prices),
    }


@torch.inference_mode()
def measure_cost_ratio(runner, context: int = 256, n: int = COST_REF_TOKENS, repeats: int = 3) -> float:
    """Time a real runner: one pass over n new tokens vs one pass over 1, after `context` cached."""
    runner.reset()
    runner.forward([1] * context, last_only=True)

    def best(k: int) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.forward([1] * k)
            times.append(time.perf_counter() - t0)
            runner.truncate(context)
        return min(times)

    best(1)  # warm-up
    return best(n) / best(1)
