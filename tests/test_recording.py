"""backends/recording.py: the decoding rows a backend returns, recorded for scripts and tests that
compare two runs' logits (scripts/sampled_divergence.py, tests/test_prefix_cache_sampled.py kept a
copy each)."""

from __future__ import annotations

from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.backends.recording import record_rows
from specserve.llm import LLM


def test_each_decoding_step_s_row_is_recorded_and_picks_its_token():
    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), speculation="none")
    rows = record_rows(llm.engine.core.target)
    out = llm.generate("def add(a, b):", SamplingParams(max_tokens=6, temperature=0))
    assert len(rows) == len(out.token_ids) == 6  # one row a step: the prefill's chunk feeds no other
    assert [int(row.argmax()) for row in rows] == out.token_ids
    assert rows[0].dim() == 1 and rows[0].shape[0] == llm.vocab_size
