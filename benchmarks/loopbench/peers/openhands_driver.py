"""Replay loopbench episodes through the OpenHands SDK's ``StuckDetector`` (needs Python >= 3.12).

Usage: ``python openhands_driver.py EPISODES.jsonl`` prints one JSON line per episode,
``{"id": ..., "openhands": step or null}``: the first step (assistant messages counted from 1)
after which ``is_stuck()`` is True. ``bench_loopbench.py`` runs it in-process when the SDK is
importable, else as a subprocess of ``$LOOPBENCH_OPENHANDS_PYTHON``.

Each message becomes the SDK's own event, as in ``bench_peers_loops.py`` (whose ``OpenHands``
wrapper builds the ``ConversationState``): a user message or an assistant message without tool
calls a ``MessageEvent``; each tool call an ``ActionEvent`` (the assistant's words as the first
call's ``thought``, one ``llm_response_id`` per assistant message); each tool result an
``ObservationEvent``, or an ``AgentErrorEvent`` when it starts with "Error". ``is_stuck()`` — which
the SDK's run loop calls once per agent step — is asked after every message; the SDK stops the
run when it is True (it has no softer level).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

from bench_peers_loops import OpenHands


class Replay(OpenHands):
    """One episode's ``ConversationState``, fed message by message."""

    def feed(self, message: dict[str, Any], step: int) -> None:  # type: ignore[override]
        action_event, error_event, _, obs_event, _, tool_call, content, action, obs = self._t
        role = message.get("role")
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        if role == "user":
            self.say("user", text or "")
        elif role == "assistant" and not message.get("tool_calls"):
            if text:
                self.say("agent", text)
        elif role == "assistant":
            self._calls = getattr(self, "_calls", {})
            for k, call in enumerate(message["tool_calls"]):
                name = call["function"]["name"]
                raw = call["function"]["arguments"]
                try:
                    args = json.loads(raw) if isinstance(raw, str) else raw
                except ValueError:
                    args = {"raw": raw}
                if not isinstance(args, dict):
                    args = {"value": args}
                event = action_event(
                    thought=[content(text=text or "")] if k == 0 else [],
                    action=action(data=args),
                    tool_name=name,
                    tool_call_id=call["id"],
                    tool_call=tool_call(
                        id=call["id"], name=name, arguments=json.dumps(args), origin="completion"
                    ),
                    llm_response_id=f"resp_{step}",
                )
                self._calls[call["id"]] = event
                self.state.append_event(event)
        elif role == "tool":
            act = getattr(self, "_calls", {}).pop(message.get("tool_call_id"), None)
            if act is None:
                return
            body = text if text is not None else json.dumps(message.get("content"))
            if body.startswith("Error"):
                event = error_event(
                    error=body, tool_name=act.tool_name, tool_call_id=act.tool_call_id
                )
            else:
                event = obs_event(
                    observation=obs(content=[content(text=body)], tool_name=act.tool_name),
                    action_id=act.id,
                    tool_name=act.tool_name,
                    tool_call_id=act.tool_call_id,
                )
            self.state.append_event(event)


def first_stuck(messages: list[dict[str, Any]]) -> int | None:
    """The first step after which the SDK's ``is_stuck()`` is True."""
    peer = Replay()
    try:
        step = 0
        for message in messages:
            if message.get("role") == "assistant":
                step += 1
            peer.feed(message, step)
            if step and peer.detector.is_stuck():
                return step
        return None
    finally:
        peer.close()


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            episode = json.loads(line)
            flag = first_stuck(episode["messages"])
            print(json.dumps({"id": episode["id"], "openhands": flag}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
