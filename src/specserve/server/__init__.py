"""The OpenAI-compatible HTTP server over the engine.

app.py         FastAPI routes, jobs, streaming, errors (talks to engine.client.EngineClient)
schemas.py     the request bodies as strict pydantic models
protocol.py    a validated request -> a `Prepared` engine job (prompt, params, speculation, grammar)
responses.py   response bodies and SSE chunks per endpoint (`Dialect`), usage, tool-call deltas
responses_api.py  `POST /v1/responses`: a Responses request rewritten as a chat one, and its shapes
tokenize.py    `/tokenize`, `/detokenize`, `/tokenizer_info` (vLLM's shapes)
errors.py      `APIError` (OpenAI's error shape); invalid bodies and engine exceptions mapped onto it
logprobs.py    token id -> the text and bytes OpenAI's logprobs show
structured.py  response_format / structured_outputs -> grammars; n choices
tools.py       tool definitions, tool_choice, the forcing grammar and <tool_call> parsing
metrics.py     Prometheus series (speculation per source, batch size, KV cache use, queue)
body_limit.py  the request-body cap (413)   openapi.py  the /openapi.json schema
ray_serve.py   `serve --ray`: replicas behind Ray Serve
launch.py      `specserve serve` as a child process on a free port (tests, `bench --load-via server`, scripts)
faults.py      faults injected on purpose (SPECSERVE_FAULT_INJECT=1): tests reach the failure paths
"""
