"""`specserve ... > /dev/full`: a stdout that refuses writes is named in the error, as stdout.

It printed "[Errno 28] No space left on device" (generate) or "No space left on device" with exit 1
(models list), which read as a disk problem with some file of ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import save_tiny

SRC = str(Path(__file__).resolve().parents[1] / "src")
SAID = "specserve: error: cannot write to stdout: No space left on device\n"

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-full"))


def _run_into_dev_full(args: list[str]) -> subprocess.CompletedProcess:
    """The CLI in a subprocess whose stdout is /dev/full (every write: ENOSPC)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "specserve.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=120,
        )


@pytest.mark.parametrize("args", [["models", "list"], ["models", "list", "--json"]])
def test_models_list_into_a_full_stdout_says_stdout(args):
    done = _run_into_dev_full(args)
    assert (done.returncode, done.stderr) == (2, SAID)


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["streamed", "json"])
def test_generate_into_a_full_stdout_says_stdout(model_dir, extra):
    done = _run_into_dev_full(
        ["generate", "hi", "--model", str(model_dir), "--dtype", "float32", "--max-tokens", "3", *extra]
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert lines[-1] + "\n" == SAID, done.stderr
