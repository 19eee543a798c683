"""Start the real `specserve serve` as a separate process on a free loopback port, for tests.

    with ServerProcess(model_dir, "--max-queue", "2") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")

The server runs `python -m specserve.cli serve` with a tiny random model saved by
`tiny.save_tiny`; we wait for /health, and stop it (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

STARTUP_TIMEOUT_S = 120.0  # imports + load on a busy 2-core machine


def free_port() -> int:
    """A port the OS says is free now (tiny race until the server binds it; fine on loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One server process; `base_url` ends in /v1 (what the openai SDK wants)."""

    def __init__(self, model_dir: str, *args: str, api_key: str | None = None, dtype: str | None = "float32"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.api_key = api_key
        self.cmd = [sys.executable, "-m", "specserve.cli", "serve", "--model", model_dir,
                    "--port", str(self.port), "--log-level", "warning", *args]
        if dtype:  # a GGUF with no dtype runs on llama.cpp
            self.cmd += ["--dtype", dtype]
        if api_key:
            self.cmd += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="specserve-server-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None
        self.stop_timeout = 60.0 if "--ray" in args else 15.0  # --ray also stops the Ray cluster it started

    def start(self) -> "ServerProcess":
        env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{self.log_tail()}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5.0).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5.0).text

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-chars:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        if os.path.exists(self.log.name):  # its tail was already shown in any failure message
            os.unlink(self.log.name)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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
