"""Greedy's argmax: the numpy path for float32 rows in host memory picks what torch picks."""

import torch

from specserve.engine.verify import argmax_rows, verify_greedy


def test_the_first_of_equal_maxima_wins_as_in_torch():
    rows = torch.tensor([[1.0, 3.0, 3.0], [5.0, 0.0, 5.0], [-1.0, -1.0, -2.0]])
    assert argmax_rows(rows) == [1, 0, 0] == rows.argmax(dim=-1).tolist()
    assert argmax_rows(rows[0]) == 1


def test_every_path_agrees_with_torch_on_random_rows():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(17, 151_936, generator=g)  # [K+1, V] at Qwen's vocabulary
    rows[3, 7] = rows[3, 9] = rows[3].max() + 1  # a tie
    want = rows.argmax(dim=-1).tolist()
    assert argmax_rows(rows) == want
    assert argmax_rows(rows.to(torch.bfloat16)) == rows.to(torch.bfloat16).argmax(dim=-1).tolist()  # torch's own path
    assert want[3] == 7
    draft = want[:5] + [want[5] + 1]  # five right, the sixth wrong
    v = verify_greedy(rows, draft)
    assert (v.num_accepted, v.next_token) == (5, want[5])
