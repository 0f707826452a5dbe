"""Agent runtimes' own trace files, read as OpenAI chat messages.

- ATIF (the Agent Trajectory Interchange Format of Harbor / terminal-bench): one trajectory
  document, ``steps`` with ``tool_calls`` and their ``observation``, ``metrics`` per step and
  ``agent.tool_definitions`` (checked against, when present);
- Claude Code session JSONL (``~/.claude/projects/*/*.jsonl``): ``user`` / ``assistant`` lines
  holding Anthropic messages (``tool_use`` / ``tool_result`` blocks); the lines of one model
  response (one block each, same message id) are joined back into one message;
- Codex CLI rollout JSONL (``~/.codex/sessions/**/rollout-*.jsonl``): ``response_item`` lines
  (messages, ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` and their
  outputs), ``turn_context`` for the model, ``event_msg`` ``token_count`` for usage;
- SWE-agent ``.traj`` (its ``history``: function calls, or text actions turned into one call
  named after the command) and mini-swe-agent ``.traj.json`` (2.x: ``tool_calls``, or the
  commands parsed in ``extra.actions``, with the usage of ``extra.response``; 1.x: a fenced
  ``bash`` block per answer is its call, the next message its output);
- tau-bench results (an array of runs, each with its ``traj`` of OpenAI messages).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, cast

from ._base import Record, State, call, from_json, message, obj, seq, str_or_none, text_of
from ._chat import tools_of, usage_of

__all__ = ["atif", "claude_code", "codex", "flush", "swe_agent", "tau_bench"]

_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)\n```", re.S)
_TRAJ_SUFFIX = re.compile(r"(\.traj)?(\.jsonl?)?$")


# -- ATIF ------------------------------------------------------------------------------------


def atif(doc: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One ATIF trajectory: each agent step is an assistant message, its observation the
    results of its calls."""
    agent = obj(doc.get("agent"))
    session = state.unique(str(doc.get("session_id") or agent.get("name") or "atif"))
    tools = tools_of(agent.get("tool_definitions"))
    default_model = agent.get("model_name")
    steps = doc.get("steps")
    for step in seq(steps):
        if not isinstance(step, dict):
            continue
        source = step.get("source")
        text = text_of(step.get("message"))
        if source != "agent":
            role = "system" if source == "system" else "user"
            yield Record(session, {"role": role, "content": text}, where, tools=tools)
            continue
        metrics = obj(step.get("metrics"))
        tokens, prompt = usage_of(metrics)
        model = step.get("model_name") or default_model
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        calls = [
            call(c.get("tool_call_id"), c.get("function_name"), c.get("arguments", {}))
            for c in seq(step.get("tool_calls"))
            if isinstance(c, dict)
        ]
        if calls:
            reply["tool_calls"] = calls
        yield Record(session, reply, where, tokens, tools, 0, str_or_none(model), prompt)
        results = obj(step.get("observation")).get("results")
        for k, value in enumerate(seq(results)):
            result = obj(value)
            call_id = result.get("source_call_id") or (calls[k]["id"] if k < len(calls) else None)
            content = text_of(result.get("content"))
            if call_id is None:  # an observation of no call (terminus keystrokes): the reply
                yield Record(session, {"role": "user", "content": content}, where, tools=tools)
            else:
                tool = {"role": "tool", "tool_call_id": call_id, "content": content}
                yield Record(session, tool, where, tools=tools)


# -- Claude Code -----------------------------------------------------------------------------


def claude_code(line: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One line of a Claude Code session file."""
    body = line.get("message")
    if not isinstance(body, dict) or line.get("type") not in ("user", "assistant"):
        return  # summaries, snapshots, queue operations: no message
    session = str(line.get("sessionId") or "claude-code")
    if line.get("isSidechain"):
        session += " (sub-agent)"
    content = body.get("content")
    if line["type"] == "assistant":
        blocks = seq(content) or [{"type": "text", "text": text_of(content)}]
        rid = str(body.get("id") or line.get("uuid") or "")
        held = state.held.get(session)
        if held is None or state.response_id.get(session) != rid:
            yield from flush(state, session)
            usage = obj(body.get("usage"))
            prompt = sum(
                v
                for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
                if isinstance(v := usage.get(k), int)
            )
            out = usage.get("output_tokens")
            tokens = prompt + (out if isinstance(out, int) else 0) if usage else None
            model = str_or_none(body.get("model"))
            held = Record(session, {"role": "assistant", "content": ""}, where, tokens, None, 0,
                          model, prompt if usage else None)  # fmt: skip
            state.held[session] = held
            state.response_id[session] = rid
        reply = _assembled(held)
        for value in blocks:
            block = obj(value)
            if block.get("type") == "tool_use":
                reply.setdefault("tool_calls", []).append(
                    call(block.get("id"), block.get("name"), block.get("input", {}))
                )
            elif block.get("type") == "text" and block.get("text"):
                text = text_of(block["text"])
                reply["content"] = "\n".join(t for t in (reply["content"], text) if t)
        return
    yield from flush(state, session)
    if not isinstance(content, list):
        yield Record(session, {"role": "user", "content": text_of(content)}, where)
        return
    said = []
    for value in content:
        block = obj(value)
        if block.get("type") == "tool_result":
            result = text_of(block.get("content"))
            if block.get("is_error") is True:  # the API's error flag: a failed result
                result = json.dumps({"error": result})
            tool = {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result}
            yield Record(session, tool, where)
        elif block.get("type") == "text":
            said.append(text_of(block.get("text")))
    if said:
        yield Record(session, {"role": "user", "content": "\n".join(said)}, where)


def _assembled(held: Record) -> dict[str, Any]:
    """The message of a held record: the dict this module built, still being added to."""
    return cast("dict[str, Any]", held.message)


def flush(state: State, session: str | None = None) -> Iterator[Record]:
    """The assistant message held for ``session`` (every session's when ``None``), and the
    results held behind it."""
    for name in [session] if session is not None else list(state.held):
        held = state.held.pop(name, None)
        if held is not None:
            yield held
        yield from state.queued.pop(name, ())


# -- Codex CLI -------------------------------------------------------------------------------

_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def codex(line: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One line of a Codex CLI rollout file.

    The items of one model response (text, calls) are joined into one assistant message, held
    with the call outputs that follow until the response's usage arrives (it is written after
    them) or the next response starts.
    """
    kind = line.get("type")
    payload = obj(line.get("payload"))
    file_key = where.rsplit(":", 1)[0]
    if kind == "session_meta":
        state.session[file_key] = str(payload.get("id") or "codex")
        return
    session = state.session.get(file_key, "codex")
    if kind == "turn_context":
        if payload.get("model"):
            state.model[session] = str(payload["model"])
        return
    if kind in ("token_usage_record", "event_msg"):
        usage = payload.get("usage")
        if kind == "event_msg":
            if payload.get("type") != "token_count":
                return
            usage = obj(payload.get("info")).get("last_token_usage")
        held = state.held.get(session)
        tokens, prompt = usage_of(usage)
        if held is not None and held.tokens is None and tokens is not None:
            state.held[session] = held._replace(tokens=tokens, prompt_tokens=prompt)
        return
    if kind != "response_item":
        return  # compacted history, world state, future record types
    item = payload.get("type")
    if item in _CALLS or (item == "message" and payload.get("role") == "assistant"):
        if state.queued.get(session):  # a new response after the last one's outputs
            yield from flush(state, session)
        _codex_answer(payload, where, state, session)
        return
    if item in _OUTPUTS:
        output = payload.get("output")
        content = output.get("content") if isinstance(output, dict) else output
        tool = {"role": "tool", "tool_call_id": payload.get("call_id"), "content": text_of(content)}
        record = Record(session, tool, where)
        if session in state.held:
            state.queued.setdefault(session, []).append(record)
        else:
            yield record
    elif item == "message":
        yield from flush(state, session)
        role = "system" if payload.get("role") == "developer" else "user"
        yield Record(session, {"role": role, "content": text_of(payload.get("content"))}, where)


def _codex_answer(payload: Mapping[str, Any], where: str, state: State, session: str) -> None:
    """Add a response item (text or a call) to the assistant message being assembled."""
    item = payload.get("type")
    held = state.held.get(session)
    if held is None:
        held = Record(session, {"role": "assistant", "content": ""}, where,
                      model=state.model.get(session))  # fmt: skip
        state.held[session] = held
    reply = _assembled(held)
    if item == "message":
        text = text_of(payload.get("content"))
        reply["content"] = "\n".join(t for t in (reply["content"], text) if t)
        return
    if item == "local_shell_call":
        arguments: Any = obj(payload.get("action"))
    elif item == "custom_tool_call":
        arguments = {"input": payload.get("input")}
    else:
        arguments = payload.get("arguments", "{}")
    call_id = payload.get("call_id") or payload.get("id")
    reply.setdefault("tool_calls", []).append(call(call_id, payload.get("name"), arguments))


# -- SWE-agent, mini-swe-agent ---------------------------------------------------------------


def swe_agent(doc: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """A SWE-agent ``.traj`` (its ``history``) or a mini-swe-agent trajectory (``messages``).

    mini-swe-agent 2 (``trajectory_format`` ``mini-swe-agent-1.1``) answers with ``tool_calls``
    (their results ``tool`` messages) or, with a text-based model, with the commands it parsed
    in ``extra.actions``; each answer's ``extra.response`` holds the model and its usage. Its
    closing ``exit`` message (the run's status and submission) was sent to no model.
    mini-swe-agent 1 answers with a fenced ``bash`` block, its output the next user message.
    """
    session = state.unique(_run_name(doc, where))
    mini = "history" not in doc
    history = doc.get("messages") if mini else doc.get("history")
    pending: list[str] = []
    n = 0
    for value in seq(history):
        m = message(value, where)
        role = m.get("role")
        content = text_of(m.get("content"))
        if role == "assistant":
            extra = obj(m.get("extra"))
            calls = m.get("tool_calls")
            commands = [c for c in map(_command, seq(extra.get("actions"))) if c]
            if not (calls or commands):
                action = _bash(content) if mini else m.get("action")
                if isinstance(action, str) and action.strip():
                    commands = [action.strip()]
            if not calls and commands:
                calls = []
                for command in commands:
                    n += 1
                    tool = "bash" if mini else command.split()[0]
                    calls.append(call(f"act_{n}", tool, {"command": command}))
            reply: dict[str, Any] = {"role": "assistant", "content": m.get("thought") or content}
            if calls:
                reply["tool_calls"] = calls
                pending = [str(c.get("id")) for c in calls if isinstance(c, dict)]
            response = obj(extra.get("response"))
            tokens, prompt = usage_of(response.get("usage"))
            model = str_or_none(response.get("model"))
            yield Record(session, reply, where, tokens, None, 0, model, prompt)
        elif role == "exit" and mini:
            continue
        elif pending and role in ("tool", "user"):
            call_id = m.get("tool_call_id")
            if isinstance(call_id, str) and call_id in pending:
                pending.remove(call_id)
            else:
                call_id = pending.pop(0)
            tool_msg = {"role": "tool", "tool_call_id": call_id, "content": content}
            yield Record(session, tool_msg, where)
        else:
            yield Record(session, {"role": str(role), "content": content}, where)


def _command(action: Any) -> str | None:
    """The command of one of mini-swe-agent 2's parsed ``actions``."""
    command = obj(action).get("command")
    return command.strip() if isinstance(command, str) and command.strip() else None


def _run_name(doc: Mapping[str, Any], where: str) -> str:
    """The task a trajectory ran: its instance id (mini-swe-agent's ``instance_id``, SWE-agent's
    problem statement in ``replay_config``, a JSON text), else the file's name without its
    ``.traj`` suffix, as both runners name a trajectory after its instance. Not SWE-agent's
    ``environment``: every run of one environment (``main``) has the same."""
    name = obj(doc.get("info")).get("instance_id") or doc.get("instance_id")
    if not name:
        replay = obj(from_json(doc.get("replay_config")))
        name = obj(replay.get("problem_statement")).get("id")
    if name:
        return str(name)
    file = os.path.basename(where.rsplit(":", 1)[0])
    return _TRAJ_SUFFIX.sub("", file) or "swe-agent"


def _bash(text: str) -> str | None:
    found = _BASH_BLOCK.search(text)
    return found.group(1) if found else None


# -- tau-bench -------------------------------------------------------------------------------


def tau_bench(run: Mapping[str, Any], where: str, state: State) -> Iterator[Record]:
    """One tau-bench run: its ``traj`` of OpenAI chat messages."""
    session = state.unique(f"task {run.get('task_id')} trial {run.get('trial', 0)}")
    traj = run.get("traj")
    for m in seq(traj):
        yield Record(session, message(m, where), where)
