"""What the litellm SDK and proxy tests share: offline flags, a tool, a stuck polling history."""

from __future__ import annotations

import os
from typing import Any

# litellm fetches these at import (or proxy start) unless told to use its bundled copies
OFFLINE_FLAGS = {
    f"LITELLM_LOCAL_{flag}": "True"
    for flag in ("MODEL_COST_MAP", "BLOG_POSTS", "ANTHROPIC_BETA_HEADERS", "POLICY_TEMPLATES")
}
for _name, _value in OFFLINE_FLAGS.items():
    os.environ.setdefault(_name, _value)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def polling_history(times: int) -> list[dict[str, Any]]:
    """A user question, then ``times`` identical polls with an unchanged result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "is the build done?"}]
    for i in range(times):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "poll", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "running, 40%"})
    return messages
