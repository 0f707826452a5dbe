"""A recording OpenAI-compatible upstream for the real openai client (httpx or httpx2).

:class:`Upstream` serves a :class:`~agentguard.testing.ScriptedModel` through an HTTP mock
transport, records every request it receives (method, path, body bytes, headers), and also
streams Responses API answers (``stream: true`` on ``/responses``) as the server-sent events
OpenAI sends, which the scripted model itself does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from agentguard.testing import Reply, ScriptedModel


def response_events(response: dict[str, Any], chunk: int = 5) -> Iterator[dict[str, Any]]:
    """A Responses API ``response`` object as the events of its stream, in OpenAI's order."""
    seq = iter(range(10_000))
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    for kind in ("response.created", "response.in_progress"):
        yield {"type": kind, "sequence_number": next(seq), "response": opening}
    for index, item in enumerate(response.get("output") or []):
        where = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            added = {**item, "status": "in_progress", "content": []}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(seq),
                "output_index": index,
                "item": added,
            }
            for part_index, part in enumerate(item["content"]):
                at = {**where, "content_index": part_index}
                empty = {**part, "text": ""}
                yield {
                    "type": "response.content_part.added",
                    "sequence_number": next(seq),
                    **at,
                    "part": empty,
                }
                text = part["text"]
                for i in range(0, len(text), chunk):
                    yield {
                        "type": "response.output_text.delta",
                        "sequence_number": next(seq),
                        **at,
                        "delta": text[i : i + chunk],
                        "logprobs": [],
                    }
                yield {
                    "type": "response.output_text.done",
                    "sequence_number": next(seq),
                    **at,
                    "text": text,
                    "logprobs": [],
                }
                yield {
                    "type": "response.content_part.done",
                    "sequence_number": next(seq),
                    **at,
                    "part": part,
                }
        elif item["type"] == "reasoning":  # its summary, streamed as OpenAI's models do
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(seq),
                "output_index": index,
                "item": {**item, "summary": []},
            }
            for summary_index, part in enumerate(item.get("summary") or ()):
                at = {**where, "summary_index": summary_index}
                for kind, extra in (
                    ("response.reasoning_summary_part.added", {"part": {**part, "text": ""}}),
                    *(
                        (
                            "response.reasoning_summary_text.delta",
                            {"delta": part["text"][i : i + chunk]},
                        )
                        for i in range(0, len(part["text"]), chunk)
                    ),
                    ("response.reasoning_summary_text.done", {"text": part["text"]}),
                    ("response.reasoning_summary_part.done", {"part": part}),
                ):
                    yield {"type": kind, "sequence_number": next(seq), **at, **extra}
        elif item["type"] == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            yield {
                "type": "response.output_item.added",
                "sequence_number": next(seq),
                "output_index": index,
                "item": added,
            }
            args = item["arguments"]
            for i in range(0, len(args), chunk):
                yield {
                    "type": "response.function_call_arguments.delta",
                    "sequence_number": next(seq),
                    **where,
                    "delta": args[i : i + chunk],
                }
            yield {
                "type": "response.function_call_arguments.done",
                "sequence_number": next(seq),
                **where,
                "arguments": args,
                "name": item["name"],
            }
        yield {
            "type": "response.output_item.done",
            "sequence_number": next(seq),
            "output_index": index,
            "item": item,
        }
    kind = "response.completed" if response.get("status") == "completed" else "response.incomplete"
    yield {"type": kind, "sequence_number": next(seq), "response": response}


def reasoning_answer(summary: str, text: str) -> dict[str, Any]:
    """A reasoning model's Responses answer: a reasoning item with its ``summary``, then a
    message with ``text``."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "m",
        "output": [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": summary}],
            },
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            },
        ],
        "usage": {"input_tokens": 12, "output_tokens": 30, "total_tokens": 42},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def text_item(text: str) -> dict[str, Any]:
    """A Responses ``message`` output item saying ``text``."""
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def reasoned_calls(arguments: str) -> list[dict[str, Any]]:
    """A reasoning model's parallel ``get_weather`` calls, each after its own reasoning item
    (Rome's, then one with ``arguments``)."""
    return [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA1"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
            "status": "completed",
        },
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAA2"},
        {
            "type": "function_call",
            "id": "fc_2",
            "call_id": "call_2",
            "name": "get_weather",
            "arguments": arguments,
            "status": "completed",
        },
    ]


def answering(
    http: Any, outputs: list[list[dict[str, Any]]], *, asynchronous: bool = True
) -> tuple[Any, list[dict[str, Any]]]:
    """An openai client (``AsyncOpenAI``, or ``OpenAI``) whose upstream answers Responses calls
    with ``outputs`` (each a response's output items) in turn, as events when the call streams;
    and the request bodies it received."""
    import openai

    seen: list[dict[str, Any]] = []

    def answer(request: Any) -> Any:
        body = json.loads(request.content)
        seen.append(body)
        response = {
            "id": f"resp_{len(seen)}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body.get("model", "m"),
            "output": outputs[len(seen) - 1],
            "usage": {"input_tokens": 12, "output_tokens": 30, "total_tokens": 42},
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        if not body.get("stream"):
            return http.Response(200, json=response)
        events = "".join(
            f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in response_events(response)
        )
        return http.Response(
            200, headers={"content-type": "text/event-stream"}, content=events.encode()
        )

    transport = http.MockTransport(answer)
    base = {"api_key": "sk-test", "base_url": "http://upstream.invalid/v1", "max_retries": 0}
    if asynchronous:
        return openai.AsyncOpenAI(**base, http_client=http.AsyncClient(transport=transport)), seen
    return openai.OpenAI(**base, http_client=http.Client(transport=transport)), seen


class Upstream:
    """A scripted upstream that records what it receives (see the module docstring)."""

    def __init__(self, http: Any, replies: list[Reply] | ScriptedModel) -> None:
        self.http = http
        self.model = (
            replies if isinstance(replies, ScriptedModel) else ScriptedModel(replies, chunk_size=5)
        )
        self.seen: list[tuple[str, str, bytes, dict[str, str]]] = []
        inner = self.model.mock_transport(http)

        def handler(request: Any) -> Any:
            headers = {k.lower(): v for k, v in request.headers.items()}
            content = request.content
            self.seen.append((request.method, request.url.path, content, headers))
            body = json.loads(content or b"{}")
            if not (request.url.path.endswith("/responses") and body.get("stream")):
                return inner.handler(request)
            del body["stream"]
            plain = http.Request(request.method, request.url, content=json.dumps(body).encode())
            answer = inner.handler(plain)
            if answer.status_code != 200:
                return answer
            sse = "".join(
                f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
                for e in response_events(json.loads(answer.content))
            )
            return http.Response(
                200, headers={"content-type": "text/event-stream"}, content=sse.encode()
            )

        self.transport = http.MockTransport(handler)

    def client(self, openai: Any, *, asynchronous: bool) -> Any:
        """An openai client (sync or async) talking to this upstream."""
        if asynchronous:
            return openai.AsyncOpenAI(
                api_key="sk-test",
                base_url="http://upstream.invalid/v1",
                http_client=self.http.AsyncClient(transport=self.transport),
            )
        return openai.OpenAI(
            api_key="sk-test",
            base_url="http://upstream.invalid/v1",
            http_client=self.http.Client(transport=self.transport),
        )


def wrapped_client(model: ScriptedModel, config: Any, *, asynchronous: bool = False) -> Any:
    """The real openai client (sync or async) over ``model``'s HTTP mock, wrapped with
    ``config`` on a fake clock (both openai majors: httpx2 for 3.x, httpx for 2.x)."""
    import random
    from importlib import import_module

    import openai

    import agentguard as ag
    from agentguard.testing import FakeClock

    http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
    clock = FakeClock()
    opts: dict[str, Any] = {"clock": clock, "rng": random.Random(0)}
    base = {"api_key": "sk-test", "base_url": "http://scripted.invalid/v1"}
    if asynchronous:
        client: Any = openai.AsyncOpenAI(
            **base, http_client=http.AsyncClient(transport=model.mock_transport(http))
        )
        return ag.wrap(client, config, sleep=clock.asleep, **opts)
    client = openai.OpenAI(**base, http_client=http.Client(transport=model.mock_transport(http)))
    return ag.wrap(client, config, sleep=clock.sleep, **opts)
