"""How well does `specserve replay` predict a measured speedup? (`specserve replay --bench`)

For every `prediction` run in a `specserve bench` report, replay the very output the model wrote
through the same drafter, with the cost curve the bench's engine drafted with (`cost_curve` in
the report's environment), and set the projected speedup beside the measured one (the run's
tok/s over our plain decoding's, same scenario, same process). Steps and acceptance are set side
by side too: a replay that simulates the same drafter takes the same steps.

The curve is timed after 32 cached tokens, while a long edit's passes read 3-8k. A report that
also holds the bench's `context_cost` (what attention over a long cache adds, timed by the bench
in the same process: `engine.governor.ContextCost`) is projected with every pass priced at the
context it read and plain decoding at the context it was timed at; the curve-alone projection
is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import SpeculationConfig
from ..engine.governor import ContextCost
from .curves import parse_curve
from .replay import projected_at_context, projected_speedup, replay_ids
from .runner import load_scenarios

# A run this short is decoded in about a second: its measured rate is noise, not a speedup to check.
MIN_TIMED_TOKENS = 64


@dataclass
class ReplayCheck:
    """One bench run beside its replay."""

    scenario: str
    output_tokens: int
    bench_steps: int
    replay_steps: int
    bench_acceptance: float | None
    replay_acceptance: float
    measured: float  # the run's tok/s / our plain decoding's
    projected: float  # the replay's speedup: the curve, plus the context cost when the report has one
    exact: bool  # the replay wrote the run's output token for token
    projected_curve: float | None = None  # the curve alone (timed after 32 cached tokens), when that differs

    @property
    def error(self) -> float:
        """projected / measured - 1."""
        return self.projected / self.measured - 1


def prediction_of(code: str, trimmed_lines: int) -> str:
    """The prediction a bench run sent: the scenario's file less the lines cut to fit the context."""
    lines = code.splitlines(True)
    return "".join(lines[: len(lines) - trimmed_lines])


def check_report(report: dict, tokenizer) -> list[ReplayCheck]:
    """Replay every prediction run of a bench report (bench.json, parsed)."""
    env = report["environment"]
    if not env.get("cost_curve"):
        raise ValueError("the report has no cost_curve: it predates `specserve bench` recording it, or no run drafted")
    prices = parse_curve(env["cost_curve"])
    cc = ContextCost(**env["context_cost"]) if env.get("context_cost") else None
    code = {s.name: s.code for s in load_scenarios()[1]}
    plain_tokens = {r["scenario"]: r["output_tokens"] for r in report["runs"] if r["mode"] == "plain"}
    checks = []
    for run in report["runs"]:
        if run["mode"] != "prediction" or run["skipped"] or not run.get("output_ids") or not run["speedup"]:
            continue
        if run["scenario"] not in code:
            raise ValueError(f"its scenario {run['scenario']!r} is not one of this version's ({', '.join(code)})")
        ids = run["output_ids"]
        prediction = prediction_of(code[run["scenario"]], run["trimmed_lines"])
        out = replay_ids(tokenizer, prediction, ids, SpeculationConfig("prediction"), prices)
        sizes = [st["proposed"] + 1 for st in out.steps]  # tokens verified per step
        curve_only = projected_speedup(len(ids), sizes, 1.0, prices)
        projected = curve_only
        if cc is not None and run.get("prompt_tokens"):
            steps, cached = [], run["prompt_tokens"]
            for n, st in zip(sizes, out.steps):
                steps.append((n, cached))
                cached += st["committed"]
            # plain decoding was timed over its own tokens, from the same prompt
            reference = run["prompt_tokens"] + plain_tokens.get(run["scenario"], 0) // 2
            projected = projected_at_context(len(ids), steps, prices, cc, reference)
        checks.append(
            ReplayCheck(
                scenario=run["scenario"],
                output_tokens=len(ids),
                bench_steps=run["stats"]["steps"],
                replay_steps=out.stats.steps,
                bench_acceptance=run["acceptance_rate"],
                replay_acceptance=out.stats.acceptance_rate,
                measured=run["speedup"],
                projected=projected,
                exact=out.token_ids == ids,
                projected_curve=curve_only if cc is not None else None,
            )
        )
    return checks


def markdown(checks: list[ReplayCheck], env: dict) -> str:
    """The comparison as a markdown table, with the largest error."""
    curve = ",".join(f"{n}:{c:.3g}" for n, c in parse_curve(env["cost_curve"]).curve)
    pct = lambda v: "–" if v is None else f"{v:.1%}"  # noqa: E731
    cc = env.get("context_cost")
    head = f"`{env['model']}` on {env['backend']}, {env['threads']} threads, {env.get('cpu', '?')}; cost curve {curve}"
    if cc:
        head += (
            f"; context cost (timed after {cc['cached']} cached tokens) {cc['per_pair']:.2e} per token and cached"
            f" token of a pass, {cc['per_cached']:.2e} per cached token of a one-token step"
        )
    lines = [
        head,
        "",
        "| scenario | output tokens | steps (bench / replay) | acceptance (bench / replay) "
        "| measured speedup | projected (curve alone) | projected | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in checks:
        note = "" if c.exact else " (replay not exact)"
        if c.output_tokens < MIN_TIMED_TOKENS:
            note += " (too short to time)"
        lines.append(
            f"| {c.scenario} | {c.output_tokens} | {c.bench_steps} / {c.replay_steps} "
            f"| {pct(c.bench_acceptance)} / {pct(c.replay_acceptance)} | {c.measured:.2f}x "
            f"| {'–' if c.projected_curve is None else f'{c.projected_curve:.2f}x'} | {c.projected:.2f}x "
            f"| {c.error:+.0%}{note} |"
        )
    timed = [c for c in checks if c.output_tokens >= MIN_TIMED_TOKENS]
    if timed:
        lines += [
            "",
            f"largest error: {max(abs(c.error) for c in timed):.0%} over the {len(timed)} runs of at least "
            f"{MIN_TIMED_TOKENS} output tokens",
        ]
    return "\n".join(lines)
