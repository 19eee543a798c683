"""The openai SDK over an in-process server on the tiny model: what the Responses tests that walk
the SDK each built in their own fixture (the model, the app behind a TestClient, the client)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient
from tiny import tiny_model, tiny_tokenizer

from specserve.llm import LLM
from specserve.server.app import create_app

MODEL = "tiny"  # the name the app serves the tiny model as


def tiny_llm() -> LLM:
    """The tiny model, without speculation (a test of the API, not of drafting)."""
    return LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")


@contextlib.contextmanager
def sdk_client(llm: LLM) -> Iterator[openai.OpenAI]:
    """An openai client whose requests reach an app serving `llm` in this process (no retries:
    a test sees the first answer)."""
    with TestClient(create_app(llm, MODEL)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def sdk_fixtures():
    """A test module's `llm` (the tiny model) and `client` (an openai client over an app serving
    it) fixtures, module-scoped: `llm, client = sdk_fixtures()` at its top level makes them that
    module's own, each module with its own model and app. (Imported as plain fixtures, their names
    would shadow the imports in every test's arguments, which the linter refuses.)"""

    @pytest.fixture(scope="module", name="llm")
    def llm_fixture() -> LLM:
        return tiny_llm()

    @pytest.fixture(scope="module", name="client")
    def client_fixture(llm: LLM) -> Iterator[openai.OpenAI]:
        with sdk_client(llm) as sdk:
            yield sdk

    return llm_fixture, client_fixture
