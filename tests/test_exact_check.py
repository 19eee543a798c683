"""`--exact` is checked at load, not hoped for: a llama.cpp build with llamafile's sgemm, or a
GGML_CPU_TILED_MM the user set to something ggml-cpu does not read as 0, is refused with a
one-line error naming the fix (docs/design.md, "Exactness on llama.cpp").

conftest.py sets GGML_CPU_TILED_MM=0 for the whole test process (exact and fast llama.cpp
models then load in any order), so the environment check is tested here in child processes
that get their own environment, and the build check with llama.cpp's system info faked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import llama_cpp
import pytest
from tiny_gguf import save_tiny_gguf

from specserve.backends import llamacpp
from specserve.backends.llamacpp import LlamaCppBackend, exactness_problem, tiled_mm_off
from specserve.errors import ModelLoadError

BUILT_IN = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
COMPILED_OUT = BUILT_IN.replace("LLAMAFILE = 1 | ", "")


def test_the_check_reads_the_build_and_the_variable_as_llama_cpp_does():
    assert exactness_problem(COMPILED_OUT, "0") is None
    assert "GGML_LLAMAFILE=OFF" in exactness_problem(BUILT_IN, "0")  # the fix: the install script's flag
    for value in ("1", "2", " 1", "-1", "1x"):
        assert "GGML_CPU_TILED_MM=0" in exactness_problem(COMPILED_OUT, value), value
    for value in ("0", "00", " 0", "", "off", "0x1"):  # ggml-cpu: atoi(value) == 0 turns the tiled matmul off
        assert tiled_mm_off(value) and exactness_problem(COMPILED_OUT, value) is None, value
    assert not tiled_mm_off(None)  # unset: on (exact mode sets 0 itself when the user did not)
    assert "\n" not in exactness_problem(BUILT_IN, "1")


def test_the_installed_build_is_the_one_exact_mode_needs():
    """scripts/install_llama_cpp.sh compiled llamafile's sgemm out, and llama.cpp says so in a
    form the check reads (a changed system-info format would make it see nothing)."""
    info = llama_cpp.llama_print_system_info().decode()
    assert "CPU : " in info and " = 1 | " in info, info
    assert exactness_problem(info, "0") is None, info


def test_a_build_with_llamafile_is_refused_at_load(tmp_path, monkeypatch):
    gguf = save_tiny_gguf(tmp_path)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: BUILT_IN.encode())
    with pytest.raises(ModelLoadError, match="GGML_LLAMAFILE=OFF"):
        LlamaCppBackend(gguf, batch_invariant=True)
    LlamaCppBackend(gguf).close()  # the fast kernels need nothing of the build
    assert llamacpp._initialised


def generate(gguf: str, tiled_mm: str | None, *flags: str) -> subprocess.CompletedProcess:
    """`specserve generate` in a fresh process whose GGML_CPU_TILED_MM is `tiled_mm` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}
    if tiled_mm is not None:
        env["GGML_CPU_TILED_MM"] = tiled_mm
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "specserve.cli",
            "generate",
            "def add(a, b):",
            "--model",
            gguf,
            "--draft-model",
            "none",
            "--max-tokens",
            "4",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> str:
    return save_tiny_gguf(tmp_path_factory.mktemp("exact-check"))


def test_a_user_setting_of_the_tiled_matmul_is_refused_by_the_cli(gguf):
    r = generate(gguf, "1", "--exact")
    assert r.returncode != 0 and not r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "GGML_CPU_TILED_MM=0" in lines[0] and "GGML_CPU_TILED_MM=1" in lines[0], r.stderr


def test_exact_mode_sets_the_variable_itself_when_the_user_did_not(gguf):
    r = generate(gguf, None, "--exact")
    assert r.returncode == 0, r.stderr


def test_fast_mode_runs_whatever_the_variable_says(gguf):
    """Only --exact needs the tiled matmul off (a lighter child: the backend alone)."""
    code = (
        "import sys; from specserve.backends.llamacpp import LlamaCppBackend as B; "
        "from specserve.backends import SeqInput; b = B(sys.argv[1]); s = b.new_sequence(); "
        "print(b.forward([SeqInput(s, [1, 2, 3])])[0].shape)"
    )
    env = {**os.environ, "GGML_CPU_TILED_MM": "1"}
    r = subprocess.run([sys.executable, "-c", code, gguf], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "torch.Size([3, " in r.stdout, r.stderr
