"""Loading models and fitting them together: clear errors, and the auto drafting order."""

import pytest
import torch
from transformers import T5Config, T5Model

from specserve import SamplingParams, SpeculationConfig
from specserve.errors import ModelLoadError
from specserve.llm import LLM
from specserve.proposer import ProposerContext, build_chain, choose_draft
from tiny import save_tiny, tiny_model, tiny_tokenizer


def test_unknown_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        LLM(model=str(tmp_path / "missing-model"), dtype="float32")


def test_non_causal_model_is_refused(tmp_path):
    # T5 is an encoder-decoder: transformers has no causal-LM class for it.
    T5Model(T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="causal language model"):
        LLM(model=str(tmp_path), dtype="float32")


def test_draft_vocabulary_must_match():
    with pytest.raises(ModelLoadError, match="vocabulary"):
        LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(vocab_size=len(tiny_tokenizer()) + 7))


def test_folder_and_draft_load_in_float32(tmp_path):
    target = save_tiny(tmp_path / "t", seed=0)
    draft = save_tiny(tmp_path / "d", seed=1)
    llm = LLM(model=target, draft_model=draft, dtype="float32")
    assert llm.has_draft_model and llm.engine.target.model.dtype == torch.float32
    plain = llm.generate("def add(a, b):", SamplingParams(max_tokens=12), speculation="none")
    assert llm.generate("def add(a, b):", SamplingParams(max_tokens=12), speculation="draft").token_ids == \
        plain.token_ids
    assert not LLM(model=target, dtype="float32").has_draft_model  # no implicit draft for a given model


def test_gguf_file_loads(smol_model_dir):
    gguf = next(smol_model_dir.glob("*.gguf"))
    llm = LLM(model=str(gguf), dtype="float32")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=8))
    assert "Paris" in out.text


def test_auto_order_prediction_then_ngram_then_draft():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    ctx = ProposerContext(SpeculationConfig("auto"), SamplingParams(), 3, llm.tokenizer, "def add(a, b):",
                          llm.engine.draft, torch.Generator())
    chain = build_chain(ctx)
    assert [p.name for p in chain] == ["prediction", "ngram", "draft"]
    for p in chain:
        p.prefill([5, 6, 7])
    assert choose_draft(chain, [5, 6, 7], 4).source == "prediction"
    chain[0].anchored = False  # the prediction has nothing: n-gram next, if it finds a match
    assert choose_draft(chain, [5, 6, 7, 5, 6], 4).source == "ngram"
    assert choose_draft(chain, [5, 6, 7, 8, 9], 4).source == "draft"  # no repeated n-gram: draft model
    no_pred = build_chain(ProposerContext(SpeculationConfig("auto"), SamplingParams(), 3, llm.tokenizer, None,
                                          None, torch.Generator()))
    assert [p.name for p in no_pred] == ["ngram"]
    assert choose_draft(chain, [5, 6, 7], 0) is None  # no budget: no draft at all
