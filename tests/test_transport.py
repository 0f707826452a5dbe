"""Neutral request/response values and their OpenAI wire forms."""

from __future__ import annotations

from types import SimpleNamespace

from agentguard.transport import ModelRequest, ModelResponse, StreamChunk, usage_from_body
from agentguard.types import Usage


def test_request_body_round_trip() -> None:
    """A body parsed into a request gives the same body back."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "max_tokens": 5,
    }
    request = ModelRequest.from_body(body)
    assert request.tools == body["tools"]
    assert request.to_body() == body
    assert request.to_body(stream=True)["stream"] is True


def test_response_from_body_reads_first_choice() -> None:
    """The first choice's message, finish reason and usage are read."""
    body = {
        "id": "x",
        "model": "m",
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    response = ModelResponse.from_body(body)
    assert response.message["content"] == "hi"
    assert response.finish_reason == "stop"
    assert response.usage == Usage(3, 4)


def test_response_without_choices_is_an_empty_assistant_message() -> None:
    """A body with no choices does not crash."""
    response = ModelResponse.from_body({"choices": []})
    assert response.message == {"role": "assistant", "content": None}


def test_usage_from_sdk_object_and_responses_api_names() -> None:
    """Usage is read from SDK objects and from Responses API field names."""
    assert usage_from_body(SimpleNamespace(prompt_tokens=1, completion_tokens=2)) == Usage(1, 2)
    assert usage_from_body({"input_tokens": 5, "output_tokens": 6}) == Usage(5, 6)
    assert usage_from_body({}) is None
    assert usage_from_body(None) is None


def test_usage_chunk_has_no_choices() -> None:
    """The final usage chunk (choices == []) parses to usage with no content."""
    chunk = StreamChunk.from_body(
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    )
    assert chunk.usage == Usage(1, 1)
    assert chunk.content is None
    assert chunk.finish_reason is None
