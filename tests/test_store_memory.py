"""The stores' bound is on memory, and what they hold in memory must be about what they count.

Kept as Python dicts and strings, a stored chat completion took 5.6 times its JSON (5,155 bytes
for 917, measured in a soak), so a store bounded at 64 MB could hold about 360 MB. The heavy parts
are now kept packed (lru_store.Packed), and each entry counts its pickle plus a fixed overhead
(lru_store.pack): counted as JSON alone, small entries still held 1.8x their count. The memory is
measured with tracemalloc: every Python allocation the entries keep, none of the interpreter's
noise outside the window. Small entries (the overhead matters most) and large ones (the pickle
does) are both within 25% of their count.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from specserve.server.chat_store import ChatCompletionStore
from specserve.server.responses_api import ResponseStore

ENTRIES = 200
MAX_SHARE = 1.25  # memory kept / bytes counted: 5.6 when the bodies were kept as objects, 1.8 counted as JSON
MIN_SHARE = 0.75  # a count far above the memory would drop entries the bound has room for


def _chat_body(i: int, lines: int = 1) -> tuple[dict, list[dict]]:
    """A chat completion's body and the messages it answered, the shapes and sizes a real one has
    (`lines`: how many lines of code the answer holds)."""
    body = {
        "id": f"chatcmpl-{i:08d}",
        "object": "chat.completion",
        "created": 1765000000 + i,
        "model": "qwen2.5-coder-1.5b-instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"def add_{i}(a, b):\n    return a + b\n" * lines},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 14, "total_tokens": 45},
    }
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": f"Write a function add_{i} that adds two numbers."},
    ]
    return body, messages


def _kept_share(put, counted) -> float:
    """Python memory the store keeps after ENTRIES puts, over the JSON bytes it counts for them."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(ENTRIES):
            put(i)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return kept / counted()


@pytest.mark.parametrize("lines", [1, 300])
def test_stored_chat_completions_take_about_their_counted_size(lines):
    store = ChatCompletionStore(max_bytes=1 << 30)

    def put(i):
        body, messages = _chat_body(i, lines)
        store.put(body, messages, {"run": str(i)})

    share = _kept_share(put, lambda: store._kept.size)
    assert MIN_SHARE < share < MAX_SHARE, f"the store keeps {share:.2f}x the bytes it counts"
    assert store.get("chatcmpl-00000007")["choices"][0]["message"]["content"].startswith("def add_7")
    assert store.messages("chatcmpl-00000007")[1]["content"].endswith("add_7 that adds two numbers.")


@pytest.mark.parametrize("lines", [1, 300])
def test_stored_responses_take_about_their_counted_size(lines):
    store = ResponseStore(max_chars=1 << 30)

    def put(i):
        chat, messages = _chat_body(i, lines)
        body = {"id": f"resp_{i:08d}", "object": "response", "model": chat["model"], "output": [
            {"id": f"msg_{i:08d}", "type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": chat["choices"][0]["message"]["content"]}]},
        ]}  # fmt: skip
        store.put(body["id"], messages, body, [{"type": "message", **m} for m in messages])

    share = _kept_share(put, lambda: store._kept.size)
    assert MIN_SHARE < share < MAX_SHARE, f"the store keeps {share:.2f}x the bytes it counts"
    assert store.item("msg_00000007")["content"][0]["text"].startswith("def add_7")
    assert store.input_items("resp_00000007")[0]["content"] == "You write Python."


def test_a_body_read_from_the_store_is_a_copy():
    """Changing what a read gave back changes nothing kept (a kept dict used to be handed out)."""
    store = ChatCompletionStore()
    body, messages = _chat_body(1)
    store.put(body, messages, None)
    store.get(body["id"])["choices"].clear()
    assert store.get(body["id"])["choices"], "a caller's change reached the stored body"
