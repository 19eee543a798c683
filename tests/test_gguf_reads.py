"""`gguf_read_once`: while transformers loads a GGUF, the file is parsed once and gguf's tensor
name map is built once per (arch, layers); outside the block gguf is untouched."""

from __future__ import annotations

import os

import gguf
import numpy as np

from specserve.models.gguf_reads import gguf_read_once


def _tiny_gguf(path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_one_reader_per_file_inside_the_block_and_gguf_restored_after(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _tiny_gguf(a)
    _tiny_gguf(b)
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first = gguf.GGUFReader(str(a))
        assert gguf.GGUFReader(a) is first  # the same file, however it is named
        assert gguf.GGUFReader(str(b)) is not first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(a)) is not gguf.GGUFReader(str(a))


def test_a_rewritten_file_is_read_again(tmp_path):
    a = tmp_path / "a.gguf"
    _tiny_gguf(a)
    with gguf_read_once():
        first = gguf.GGUFReader(str(a))
        a.unlink()
        _tiny_gguf(a)
        os.utime(a, ns=(1, 1))  # a different mtime, as a rewrite has
        assert gguf.GGUFReader(str(a)) is not first
