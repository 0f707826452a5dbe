"""What the litellm SDK and proxy tests share: offline flags, a tool, a stuck polling history,
and a real litellm proxy process on loopback in front of a scripted upstream."""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from _processes import free_port, process_env, running
from agentguard.testing import Fault, Reply, ScriptedModel
from agentguard.transport import ModelRequest

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


# The proxy's config.yaml: two models on agentguard's provider, its report as response headers.
PROXY_CONFIG = {
    "model_list": [
        {"model_name": "agent", "litellm_params": {"model": "agentguard/fast"}},
        {"model_name": "agent-strong", "litellm_params": {"model": "agentguard/strong"}},
    ],
    "litellm_settings": {
        "custom_provider_map": [
            {
                "provider": "agentguard",
                "custom_handler": "agentguard.integrations.litellm.proxy_handler",
            }
        ],
        "callbacks": "agentguard.integrations.litellm.proxy_headers",
    },
    # the guard is the one retry layer: the proxy's router must not retry guarded calls
    "router_settings": {"num_retries": 0},
}


def guard_config(upstream_url: str, **sections: Any) -> dict[str, Any]:
    """The proxy's guard: tiers fast and strong (``fast-model``, ``strong-model`` upstream)."""
    tier = {"base_url": upstream_url, "api_key_env": "UPSTREAM_API_KEY"}
    return {
        "tiers": {
            "fast": {"model": "openai/fast-model", **tier},
            "strong": {"model": "openai/strong-model", **tier},
        },
        "escalation": {"chain": ["fast", "strong"], "max_retries_before_escalate": 0},
        "memory_pressure": {"enabled": False},
        **sections,
    }


class Upstream:
    """The scripted upstream: each test queues the answers of each model."""

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[Reply | Fault]] = collections.defaultdict(
            collections.deque
        )
        self.model = ScriptedModel({"*": [self._next]}, cycle=True)

    def _next(self, request: ModelRequest) -> Reply | Fault:
        queue = self.queues[request.model]
        return queue.popleft() if queue else Fault.server_error(500, "nothing queued")

    def script(self, **answers: list[Reply | Fault]) -> int:
        """Queue answers per model (``fast_model=[...]``); returns the request count so far."""
        for model, steps in answers.items():
            self.queues[model.replace("_", "-")].extend(steps)
        return len(self.model.requests)

    def models_since(self, start: int) -> list[str]:
        return [r.model for r in self.model.requests[start:]]


@contextlib.contextmanager
def litellm_proxy(
    litellm_cli: str,
    tmp: Path,
    guard: Mapping[str, Any],
    *,
    prefix: Sequence[str] = (),
    callbacks: Sequence[str] = (),
    general: Mapping[str, Any] | None = None,
) -> Iterator[tuple[str, str]]:
    """Run ``litellm --config`` (:data:`PROXY_CONFIG`, the guard configured by ``guard``) on
    loopback until the block ends; yields its base URL and master key. ``prefix``: arguments
    before litellm's own (for a launcher standing in for the ``litellm`` executable);
    ``callbacks``: litellm callbacks to run besides the guard's (``otel`` ...); ``general``:
    the proxy's ``general_settings`` (a module it names may be a file in ``tmp``)."""
    import yaml

    (tmp / "agentguard.yaml").write_text(yaml.safe_dump({"reliability": dict(guard)}))
    config = PROXY_CONFIG
    if callbacks:
        settings = dict(config["litellm_settings"])
        settings["callbacks"] = [settings["callbacks"], *callbacks]
        config = {**config, "litellm_settings": settings}
    if general:
        config = {**config, "general_settings": dict(general)}
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    master_key = "sk-" + secrets.token_hex(24)
    env = process_env(
        {
            "AGENTGUARD_CONFIG": str(tmp / "agentguard.yaml"),
            "UPSTREAM_API_KEY": "sk-test-upstream-not-real",
            "LITELLM_MASTER_KEY": master_key,
            **OFFLINE_FLAGS,
        }
    )
    base = f"http://127.0.0.1:{free_port()}"
    command = [litellm_cli, *prefix, "--config", str(tmp / "config.yaml"), "--host", "127.0.0.1"]
    with running(
        [*command, "--port", base.rsplit(":", 1)[1]],
        env=env,
        log=tmp / "proxy.log",
        health=f"{base}/health/liveliness",
        name="litellm proxy",
    ):
        yield base, master_key
