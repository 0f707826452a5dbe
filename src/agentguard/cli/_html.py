"""``agentguard scan --html``: one self-contained page (inline CSS and SVG, nothing fetched).

A summary and the tools with findings, then per session a timeline strip (one mark per
message, coloured by role and by the severity it was judged at, findings flagged), the findings
table (step, what the guard would have done, tokens and money burnt) and, under each finding,
the messages around it: the arguments of the calls and their results. Everything that comes
from the trace is escaped.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from math import fsum

from agentguard import __version__
from agentguard.types import Severity

from ._audit import ISSUE_BIT, ROLE_CALL, ROLE_TEXT, ROLE_TOOL, SessionAudit
from ._findings import Issue
from ._output import tool_totals

__all__ = ["render"]

_SEVERITIES = (Severity.WARNING, Severity.CRITICAL, Severity.BREAK)
_WIDTH = 960
_MAX_MARKS = 480
_ROLE_COLOUR = {ROLE_TEXT: "#8fb8de", ROLE_CALL: "#4a7fb5", ROLE_TOOL: "#b9c7d3"}
_SEVERITY_COLOUR = {1: "#e8b339", 2: "#e0582f", 3: "#a3162b"}
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1040px;padding:0 1rem;color:#1d2733;background:#fbfcfd}
h1{font-size:1.5rem;margin:0 0 .3rem}h2{font-size:1.15rem;margin:2rem 0 .4rem}
.meta{color:#5b6b7b;margin:0 0 1rem}.cards{display:flex;gap:.8rem;flex-wrap:wrap;margin:1rem 0}
.card{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:.6rem .9rem;min-width:8rem}
.card b{display:block;font-size:1.35rem}.card span{color:#5b6b7b;font-size:.85rem}
section{background:#fff;border:1px solid #dde3ea;border-radius:8px;padding:.8rem 1rem;margin:1rem 0}
table{border-collapse:collapse;width:100%;font-size:.9rem}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid #eef1f4;vertical-align:top}th{color:#5b6b7b;font-weight:600}
.sev{font-weight:700;border-radius:4px;padding:0 .35rem;color:#fff}
.warning{background:#c98f10}.critical{background:#d2461c}.break{background:#a3162b}
.ok{color:#2e7d32;font-weight:600}.legend{font-size:.8rem;color:#5b6b7b}
.legend i{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin:0 .25rem 0 .8rem;
vertical-align:-1px}svg{display:block;margin:.4rem 0}
details{margin:.2rem 0 .6rem}summary{cursor:pointer;color:#2b5d8a;font-size:.85rem}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px/1.4 ui-monospace,monospace}
.ctx td{border-bottom:1px solid #f1f3f5}.ctx .here{background:#fff4dc}.role{color:#5b6b7b}
"""


#: ``html.escape``, remembered: findings repeat their texts, and each message around a
#: finding is shown under every finding near it
_escape = functools.lru_cache(maxsize=8192)(html.escape)


def render(path: str, audits: Sequence[SessionAudit]) -> str:
    """The report page for the audits of ``path``."""
    e = html.escape
    total_msgs = sum(a.messages for a in audits)
    issues = [i for a in audits for i in a.issues]
    by_sev = {str(s): sum(1 for i in issues if i.severity == s) for s in _SEVERITIES}
    cards = [
        (f"{len(audits):,}", "sessions"),
        (f"{total_msgs:,}", "messages"),
        (f"{len(issues):,}", "findings"),
        (f"{sum(a.tokens for a in audits):,}", "tokens" + _est(audits)),
        (f"{sum(a.loop_tokens for a in audits):,}", "tokens burnt in loops"),
        (f"{sum(a.retry_tokens for a in audits):,}", "tokens burnt in retries"),
        (f"{sum(i.tokens for i in issues):,}", "tokens burnt at the findings"),
    ]
    cost = fsum(a.cost for a in audits)
    if cost:
        cards.append((f"${cost:,.4f}", "spent"))
        cards.append((f"${fsum(i.cost for i in issues):,.4f}", "burnt at the findings"))
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>agentguard scan — {e(path)}</title><style>{_CSS}</style></head><body>",
        f"<h1>agentguard scan report</h1><p class='meta'>{e(path)} · agentguard {__version__} · "
        + ", ".join(f"{n} {s}" for s, n in by_sev.items())
        + "</p>",
        "<div class='cards'>"
        + "".join(f"<div class='card'><b>{v}</b><span>{e(k)}</span></div>" for v, k in cards)
        + "</div>",
        _legend(),
        _tools(audits),
    ]
    for audit in audits:
        parts.append(_session(audit))
    parts.append("</body></html>")
    return "\n".join(parts)


def _est(audits: Sequence[SessionAudit]) -> str:
    return " (estimated)" if any(a.estimated for a in audits) else ""


def _legend() -> str:
    items = [
        ("#8fb8de", "assistant text"),
        ("#4a7fb5", "tool call"),
        ("#b9c7d3", "tool result"),
        ("#e8b339", "warning"),
        ("#e0582f", "critical"),
        ("#a3162b", "break"),
    ]
    return (
        "<p class='legend'>Timeline:"
        + "".join(f"<i style='background:{c}'></i>{t}" for c, t in items)
        + "<i style='background:#1d2733'></i>finding</p>"
    )


def _tools(audits: Sequence[SessionAudit]) -> str:
    e = html.escape
    rows = sorted(
        ((n, t) for n, t in tool_totals(audits).items() if t.findings or t.errors),
        key=lambda kv: (-kv[1].tokens, -kv[1].findings, kv[0]),
    )
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{e(n or '(no name)')}</td><td>{t.calls:,}</td><td>{t.errors:,}</td>"
        f"<td>{t.findings:,}</td><td>{t.tokens:,}</td><td>{_cost(t.cost)}</td></tr>"
        for n, t in rows
    )
    return (
        "<section><h2>Tools with findings or failed results</h2><table><thead><tr><th>tool</th>"
        "<th>calls</th><th>failed results</th><th>findings</th><th>tokens burnt</th>"
        f"<th>cost burnt</th></tr></thead><tbody>{body}</tbody></table></section>"
    )


def _cost(cost: float) -> str:
    return f"${cost:,.4f}" if cost else ""


def _session(audit: SessionAudit) -> str:
    e = _escape
    first = audit.first_action()
    acted = f" · the guard would first act at step {first[0]} ({e(first[1])})" if first else ""
    if audit.ladder.acts:
        acted += " · its loop recovery: " + ", ".join(
            f"{e(action)} at step {step}" for step, action, _ in audit.ladder.acts
        )
    spent = f" ({_cost(audit.cost)})" if audit.cost else ""
    head = (
        f"<section><h2>{e(audit.id)}</h2><p class='meta'>{audit.messages:,} messages · "
        f"{audit.steps:,} steps · {audit.tokens:,} tokens"
        f"{' (estimated)' if audit.estimated else ''}{spent} · "
        f"{audit.loop_tokens:,} burnt in loops · {audit.retry_tokens:,} in retries{acted}</p>"
    )
    body = _timeline(audit)
    if not audit.issues:
        return head + body + "<p class='ok'>✓ no loops or bad tool calls found</p></section>"
    rows = "".join(_finding(i) for i in audit.issues)
    table = (
        "<table><thead><tr><th>step</th><th>msg</th><th>severity</th><th>category</th>"
        "<th>detector</th><th>tool</th><th>count</th><th>guard would</th><th>tokens burnt</th>"
        f"<th>what</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    return head + body + table + "</section>"


def _finding(i: Issue) -> str:
    e = _escape
    burnt = f"{i.tokens:,} {_cost(i.cost)}".strip() if i.tokens else ""
    row = (
        f"<tr><td>{i.step}</td><td>#{i.index}</td><td><span class='sev {i.severity}'>"
        f"{str(i.severity).upper()}</span></td><td>{e(i.category)}</td><td>{e(i.detector)}</td>"
        f"<td>{e(i.tool or '(text)')}</td><td>{i.count}</td><td>{e(i.action)}</td>"
        f"<td>{burnt}</td><td>{e(i.message)}</td></tr>"
    )
    if not i.context:
        return row
    lines = "".join(_context_row(line, line[0] == i.index) for line in i.context)
    return (
        f"{row}<tr><td></td><td colspan='9'><details><summary>the calls and results around it"
        f"</summary><table class='ctx'>{lines}</table></details></td></tr>"
    )


@functools.lru_cache(maxsize=4096)
def _context_row(line: tuple[int, str, str], here: bool) -> str:
    """The row of a message around a finding (``here``: the finding's own)."""
    n, role, text = line
    return (
        f"<tr{' class=here' if here else ''}><td>#{n}</td><td class='role'>{_escape(role)}"
        f"</td><td><pre>{_escape(text)}</pre></td></tr>"
    )


def _timeline(audit: SessionAudit) -> str:
    codes = audit.timeline or bytearray()
    n = len(codes)
    if not n:
        return ""
    marks = _marks(n)
    rects = []
    for lo, hi, head, tail, finding in marks:
        if hi - lo == 1:  # a mark per message (a short session): its code, read once
            c = codes[lo]
            severity, flagged, role = (c >> 2) & 0x3, c & ISSUE_BIT, c & 0x3
        else:
            bucket = codes[lo:hi]
            severity = max((c >> 2) & 0x3 for c in bucket)
            flagged = any(c & ISSUE_BIT for c in bucket)
            role = max(c & 0x3 for c in bucket)
        colour = _SEVERITY_COLOUR.get(severity) or _ROLE_COLOUR.get(role, "#d5dbe1")
        rects.append(head + colour + tail)
        if flagged:
            rects.append(finding)
    return (
        f"<svg viewBox='0 0 {_WIDTH} 42' width='100%' height='42' preserveAspectRatio='none' "
        "role='img' "
        f"aria-label='timeline of {html.escape(audit.id)}'>{''.join(rects)}</svg>"
    )


@functools.lru_cache(maxsize=64)
def _marks(n: int) -> tuple[tuple[int, int, str, str, str], ...]:
    """The marks of a timeline of ``n`` messages: ``(lo, hi, the rect up to its colour, the
    rect after it, the finding's dot)``, the same for every session of ``n`` messages (their
    positions are formatted once, not per session)."""
    marks = min(n, _MAX_MARKS)
    per = n / marks
    width = _WIDTH / marks
    out = []
    for k in range(marks):
        lo, hi = int(k * per), max(int((k + 1) * per), int(k * per) + 1)
        x = k * width
        label = f"messages {lo}–{hi - 1}" if hi - lo > 1 else f"message {lo}"
        head = f"<rect x='{x:.2f}' y='6' width='{max(width - 0.5, 0.5):.2f}' height='22' fill='"
        tail = f"'><title>{label}</title></rect>"
        dot = (
            f"<circle cx='{x + width / 2:.2f}' cy='36' r='3' fill='#1d2733'>"
            f"<title>finding at {label}</title></circle>"
        )
        out.append((lo, hi, head, tail, dot))
    return tuple(out)
