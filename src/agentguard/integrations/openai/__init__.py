"""openai: :func:`wrap` (a guarded client) and the client as a transport (sync and async).

- ``_transport``: :class:`OpenAITransport` / :class:`AsyncOpenAITransport`, chat and Responses;
- ``_responses``: the Responses API in the pipeline's neutral (chat) form, and back;
- ``_client``: :func:`wrap`, the guarded ``chat.completions`` and ``responses`` resources;
- ``_stream``: the SDK chunk objects a guarded ``create(stream=True)`` yields;
- ``_events``: the SDK events a guarded ``responses.create(stream=True)`` yields;
- ``_raw``: what ``with_raw_response`` / ``with_streaming_response`` return;
- ``_structured``: ``parse`` (structured outputs judged before the SDK parses them) and the
  ``stream`` helpers.

Importing this package does not import the openai SDK; using it does.
"""

from __future__ import annotations

from ._client import wrap
from ._responses import request_from_responses
from ._transport import AsyncOpenAITransport, OpenAITransport, is_async_client

__all__ = [
    "AsyncOpenAITransport",
    "OpenAITransport",
    "is_async_client",
    "request_from_responses",
    "wrap",
]
