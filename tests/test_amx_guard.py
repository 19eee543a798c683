"""ggml's AMX kernels crash on K-quant weights in the llama.cpp that llama-cpp-python 0.3.36 ships
(upstream llama.cpp#20824): on a Xeon with AMX, every pass of 2+ tokens on the Qwen Q4_K_M pack
segfaulted, in our backend and in llama-cpp-python's own `Llama`, and took the test run with it.
Our install script compiles those kernels out on such CPUs, and a build that has them (a user's
own `pip install` there) never gets weights repacked for them: the model loads with extra buffer
types off. Tested with llama.cpp's system info faked, since most machines have no AMX.
"""

from __future__ import annotations

import llama_cpp
from tiny_gguf import save_tiny_gguf

from specserve.backends.llamacpp import LlamaCppBackend, amx_repacks, system_info
from specserve.bench.peers import peer_skip_reason

WITH_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 1 | "
WITHOUT = WITH_AMX.replace("AMX_INT8 = 1 | ", "")


def test_the_guard_reads_the_build_as_llama_cpp_reports_it():
    assert amx_repacks(WITH_AMX) and not amx_repacks(WITHOUT)
    assert not amx_repacks(WITH_AMX.replace("AMX_INT8 = 1", "AMX_INT8 = 0"))


def test_the_installed_build_has_no_amx_kernels():
    """scripts/install_llama_cpp.sh compiles them out where the CPU has AMX (elsewhere
    -march=native never had them), so the default mode keeps its repacked weights."""
    info = system_info()
    assert "CPU : " in info and " = 1 | " in info, info  # a format the guard can read
    assert not amx_repacks(info), info


def _extra_bufts_at_load(tmp_path, monkeypatch, info: str) -> bool:
    """Whether a default-mode model asks llama.cpp for extra (repacked) buffers under `info`."""
    seen = []
    load = llama_cpp.llama_model_load_from_file

    def spy(path, params):
        seen.append(bool(params.use_extra_bufts))
        return load(path, params)

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info.encode())
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", spy)
    LlamaCppBackend(save_tiny_gguf(tmp_path)).close()
    assert len(seen) == 1
    return seen[0]


def test_a_build_with_amx_kernels_loads_weights_unrepacked(tmp_path, monkeypatch):
    assert _extra_bufts_at_load(tmp_path, monkeypatch, WITHOUT)  # the fast path where it is safe
    assert not _extra_bufts_at_load(tmp_path, monkeypatch, WITH_AMX)


def test_the_benchmark_skips_llama_cpp_python_on_such_a_build(monkeypatch):
    class LLM:
        backend_name = "llama.cpp"
        has_draft_model = False

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: WITHOUT.encode())
    assert peer_skip_reason(LLM(), "llama.cpp") is None
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: WITH_AMX.encode())
    for peer in ("llama.cpp", "llama.cpp-lookup"):
        assert "AMX" in peer_skip_reason(LLM(), peer)
