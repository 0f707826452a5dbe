"""Tool calls written into ``content`` instead of ``tool_calls``, as local models often do.

Recognised: Hermes/Qwen ``<tool_call>{...}</tool_call>`` (also unclosed), ``<function=NAME>{...}
</function>``, Llama ``<|python_tag|>`` (``parameters`` instead of ``arguments``, several calls
separated by ``;``), Mistral ``[TOOL_CALLS] [...]``, fenced ``json`` blocks, and a message that is
nothing but a ``{"name": ..., "arguments": ...}`` object. A JSON object only counts as a call when
it names a tool (``name`` plus ``arguments`` or ``parameters``), so prose and ordinary JSON in an
answer are left alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Extracted", "extract_calls"]

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION_TAG = re.compile(r"<function=([\w.\-]+)>\s*(.*?)\s*(?:</function>|\Z)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"
_FENCE = re.compile(r"```(?:json|tool_call|tool)?\s*\n(.*?)\n?```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Extracted:
    """Calls found in text.

    Attributes:
        calls: ``(name, arguments)`` pairs; arguments as found (a JSON text or a value).
        style: the format recognised (``hermes``, ``function_tag`` ...).
        remaining: the text left once the calls are taken out (``None`` when nothing is left).
    """

    calls: tuple[tuple[str, Any], ...]
    style: str
    remaining: str | None


def _objects(text: str) -> Iterator[Any]:
    """Every JSON value decodable in ``text`` (one after another, or ``;``-separated)."""
    decoder = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n;,":
            i += 1
        if i >= n:
            return
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            return
        yield value
        i = end


def _as_call(value: Any) -> tuple[str, Any] | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict) and "name" in value["function"]:  # OpenAI shape
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    for key in ("arguments", "parameters", "args", "input"):
        if key in value:
            return name, value[key]
    return None


def _calls(text: str) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    for value in _objects(text):
        items = value if isinstance(value, list) else [value]
        for item in items:
            call = _as_call(item)
            if call is None:
                return []
            calls.append(call)
    return calls


def _rest(text: str, start: int, end: int) -> str | None:
    rest = (text[:start] + text[end:]).strip()
    return rest or None


def extract_calls(content: str) -> Extracted | None:
    """Find tool calls written as text in ``content``; ``None`` when there are none."""
    if not content or ("{" not in content and "<function=" not in content):
        return None
    if "<tool_call>" in content:
        matches = list(_HERMES.finditer(content))
        calls = [c for m in matches for c in _calls(m.group(1))]
        if calls:
            remaining = _HERMES.sub("", content).strip() or None
            return Extracted(tuple(calls), "hermes", remaining)
    if "<function=" in content:
        found: list[tuple[str, Any]] = []
        for m in _FUNCTION_TAG.finditer(content):
            body = m.group(2).strip() or "{}"
            found.append((m.group(1), body))
        if found:
            return Extracted(
                tuple(found), "function_tag", _FUNCTION_TAG.sub("", content).strip() or None
            )
    if _PYTHON_TAG in content:
        head, _, tail = content.partition(_PYTHON_TAG)
        calls = _calls(tail)
        if calls:
            return Extracted(tuple(calls), "python_tag", head.strip() or None)
    if _MISTRAL in content:
        head, _, tail = content.partition(_MISTRAL)
        calls = _calls(tail)
        if calls:
            return Extracted(tuple(calls), "mistral", head.strip() or None)
    fences = list(_FENCE.finditer(content))
    for m in fences:
        calls = _calls(m.group(1))
        if calls:
            return Extracted(tuple(calls), "fenced", _rest(content, m.start(), m.end()))
    stripped = content.strip()
    if stripped.startswith(("{", "[")):
        calls = _calls(stripped)
        if calls:
            return Extracted(tuple(calls), "bare", None)
    return None
