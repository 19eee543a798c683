"""`specserve serve` as a child process on a free loopback port: start it, wait for /health, stop it.

    with ServerProcess(["--model", "smollm2-135m-instruct"]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")

One launcher for the tests (`tests/server_proc.py`), `specserve bench --load-via server` and the
scripts. It polls /health with the standard library, so a server-only install can use it. The
server's output goes to a log file: `log_path` when given (kept), else a temporary file that is
deleted on `stop()` (quote `log_tail()` in any failure message before then).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from ..errors import SpecServeError

HOST = "127.0.0.1"


class ServerStartError(SpecServeError, RuntimeError):
    """The server exited or never became healthy. One line for the CLI; `log_tail` has the log's end."""

    def __init__(self, message: str, log_tail: str):
        super().__init__(message)
        self.log_tail = log_tail


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now (a tiny race until the server binds it; fine on loopback)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `specserve serve` process; `url` is its root, `base_url` ends in /v1 (what the openai SDK wants).

    args: the `serve` flags, without --host and --port (the launcher picks them).
    env: extra environment variables for the child, over this process's own.
    startup_timeout: seconds to wait for /health (imports and model loading included).
    stop_timeout: seconds from SIGTERM to SIGKILL.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        host: str = HOST,
        port: int | None = None,
    ):
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.cmd = [sys.executable, "-m", "specserve.cli", "serve", *args, "--host", host, "--port", str(self.port)]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self.startup_timeout, self.stop_timeout = startup_timeout, stop_timeout
        self.keep_log = log_path is not None
        self.log_path = Path(log_path) if log_path is not None else None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> ServerProcess:
        """Start the process and return once /health answers 200; raises ServerStartError when it exits
        or is not healthy in time, after stopping it (the log is kept then)."""
        if self.log_path is None:
            # The log lives as long as the process: closed in stop(), so no `with` (SIM115).
            self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
                "w+", prefix="specserve-server-", suffix=".log", delete=False
            )
            self.log_path = Path(self._log.name)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise self._start_error(f"exited with {self.proc.returncode}")
            if self._get("/health", 2.0)[0] == 200:
                return
            if time.monotonic() > deadline:
                raise self._start_error(f"was not healthy after {self.startup_timeout:.0f}s")
            time.sleep(0.2)

    def _start_error(self, what: str) -> ServerStartError:
        tail = self.log_tail()
        last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "(empty log)")
        return ServerStartError(f"`specserve serve` {what}; its log ({self.log_path}) ends: {last}", tail)

    def _get(self, path: str, timeout: float) -> tuple[int | None, bytes]:
        """(status, body) of a GET; status None when nothing answered."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:  # a 4xx/5xx still answered
            return e.code, e.read()
        except (OSError, ValueError):  # refused, reset, timed out: not up yet
            return None, b""

    def health(self) -> dict:
        """The /health body (any status)."""
        status, body = self._get("/health", 5.0)
        if status is None:
            raise RuntimeError(f"the server at {self.url} does not answer /health")
        return json.loads(body)

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        return self._get("/metrics", 5.0)[1].decode("utf-8", errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except (OSError, AttributeError):
            return ""

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM, then SIGKILL after stop_timeout; a temporary log is deleted unless keep_log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
            if not self.keep_log and not keep_log and self.log_path is not None and self.log_path.exists():
                self.log_path.unlink()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
