import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/tiny.py, tests/synthetic.py, ...
torch.set_num_threads(1)  # tiny models: extra threads only add contention on a 2-core machine
# Each pytest-xdist worker owns one core (and so do the servers it starts, which inherit it):
# llama.cpp's threads spin at every barrier, and two workers' models each running as many threads
# as there are cores stall one another (a 0.4 s test took 30 s beside another worker's).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cores[int(_worker[2:]) % len(_cores)]})
# llama.cpp reads this once per process; off from the start, exact (batch-invariant) models can
# be loaded in any order next to fast ones (specserve refuses an exact one after a fast one).
# It also hides the user's own setting from this process: the refusal of a GGML_CPU_TILED_MM that
# breaks --exact is tested in child processes with their own environment (test_exact_check.py).
os.environ["GGML_CPU_TILED_MM"] = "0"
os.environ["GGML_CPU_LLAMAFILE"] = "0"  # the same for llamafile's sgemm (scripts/llama_cpp_switch.py)
os.environ["LLAMA_KV_CELL_ORDER"] = "1"  # each sequence's cells in position order, as exact mode sets it

pytest_plugins = ["fixtures_packs"]  # the session fixture that pulls the SmolLM2 pack
