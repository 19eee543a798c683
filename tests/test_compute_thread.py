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

import os
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


# -- no torch op of size V off the compute thread ---------------------------------------------
# One parallel torch op on another thread is enough: its OpenMP team stays for the thread's life,
# and every later decoding step of the process pays (2-core EPYC, Qwen 1.5B at 2k cached tokens:
# 19.5 tokens/s before one `argmax` over [160, 151936] on the main thread, 14.4 after).
QWEN_VOCAB = 151936


def _threads_left_by(fn) -> int:
    """OS threads that fn(), run on a fresh thread with torch allowed 2 threads, leaves running
    while that thread lives (an OpenMP team's workers)."""
    left = []

    def run() -> None:
        before = set(os.listdir("/proc/self/task"))
        fn()
        left.append(len(set(os.listdir("/proc/self/task")) - before))

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # conftest allows 1, with which torch never starts a team
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    finally:
        torch.set_num_threads(threads)
    return left[0]


def test_the_probe_sees_a_torch_team():
    """The probe itself can fail: a torch fill of [V] on a new thread leaves a team behind."""
    assert _threads_left_by(lambda: torch.zeros(QWEN_VOCAB, dtype=torch.bool)) >= 1


def test_a_grammar_ban_list_starts_no_team():
    """Constraint bans are built on a grammar-compiling thread (engine/constrain/factory.py)."""
    from types import SimpleNamespace

    from specserve.engine.constrain import ConstraintFactory

    factory = SimpleNamespace(
        vocab_size=QWEN_VOCAB, decoded=[b"a", b"\n"] * (QWEN_VOCAB // 2), _bans={}, _bans_lock=threading.Lock()
    )
    bans = []
    assert _threads_left_by(lambda: bans.append(ConstraintFactory.banned(factory, "\n"))) == 0
    assert bans[0].shape == (QWEN_VOCAB,) and int(bans[0].sum()) == QWEN_VOCAB // 2 and bool(bans[0][1])


def test_prices_are_measured_on_the_compute_thread(tmp_path, monkeypatch):
    """Calibration (timed passes, then the draft model's agreement: an argmax over [T, V] rows)
    runs where the forwards do, whichever thread asks for the prices (the main thread at load)."""
    from specserve import LLM
    from specserve.engine import core as core_module

    seen = []

    def measured(target, draft, batched, calibrate):
        seen.append(threading.current_thread())
        return calibrate()  # no price cache: measure

    monkeypatch.setattr(core_module, "measured", measured)
    gguf = save_tiny_gguf(tmp_path)
    llm = LLM(model=gguf, draft_model=gguf)
    assert len(seen) == 1 and seen[0].name.startswith("specserve-compute"), seen
    assert llm.engine.core.measured_prices.agreement == 1.0  # the draft model is the target


def test_models_are_loaded_on_the_compute_thread(tmp_path, monkeypatch):
    from specserve.models import loader

    seen = []
    load = loader._load_llamacpp

    def spy(*args):
        seen.append(threading.current_thread())
        return load(*args)

    monkeypatch.setattr(loader, "_load_llamacpp", spy)
    loaded = loader.load(save_tiny_gguf(tmp_path), "target")
    loaded.backend.close()
    assert len(seen) == 1 and seen[0].name.startswith("specserve-compute"), seen


def test_the_benchmark_peer_is_built_on_the_compute_thread(tmp_path, monkeypatch):
    """Building a `Llama` loads (and may repack) weights: it runs where the peer decodes."""
    from types import SimpleNamespace

    from specserve.bench import peers

    seen = []

    class Spy:
        def __init__(self, **kwargs):
            seen.append(threading.current_thread())

    monkeypatch.setattr(llama_cpp, "Llama", Spy)
    monkeypatch.setattr(peers, "_LLAMAS", {})
    backend = SimpleNamespace(path=tmp_path / "model.gguf", max_context=4096, threads=1, gpu_layers=0)
    peers._llama(SimpleNamespace(target_backend=backend), False, 100)
    assert len(seen) == 1 and seen[0].name.startswith("specserve-compute"), seen
