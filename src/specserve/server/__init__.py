"""The OpenAI-compatible HTTP server over the engine.

    app.py         FastAPI routes, jobs, streaming, errors (talks to engine.client.EngineClient)
    protocol.py    request parsing and validation, response and SSE chunk shapes
    structured.py  response_format / structured_outputs -> grammars; n choices
    tools.py       tool definitions, tool_choice, templating and <tool_call> parsing
    metrics.py     Prometheus series (speculation per source, batch size, KV cache use, queue)
    body_limit.py  the request-body cap (413)   openapi.py  the /openapi.json schema
    ray_serve.py   `serve --ray`: replicas behind Ray Serve
"""
