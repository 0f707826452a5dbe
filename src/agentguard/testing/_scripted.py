"""ScriptedModel: a model that answers from a script and fails on demand.

It speaks two ways: directly as a :class:`~agentguard.transport.Transport` (``send``,
``stream`` and their async twins), and over HTTP as an OpenAI-compatible endpoint behind an
httpx or httpx2 ``MockTransport`` (:meth:`ScriptedModel.mock_transport`), so the *real* openai
client can be tested against it with no network; or on a real loopback port
(:meth:`ScriptedModel.serve`) for clients and servers that cannot take a transport (LiteLLM,
its proxy, other processes).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any, Literal, TypeAlias

from agentguard.exceptions import ModelError, ModelTimeout
from agentguard.transport import ModelRequest, ModelResponse, StreamChunk
from agentguard.types import Usage

__all__ = ["Fault", "Reply", "ScriptExhausted", "ScriptedModel", "Step"]

EmbedStyle = Literal[
    "hermes", "hermes_unclosed", "function_tag", "python_tag", "mistral", "fenced", "bare"
]


class ScriptExhausted(AssertionError):
    """The scripted model was asked for more answers than its script holds."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer.

    Attributes:
        content: the assistant text (``None`` for a pure tool-call answer).
        tool_calls: OpenAI ``tool_calls`` entries; ``arguments`` is sent verbatim, so broken JSON
            stays broken.
        finish_reason: defaults to ``tool_calls`` when there are calls, else ``stop``.
        usage: token usage to report; ``"auto"`` estimates it, ``None`` omits it (as some
            servers do).
    """

    content: str | None = None
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str | None = None
    usage: Usage | Literal["auto"] | None = "auto"

    @classmethod
    def text(cls, content: str, **kw: Any) -> Reply:
        """A plain text answer."""
        return cls(content=content, **kw)

    @classmethod
    def call(
        cls, name: str, arguments: Mapping[str, Any] | str, *, id: str | None = None, **kw: Any
    ) -> Reply:
        """One native tool call; ``arguments`` as a mapping (encoded) or a raw JSON text."""
        return cls.calls([(name, arguments, id)], **kw)

    @classmethod
    def calls(
        cls, calls: Sequence[tuple[str, Mapping[str, Any] | str, str | None]], **kw: Any
    ) -> Reply:
        """Several native tool calls in one answer: ``(name, arguments, id)`` each."""
        entries = []
        for i, (name, arguments, call_id) in enumerate(calls):
            args = arguments if isinstance(arguments, str) else json.dumps(arguments)
            entries.append(
                {
                    "id": call_id or f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
            )
        return cls(tool_calls=tuple(entries), **kw)

    @classmethod
    def embedded(
        cls, name: str, arguments: Mapping[str, Any], *, style: EmbedStyle = "hermes", **kw: Any
    ) -> Reply:
        """A tool call written into ``content`` instead of ``tool_calls``, as local models do."""
        args = json.dumps(arguments)
        payload = json.dumps({"name": name, "arguments": arguments})
        text = {
            "hermes": f"<tool_call>\n{payload}\n</tool_call>",
            "hermes_unclosed": f"<tool_call>\n{payload}",
            "function_tag": f"<function={name}>{args}</function>",
            "python_tag": "<|python_tag|>" + json.dumps({"name": name, "parameters": arguments}),
            "mistral": "[TOOL_CALLS] " + json.dumps([{"name": name, "arguments": arguments}]),
            "fenced": f"```json\n{payload}\n```",
            "bare": payload,
        }[style]
        return cls(content=text, **kw)

    @classmethod
    def degenerate(cls, phrase: str, times: int = 40, **kw: Any) -> Reply:
        """Text that degenerates into repeating ``phrase``, as tiny models do."""
        return cls(content=" ".join([phrase] * times), **kw)

    def message(self) -> dict[str, Any]:
        """This reply as an OpenAI assistant message."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        return msg

    def finish(self) -> str:
        """The finish reason this reply reports."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True, slots=True)
class Fault:
    """One scripted failure.

    Attributes:
        status: the HTTP status to answer with; ``None`` means no answer at all (a timeout).
        headers: response headers (``Retry-After``, ``retry-after-ms`` ...).
        message: the error message in the body.
    """

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    message: str = "scripted failure"

    @classmethod
    def rate_limit(
        cls, retry_after: float | None = 1.0, *, retry_after_ms: int | None = None
    ) -> Fault:
        """HTTP 429, with ``Retry-After`` (seconds) and/or ``retry-after-ms``."""
        headers = {}
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}"
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(retry_after_ms)
        return cls(429, headers, "Rate limit reached; please retry later.")

    @classmethod
    def server_error(cls, status: int = 500, message: str = "The server had an error.") -> Fault:
        """An HTTP 5xx answer."""
        return cls(status, {}, message)

    @classmethod
    def timeout(cls) -> Fault:
        """No answer in time."""
        return cls(None, {}, "scripted timeout")

    @classmethod
    def context_length(cls) -> Fault:
        """HTTP 400 "maximum context length", as long runs end on some servers."""
        return cls(400, {}, "This model's maximum context length is 4096 tokens.")


Step: TypeAlias = "Reply | Fault | Callable[[ModelRequest], Reply | Fault]"


class ScriptedModel:
    """A model that answers from a script, for tests, demos and benchmarks.

    Args:
        script: the steps, in order; or a mapping from model name to its own steps (``"*"``
            for any other model), so tiers can behave differently (a dead ``fast`` tier, a
            working ``premium`` one). A step is a :class:`Reply`, a :class:`Fault`, or a
            function of the request returning one.
        cycle: start again from the first step when a script runs out (default: raise
            :class:`ScriptExhausted`).
        chunk_size: characters per streamed content delta.

    Every request is recorded in :attr:`requests`, in order.
    """

    def __init__(
        self,
        script: Sequence[Step] | Mapping[str, Sequence[Step]],
        *,
        cycle: bool = False,
        chunk_size: int = 16,
    ) -> None:
        scripts = dict(script) if isinstance(script, Mapping) else {"*": list(script)}
        self._steps: dict[str, Iterator[Step]] = {
            model: (itertools.cycle(list(steps)) if cycle and steps else iter(list(steps)))
            for model, steps in scripts.items()
        }
        self._chunk_size = max(1, chunk_size)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: Every request received, in order.
        self.requests: list[ModelRequest] = []

    # -- the script ---------------------------------------------------------------------------

    def _next(self, request: ModelRequest) -> Reply | Fault:
        with self._lock:
            self.requests.append(request)
            steps = self._steps.get(request.model) or self._steps.get("*")
            step = next(steps, None) if steps is not None else None
        if step is None:
            raise ScriptExhausted(
                f"scripted model has no more steps for model {request.model!r} "
                f"(request #{len(self.requests)})"
            )
        return step(request) if callable(step) else step

    def _answer(self, request: ModelRequest) -> tuple[Reply, str]:
        step = self._next(request)
        if isinstance(step, Fault):
            if step.status is None:
                raise ModelTimeout(step.message, model=request.model)
            raise ModelError(
                f"HTTP {step.status}: {step.message}",
                status_code=step.status,
                headers=step.headers,
                model=request.model,
            )
        return step, f"chatcmpl-scripted-{next(self._ids)}"

    # -- Transport -----------------------------------------------------------------------------

    def send(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request`` with the next step (raising :class:`ModelError` for faults)."""
        reply, rid = self._answer(request)
        return ModelResponse.from_body(self._completion(request, reply, rid))

    async def asend(self, request: ModelRequest) -> ModelResponse:
        """Async twin of :meth:`send`."""
        return self.send(request)

    def stream(self, request: ModelRequest) -> Iterator[StreamChunk]:
        """Answer ``request`` as a stream of chunks."""
        reply, rid = self._answer(request)
        for body in self._chunks(request, reply, rid):
            yield StreamChunk.from_body(body)

    async def astream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Async twin of :meth:`stream`."""
        for chunk in self.stream(request):
            yield chunk

    # -- HTTP ----------------------------------------------------------------------------------

    def mock_transport(self, http: ModuleType) -> Any:
        """An ``http.MockTransport`` serving this model as an OpenAI-compatible endpoint.

        Args:
            http: the ``httpx`` or ``httpx2`` module (whichever the openai client in use runs on).

        Example::

            client = openai.OpenAI(api_key="sk-test", base_url="http://scripted/v1",
                                   http_client=httpx2.Client(transport=model.mock_transport(httpx2)))
        """

        def handler(req: Any) -> Any:
            return self._handle_http(http, req)

        return http.MockTransport(handler)

    def _handle_http(self, http: ModuleType, req: Any) -> Any:
        answer = self._http_answer(req.method, str(req.url.path), req.content)
        if answer is None:
            raise http.ReadTimeout("scripted timeout", request=req)
        status, headers, content = answer
        return http.Response(status, headers=headers, content=content)

    def _http_answer(
        self, method: str, path: str, content: bytes | None
    ) -> tuple[int, dict[str, str], bytes] | None:
        """Status, headers and body for one HTTP request; ``None`` for a scripted timeout."""
        responses_api = path.endswith("/responses")
        if method != "POST" or not (path.endswith("/chat/completions") or responses_api):
            return _json_answer(404, {"error": {"message": f"no route {path}"}})
        body = json.loads(content or b"{}")
        if responses_api:
            # the adapter's translation; importing it loads no SDK, and only a test server needs it
            from agentguard.integrations.openai import request_from_responses  # noqa: PLC0415

            request = request_from_responses(body)
        else:
            request = ModelRequest.from_body(body)
        try:
            step = self._next(request)
        except ScriptExhausted as exc:
            return _json_answer(500, {"error": {"message": str(exc), "type": "script_exhausted"}})
        if isinstance(step, Fault):
            if step.status is None:
                return None
            error = {"message": step.message, "type": "scripted", "code": step.status}
            return _json_answer(step.status, {"error": error}, step.headers)
        rid = f"chatcmpl-scripted-{next(self._ids)}"
        if responses_api:
            if body.get("stream"):
                error = {"message": "scripted: Responses streaming not served"}
                return _json_answer(400, {"error": error})
            return _json_answer(200, self._response_object(request, step, rid, body))
        if body.get("stream"):
            sse = "".join(f"data: {json.dumps(c)}\n\n" for c in self._chunks(request, step, rid))
            return 200, {"content-type": "text/event-stream"}, (sse + "data: [DONE]\n\n").encode()
        return _json_answer(200, self._completion(request, step, rid))

    @contextlib.contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve this model over real HTTP on loopback, for clients that cannot take a transport.

        A thread answers OpenAI ``POST .../chat/completions`` requests (also streamed) until the
        block ends; a scripted timeout closes the connection without an answer.

        Args:
            host: the address to listen on (keep it on loopback).
            port: the port; ``0`` picks a free one.

        Yields:
            the base URL to give a client, e.g. ``http://127.0.0.1:40123/v1``.
        """
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out as two writes: without TCP_NODELAY, Nagle's algorithm and
            # the client's delayed ACK add ~40 ms to every answer on a kept-alive connection
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                answer = model._http_answer("POST", self.path, self.rfile.read(length))
                self._reply(answer)

            def do_GET(self) -> None:
                self._reply(model._http_answer("GET", self.path, None))

            def _reply(self, answer: tuple[int, dict[str, str], bytes] | None) -> None:
                if answer is None:  # a timeout: no answer at all
                    self.close_connection = True
                    return
                status, headers, content = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: the script and model.requests say what happened

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True)
        thread.start()
        try:
            yield f"http://{host}:{server.server_port}/v1"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()

    # -- wire format ---------------------------------------------------------------------------

    def _usage(self, request: ModelRequest, reply: Reply) -> dict[str, int] | None:
        if reply.usage is None:
            return None
        if isinstance(reply.usage, Usage):
            usage = reply.usage
        else:  # estimate: ~4 characters per token, as the ledger's own heuristic
            prompt = len(json.dumps(list(request.messages), default=str)) // 4 + 1
            out = len(reply.content or "") + sum(
                len(str(c.get("function", {}).get("arguments", ""))) for c in reply.tool_calls
            )
            usage = Usage(prompt, out // 4 + 1)
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }

    def _completion(self, request: ModelRequest, reply: Reply, rid: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": reply.message(),
                    "finish_reason": reply.finish(),
                    "logprobs": None,
                }
            ],
        }
        usage = self._usage(request, reply)
        if usage is not None:
            body["usage"] = usage
        return body

    def _response_object(
        self, request: ModelRequest, reply: Reply, rid: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``reply`` as a Responses API ``response`` object (``body``: the request's)."""
        output: list[dict[str, Any]] = []
        if reply.content is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{rid}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.content, "annotations": []}],
                }
            )
        for i, call in enumerate(reply.tool_calls):
            fn = call.get("function", {})
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{rid}_{i}",
                    "call_id": call.get("id") or f"call_{i}",
                    "name": fn.get("name", ""),
                    "arguments": str(fn.get("arguments", "")),
                    "status": "completed",
                }
            )
        length = reply.finish() == "length"
        answer: dict[str, Any] = {
            "id": rid.replace("chatcmpl", "resp"),
            "object": "response",
            "created_at": 1_700_000_000,
            "model": request.model,
            "status": "incomplete" if length else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": request.params.get("tool_choice", "auto"),
            "tools": list(body.get("tools") or []),
        }
        usage = self._usage(request, reply)
        if usage is not None:
            answer["usage"] = {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"],
            }
        return answer

    def _chunks(self, request: ModelRequest, reply: Reply, rid: str) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": request.model,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }

        yield chunk({"role": "assistant", "content": ""})
        text = reply.content or ""
        for i in range(0, len(text), self._chunk_size):
            yield chunk({"content": text[i : i + self._chunk_size]})
        for index, call in enumerate(reply.tool_calls):
            fn = call.get("function", {})
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.get("id"),
                            "type": "function",
                            "function": {"name": fn.get("name"), "arguments": ""},
                        }
                    ]
                }
            )
            args = str(fn.get("arguments", ""))
            for i in range(0, len(args), self._chunk_size):
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "function": {"arguments": args[i : i + self._chunk_size]},
                            }
                        ]
                    }
                )
        yield chunk({}, reply.finish())
        options = request.params.get("stream_options") or {}
        usage = self._usage(request, reply)
        if usage is not None and isinstance(options, Mapping) and options.get("include_usage"):
            yield {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": request.model,
                "choices": [],
                "usage": usage,
            }


def _json_answer(
    status: int, body: Any, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return (
        status,
        {**(headers or {}), "content-type": "application/json"},
        json.dumps(body).encode(),
    )
