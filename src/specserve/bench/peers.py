"""Peers in the benchmark: other engines decoding greedily on the very same weights.

transformers (the torch backend's model objects): plain `generate()`, prompt lookup, and
assisted generation with our draft model. llama-cpp-python (the llama.cpp backend's GGUF, its
own high-level `Llama` with its default settings, as many layers on a GPU as our backend
put there): plain decoding, and its prompt lookup (`LlamaPromptLookupDecoding`). Each returns
the new token ids and a clock fed as tokens come.
"""

from __future__ import annotations

import atexit

TRANSFORMERS_PEERS = ("hf", "hf-prompt-lookup", "hf-assisted")
LLAMACPP_PEERS = ("llama.cpp", "llama.cpp-lookup")
PEERS = TRANSFORMERS_PEERS + LLAMACPP_PEERS
PEER_ENGINE = {p: "transformers" for p in TRANSFORMERS_PEERS} | {p: "llama-cpp-python" for p in LLAMACPP_PEERS}
PROMPT_LOOKUP_TOKENS = 10  # the value both peers document in their examples


def peers_for(backend_name: str) -> tuple[str, ...]:
    """The peers that run on the same weights as a backend."""
    return LLAMACPP_PEERS if backend_name == "llama.cpp" else TRANSFORMERS_PEERS


def peer_skip_reason(llm, peer: str) -> str | None:
    if peer not in peers_for(llm.backend_name):
        return f"runs on the {'llama.cpp' if peer in LLAMACPP_PEERS else 'transformers'} backend only"
    if peer == "hf-assisted" and not llm.has_draft_model:
        return "no draft model loaded"
    if peer in LLAMACPP_PEERS:
        from ..backends.llamacpp import amx_repacks, system_info

        if amx_repacks(system_info()):  # `Llama` has no switch for the extra buffers that crash
            return "this llama-cpp-python build has ggml's AMX kernels, which crash on K-quants (llama.cpp#20824)"
    return None


def run_peer(llm, prompt_ids: list[int], max_tokens: int, peer: str, clock) -> list[int]:
    """Greedy decoding by `peer`; feeds `clock` as tokens come. Returns the new token ids."""
    if peer in LLAMACPP_PEERS:
        ids = _run_llamacpp(llm, prompt_ids, max_tokens, peer == "llama.cpp-lookup", clock)
    else:
        ids = _run_transformers(llm, prompt_ids, max_tokens, peer, clock)
    clock.stop()
    return ids


# -- llama-cpp-python ---------------------------------------------------------------------------
_LLAMAS: dict[tuple[str, bool], object] = {}


@atexit.register
def _close_llamas() -> None:
    """Free the peers before interpreter shutdown tears down what their destructors call."""
    while _LLAMAS:
        _LLAMAS.popitem()[1].close()


def _llama(llm, lookup: bool, n_ctx: int):
    """llama-cpp-python's own Llama over the target's GGUF (one per mode and context size).

    Its prompt lookup verifies drafts through `logits_all=True`, which keeps an [n_ctx, V] score
    array: the context is sized to the run (prompt + max_tokens), not to the model."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    backend = llm.target_backend
    n_ctx = min(backend.max_context, -(-n_ctx // 512) * 512)
    key = (str(backend.path), lookup)
    if key in _LLAMAS and _LLAMAS[key].n_ctx() < n_ctx:
        _LLAMAS.pop(key).close()
    if key not in _LLAMAS:
        from ..backends.compute import on_compute_thread

        draft = LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS) if lookup else None
        _LLAMAS[key] = on_compute_thread(  # like its decoding: no second OpenMP team (backends/compute.py)
            lambda: Llama(
                model_path=str(backend.path),
                n_ctx=n_ctx,
                n_batch=512,
                n_gpu_layers=backend.gpu_layers,  # as many layers on a GPU as ours (a CPU build ignores it)
                logits_all=lookup,
                n_threads=backend.threads,
                n_threads_batch=backend.threads,
                draft_model=draft,
                verbose=False,
            )
        )
    return _LLAMAS[key]


def _run_llamacpp(llm, prompt_ids, max_tokens: int, lookup: bool, clock) -> list[int]:
    peer = _llama(llm, lookup, len(prompt_ids) + max_tokens + 1)
    peer.reset()  # no prefix reuse from the previous run: every run pays its prefill
    return _greedy(peer, prompt_ids, max_tokens, llm.engine.eos_token_ids, clock)


def _greedy(peer, prompt_ids: list[int], max_tokens: int, eos: set[int], clock) -> list[int]:
    """Greedy decoding on a `Llama` until EOS or max_tokens, feeding `clock` as tokens come. It
    runs on the thread of our own llama.cpp passes: a second calling thread would give ggml a
    second OpenMP team and slow both engines down (backends/compute.py)."""
    from ..backends.compute import on_compute_thread

    def run() -> list[int]:
        out: list[int] = []
        for tok in peer.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            clock.emitted(1)
            if tok in eos or len(out) >= max_tokens:
                break
        return out

    return on_compute_thread(run)


# -- transformers -------------------------------------------------------------------------------
class _PeerStreamer:
    """transformers streamer that feeds a clock (the first put() is the prompt: ignored)."""

    def __init__(self, clock):
        self.clock, self.seen_prompt = clock, False

    def put(self, value) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.clock.emitted(int(value.numel()))

    def end(self) -> None:
        pass


def peer_config(llm, max_tokens: int, peer: str):
    """Greedy GenerationConfig; every field the model's own generation_config could fill is set
    (Qwen's ships sampling and repetition_penalty=1.1 defaults that would change the output)."""
    from transformers import GenerationConfig

    eos = sorted(llm.engine.eos_token_ids)
    extra = {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS} if peer == "hf-prompt-lookup" else {}
    return GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        temperature=1.0,
        top_p=1.0,
        repetition_penalty=1.0,
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else llm.tokenizer.pad_token_id,
        **extra,
    )


def _run_transformers(llm, prompt_ids, max_tokens: int, peer: str, clock) -> list[int]:
    """transformers `generate()` greedy on the very same model objects."""
    import torch

    model = llm.target_backend.model
    assistant = {"assistant_model": llm.draft_backend.model} if peer == "hf-assisted" else {}
    ids = torch.tensor([prompt_ids], device=llm.target_backend.device)  # [1, P]
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_config=peer_config(llm, max_tokens, peer),
            streamer=_PeerStreamer(clock),
            **assistant,
        )  # [1, P + N]
    return out[0, len(prompt_ids) :].tolist()


# -- llama-cpp-python in a conversation (bench --session) ---------------------------------------
def session_llama(llm):
    """The plain llama-cpp-python peer sized to the whole context: one `Llama` serves every turn of
    a session, so it keeps its previous prompt's KV (never recreated nor reset between turns)."""
    return _llama(llm, False, llm.target_backend.max_context)


def run_session_turn(peer, prompt_ids: list[int], max_tokens: int, eos: set[int], clock) -> tuple[list[int], int]:
    """One turn of a conversation on `peer`, greedy, without a reset: `Llama.generate` keeps the
    longest common prefix of its evaluated tokens (previous prompt + output) and this prompt, and
    evaluates the rest. Returns (new token ids, prompt tokens it kept), the latter read from its
    state before the call as `generate` computes it (the last prompt token is always evaluated)."""
    from ..engine.prefix_cache import common_prefix

    kept = common_prefix(list(peer._input_ids), prompt_ids, len(prompt_ids) - 1)  # what its KV keeps
    out = _greedy(peer, prompt_ids, max_tokens, eos, clock)
    clock.stop()
    return out, kept
