"""backends/row_buffers.py: logits memory is reused only once nobody holds it."""

from __future__ import annotations

import gc

import torch

from specserve.backends.row_buffers import MIN_ROWS, RowBuffers


def test_a_dropped_block_is_reused_and_a_held_one_is_not():
    pool = RowBuffers(width=64)
    a = torch.from_numpy(pool.take(40))  # the engine wraps rows in a tensor, as here
    a_ptr = a.data_ptr()
    b = pool.take(40)
    assert b.ctypes.data != a_ptr and pool.allocated == 2  # a is held: b has memory of its own
    del a
    gc.collect()
    c = pool.take(33)  # fits the freed 64-row block
    assert c.ctypes.data == a_ptr and pool.allocated == 2 and c.shape == (33, 64)


def test_a_view_of_the_rows_keeps_the_block():
    pool = RowBuffers(width=8)
    rows = torch.from_numpy(pool.take(MIN_ROWS))
    tail = rows[3:]  # shares storage
    ptr = rows.data_ptr()
    del rows
    gc.collect()
    assert pool.take(MIN_ROWS).ctypes.data != ptr  # tail still reads that memory
    del tail


def test_the_smallest_block_that_fits_is_taken_and_few_are_kept():
    pool = RowBuffers(width=8, keep=2)
    for n in (16, 64, 256):
        pool.take(n)  # dropped at once
    gc.collect()
    assert sorted(len(b) for b in pool._free) == [64, 256]  # the smallest went past `keep`
    assert len(pool.take(50)) == 50 and sorted(len(b) for b in pool._free) == [256]


def test_small_outputs_are_plain_allocations():
    pool = RowBuffers(width=8)
    for _ in range(3):
        pool.take(MIN_ROWS - 1)
    assert pool.allocated == 0
