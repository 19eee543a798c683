"""The decoding rows a backend returns, recorded: what scripts and tests read to compare two runs'
logits row by row (scripts/sampled_divergence.py, tests/test_prefix_cache_sampled.py)."""

from __future__ import annotations

import torch


def record_rows(backend) -> list[torch.Tensor]:
    """Every decoding row `backend` returns from now on, appended to the list returned: the last
    row of each sequence that asked for logits in a forward (one per step when speculation is off;
    prefill chunks that want none add nothing). Wraps the backend's `forward` in place."""
    rows: list[torch.Tensor] = []
    forward = backend.forward

    def recording(inputs):
        out = forward(inputs)
        rows.extend(o[-1].clone() for x, o in zip(inputs, out) if o is not None and x.logits != "none")
        return out

    backend.forward = recording
    return rows
