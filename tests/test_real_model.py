"""The engine on real pretrained weights: the SmolLM2-135M-Instruct pack, on both backends:
transformers in float32 (de-quantized), and llama.cpp running the Q4_1 GGUF as it is, where
greedy exactness rests on the backend's batch-invariant settings (docs/design.md).

A real byte-level BPE tokenizer exercises what the tiny test tokenizer cannot: multi-byte
characters split across tokens, and edits whose text tokenizes differently in context than
in the prediction (the re-anchoring seam).
"""

import pytest

from specserve import SamplingParams
from specserve.bench.curves import LLAMACPP_2CORE_CURVE
from specserve.engine.governor import CostModel
from specserve.llm import LLM

CURVE = CostModel(LLAMACPP_2CORE_CURVE)  # the fixed prices every model here drafts with

CODE = """def total_price(items):
    total = 0
    for item in items:
        total += item["price"] * item["quantity"]
    return total


def format_price(value):
    return f"${value:.2f}"
"""


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def llm(request, smol_hf_dir, smol_gguf):
    """The pack on each backend, priced by a fixed curve: draft lengths follow the engine's
    prices, and a measurement taken while another test worker loads the CPU can say anything
    (the real calibration is tested in test_governor.py)."""
    if request.param == "llama.cpp":  # (speculation "none" at load: no measurement; each test names its method)
        llm = LLM(model=str(smol_gguf), exact=True, speculation="none")
        assert llm.backend_name == "llama.cpp"
    else:
        llm = LLM(model=str(smol_hf_dir), dtype="float32", speculation="none")
    llm.engine.use_prices(CURVE)
    return llm


def chat(llm, instruction, **kw):
    messages = [{"role": "user", "content": f"{instruction}\n\n```python\n{CODE}```"}]
    return llm.chat(messages, SamplingParams(max_tokens=120), **kw)


def test_chat_template_is_applied(llm):
    ids = llm.apply_chat_template([{"role": "user", "content": "hi"}])
    text = llm.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")


def test_predicted_outputs_on_real_model_are_exact_and_accepted(llm):
    instruction = "Add type hints to this code."
    base = chat(llm, instruction, speculation="none")
    for method in ("prediction", "auto", "ngram"):
        out = chat(llm, instruction, prediction=CODE, speculation=method)
        assert out.token_ids == base.token_ids, method
        assert out.text == base.text
    # where verifying is nearly free (a GPU), the drafter drafts long and most tokens come from it
    llm.engine.use_prices(CostModel.linear(0.02))
    try:
        cheap = chat(llm, instruction, prediction=CODE, speculation="prediction")
    finally:
        llm.engine.use_prices(CURVE)
    pred = cheap.stats.by_source["prediction"]
    assert pred.accepted >= 0.4 * len(cheap.token_ids), cheap.stats.to_dict()
    assert cheap.stats.tokens_per_step > 2.0
    # on the fixture's CPU curve it drafts what pays there: cheaper at that curve than the long drafts
    priced = chat(llm, instruction, prediction=CODE, speculation="prediction")
    assert priced.token_ids == base.token_ids

    def cost(out) -> float:
        return sum(CURVE.target(s["proposed"] + 1) for s in out.steps)

    assert cost(priced) < cost(cheap), (priced.steps, cheap.steps)


def test_non_ascii_stream_is_exact(llm):
    prompt = "Translate to French and Japanese: 'The café is open.' →"
    base = llm.generate(prompt, SamplingParams(max_tokens=40), speculation="none")
    gen = llm.stream(prompt, SamplingParams(max_tokens=40), prediction=base.text, speculation="prediction")
    text = "".join(e.text for e in gen)
    assert gen.output.token_ids == base.token_ids and text == base.text
    assert "\ufffd" not in text


ASKS = [
    "Write a Python function that reverses a linked list, with comments.",
    "Explain what a hash table is, and give a short example in Python.",
    "List five ways to speed up a slow SQL query.",
    "Write a bash script that counts the lines of every .py file in a folder.",
]


def test_requests_speculating_together_answer_as_they_do_alone(llm):
    """Four greedy requests drafting by n-gram in one batch: their drafts are rejected at
    different steps, so on llama.cpp each frees cells between the others' (before 2026-12-04, 2 to
    3 of these 4 answers left their solo runs there: tokens landed in freed cells below their own,
    and flash attention sums in cell order; LLAMA_KV_CELL_ORDER places them above)."""
    prompts = [llm.apply_chat_template([{"role": "user", "content": ask}]) for ask in ASKS]
    params = SamplingParams(max_tokens=160, temperature=0)
    alone = [llm.generate(p, params, speculation="ngram") for p in prompts]
    together = llm.generate(prompts, [params] * len(prompts), speculation="ngram")
    rejected = sum(s.proposed - s.accepted for out in together for s in out.stats.by_source.values())
    assert rejected > 0  # drafts were rejected, so cells were freed while others ran
    for ask, a, t in zip(ASKS, alone, together):
        assert t.token_ids == a.token_ids, ask
