"""Write the tiny random Qwen2-shaped test model as an f32 GGUF that llama.cpp loads.

The llama.cpp backend is tested on the same seeded weights as the transformers one, so the
exactness suites can run on both and the two backends' logits can be compared. Only what
llama.cpp's qwen2 loader reads is written: hyperparameters, the tensors under llama.cpp's
names (HF shapes; the writer stores them in GGML's reversed order), and a vocabulary it
accepts (the engine tokenizes with the HF tokenizer, never with llama.cpp's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType
from tiny import SPECIAL, tiny_model, tiny_tokenizer

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


HIDDEN = 128  # 4 heads of 32: llama.cpp's q8_0 KV cache needs head sizes divisible by 32


def write_tiny_gguf(path: str | Path, seed: int = 0, layers: int = 2) -> Path:
    """The seeded tiny Qwen2 model (tests/tiny.py, hidden size HIDDEN) as an f32 GGUF at `path`."""
    model = tiny_model("qwen2", seed=seed, layers=layers, hidden=HIDDEN)
    cfg = model.config
    tok = tiny_tokenizer()
    w = GGUFWriter(str(path), "qwen2")
    w.add_name(f"tiny-qwen2-seed{seed}")
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    _add_vocab(w, tok, cfg.vocab_size)
    for name, tensor in model.state_dict().items():
        w.add_tensor(gguf_name(name), tensor.detach().float().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add_vocab(w: GGUFWriter, tok, vocab_size: int) -> None:
    """A gpt2-style vocabulary of the model's width: the tokenizer's tokens, merges and EOS."""
    by_id = {i: t for t, i in tok.get_vocab().items()}
    tokens = [by_id.get(i, f"<unused{i}>") for i in range(vocab_size)]
    special = set(SPECIAL) | {"<unk>"}
    types = [TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_eos_token_id(tok.eos_token_id)


def save_tiny_gguf(folder: str | Path, seed: int = 0) -> str:
    """The tiny GGUF with the tiny tokenizer saved beside it (what a pack folder holds);
    returns the .gguf path, a model spec for `LLM(model=...)` and `specserve serve --model`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer().save_pretrained(folder)
    return str(write_tiny_gguf(folder / "model.gguf", seed))


def llamacpp_llms(folder: Path):
    """(LLM with a different-seed draft, LLM whose draft is the target's own weights) on llama.cpp."""
    from specserve.backends.llamacpp import LlamaCppBackend
    from specserve.llm import LLM

    target, other = write_tiny_gguf(folder / "seed0.gguf", 0), write_tiny_gguf(folder / "seed1.gguf", 1)
    tok = tiny_tokenizer()

    def exact(path):  # batch-invariant kernels: greedy speculation must equal plain bit for bit
        return LlamaCppBackend(path, batch_invariant=True)

    return (
        LLM.from_backends(exact(target), tok, exact(other), name="llama.cpp"),
        LLM.from_backends(exact(target), tok, exact(target), name="llama.cpp"),
    )


def write_tiny_swa_gguf(path: str | Path, window: int = 16, seed: int = 0, layers: int = 2) -> Path:
    """A seeded random Gemma-3-shaped f32 GGUF whose layers all use sliding-window attention over
    `window` positions (as Gemma 3's do over 512), with the tiny tokenizer's vocabulary: llama.cpp
    gives it the same two-part cache (`llama_kv_cache_iswa`) as the gemma-3-270m pack."""
    rng = np.random.default_rng(seed)
    vocab, heads, kv_heads, ff = len(tiny_tokenizer()), 4, 2, HIDDEN * 2
    head = HIDDEN // heads
    w = GGUFWriter(str(path), "gemma3")
    w.add_name(f"tiny-gemma3-swa{window}-seed{seed}")
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(window)
    _add_vocab(w, tiny_tokenizer(), vocab)

    def random(name: str, ne0: int, ne1: int, scale: float = 0.2) -> None:  # llama.cpp's {ne0, ne1}
        w.add_tensor(name, (rng.standard_normal((ne1, ne0)) * scale).astype(np.float32))

    random("token_embd.weight", HIDDEN, vocab, scale=0.1)  # Gemma scales it by sqrt(HIDDEN)
    output = rng.standard_normal((vocab, HIDDEN)).astype(np.float32)  # untied: not the last token again
    output[: len(SPECIAL) + 1] = 0  # as tiny_model: text, not control tokens (nor EOS)
    w.add_tensor("output.weight", output)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    for i in range(layers):
        for norm, width in [("attn_norm", HIDDEN), ("post_attention_norm", HIDDEN), ("ffn_norm", HIDDEN)]:
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(width, np.float32))
        for norm, width in [("post_ffw_norm", HIDDEN), ("attn_q_norm", head), ("attn_k_norm", head)]:
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(width, np.float32))
        random(f"blk.{i}.attn_q.weight", HIDDEN, heads * head)
        random(f"blk.{i}.attn_k.weight", HIDDEN, kv_heads * head)
        random(f"blk.{i}.attn_v.weight", HIDDEN, kv_heads * head)
        random(f"blk.{i}.attn_output.weight", heads * head, HIDDEN)
        random(f"blk.{i}.ffn_gate.weight", HIDDEN, ff)
        random(f"blk.{i}.ffn_up.weight", HIDDEN, ff)
        random(f"blk.{i}.ffn_down.weight", ff, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
