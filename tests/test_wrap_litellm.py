"""LiteLLM's own openai provider over a wrapped client (real litellm, offline).

``litellm.completion(model="openai/...", client=ag.wrap(OpenAI(...)))``: litellm calls the
client's ``chat.completions.with_raw_response.create``, which the wrapped client guards. Its
users get repaired tool calls, and the report as litellm files response headers
(``report_headers(response)``). Runs in the ``litellm`` nox session.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest

import agentguard as ag
from _litellm_kit import TOOLS  # sets litellm's offline flags first
from agentguard.testing import Reply, ScriptedModel

litellm = pytest.importorskip("litellm", reason="needs litellm: nox -s litellm")
openai = pytest.importorskip("openai")
from agentguard.integrations.litellm import report_headers  # noqa: E402

http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
# litellm's own types trip pydantic warnings (its stream handler reads a deprecated pydantic
# attribute on every delta: an unwrapped client streaming the same answer trips it too)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_.*' attribute on the instance"),
]
CONFIG = ag.GuardConfig.from_dict({"memory_pressure": {"enabled": False}}, env={})
ASK = [{"role": "user", "content": "find the install docs"}]


def _client(model: ScriptedModel, *, asynchronous: bool = False) -> Any:
    if asynchronous:
        return ag.wrap(
            openai.AsyncOpenAI(
                api_key="sk-test",
                base_url="http://scripted.invalid/v1",
                http_client=http.AsyncClient(transport=model.mock_transport(http)),
            ),
            CONFIG,
        )
    return ag.wrap(
        openai.OpenAI(
            api_key="sk-test",
            base_url="http://scripted.invalid/v1",
            http_client=http.Client(transport=model.mock_transport(http)),
        ),
        CONFIG,
    )


def test_completion_gets_a_repaired_tool_call_and_the_report() -> None:
    """A tool call written in the text comes back as a tool call; the report is in the
    headers litellm keeps."""
    model = ScriptedModel([Reply.embedded("search", {"query": "install"}, style="hermes")])
    response = litellm.completion(
        model="openai/m", messages=ASK, tools=TOOLS, client=_client(model), api_key="sk-test"
    )
    call = response.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("search", '{"query": "install"}')
    headers = report_headers(response)
    assert headers is not None
    assert headers["x-agentguard-repairs"] == "1"


@pytest.mark.anyio
async def test_acompletion_repairs_broken_arguments() -> None:
    """Async: arguments that are not valid JSON are repaired."""
    model = ScriptedModel([Reply.call("search", '{"query": "install",', id="c1")])
    response = await litellm.acompletion(
        model="openai/m",
        messages=ASK,
        tools=TOOLS,
        client=_client(model, asynchronous=True),
        api_key="sk-test",
    )
    assert response.choices[0].message.tool_calls[0].function.arguments == '{"query": "install"}'
    assert report_headers(response)["x-agentguard-repairs"] == "1"


def test_streaming_completion_gets_the_corrected_tool_call() -> None:
    """Streaming: a hallucinated tool gets a corrective re-ask; the stream carries the
    corrected call only."""
    model = ScriptedModel(
        [Reply.call("wipe_disk", {"force": True}), Reply.call("search", {"query": "docs"})]
    )
    chunks = list(
        litellm.completion(
            model="openai/m",
            messages=ASK,
            tools=TOOLS,
            stream=True,
            client=_client(model),
            api_key="sk-test",
        )
    )
    names = [
        call.function.name
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
        if call.function.name
    ]
    assert names == ["search"]
    assert len(model.requests) == 2
