"""Tiny random-weight models and a small byte-level BPE tokenizer, built in seconds offline.

Used by the engine, server and benchmark tests so they need no download. Weights are seeded,
so every test run sees the same models.
"""

from __future__ import annotations

import functools
import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class UserController:\n    def get_user(self, user_id):\n        return self.db.find(user_id)\n",
    "import os\nimport sys\n\nprint('hello world')\n",
    "function getUser(req, res) {\n  const id = req.params.id;\n  res.json(users[id]);\n}\n",
    "Le café coûte 3 €. Über naïve façade — 東京 日本語 テキスト ✓\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
]
SLIDING_WINDOW = 16  # the gemma3 kind's window, short enough that any test runs past it
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level BPE with ~400 tokens, trained on CORPUS.

    Every token decodes to whole characters (no byte pieces), so random models still write
    valid text, including non-ASCII characters; unknown characters map to <unk>.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?\w+| ?[^\w\s]+|\s+"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    alphabet = sorted(set("".join(CORPUS)) | set(string.printable))
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL + ["<unk>"], initial_alphabet=alphabet)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(
    kind: str = "llama",
    seed: int = 0,
    vocab_size: int | None = None,
    layers: int = 2,
    hidden: int = 64,
    max_positions: int = 512,
):
    """A seeded random-weight causal LM (Llama-, Qwen2- or Gemma3-shaped), float32, eval mode."""
    vocab = vocab_size or len(tiny_tokenizer())
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=tiny_tokenizer().eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "gemma3":  # sliding-window attention: 3 of every 4 layers see the last SLIDING_WINDOW positions
        types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
        config = Gemma3TextConfig(**common, head_dim=hidden // 4, sliding_window=SLIDING_WINDOW, layer_types=types)
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(kind)
    # Sharper logits than the default init, so greedy outputs have clear winners and repeat
    # themselves (which gives the n-gram drafter something to find).
    # Special tokens (EOS included) get zero weights: a random model should write text, not
    # control tokens; tests that need EOS pick an ordinary token as EOS instead.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.lm_head.weight[: len(SPECIAL) + 1].zero_()
    return model.float().eval()


def save_tiny(path, kind: str = "llama", seed: int = 0) -> str:
    """Write a tiny model + tokenizer as a normal Hugging Face folder; returns the path."""
    tiny_model(kind, seed).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def steady_prices(*llms, copy: float | None = None):
    """Pin each LLM's prices to a fixed curve (a verified token costs 0.05 of a pass, a draft
    model's pass 0.2), so which K a test's drafts get never depends on timing a tiny model,
    whose millisecond passes a busy machine can make look dear (K = 1) or free. copy: what
    saving and restoring a cell costs, in passes (CostModel.copy); None, unmeasured, keeps the
    prefix cache's host tier off. Returns llms."""
    from dataclasses import replace

    from specserve.engine.governor import CostModel

    for llm in llms:
        llm.engine.use_prices(replace(CostModel.linear(0.05, draft=0.2), copy=copy))
    return llms
