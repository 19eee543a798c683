"""Requests at the edges of the context: prompts of n_ctx - 1, n_ctx and n_ctx + 1 tokens, answers
that would run past the context's end, on both backends with a small context so it is cheap."""

from __future__ import annotations

import json
import warnings

import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer
from tiny_gguf import write_tiny_gguf

from specserve.config import SPARE_CELLS
from specserve.errors import ContextLengthError
from specserve.llm import LLM
from specserve.server.app import create_app

CTX = 64


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def client(request, tmp_path_factory):
    if request.param == "transformers":
        llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none", max_context=CTX)
    else:
        from specserve.backends.llamacpp import LlamaCppBackend

        path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
        backend = LlamaCppBackend(path, max_context=CTX, max_sequences=2, cache_tokens=CTX + SPARE_CELLS)
        llm = LLM.from_backends(backend, tiny_tokenizer())
    assert llm.max_context == CTX
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def _score(client, prompt: list[int]):
    return client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0},
    )


def test_a_prompt_that_fills_the_context_can_be_scored(client):
    """max_tokens 0 writes nothing the answer keeps, so a prompt of exactly the context length is
    scored (it was a 400, "the prompt has 64 tokens", as if it asked for one more token)."""
    prompt = [(7 * i) % 250 + 5 for i in range(CTX)]
    full = _score(client, prompt)
    assert full.status_code == 200, full.text
    scores = full.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert len(scores) == CTX and scores[0] is None
    shorter = _score(client, prompt[:-1]).json()["choices"][0]["logprobs"]["token_logprobs"]
    assert scores[:-1] == pytest.approx(shorter, abs=1e-4)  # each position reads only the tokens before it
    assert full.json()["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("max_tokens", [0, 1, None])
def test_a_prompt_over_the_context_is_refused(client, max_tokens):
    body = {"model": "tiny", "prompt": [5] * (CTX + 1), "echo": True}
    r = client.post("/v1/completions", json=body | ({} if max_tokens is None else {"max_tokens": max_tokens}))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_prompt_that_fills_the_context_leaves_no_room_for_an_answer(client):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5] * CTX, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_the_message_for_a_conversation_over_the_context_reads_right(client):
    """It said "the messages has 80 tokens" (found by `specserve edit` on a file over the context)."""
    messages = [{"role": "user", "content": "a b " * CTX}]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "but the messages have " in err["message"] and "messages has" not in err["message"]
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": [5] * (CTX + 1), "max_tokens": 1})
    assert f"but the prompt has {CTX + 1} tokens" in r.json()["error"]["message"]


def test_the_spare_sequence_gets_the_cells_that_measure_prices_not_a_context(tmp_path):
    """The engine hands out a full context to each sequence but the spare one, which measures
    prices on SPARE_CELLS; the default cache gave it a whole context as well, never used."""
    from specserve.backends.llamacpp import LlamaCppBackend

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    for sequences in (1, 2, 9):  # a bare backend; generate's one request; serve's eight
        b = LlamaCppBackend(path, max_sequences=sequences)
        want = b.max_context if sequences == 1 else b.max_context * (sequences - 1) + SPARE_CELLS
        assert b.cache_tokens == want, (sequences, b.cache_tokens)
        b.close()
    exact = LlamaCppBackend(path, max_sequences=9, batch_invariant=True)  # keeps a free context above
    assert exact.cache_tokens == 9 * exact.max_context
    exact.close()


def test_generate_allocates_one_request_s_cache(tmp_path, capsys):
    """`specserve generate` runs one request, but loaded the engine's default of 8 sequences and
    a cache of 9 contexts (73,728 cells, 1.6 GiB on SmolLM2): now one context and the spare cells."""
    from tiny_gguf import save_tiny_gguf

    from specserve.cli.main import main

    model = save_tiny_gguf(tmp_path / "pack")
    argv = ["generate", "def add(a, b):", "--model", model, "--max-tokens", "4", "--speculation", "none"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"KV cache {512 + SPARE_CELLS} cells" in err and "2 sequence ids" in err, err


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory):
    from tiny_gguf import save_tiny_gguf

    return save_tiny_gguf(tmp_path_factory.mktemp("pack"))


def _generate(tiny_pack, capsys, *flags):
    from specserve.cli.main import main

    code = main(["generate", "--model", tiny_pack, "--speculation", "none", "--max-context", "256", *flags])
    return code, capsys.readouterr()


def test_generate_refuses_max_tokens_the_context_cannot_hold(tiny_pack, capsys):
    """--max-tokens beyond what the context leaves was cut at the context's end without a word (the
    answer shorter than asked, finish "length"): a one-line error now, as the server's 400."""
    prompt = "hello " * 100
    n = len(tiny_tokenizer().encode(prompt))
    code, out = _generate(tiny_pack, capsys, prompt, "--max-tokens", str(256 - n + 1), "--json")
    assert code == 2 and out.out == "", out.out
    assert f"leaves {256 - n}; lower --max-tokens" in out.err and "Traceback" not in out.err, out.err
    code, out = _generate(tiny_pack, capsys, prompt, "--max-tokens", str(256 - n), "--json")
    assert code == 0, out.err
    assert len(json.loads(out.out)["token_ids"]) == 256 - n  # exactly what fits, still allowed


def test_generate_does_not_say_raise_max_context_at_the_model_s_own_context(tiny_pack, capsys):
    """At the context the model was trained on (the tiny pack's 512), raising --max-context does
    nothing (the backends cap it there), yet the error said "(or raise --max-context)"; it names the
    trained context now. Below it, raising --max-context still helps, and the hint says so."""
    from specserve.cli.main import main

    prompt = "hello " * 100
    n = len(tiny_tokenizer().encode(prompt))
    for ctx in ("512", "4096"):  # asked at, or over, what the model was trained on
        code = main(["generate", "--model", tiny_pack, "--speculation", "none", "--max-context", ctx, prompt,
                     "--max-tokens", str(512 - n + 1)])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and f"leaves {512 - n}; lower --max-tokens" in err, err
        assert "raise --max-context" not in err and "trained on 512 tokens" in err, err
        code = main(["generate", "--model", tiny_pack, "--speculation", "none", "--max-context", ctx, "hello " * 600])
        err = capsys.readouterr().err
        assert code == 2 and "no room is left" in err and "raise --max-context" not in err, err
    code, out = _generate(tiny_pack, capsys, prompt, "--max-tokens", str(256 - n + 1))
    assert code == 2 and "(or raise --max-context: the model was trained on 512 tokens)" in out.err, out.err


def test_generate_s_default_max_tokens_is_capped_to_what_the_context_leaves(tiny_pack, capsys):
    prompt = "hello " * 100
    n = len(tiny_tokenizer().encode(prompt))
    code, out = _generate(tiny_pack, capsys, prompt, "--json")
    assert code == 0, out.err
    assert len(json.loads(out.out)["token_ids"]) == 256 - n


def test_the_python_api_warns_when_max_tokens_is_cut_by_the_context(tiny_pack):
    """LLM.generate keeps vLLM's behaviour (the answer stops at the context's end), but says so."""
    from specserve.config import SamplingParams
    from specserve.llm import ContextCutWarning

    llm = LLM(tiny_pack, max_context=256, max_num_seqs=1, speculation="none")
    prompt = [5] * 250
    with pytest.warns(ContextCutWarning, match="max_tokens=20 does not fit.*at most 6"):
        out = llm.generate(prompt, SamplingParams(max_tokens=20))
    assert len(out.token_ids) == 6 and out.finish_reason == "length"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(llm.generate(prompt, SamplingParams(max_tokens=6)).token_ids) == 6
        assert len(llm.generate([5] * 256, SamplingParams(max_tokens=1)).token_ids) == 1  # a full prompt, one token
        with pytest.raises(ContextLengthError):  # refused, and not warned about as if it were cut
            llm.generate([5] * 257, SamplingParams(max_tokens=4))
    llm.close()


def test_a_max_context_over_the_model_s_is_capped_with_a_warning(tiny_pack, capsys):
    """The backends cap the context at the model's training context; that was silent."""
    llm = LLM(tiny_pack, max_context=1024, max_num_seqs=1, speculation="none")
    assert llm.max_context == 512
    assert "warning: --max-context 1024 is more than model.gguf was trained on: its context is 512" in (
        capsys.readouterr().err
    )
    llm.close()


def test_a_prompt_that_fills_a_kv_cache_smaller_than_the_context_can_be_scored(tmp_path):
    """With --kv-cache-tokens below the context, the server offers the cache's size as max_model_len;
    a scored prompt of that length holds exactly that many cells (the token written after it is
    never fed), but it was reserved one more and refused: "needs 101 cache cells ... holds 100"."""
    from specserve.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(write_tiny_gguf(tmp_path / "t.gguf"), max_sequences=2, cache_tokens=100 + SPARE_CELLS)
    llm = LLM.from_backends(backend, tiny_tokenizer())
    assert llm.max_context == 100 < backend.max_context
    with TestClient(create_app(llm, "tiny")) as c:
        r = _score(c, [(3 * i) % 250 + 5 for i in range(100)])
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) == 100
        body = {"model": "tiny", "prompt": [5] * 60, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        r = c.post("/v1/completions", json=body)  # prompt + max_tokens = the whole cache: still served
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40, r.text
    from specserve.config import SamplingParams

    with warnings.catch_warnings():  # refused for the cache, so not warned about as if it were cut
        warnings.simplefilter("error")
        with pytest.raises(ContextLengthError, match="cache holds 100"):
            llm.generate([5] * 60, SamplingParams(max_tokens=50))


def test_replay_measures_its_cost_on_one_request_s_cache(tiny_pack, tmp_path, capsys):
    """replay --measure-cost times one runner, but loaded the batching default's 8 sequences."""
    from specserve.cli.main import main

    (tmp_path / "a.py").write_text("def add(a, b):\n    return a + b\n")
    files = ["--prediction", str(tmp_path / "a.py"), "--output", str(tmp_path / "a.py")]
    assert main(["replay", *files, "--model", tiny_pack, "--measure-cost"]) == 0
    err = capsys.readouterr().err
    assert f"KV cache {512 + SPARE_CELLS} cells" in err and "2 sequence ids" in err, err


def test_a_scratch_sequence_may_fill_a_context_beside_cached_prefixes(tiny_pack):
    """Benchmarks score a whole answer on a spare sequence (engine.scratch). The spare sequence now
    has SPARE_CELLS of its own, not a context: the finished requests' cached prefixes must leave
    the cells first, or the pass runs out of cache (bench --quick: "llama_decode failed")."""
    from specserve.config import SamplingParams

    llm = LLM(tiny_pack, max_num_seqs=1, speculation="none")
    out = llm.generate([(3 * i) % 250 + 5 for i in range(400)], SamplingParams(max_tokens=100, ignore_eos=True))
    assert llm.engine.core.prefix.cells >= 400  # the answer's prefix stays cached
    with llm.engine.scratch() as runner:
        assert runner.forward(out.prompt_token_ids + out.token_ids[:-1], last_only=True)[-1].shape[-1] > 0
    assert llm.engine.context_cost(256).cached == 256  # times passes after half the context, beside no entry
    llm.close()
