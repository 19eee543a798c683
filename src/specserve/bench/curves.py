"""The cost figures `specserve replay` assumes when it measures none: light on purpose, so that the
CLI can show them in `--help` without importing torch and the engine."""

from __future__ import annotations

DEFAULT_COST_RATIO = 1.16  # cost of verifying 8 tokens / cost of 1 (DESIGN.md, 1.5B bf16 CPU)
COST_REF_TOKENS = 8
# Qwen2.5-Coder 1.5B Q4_K_M on llama.cpp's default kernels, 2 threads, AVX-512, a 1024-token
# cache (docs/benchmarks.md, "The backend's own costs"): a pass of n tokens in decoding steps.
LLAMACPP_2CORE_CURVE = ((1, 1.0), (8, 6.6), (32, 15.4), (128, 44.9))
