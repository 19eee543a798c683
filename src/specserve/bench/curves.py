"""The cost figures `specserve replay` assumes when it measures none: light on purpose, so that the
CLI can show them in `--help` without importing torch and the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.governor import CostModel

DEFAULT_COST_RATIO = 1.16  # cost of verifying 8 tokens / cost of 1 (DESIGN.md, 1.5B bf16 CPU)
COST_REF_TOKENS = 8
# Qwen2.5-Coder 1.5B Q4_K_M on llama.cpp's default kernels, 2 threads, AVX-512, a 1024-token
# cache (docs/benchmarks.md, "The backend's own costs"): a pass of n tokens in decoding steps.
LLAMACPP_2CORE_CURVE = ((1, 1.0), (8, 6.6), (32, 15.4), (128, 44.9))


def parse_curve(text: str) -> CostModel:
    """'1:1,8:6.6,128:44.9' (tokens in a pass : its cost in decoding steps) -> a CostModel."""
    from ..engine.governor import CostModel, curve_problem  # imported late: --help stays light

    example = "such as 1:1,8:6.6,128:44.9"
    try:
        points = sorted((int(n), float(c)) for n, c in (p.split(":") for p in text.split(",") if p.strip()))
    except ValueError:
        raise ValueError(f"a cost curve is 'tokens:cost,...' {example}; got {text!r}") from None
    if problem := curve_problem(points):
        raise ValueError(f"a cost curve {problem}, {example}; got {text!r}")
    return CostModel(tuple(points))


def format_curve(prices: CostModel) -> str:
    """A CostModel's target curve as parse_curve reads it: '1:1,8:6.6,128:44.9'."""
    return ",".join(f"{n}:{c!r}" for n, c in prices.curve)  # exact: a replay drafts with the same K
