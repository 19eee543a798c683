"""Start the real `specserve serve` as a separate process on a free loopback port, for tests.

    with ServerProcess(model_dir, "--max-queue", "2") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")

The package's launcher (`specserve.server.launch`) runs `python -m specserve.cli serve` with a
tiny random model saved by `tiny.save_tiny`, waits for /health, and stops it (SIGTERM, then
SIGKILL) at the end; this adds the flags every test server shares.
"""

from __future__ import annotations

import os

from specserve.server import launch

STARTUP_TIMEOUT_S = 120.0  # imports + load on a busy 2-core machine


class ServerProcess(launch.ServerProcess):
    """One server process; `base_url` ends in /v1 (what the openai SDK wants)."""

    def __init__(self, model_dir: str, *args: str, api_key: str | None = None, dtype: str | None = "float32"):
        flags = ["--model", model_dir, "--log-level", "warning", *args]
        if dtype:  # a GGUF with no dtype runs on llama.cpp
            flags += ["--dtype", dtype]
        if api_key:
            flags += ["--api-key", api_key]
        self.api_key = api_key
        threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # 1 unless the caller says
        super().__init__(
            flags, env=threads, startup_timeout=STARTUP_TIMEOUT_S, stop_timeout=60.0 if "--ray" in args else 15.0
        )  # --ray also stops its Ray cluster

    def start(self) -> ServerProcess:
        try:
            return super().start()
        except launch.ServerStartError as e:  # a failing test shows the whole end of the log
            raise RuntimeError(f"{e}\n{e.log_tail}") from None


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        head, _, rest = series.partition("{")
        if head != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def save_slow_tiny(path) -> str:
    """A deeper tiny model (~20x slower per step) for queue-full and timeout tests: 400 plain
    steps take well over their 1.5 s timeout."""
    from tiny import tiny_model, tiny_tokenizer

    tiny_model(layers=24, hidden=128).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)
