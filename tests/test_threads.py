"""Tokenizers across threads (issue 17, item 1): no tokenizer object is ever called from two threads.

The server tokenizes prompts and predictions on its prep thread, names logprob tokens on the
event loop and detokenizes (and re-anchors predictions) on the engine worker. A fast tokenizer
shared by those threads can fail ("Already borrowed") or silently return wrong ids when one
thread changes its settings while another encodes. `engine/tokenizer.py` gives each thread its
own copy; these tests check the invariant that makes the race impossible.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve import LLM
from specserve.backends.transformers import TransformersBackend
from specserve.config import EngineLimits
from specserve.engine.tokenizer import PerThreadTokenizer, per_thread, shared
from specserve.server.app import ServerOptions, create_app

LONG_TEXT = "def get_user(self, user_id):\n    return self.db.find(user_id)\n" * 300
CALLED = ("__call__", "encode", "decode", "batch_decode", "apply_chat_template", "convert_ids_to_tokens")


class ThreadLog:
    """Which threads called each tokenizer object (a copy made by deepcopy is a new object)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads: dict[int, set[str]] = {}  # id(tokenizer) -> thread names
        self.keep: list = []  # keeps logged objects alive, so their ids stay unique

    def record(self, tok) -> None:
        with self.lock:
            if id(tok) not in self.threads:
                self.keep.append(tok)
            self.threads.setdefault(id(tok), set()).add(threading.current_thread().name)

    def shared_objects(self) -> list[set[str]]:
        return [names for names in self.threads.values() if len(names) > 1]


def _logged(method, log: ThreadLog):
    """`method`, recording its calling thread in `log` first."""

    def wrapper(self, *args, **kwargs):
        log.record(self)
        return method(self, *args, **kwargs)

    return wrapper


def logged_tokenizer(log: ThreadLog):
    """A copy of the tiny tokenizer whose public entry points record their calling thread."""
    tok = copy.deepcopy(tiny_tokenizer())
    base = type(tok)
    methods = {}
    for name in CALLED:
        methods[name] = _logged(getattr(base, name), log)
    tok.__class__ = type("Logged" + base.__name__, (base,), methods)
    return tok


def test_each_thread_gets_its_own_copy():
    tok = per_thread(tiny_tokenizer())
    assert per_thread(tok) is tok and shared(tok) is tiny_tokenizer()
    mine = tok.thread_copy()
    with ThreadPoolExecutor(3) as pool:
        theirs = list(pool.map(lambda _: id(tok.thread_copy()), range(30)))
    assert mine is tok.thread_copy() and mine is not tiny_tokenizer()
    assert id(mine) not in theirs and len(set(theirs)) <= 3
    ids = tok.encode("Le café coûte 3 €.", add_special_tokens=False)
    assert tok.decode(ids) == "Le café coûte 3 €." and len(tok) == len(tiny_tokenizer())
    with pytest.raises(AttributeError, match="per-thread"):
        tok.chat_template = "x"


def test_settings_changed_by_one_thread_do_not_reach_another():
    """Direct stress of one tokenizer from several threads: one toggles truncation (transformers
    rewrites the Rust tokenizer's settings on the way in) while others encode long texts. Shared,
    some of the long encodes come back truncated or raise; with one copy per thread none do."""
    tok = per_thread(tiny_tokenizer())
    full = len(tiny_tokenizer().encode(LONG_TEXT, add_special_tokens=False))
    rounds = 40

    def encoder(_):
        return [
            len(tok(LONG_TEXT, add_special_tokens=False, return_offsets_mapping=True)["input_ids"])
            for _ in range(rounds)
        ]

    def toggler(_):
        for _ in range(rounds * 20):
            tok.encode("hello world " * 20, truncation=True, max_length=5)
            tok.encode("hello world " * 20)
        return []

    with ThreadPoolExecutor(4) as pool:
        lengths = [n for got in pool.map(lambda f: f(0), [encoder, encoder, encoder, toggler]) for n in got]
    assert lengths == [full] * (3 * rounds)


def test_server_threads_never_share_a_tokenizer():
    """Many concurrent long predictions (tokenized on the prep thread, re-anchored on the worker),
    some streamed with logprobs (token names on the event loop), while the worker streams: every
    tokenizer object that gets called is called from one thread only, and every request succeeds."""
    log = ThreadLog()
    llm = LLM.from_backends(
        TransformersBackend(tiny_model()), logged_tokenizer(log), name="tiny", limits=EngineLimits(max_num_seqs=4)
    )
    app = create_app(llm, "tiny", ServerOptions(max_queue=64))
    base = LONG_TEXT[:900]

    def one(i: int):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Rewrite {i}:\n{base}"}],
            "max_tokens": 24,
            "temperature": 0,
            "prediction": {"type": "content", "content": base[i:]},
            "stream": i % 2 == 0,
            "logprobs": i % 3 == 0,
            "top_logprobs": 2 if i % 3 == 0 else None,
        }
        r = client.post("/v1/chat/completions", json=body)
        return r.status_code, r.text[:300]

    with TestClient(app) as client, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(24)))
    assert [s for s, _ in results] == [200] * 24, results
    assert len(log.threads) >= 3  # the prep thread, the worker, the event loop: one copy each
    assert log.shared_objects() == []
    assert isinstance(llm.tokenizer, PerThreadTokenizer)


def test_the_copies_a_first_request_needs_are_made_at_load():
    """Copying Qwen2.5's tokenizer takes 0.7-0.8 s a thread: the threads a request crosses (the
    caller, the compute thread that steps, the server's prep thread) get theirs before any request,
    so a fresh server's first request does not wait for them (it took 2.8-4.1 s, against 0.14 s
    for the next, on the 1.5B pack)."""
    from specserve.backends.compute import on_compute_thread

    llm = LLM.from_backends(TransformersBackend(tiny_model()), tiny_tokenizer(), name="tiny")
    tok = llm.tokenizer

    def has_copy() -> bool:
        return hasattr(tok._local, "tok")

    assert has_copy() and on_compute_thread(has_copy)
    app = create_app(llm, "tiny", ServerOptions())
    with TestClient(app):
        assert app.state.server.prep.submit(has_copy).result()
