"""The measured prices (governor.CostModel), kept on disk so that no request waits for them.

Calibration times passes of 1 ... 128 tokens: about 25 s for a 1.5B model on 2 CPU cores. It
runs once per machine and model setup, at load (`LLM` measures before it returns, so the server
reports ready only after), and its result is stored under `$SPECSERVE_HOME/prices/`, keyed by
everything a price depends on:

    the model file (path, size, modification time), the backend and how it runs it (threads,
    exact kernels, context and cache cells; dtype and device on transformers), the draft model
    likewise (and the reference passage its agreement is measured on), and the CPU (model
    name, SIMD flags, usable cores).

Not the number of sequence ids on llama.cpp: its one cache is unified (all sequences share its
cells), and a pass over one sequence attends over the cells in use, so the ids a prefix cache
adds, or `--max-num-seqs` with the same cells, leave a pass's price as it was. A server with its
prefix cache and one without (`specserve bench --session` loads both) share their prices.

Change any of them and the key changes, so stale prices are never read; a backend we cannot
identify (a model built in memory, a test runner) is measured every time and never cached.
The folder keeps the KEEP_FILES most recently used setups: every upgrade of a model file or of
specserve leaves a key nobody reads again, and a test run leaves one per temporary model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from .. import hardware
from ..atomic import write_atomic
from ..config import AGREEMENT_TEXT
from .governor import CALIBRATION_SIZES, CostModel, curve_problem

CACHE_VERSION = 6  # 2: the sequence count left the llama.cpp key; 3: the draft model's agreement;
# 4: logits rows in reused memory made passes of 64+ tokens cheaper (backends/row_buffers.py);
# 5: the price of copying cells out and back (CostModel.copy); 6: transformers can copy too
# (its version-5 prices say it cannot, which would keep its host tier off on a GPU)
KEEP_FILES = 64  # setups whose prices stay on disk, the most recently used


def file_key(path: Path) -> dict | None:
    """Which file this is, as far as outputs and prices go: its path, size and modification time."""
    try:
        st = path.stat()
    except OSError:
        return None
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def weight_files(model) -> list[Path]:
    """The safetensors files a Hugging Face model was loaded from; [] for one built in memory or
    named by a hub id (an empty `name_or_path` is not the working folder)."""
    name = getattr(model, "name_or_path", "") or ""
    folder = Path(name)
    return sorted(folder.glob("*.safetensors")) if name and folder.is_dir() else []


def backend_key(backend) -> dict | None:
    """What this backend's prices depend on, or None when it cannot be identified."""
    if backend is None:
        return None
    name = getattr(backend, "name", type(backend).__name__)
    path = getattr(backend, "path", None)
    if path is not None:  # llama.cpp: one GGUF file
        model = file_key(Path(path))
        if model is None:
            return None
        return {
            "backend": name,
            "model": model,
            "threads": getattr(backend, "threads", None),
            "exact": bool(getattr(backend, "batch_invariant", False)),
            "kernels": getattr(backend, "kernels", None),
            "context": getattr(backend, "max_context", None),
            "cache_tokens": getattr(backend, "cache_tokens", None),
        }
    weights = weight_files(getattr(backend, "model", None))
    if not weights:  # built in memory (tests) or a hub id: nothing on disk says what it is
        return None
    import torch

    return {
        "backend": name,
        "model": [file_key(w) for w in weights],
        "dtype": str(getattr(backend, "dtype", "")),
        "device": str(getattr(backend, "device", "")),
        "threads": torch.get_num_threads(),
    }


def cpu_key() -> dict:
    info = hardware.cpu_info()
    return {"cpu": info["cpu"], "flags": info["cpu_flags"], "cores": info["cores"]}


def cache_key(target, draft=None, batched: bool = True) -> str | None:
    """A digest of everything the prices depend on; None when the target (or the draft) cannot be identified."""
    t = backend_key(target)
    d = backend_key(draft) if draft is not None else None
    if t is None or (draft is not None and d is None):
        return None
    payload = {
        "version": CACHE_VERSION,
        "sizes": CALIBRATION_SIZES,
        "target": t,
        "draft": d,
        "batched": batched,
        "cpu": cpu_key(),
        "agreement_text": hashlib.sha256(AGREEMENT_TEXT.encode()).hexdigest()[:16] if draft is not None else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def cache_dir() -> Path:
    return Path(os.environ.get("SPECSERVE_HOME") or "~/.cache/specserve").expanduser() / "prices"


def load(key: str) -> CostModel | None:
    path = cache_dir() / f"{key}.json"
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        os.utime(path)  # used now: the pruning keeps it
        agreement = None if d["agreement"] is None else float(d["agreement"])
        curve = tuple((int(n), float(c)) for n, c in d["curve"])
        copy = None if d["copy"] is None else float(d["copy"])
        prices = CostModel(curve, float(d["draft"]), bool(d["batched"]), agreement, copy)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or unreadable: measure again
    return prices if sane(prices) else None  # damaged, or edited by hand: measure again


def sane(prices: CostModel) -> bool:
    """Whether prices read from a file can be used: a curve that governor.curve_problem accepts,
    and finite non-negative other prices (agreement at most 1)."""
    others = [prices.draft, prices.copy or 0.0, prices.agreement or 0.0]
    return (
        curve_problem(prices.curve) is None
        and all(math.isfinite(c) and c >= 0 for c in others)
        and (prices.agreement is None or prices.agreement <= 1)
    )


def save(key: str, prices: CostModel) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # every field (none can be left out), atomically: a concurrent reader sees the old file or the new
        write_atomic(folder / f"{key}.json", [json.dumps(asdict(prices)).encode()], cache=True)
        _prune(folder)
    except OSError:
        pass  # a read-only home only costs the next process a calibration


def _prune(folder: Path) -> None:
    """Delete all but the KEEP_FILES most recently used price files."""
    files = []
    for path in folder.glob("*.json"):
        try:
            files.append((path.stat().st_mtime_ns, path))
        except OSError:
            pass  # removed by another process meanwhile
    for _, path in sorted(files, reverse=True)[KEEP_FILES:]:
        path.unlink(missing_ok=True)


def measured(target, draft, batched: bool, calibrate: Callable[[], CostModel]) -> CostModel:
    """The cached prices for this setup, or `calibrate()` (then cached when the setup is identifiable)."""
    key = cache_key(target, draft, batched)
    if key is not None and (prices := load(key)) is not None:
        return prices
    # up to half a minute on a CPU with a draft model: say what the wait is, and that it is once
    where = f"; kept in {cache_dir()}" if key is not None else ""
    print(f"measuring speculation prices on this machine (once per model set-up{where})...", file=sys.stderr)
    start = time.perf_counter()
    prices = calibrate()
    print(f"measured speculation prices in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    if key is not None:
        save(key, prices)
    return prices
