"""Session fixtures for tests on real pretrained weights (loaded by conftest's pytest_plugins).

``smol_model_dir`` pulls the SmolLM2-135M pack once per session. It uses ``$SPECSERVE_HOME``
when set (the Makefile points it into the repo so one CI run reuses the pull), otherwise a
temporary cache under the pytest session, so a bare test run never writes to ~/.cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specserve.models import packs


def pack_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache the real-pack fixtures pull into."""
    home = os.environ.get("SPECSERVE_HOME")
    return Path(home).expanduser() if home else tmp_path_factory.getbasetemp() / "specserve-home"


@pytest.fixture(scope="session")
def smol_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SmolLM2-135M-Instruct pack folder (the verified Q4_1 GGUF, tokenizer, chat template)."""
    return packs.pull(packs.TEST_PACK, home=pack_home(tmp_path_factory))


@pytest.fixture(scope="session")
def smol_tokenizer(smol_model_dir: Path):
    """The pack's tokenizer (SmolLM2's 49k-token BPE), as the engine loads it."""
    from specserve.models import loader

    return loader.load_tokenizer(
        packs.ModelSource(
            path=str(smol_model_dir), gguf_file=packs.PACKS[packs.TEST_PACK].gguf_name, pack=packs.TEST_PACK
        )
    )


@pytest.fixture(scope="session")
def smol_gguf(smol_model_dir: Path) -> Path:
    """The pack's GGUF file, as llama.cpp runs it."""
    return smol_model_dir / packs.PACKS[packs.TEST_PACK].gguf_name


@pytest.fixture(scope="session")
def smol_hf_dir(smol_model_dir: Path) -> Path:
    """The same pack converted (once) to a safetensors folder for the transformers backend."""
    source = packs.ModelSource(
        path=str(smol_model_dir), gguf_file=packs.PACKS[packs.TEST_PACK].gguf_name, pack=packs.TEST_PACK
    )
    return Path(packs.ensure_converted(source).path)
