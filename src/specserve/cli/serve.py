"""`specserve serve`: load the models, then run the OpenAI-compatible HTTP server.

    specserve serve                                  # default packs, http://127.0.0.1:8000/v1
    specserve serve --model smollm2-135m-instruct --dtype float32 --port 8080 --api-key secret

Heavy imports (torch, transformers, fastapi) happen in `run`, so `specserve --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from ..config import METHODS
from ..server import ray_serve as serve_ray
from .argtypes import api_key, non_negative_int, non_negative_seconds, port, positive_int
from .flagnames import flag_errors
from .generate import add_engine_args, add_model_args, check_model_paths, engine_limits, load_options


def add_parser(subparsers) -> None:
    """Register the `serve` subcommand (contract with cli/main.py)."""
    p = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="Serve /v1/chat/completions, /v1/completions and /v1/responses (with "
        "Predicted Outputs), /v1/models, /health and /metrics.",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="port to bind (default 8000)")
    p.add_argument(
        "--api-key",
        type=api_key,
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health, /metrics and the OpenAPI docs "
        "(default: $SPECSERVE_API_KEY, else open)",
    )
    p.add_argument("--speculation", default="auto", choices=METHODS, help="default speculation method (default auto)")
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help="starting number of draft tokens per step (each source adapts it)",
    )
    add_engine_args(p)
    p.add_argument(
        "--max-queue",
        type=non_negative_int,
        default=16,
        help="requests allowed to wait for a place in the running batch; beyond that 429 (default 16)",
    )
    p.add_argument(
        "--request-timeout",
        type=non_negative_seconds,
        default=600.0,
        metavar="SECONDS",
        help="per-request deadline from arrival, queue wait included; 0 = none (default 600)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        metavar="BYTES",
        help="refuse request bodies larger than this with 413 (default: 2 x 64 B x context + 1 MiB)",
    )
    p.add_argument(
        "--host-cache-dir",
        default=None,
        metavar="DIR",
        help="write the prefix cache's host tier to DIR as it changes (every 30 s) and when the server "
        "stops, and read it back when it starts, so conversations stay warm across restarts and "
        "crashes (default: off)",
    )
    p.add_argument("--served-model-name", default=None, help="model id clients send (default: the model's name)")
    p.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default info)",
    )
    serve_ray.add_arguments(p)
    p.set_defaults(func=run)


def check_address(host: str, port: int) -> None:
    """Fail now, in one line, when host:port cannot be listened on (taken, or no such address),
    not after the minutes a model takes to load and calibrate. Bound the way uvicorn binds
    (SO_REUSEADDR), so what passes here is what uvicorn can take."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as e:  # socket.gaierror included
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def base_url_line(host: str, port: int, model: str, api_key: bool) -> str:
    """The start-up line that says what to give a client: the OpenAI base URL (with /v1, which
    the openai SDK does not add; uvicorn's own line, "Uvicorn running on http://127.0.0.1:8000",
    has none, and a client given that address got 404s) and the model id to send. A wildcard
    host is reached through loopback on this machine."""
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    shown = f"[{local}]" if ":" in local else local
    everywhere = " (listening on every address)" if local != host else ""
    key = ", with the API key as the bearer token" if api_key else ""
    return f"OpenAI base URL: http://{shown}:{port}/v1{everywhere}; model {model!r}{key}"


RAY_FLAGS = ("ray_address", "replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "replica_cpus")


def check_ray_flags(args: argparse.Namespace) -> None:
    """Ray flags without --ray are refused: they were ignored, and `serve --replicas 4` served one
    process while its user counted on four."""
    if args.ray:
        return
    given = [name for name in RAY_FLAGS if getattr(args, name) is not None]  # None: not given
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: Ray Serve flags, which need --ray")


def speculation_config(args: argparse.Namespace):
    """The --speculation / -k flags as a SpeculationConfig; a bad value is an error naming the flag.
    Checked with --ray too, before the cluster starts: each replica refused it only after Ray had
    started, as "num_speculative_tokens must be in [1, 256]", the config field's name."""
    from ..config import SpeculationConfig

    with flag_errors():
        return SpeculationConfig(method=args.speculation, num_speculative_tokens=args.num_speculative_tokens)


def run(args: argparse.Namespace) -> int:
    """Load the LLM and serve until interrupted (or hand over to Ray Serve with --ray)."""
    check_model_paths(args)
    check_ray_flags(args)
    if args.ray and args.ray_address is None:  # the local cluster's proxy listens here (a taken port was
        check_address(args.host, args.port)  # a Ray traceback, "Failed to bind", after the cluster started)
    speculation, loading = speculation_config(args), load_options(args)  # --ray: what each replica loads
    if args.ray:
        return serve_ray.run(args, engine_limits(args))
    check_address(args.host, args.port)
    folder = Path(args.host_cache_dir).expanduser() if args.host_cache_dir else None
    if folder is not None and folder.exists() and not folder.is_dir():
        raise ValueError(f"--host-cache-dir {args.host_cache_dir} is a file, not a folder")
    from ..llm import LLM
    from ..server.app import ServerOptions, serve

    options = ServerOptions(
        api_key=args.api_key or os.environ.get("SPECSERVE_API_KEY") or None,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout or None,
        max_body_bytes=args.max_body_bytes,
    )
    llm = LLM.from_options(args.model, args.draft_model, loading, speculation, engine_limits(args))
    core = llm.engine.core
    if core.host is not None:
        print(
            f"prefix cache: entries leaving the KV cache are kept in host memory, up to "
            f"{core.host.budget / 2**30:.1f} GiB (--host-cache-gib)",
            file=sys.stderr,
        )
    if core.host_store is not None:
        print(
            f"prefix cache: {len(core.host.saved)} entries read from {core.host_store.folder}; "
            "the host tier is written there every 30 s while it changes and when the server stops",
            file=sys.stderr,
        )
    elif args.host_cache_dir and core.host is None:  # otherwise the engine has said why (host_store_refused)
        print(
            "prefix cache: --host-cache-dir ignored: there is no host tier "
            f"(--no-prefix-cache, or {llm.backend_name} cannot copy a cache out)",
            file=sys.stderr,
        )
    name = args.served_model_name or llm.model_name
    print(base_url_line(args.host, args.port, name, options.api_key is not None), file=sys.stderr, flush=True)
    serve(llm, args.host, args.port, options, args.served_model_name, args.log_level)
    return 0
