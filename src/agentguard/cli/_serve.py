"""``agentguard serve``: run the OpenAI-compatible guard server (Starlette on uvicorn)."""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import sys
from typing import Any

from agentguard._redact import redact
from agentguard.config import GuardConfig
from agentguard.exceptions import ConfigError


def register(sub: Any) -> None:
    """Add the ``serve`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run an OpenAI-compatible guard in front of an upstream",
        description="Serve /v1/chat/completions, /v1/responses and /v1/models through the "
        "guard, forwarding every other request to the upstream unchanged.",
    )
    parser.add_argument(
        "--upstream",
        help="the upstream's OpenAI base URL, e.g. http://127.0.0.1:11434/v1 (needed unless "
        "every tier of the configuration names its own base_url)",
    )
    parser.add_argument("--config", help="a configuration file (default: AGENTGUARD_CONFIG)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (0: any)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="upstream timeout in seconds (default 600)"
    )
    parser.add_argument(
        "--graceful-timeout",
        type=int,
        default=30,
        help="on SIGTERM, seconds to let open requests finish before they are cut and settled",
    )
    parser.add_argument("--log-level", default="warning", help="uvicorn's log level")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: PLC0415 - only this subcommand needs the serve extra

        from agentguard.serve import GuardServer, create_app  # noqa: PLC0415
    except ImportError:
        print('agentguard serve needs its extra: pip install "agentguard[serve]"', file=sys.stderr)
        return 2
    try:
        config = GuardConfig.load(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    upstream = args.upstream
    if not upstream:
        urls = {t.base_url for t in config.tiers.values()}
        if not config.tiers or None in urls:
            print(
                "agentguard serve: give --upstream (or a base_url for every tier)", file=sys.stderr
            )
            return 2
        upstream = sorted(u for u in urls if u)[0]
    app = create_app(GuardServer(config, upstream, timeout=args.timeout))
    _warm()
    # A long-lived server: what start-up built (the imported modules, the app) is never garbage,
    # so full collections, which stop the event loop, need not walk it again and again.
    gc.freeze()
    loop, http = _fastest()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=_log_config(uvicorn.config.LOGGING_CONFIG),
        # the access log's line per request only where the log level shows it
        access_log=args.log_level.lower() in ("trace", "debug", "info"),
        timeout_graceful_shutdown=args.graceful_timeout,
        lifespan="on",
        loop=loop,
        http=_protocol(http),
        # an answer passed on carries the upstream's Date and Server: uvicorn's own would go
        # out beside them, each header twice (the app dates its own answers, see _dated)
        server_header=False,
        date_header=False,
    )
    return 0


class RedactedRequestLine(logging.Filter):
    """Takes the secrets out of an access log line's request (``?key=...``, ``&api-key=...``,
    a key the server forwarded upstream: see :func:`agentguard._redact.redact`), keeping the
    line's arguments, which uvicorn's access formatter reads one by one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def _log_config(default: dict[str, Any]) -> dict[str, Any]:
    """uvicorn's logging configuration (``default``), its access log's lines redacted: a
    caller's key in a query string (Google's ``?key=``, Azure's ``?api-key=``) is never
    written to the log."""
    config = copy.deepcopy(default)
    config.setdefault("filters", {})["redacted"] = {"()": RedactedRequestLine}
    config["loggers"].setdefault("uvicorn.access", {})["filters"] = ["redacted"]
    return config


def _warm() -> None:
    """Build at start-up what the first requests would: the CAs of the upstream connections
    (about 20 ms) and the JSON Schema validator a request's tools are checked with (its import,
    about 35 ms). The first requests do not wait for them, and frozen with the rest of
    start-up, full collections never walk them."""
    from jsonschema import Draft202012Validator  # noqa: F401, PLC0415

    try:
        from agentguard.serve._aiohttp import ssl_context  # noqa: PLC0415
    except ImportError:  # no aiohttp: httpx's own transport reads them when it is made
        return
    ssl_context()


def _protocol(http: str) -> Any:
    """uvicorn's ``http``: on httptools, its protocol writing each answer's head with the start
    of its body (one write, not two: see :mod:`agentguard.serve._protocol`)."""
    if http != "httptools":
        return http
    try:
        from agentguard.serve._protocol import HttpToolsHeadWithBody  # noqa: PLC0415
    except ImportError:  # a uvicorn that moved its protocol: its own, two writes an answer
        return http
    return HttpToolsHeadWithBody


def _fastest() -> tuple[str, str]:
    """uvicorn's event loop and HTTP parser: uvloop and httptools (C, with ``uvicorn[standard]``)
    when installed, named explicitly so that their absence is not silent (uvicorn's pure-Python
    h11 parser costs the server more CPU per request)."""
    from importlib.util import find_spec  # noqa: PLC0415

    loop = "uvloop" if find_spec("uvloop") else "asyncio"
    http = "httptools" if find_spec("httptools") else "h11"
    if (loop, http) != ("uvloop", "httptools"):
        print(
            f"agentguard serve: running on {loop} and {http} (slower; uvloop and httptools "
            'come with pip install "agentguard[serve]")',
            file=sys.stderr,
        )
    return loop, http
