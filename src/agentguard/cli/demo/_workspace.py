"""The demo agent's task and its real tools, over a temporary directory.

The task: read the team's meeting notes and write ``summary.md`` with the decisions and open
action items. The tools really list, read and write files (inside the workspace only); the
ticket tracker is an in-process stand-in for a flaky HTTP service.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["NOTES", "TASK", "TOOLS", "TicketService", "Workspace"]

TASK = (
    "Read the meeting notes in notes/ and write summary.md: the decisions taken and the open "
    "action items, with their owners."
)

NOTES: dict[str, str] = {
    "notes/standup.md": (
        "# Stand-up, 2 May\n"
        "- Decision: ship the CSV export behind a feature flag.\n"
        "- Action (Ana): fix the flaky upload test, ticket AG-12.\n"
        "- Action (Raj): ask the data team for the export schema.\n"
    ),
    "notes/planning.md": (
        "# Planning, 9 May\n"
        "- Decision: drop the legacy XML endpoint in June.\n"
        "- Action (Mei): announce the deprecation, ticket AG-13.\n"
        "- Action (Ana): load-test the export, ticket AG-14.\n"
    ),
    "notes/retro.md": (
        "# Retro, 16 May\n"
        "- Decision: pair on every on-call handover.\n"
        "- Went well: the release train. Went badly: flaky CI.\n"
    ),
    **{
        f"notes/archive/2024-{m:02d}.md": f"# Archived notes, month {m}\n" + "- nothing open\n" * 40
        for m in range(1, 13)
    },
}

_STRING = {"type": "string"}


def _tool(name: str, description: str, params: Mapping[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {**_STRING, "description": d} for p, d in params.items()},
                "required": list(params),
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("list_files", "List the files in a directory.", {"directory": "relative path"}),
    _tool("read_file", "Read a text file.", {"path": "relative path"}),
    _tool(
        "write_file",
        "Write a text file (overwrites it).",
        {"path": "relative path", "content": "the text"},
    ),
    _tool(
        "fetch_ticket",
        "Fetch a ticket's status from the issue tracker.",
        {"ticket_id": "e.g. AG-12"},
    ),
]


class TicketService:
    """The issue tracker: answers from a plan of outcomes, one per request, then stays up.

    Args:
        plan: per request, ``"ok"`` or ``"timeout"``; after the plan, every request succeeds.
        on_fault: told about each failure as it is served.
    """

    _STATUS: ClassVar[dict[str, str]] = {"AG-12": "in progress", "AG-13": "open", "AG-14": "open"}

    def __init__(
        self, plan: tuple[str, ...] = (), *, on_fault: Callable[[str], None] | None = None
    ) -> None:
        self._plan = list(plan)
        self._on_fault = on_fault
        self.requests = 0

    def fetch(self, ticket_id: str) -> str:
        """One request to the tracker; raises :class:`TimeoutError` when the plan says so."""
        self.requests += 1
        outcome = self._plan.pop(0) if self._plan else "ok"
        if outcome == "timeout":
            if self._on_fault is not None:
                self._on_fault(f"issue tracker timeout on {ticket_id}")
            raise TimeoutError("issue tracker did not answer within 5 s")
        status = self._STATUS.get(ticket_id)
        if status is None:
            return json.dumps({"error": f"no ticket {ticket_id}"})
        return json.dumps({"id": ticket_id, "status": status})


class Workspace:
    """The agent's files (a temporary directory) and the tools that act on them.

    Args:
        root: the directory; the notes are written into it.
        tickets: the ticket tracker stand-in.
    """

    def __init__(self, root: Path, tickets: TicketService | None = None) -> None:
        self.root = root
        self.tickets = tickets or TicketService()
        for rel, text in NOTES.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        self.functions: dict[str, Callable[..., str]] = {
            "list_files": self.list_files,
            "read_file": self.read_file,
            "write_file": self.write_file,
            "fetch_ticket": self.tickets.fetch,
        }

    def _inside(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise PermissionError(f"{rel}: outside the workspace")
        return path

    def list_files(self, directory: str) -> str:
        """The entries of ``directory``, one per line (directories end with ``/``)."""
        path = self._inside(directory)
        if not path.is_dir():
            return f"error: {directory} is not a directory"
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        return "\n".join(names)

    def read_file(self, path: str) -> str:
        """The text of ``path``."""
        target = self._inside(path)
        if not target.is_file():
            return f"error: no file {path}"
        return target.read_text(encoding="utf-8")

    def write_file(self, path: str, content: str) -> str:
        """Write ``content`` to ``path``."""
        target = self._inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {path}"

    @property
    def done(self) -> bool:
        """Whether the task's output exists."""
        return (self.root / "summary.md").is_file()
