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


def test_help_and_version_on_a_closed_stdout_fail_in_one_line():
    """`specserve --help >&-` exited 0 with the help printed to stderr (argparse's fallback) as if it
    had been written where it was asked for; `models list >&-` already failed in one line."""
    for args, line in (
        (["--help"], "`specserve --help`"),
        (["generate", "--help"], "`specserve generate --help`"),
        (["serve", "-h"], "`specserve serve --help`"),  # serve writes nothing to stdout, but its help does
        (["models", "list", "--help"], "`specserve models list --help`"),
        (["--version"], "`specserve --version`"),
    ):
        done = _run(args, close=1)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(f"specserve: error: stdout is closed, so {line} has nowhere"), done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    shown = _run(["--help"], close=0)  # a closed stdin is no reason to refuse
    assert shown.returncode == 0 and shown.stdout.startswith("usage: specserve") and shown.stderr == ""


def test_help_and_version_into_a_full_device_fail_in_one_line():
    """`specserve --help > /dev/full` exited 0 (argparse drops write errors): now as `models list`."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for args in (["--help"], ["serve", "--help"], ["--version"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "specserve.cli", *args], stdout=full, stderr=subprocess.PIPE, env=env, text=True
            )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr == "specserve: error: cannot write to stdout: No space left on device\n", done.stderr
