"""Every model computation in a process runs on one thread, whichever thread asks for it
(backends/compute.py).

OpenMP (ggml-cpu's build, and torch, which ships the same libgomp) gives each calling thread its
own team of workers, and once libgomp manages more threads than there are CPUs its barriers sleep
instead of spinning: on 2 cores a decoding step on a second calling thread took 107 ms against 81
on the first (Qwen 1.5B Q4_K_M, 2981 cached tokens). The server's engine worker is such a second
thread whenever the model's prices were measured on the main thread at load, and a benchmark peer
on the main thread is one for our engine. Timing lives in benchmarks; this checks the mechanism:
which threads call `llama_decode`, the transformers model and the engine's step.
"""

from __future__ import annotations

import threading
import time

import llama_cpp
import torch
from tiny import tiny_model
from tiny_gguf import save_tiny_gguf

from specserve.backends import SeqInput
from specserve.backends.llamacpp import LlamaCppBackend
from specserve.backends.transformers import TransformersBackend


def _decoding_threads(monkeypatch) -> list[threading.Thread]:
    seen: list[threading.Thread] = []
    decode = llama_cpp.llama_decode

    def spy(ctx, batch):
        seen.append(threading.current_thread())
        return decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", spy)  # what our backend calls
    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_decode", spy)  # what `Llama` calls
    return seen


def test_passes_asked_for_on_any_thread_run_on_one(tmp_path, monkeypatch):
    seen = _decoding_threads(monkeypatch)
    backend = LlamaCppBackend(save_tiny_gguf(tmp_path), max_context=64)
    seq = backend.new_sequence()
    rows = []

    def step(tokens: list[int]) -> None:
        rows.append(backend.forward([SeqInput(seq, tokens, logits="last")])[0])

    step([5, 6, 7])  # the caller's thread (the main thread here, as for prices measured at load)
    for tokens in ([8], [9, 10]):  # then two other threads, as the server's worker would be
        t = threading.Thread(target=step, args=(tokens,))
        t.start()
        t.join()
    backend.close()
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    assert seen[0] is not threading.current_thread()
    assert [r.shape[0] for r in rows] == [1, 1, 1]  # the logits came back to each caller


def test_errors_reach_the_caller(tmp_path):
    backend = LlamaCppBackend(save_tiny_gguf(tmp_path), max_context=8)
    seq = backend.new_sequence()
    try:
        backend.forward([SeqInput(seq, list(range(5, 13)), logits="none")])  # fills the context
        raised = None
        try:
            backend.forward([SeqInput(seq, [5], logits="last")])
        except ValueError as e:
            raised = e
        assert raised is not None and "context length" in str(raised)
    finally:
        backend.close()


def test_the_benchmark_peer_decodes_on_the_same_thread(tmp_path, monkeypatch):
    from specserve.bench.peers import _greedy

    seen = _decoding_threads(monkeypatch)
    ours = LlamaCppBackend(save_tiny_gguf(tmp_path), max_context=64)
    seq = ours.new_sequence()
    worker = threading.Thread(target=ours.forward, args=([SeqInput(seq, [5, 6], logits="last")],))
    worker.start()  # our engine steps on its worker thread, the peer runs on the caller's
    worker.join()
    peer = llama_cpp.Llama(model_path=str(ours.path), n_ctx=64, verbose=False)

    class Clock:
        def emitted(self, n: int) -> None:
            pass

    out = _greedy(peer, [5, 6, 7], 4, set(), Clock())
    peer.close()
    ours.close()
    assert len(out) == 4
    assert len(seen) >= 2 and len(set(seen)) == 1, seen


def _on_threads(fn, *calls) -> None:
    """fn(*args) on the caller's thread for the first call, then each other on a thread of its own."""
    fn(*calls[0])
    for args in calls[1:]:
        t = threading.Thread(target=fn, args=args)
        t.start()
        t.join()


def test_transformers_forwards_run_on_one_thread_without_autograd():
    model = tiny_model("qwen2", 0)
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append((threading.current_thread(), torch.is_grad_enabled())))
    backend = TransformersBackend(model)
    seq = backend.new_sequence()
    rows = []
    _on_threads(
        lambda ids: rows.append(backend.forward([SeqInput(seq, ids, logits="last")])[0]), ([5, 6],), ([7],), ([8],)
    )
    assert len(seen) == 3 and len({t for t, _ in seen}) == 1, seen
    assert not any(grad for _, grad in seen)  # inference mode holds on the thread that computes
    assert [r.shape[0] for r in rows] == [1, 1, 1]


def test_engine_steps_run_on_the_compute_thread(tmp_path):
    """The engine's own torch ops (sampling, verification) share the forwards' thread, whether
    `LLM.generate` steps it on the caller's thread or the server's worker does."""
    from specserve import LLM, SamplingParams

    llm = LLM(model=save_tiny_gguf(tmp_path), draft_model="none")
    seen = []
    core = llm.engine.core
    step = core._step

    def spy():
        seen.append(threading.current_thread())
        return step()

    core._step = spy
    params = SamplingParams(max_tokens=3, temperature=0.0)
    _on_threads(lambda: llm.generate([5, 6, 7], params, speculation="none"), (), ())
    assert len(seen) >= 6 and len(set(seen)) == 1, seen
    assert seen[0] is not threading.current_thread()


def test_a_forked_child_gets_its_own_compute_thread():
    """A child forked after the parent started its compute thread has no such thread: handing it
    work would wait forever unless the child starts its own."""
    import os

    from specserve.backends.compute import on_compute_thread

    assert on_compute_thread(lambda: 1) == 1  # the parent's thread exists now
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the work ran
        code = 1
        try:
            code = 0 if on_compute_thread(lambda: 2) == 2 else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's work never ran")
