"""What machine a figure was measured on: CPU model and the SIMD flags that decide kernel speed
(and the memory available, which sizes the default caches).

Every benchmark and the `generate` stats line name the backend, the CPU and these flags, since
the same model runs several times faster or slower across CPUs (AVX2 only vs AVX-512 / AMX).
"""

from __future__ import annotations

import functools
import os
import platform
import re

FLAG_PATTERN = re.compile(r"^(avx2|avx512\w*|amx\w*)$")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """{"cpu": model name, "cpu_flags": [avx2, avx512*, amx*], "cores": usable cores}."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not flags:
                    model = value.strip()
                elif key == "flags":
                    flags = sorted(x for x in value.split() if FLAG_PATTERN.match(x))
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return {"cpu": model, "cpu_flags": flags, "cores": cores}


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return None


def describe(backend_name: str) -> str:
    """One line: backend, CPU model and flags, e.g. for the `generate` stats line."""
    info = cpu_info()
    flags = " ".join(info["cpu_flags"]) or "no AVX2/AVX-512/AMX"
    return f"{backend_name} on {info['cpu']} ({info['cores']} cores; {flags})"
