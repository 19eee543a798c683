"""`--exact` is checked at load, not hoped for: a stock llama.cpp build (llamafile's sgemm with no
switch, or no switch to keep a sequence's cells in position order), or a switch (GGML_CPU_TILED_MM,
GGML_CPU_LLAMAFILE, LLAMA_KV_CELL_ORDER) the user set to something that breaks exactness, is
refused with a one-line error naming the fix (docs/design.md, "Exactness on llama.cpp").

conftest.py sets every switch as exact mode does for the whole test process (exact and fast
llama.cpp models then load in any order), so the environment check is tested here in child
processes that get their own environment, and the build check with llama.cpp's system info faked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import llama_cpp
import pytest
import torch
from tiny_gguf import save_tiny_gguf

from specserve.backends import SeqInput, llamacpp
from specserve.backends.llamacpp import (
    CELL_ORDER_SWITCH,
    EXACT_ENV,
    KERNEL_SWITCHES,
    LlamaCppBackend,
    exactness_problem,
    switch_off,
    switch_on,
)
from specserve.errors import ModelLoadError

BUILT_IN = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
COMPILED_OUT = BUILT_IN.replace("LLAMAFILE = 1 | ", "")  # a stock build with -DGGML_LLAMAFILE=OFF
ORDERED = "KV_CELL_ORDER_SWITCH = 1 | "
SWITCHED = ORDERED + BUILT_IN.replace("LLAMAFILE = 1 | ", "LLAMAFILE = 1 | LLAMAFILE_SWITCH = 1 | ")  # ours
OURS_COMPILED_OUT = ORDERED + COMPILED_OUT  # our patch, built without the sgemm


def test_the_check_reads_the_build_and_the_variables_as_llama_cpp_does():
    assert exactness_problem(OURS_COMPILED_OUT, EXACT_ENV) is None and exactness_problem(SWITCHED, EXACT_ENV) is None
    for stock in (BUILT_IN, COMPILED_OUT, SWITCHED.replace(ORDERED, "")):  # no switch to turn, or no cell order
        assert "scripts/install_llama_cpp.sh" in exactness_problem(stock, EXACT_ENV), stock
    for value in ("1", "2", " 1", "-1", "1x", None):
        for name in KERNEL_SWITCHES:
            problem = exactness_problem(SWITCHED, {**EXACT_ENV, name: value})
            assert f"{name}=0" in problem, (name, value)
    for value in ("0", "", "off", None):  # the cell order is off unless set to what atoi reads as non-zero
        problem = exactness_problem(SWITCHED, {**EXACT_ENV, CELL_ORDER_SWITCH: value})
        assert f"{CELL_ORDER_SWITCH}=1" in problem, value
    for value in ("1", "2", " 1", "1x"):
        assert switch_on(value) and exactness_problem(SWITCHED, {**EXACT_ENV, CELL_ORDER_SWITCH: value}) is None
    # a build without the sgemm does not care what its (absent) switch says
    assert exactness_problem(OURS_COMPILED_OUT, {**EXACT_ENV, "GGML_CPU_LLAMAFILE": "1"}) is None
    for value in ("0", "00", " 0", "", "off", "0x1"):  # ggml-cpu: atoi(value) == 0 turns a kernel off
        switches = EXACT_ENV | dict.fromkeys(KERNEL_SWITCHES, value)
        assert switch_off(value) and exactness_problem(SWITCHED, switches) is None
    assert not switch_off(None)  # unset: on (exact mode sets 0 itself when the user did not)
    assert "\n" not in exactness_problem(BUILT_IN, {}) and "\n" not in exactness_problem(SWITCHED, {})


def test_the_installed_build_is_the_one_exact_mode_needs():
    """scripts/install_llama_cpp.sh gave llamafile's sgemm its run-time switch, and llama.cpp says
    so in a form the check reads (a changed system-info format would make it see nothing)."""
    info = llama_cpp.llama_print_system_info().decode()
    assert "CPU : " in info and " = 1 | " in info, info
    assert "LLAMAFILE = 1" in info and "LLAMAFILE_SWITCH = 1" in info, info
    assert "KV_CELL_ORDER_SWITCH = 1" in info, info
    assert exactness_problem(info, EXACT_ENV) is None, info


def test_a_build_with_llamafile_is_refused_at_load(tmp_path, monkeypatch):
    gguf = save_tiny_gguf(tmp_path)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: BUILT_IN.encode())
    with pytest.raises(ModelLoadError, match="install_llama_cpp.sh"):
        LlamaCppBackend(gguf, batch_invariant=True)
    LlamaCppBackend(gguf).close()  # the fast kernels need nothing of the build
    assert llamacpp._initialised


def generate(gguf: str, switches: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    """`specserve generate` in a fresh process whose switches are `switches` (absent: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in EXACT_ENV} | switches
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


@pytest.mark.parametrize("name", EXACT_ENV)
def test_a_user_setting_of_a_switch_is_refused_by_the_cli(gguf, name):
    wrong = "0" if EXACT_ENV[name] == "1" else "1"
    r = generate(gguf, {name: wrong}, "--exact")
    assert r.returncode != 0 and not r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{name}={EXACT_ENV[name]}" in lines[0] and f"{name}={wrong}" in lines[0], r.stderr


def test_exact_mode_sets_the_variables_itself_when_the_user_did_not(gguf):
    r = generate(gguf, {}, "--exact")
    assert r.returncode == 0, r.stderr


def test_fast_mode_runs_whatever_the_variable_says(gguf):
    """Only --exact needs the kernels off (a lighter child: the backend alone)."""
    code = (
        "import sys; from specserve.backends.llamacpp import LlamaCppBackend as B; "
        "from specserve.backends import SeqInput; b = B(sys.argv[1]); s = b.new_sequence(); "
        "print(b.forward([SeqInput(s, [1, 2, 3])])[0].shape)"
    )
    env = {**os.environ, "GGML_CPU_TILED_MM": "1", "GGML_CPU_LLAMAFILE": "1", CELL_ORDER_SWITCH: "0"}
    r = subprocess.run([sys.executable, "-c", code, gguf], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "torch.Size([3, " in r.stdout, r.stderr


SWITCH_PROBE = """
import sys, torch
from specserve.backends import SeqInput, llamacpp
llamacpp.exactness_problem = lambda info, switches: None  # every other kernel batch-invariant: the switch decides
b = llamacpp.LlamaCppBackend(sys.argv[1], max_context=512, batch_invariant=True)
s = b.new_sequence()
ids = torch.randint(1, b.vocab_size, (80,), generator=torch.Generator().manual_seed(0)).tolist()
b.forward([SeqInput(s, ids[:16], "none")])
chunk = b.forward([SeqInput(s, ids[16:])])[0]  # [64, V] in one pass
b.truncate(s, 16)
steps = torch.cat([b.forward([SeqInput(s, [t])])[0] for t in ids[16:]])  # [64, V], one token a pass
print("EQUAL" if torch.equal(chunk, steps) else "DIFFERS")
"""


def test_the_sgemm_switch_turns_the_kernel_off(gguf):
    """The patched switch really changes the arithmetic: with the rest of exact mode in place, a
    64-token chunk of the f32 GGUF rounds differently from one-token steps while llamafile's sgemm
    runs, and identically once GGML_CPU_LLAMAFILE=0 turns it off."""
    seen = {}
    for value in ("1", "0"):
        env = {k: v for k, v in os.environ.items() if k not in KERNEL_SWITCHES}
        env |= {"GGML_CPU_TILED_MM": "0", "GGML_CPU_LLAMAFILE": value}
        r = subprocess.run(
            [sys.executable, "-c", SWITCH_PROBE, gguf], capture_output=True, text=True, timeout=120, env=env
        )
        assert r.returncode == 0, r.stderr
        seen[value] = r.stdout.strip().splitlines()[-1]
    assert seen == {"1": "DIFFERS", "0": "EQUAL"}


ORDER_PROBE = """
import sys, torch
from specserve.backends import SeqInput, llamacpp
llamacpp.exactness_problem = lambda info, switches: None  # every other setting exact: the switch decides
b = llamacpp.LlamaCppBackend(sys.argv[1], max_context=512, max_sequences=3, batch_invariant=True)
g = torch.Generator().manual_seed(0)
ids_a, ids_b = (torch.randint(1, b.vocab_size, (40,), generator=g).tolist() for _ in range(2))
solo = b.new_sequence()  # the reference: b's tokens alone in an empty cache
b.forward([SeqInput(solo, ids_b[:24], "none")])
alone = b.forward([SeqInput(solo, ids_b[24:32])])[0]  # [8, V]
b.free_sequence(solo)
sa, sb = b.new_sequence(), b.new_sequence()
b.forward([SeqInput(sa, ids_a[:20], "none"), SeqInput(sb, ids_b[:20], "none")])
# both draft 16 tokens in one pass (a's land below b's), then keep 4: a frees cells below b's
b.forward([SeqInput(sa, ids_a[20:36]), SeqInput(sb, ids_b[20:36])])
b.truncate(sa, 24)
b.truncate(sb, 24)
together = b.forward([SeqInput(sb, ids_b[24:32])])[0]  # [8, V]: upstream puts these in a's freed cells
print("EQUAL" if torch.equal(alone, together) else "DIFFERS")
"""


def test_the_cell_order_switch_keeps_a_sequence_rounding_as_it_does_alone(gguf):
    """The patched switch is what makes concurrent speculation exact: a sequence whose next tokens
    would land in cells another sequence freed below its own gives logits that differ in their last
    bits from the same tokens run alone (flash attention sums in cell order), and identical ones
    once LLAMA_KV_CELL_ORDER=1 places them above its cells."""
    seen = {}
    for value in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if k not in EXACT_ENV} | EXACT_ENV | {CELL_ORDER_SWITCH: value}
        r = subprocess.run(
            [sys.executable, "-c", ORDER_PROBE, gguf], capture_output=True, text=True, timeout=120, env=env
        )
        assert r.returncode == 0, r.stderr
        seen[value] = r.stdout.strip().splitlines()[-1]
    assert seen == {"0": "DIFFERS", "1": "EQUAL"}


def test_a_pass_with_no_free_cell_above_its_sequence_is_placed_as_upstream_does(gguf):
    """A fragmented cache (free cells only below the sequence's) is not a failed pass: llama.cpp
    places it as upstream would, and says so in its log."""
    b = LlamaCppBackend(gguf, max_context=256, max_sequences=2, cache_tokens=256, batch_invariant=True)
    ids = torch.randint(1, b.vocab_size, (170,), generator=torch.Generator().manual_seed(0)).tolist()
    sa, sb = b.new_sequence(), b.new_sequence()
    b.forward([SeqInput(sa, ids[:100], "none")])  # cells 0-99
    b.forward([SeqInput(sb, ids[:150], "none")])  # cells 100-249
    b.free_sequence(sa)  # 100 free cells below b's, 6 above
    llamacpp._log_tail.clear()
    before = b.cells_out_of_order
    assert b.forward([SeqInput(sb, ids[150:170])])[0].shape == (20, b.vocab_size)
    assert b.length(sb) == 170
    assert any("no free cell above sequence" in line for line in llamacpp._log_tail), llamacpp._log_tail
    assert b.cells_out_of_order == before + 1  # counted, for /health (exact_cells_out_of_order)
    b.close()


@pytest.mark.parametrize("exact", [False, True])
def test_exact_mode_keeps_the_model_on_the_cpu_of_a_gpu_build(tmp_path, monkeypatch, exact):
    """A GPU's matmuls change with the batch size (on an H200, a prediction run left plain
    decoding at its second token), so `--exact` keeps every layer, the cache and long passes'
    matmuls on the CPU kernels it was made batch-invariant on; the default mode offloads all, and
    runs flash attention wherever the cache is on the GPU (without it, saving scattered cells
    there copied one value at a time: seconds per sequence on an H200)."""
    seen = {}
    load, init = llama_cpp.llama_model_load_from_file, llama_cpp.llama_init_from_model

    def spy_load(path, params):
        seen["layers"] = params.n_gpu_layers
        return load(path, params)

    def spy_init(model, params):
        seen["kv"], seen["ops"] = params.offload_kqv, params.op_offload
        seen["flash"] = params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        return init(model, params)

    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)  # as a CUDA build answers
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", spy_load)
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", spy_init)
    gguf = save_tiny_gguf(tmp_path)
    backend = LlamaCppBackend(gguf, batch_invariant=exact)
    backend.close()
    if exact:
        assert seen == {"layers": 0, "kv": False, "ops": False, "flash": True} and not backend.on_gpu
        with pytest.raises(ModelLoadError, match="gpu_layers must be 0"):
            LlamaCppBackend(gguf, batch_invariant=True, gpu_layers=4)
    else:
        # flash attention where the cache is on the GPU (GPU_FLASH_ATTENTION), as on the CPU without
        assert seen == {"layers": -1, "kv": True, "ops": True, "flash": True} and backend.on_gpu
        LlamaCppBackend(gguf, gpu_layers=0).close()  # --gpu-layers 0: a GPU build kept to the CPU
        assert seen["layers"] == 0 and not seen["flash"]
        LlamaCppBackend(gguf, gpu_layers=1).close()  # part of the model there
        assert seen["layers"] == 1 and seen["flash"]


def test_gpu_layers_is_checked_before_anything_loads(gguf):
    """--gpu-layers with --exact, or on the transformers backend, is a one-line error."""
    r = generate(gguf, {}, "--exact", "--gpu-layers", "8")
    assert r.returncode != 0 and not r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--gpu-layers 8" in lines[0] and "--exact" in lines[0], r.stderr
    r = generate(gguf, {}, "--gpu-layers", "-2")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "--gpu-layers" in r.stderr, r.stderr
    r = generate(gguf, {}, "--backend", "transformers", "--gpu-layers", "2")
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "specserve: error: --gpu-layers applies to the llama.cpp backend only; transformers takes --device"
    ]
    assert generate(gguf, {}, "--gpu-layers", "0").returncode == 0
    r = generate(gguf, {}, "--gpu-layers", "2")  # on a build without a GPU: said, then run on the CPU
    assert r.returncode == 0
    assert ("--gpu-layers 2 ignored" in r.stderr) == (not llama_cpp.llama_supports_gpu_offload()), r.stderr
