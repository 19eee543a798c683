"""Loading models and fitting them together: clear errors, and the auto drafting order."""

from pathlib import Path

import pytest
import torch
from tiny import save_tiny, tiny_model, tiny_tokenizer
from transformers import T5Config, T5Model

from specserve import SamplingParams, SpeculationConfig
from specserve.backends import SequenceRunner
from specserve.config import LoadOptions
from specserve.engine.sampling import Noise
from specserve.errors import ModelLoadError
from specserve.llm import LLM
from specserve.models.loader import choose_backend
from specserve.models.packs import ModelSource
from specserve.proposers.base import ProposerContext, build_chain, choose_draft


def test_unknown_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        LLM(model=str(tmp_path / "missing-model"), dtype="float32")


def test_non_causal_model_is_refused(tmp_path):
    # T5 is an encoder-decoder: transformers has no causal-LM class for it.
    T5Model(T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="causal language model"):
        LLM(model=str(tmp_path), dtype="float32")


def test_truncated_safetensors_is_a_one_line_error(tmp_path):
    """safetensors' own error used to escape as a traceback (exit 1)."""
    folder = Path(save_tiny(tmp_path / "t"))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    with pytest.raises(ModelLoadError, match="causal language model") as err:
        LLM(str(folder), dtype="float32")
    assert "\n" not in str(err.value)


def test_draft_vocabulary_must_match():
    with pytest.raises(ModelLoadError, match="vocabulary"):
        LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(vocab_size=len(tiny_tokenizer()) + 7))


def test_folder_and_draft_load_in_float32(tmp_path):
    target = save_tiny(tmp_path / "t", seed=0)
    draft = save_tiny(tmp_path / "d", seed=1)
    llm = LLM(model=target, draft_model=draft, dtype="float32")
    assert llm.has_draft_model and llm.target_backend.model.dtype == torch.float32
    assert llm.backend_name == "transformers"
    plain = llm.generate("def add(a, b):", SamplingParams(max_tokens=12), speculation="none")
    assert (
        llm.generate("def add(a, b):", SamplingParams(max_tokens=12), speculation="draft").token_ids == plain.token_ids
    )
    assert not LLM(model=target, dtype="float32").has_draft_model  # no implicit draft for a given model


@pytest.mark.parametrize(
    "backend, dtype, expected",
    [
        ("auto", None, "llama.cpp"),
        ("auto", "float32", "transformers"),
        ("auto", "bfloat16", "transformers"),
        ("llama.cpp", None, "llama.cpp"),
        ("transformers", None, "transformers"),
    ],
)
def test_backend_choice_for_a_gguf(backend, dtype, expected):
    source = ModelSource(path="/models", gguf_file="m.gguf")
    assert choose_backend(source, LoadOptions(backend=backend, dtype=dtype)) == expected


def test_backend_choice_for_a_folder_is_transformers():
    source = ModelSource(path="/models/m")
    assert choose_backend(source, LoadOptions()) == "transformers"
    with pytest.raises(ModelLoadError, match="runs GGUF files"):
        choose_backend(source, LoadOptions(backend="llama.cpp"))


# A real load for each backend (a GGUF on transformers is dequantized: ~30 s, so only once).
@pytest.mark.parametrize(
    "backend, dtype, expected",
    [("auto", None, "llama.cpp"), ("transformers", None, "transformers")],
)
def test_gguf_file_loads_on_the_chosen_backend(smol_gguf, backend, dtype, expected):
    # speculation "none": a speculative LLM measures its prices at load (12 s for this pack on
    # transformers in bf16 on an AVX2 CPU), which is not what this test is about
    llm = LLM(model=str(smol_gguf), dtype=dtype, backend=backend, speculation="none")
    assert llm.backend_name == expected
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=6))
    assert "Paris" in out.text


def test_auto_order_prediction_then_ngram_then_draft():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    ctx = ProposerContext(
        SpeculationConfig("auto"),
        SamplingParams(),
        3,
        llm.tokenizer,
        "def add(a, b):",
        SequenceRunner(llm.draft_backend),
        Noise(0),
    )
    chain = build_chain(ctx)
    assert [p.name for p in chain] == ["prediction", "ngram", "draft"]
    for p in chain:
        p.prefill([5, 6, 7])
    assert choose_draft(chain, [5, 6, 7], 4).source == "prediction"
    chain[0].anchored = False  # the prediction has nothing: n-gram next, if it finds a match
    assert choose_draft(chain, [5, 6, 7, 5, 6], 4).source == "ngram"
    assert choose_draft(chain, [5, 6, 7, 8, 9], 4).source == "draft"  # no repeated n-gram: draft model
    no_pred = build_chain(
        ProposerContext(SpeculationConfig("auto"), SamplingParams(), 3, llm.tokenizer, None, None, Noise(0))
    )
    # no prediction: the prompt's code stands in for it (proposers/prompt.py), then the n-gram
    # lookup; a prompt without code gives the prompt source nothing to draft, so n-gram drafts
    assert [p.name for p in no_pred] == ["prompt", "ngram"]
    for p in no_pred:
        p.prefill([5, 6, 7])
    assert choose_draft(no_pred, [5, 6, 7, 5, 6], 4).source == "ngram"
    assert choose_draft(chain, [5, 6, 7], 0) is None  # no budget: no draft at all


# --------------------------------------------------------------------------- GGUF on llama.cpp: bad input


def _run_cli(*argv):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specserve.cli", *argv], capture_output=True, text=True, timeout=120)


def test_missing_gguf_is_a_one_line_cli_error(tmp_path):
    r = _run_cli("generate", "hi", "--model", str(tmp_path / "nothing.gguf"), "--max-tokens", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("specserve: error: no such file or folder")


def test_truncated_gguf_names_the_file(tmp_path, smol_gguf):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(smol_gguf.read_bytes()[: 4 << 20])  # the header and a sliver of the tensors
    with pytest.raises(ModelLoadError, match="cut.gguf") as err:
        LLM(model=str(bad), backend="llama.cpp")
    assert "\n" not in str(err.value)
    r = _run_cli("generate", "hi", "--model", str(bad), "--backend", "llama.cpp", "--max-tokens", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cut.gguf" in r.stderr


def test_unsupported_architecture_is_named(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "alien.gguf"
    w = GGUFWriter(str(path), "no-such-arch")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"alien\.gguf.*no-such-arch"):
        LLM(model=str(path), backend="llama.cpp")


def test_draft_gguf_with_another_vocabulary_is_refused(tmp_path, smol_gguf):
    from tiny_gguf import save_tiny_gguf

    tiny = save_tiny_gguf(tmp_path / "tiny")
    with pytest.raises(ModelLoadError, match=r"model.gguf cannot draft for smollm2.*vocabulary"):
        LLM(model=str(smol_gguf), draft_model=tiny)


def test_backend_and_dtype_mismatches_are_clear(tmp_path, smol_gguf):
    folder = save_tiny(tmp_path / "hf")
    with pytest.raises(ModelLoadError, match="llama.cpp backend runs GGUF files"):
        LLM(model=folder, backend="llama.cpp")
    with pytest.raises(ModelLoadError, match="--dtype applies to the transformers backend only"):
        LLM(model=str(smol_gguf), backend="llama.cpp", dtype="float32")
    with pytest.raises(ValueError, match="unknown backend"):
        LLM(model=str(smol_gguf), backend="vllm")


def test_exact_on_the_transformers_backend_is_refused(tmp_path):
    """`--exact` (exact=True) names llama.cpp's batch-invariant kernels; on transformers it was
    dropped without a word, so `--backend transformers --exact` ran bf16 with none of the
    exactness asked for, where --dtype on llama.cpp and --gpu-layers on transformers are refused."""
    folder = save_tiny(tmp_path / "hf")
    with pytest.raises(ModelLoadError, match="--exact applies to the llama.cpp backend only; .*--dtype float32"):
        LLM(model=folder, draft_model="none", exact=True)
