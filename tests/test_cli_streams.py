"""`specserve` run with stdin or stdout closed (`cmd <&-`, `cmd >&-`): Python starts with
sys.stdin / sys.stdout set to None, which was an AttributeError traceback in generate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run(args: list[str], close: int) -> subprocess.CompletedProcess:
    """The CLI in a subprocess whose file descriptor `close` (0: stdin, 1: stdout) is closed."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "specserve.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        preexec_fn=lambda: os.close(close),  # after the pipes are in place: the child starts without it
        env=env,
        text=True,
        timeout=120,
    )


def test_a_closed_stdout_is_one_line_and_a_failure_not_a_lost_output():
    done = _run(["models", "list"], close=1)
    assert done.returncode == 2  # it was 0, the table written nowhere
    assert done.stderr.startswith("specserve: error: stdout is closed")
    assert "> /dev/null" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_closed_stdout_stops_generate_before_any_model_loads():
    done = _run(["generate", "hi", "--model", "no-such-model"], close=1)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "stdout is closed" in done.stderr


def test_a_closed_stdin_reads_as_empty():
    done = _run(["generate", "--model", "no-such-model"], close=0)
    assert done.returncode == 2  # it was an AttributeError traceback from sys.stdin.isatty()
    assert done.stderr == "specserve: error: the prompt on stdin is empty\n"
