"""Session fixtures for tests on real pretrained weights (loaded by conftest's pytest_plugins).

``smol_model_dir`` pulls the SmolLM2-135M pack once per session. It uses ``$SPECSERVE_HOME``
when set (the Makefile points it into the repo so one CI run reuses the pull), otherwise a
temporary cache under the pytest session, so a bare test run never writes to ~/.cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specserve import packs


def pack_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache the real-pack fixtures pull into."""
    home = os.environ.get("SPECSERVE_HOME")
    return Path(home).expanduser() if home else tmp_path_factory.getbasetemp() / "specserve-home"


@pytest.fixture(scope="session")
def smol_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted SmolLM2-135M-Instruct folder (safetensors, bf16, tokenizer, chat template)."""
    return packs.pull(packs.TEST_PACK, home=pack_home(tmp_path_factory))
