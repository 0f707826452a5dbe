"""Offline scanning: run the LoopDetector over OpenAI-format transcripts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentguard.config import GuardConfig, LoopDetectionConfig
from agentguard.types import Message, Severity

from ._detector import LoopDetector
from ._detectors import _SEV_OK as _OK

__all__ = ["Finding", "TranscriptScanner", "scan_transcript"]


@dataclass(frozen=True, slots=True)
class Finding:
    """A loop found in a transcript.

    Attributes:
        index: the 0-based index of the message where the severity was reached.
        severity: the severity reached.
        detector: the detector that fired.
        count: the repetition count behind the severity.
        message: the hint the guard would have shown the model.
        tool: the tool concerned, ``None`` for text findings.
    """

    index: int
    severity: Severity
    detector: str
    count: int
    message: str
    tool: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain JSON-ready data."""
        return {
            "index": self.index,
            "severity": str(self.severity),
            "detector": self.detector,
            "count": self.count,
            "tool": self.tool,
            "message": self.message,
        }


class TranscriptScanner:
    """Feeds one transcript to a :class:`LoopDetector` message by message.

    A finding is reported when the severity for a subject (a tool, or the assistant's text)
    rises, not again on every message of a continuing loop; once the subject is judged OK again,
    a new loop is reported afresh. Feed only new messages: state is the detector's, O(window).

    Args:
        config: as for :class:`LoopDetector`.
        tools: as for :class:`LoopDetector`.

    Attributes:
        last_severity: the worst severity the last message fed was judged at (``OK`` when
            none fired). Unlike the findings, which are reported once per rise, this is the
            verdict on that one message: a loop that goes on keeps it above ``OK`` message
            after message.
        last_detector: the detector behind :attr:`last_severity` (the first of equals),
            ``None`` when OK.
    """

    # (the verdict on the last message in plain slots, not properties: a scan reads it per
    # message)
    __slots__ = ("_detector", "_index", "_reported", "last_detector", "last_severity")

    def __init__(
        self,
        config: GuardConfig | LoopDetectionConfig | None = None,
        *,
        tools: Iterable[Any] | Mapping[str, Any] | None = None,
    ) -> None:
        self._detector = LoopDetector(config, tools=tools, hooks=(), _process_hooks=False)
        self._index = 0
        self.last_severity = Severity.OK
        self.last_detector: str | None = None
        self._reported: dict[str | None, Severity] = {}

    @property
    def messages_seen(self) -> int:
        """How many messages were fed so far."""
        return self._index

    @property
    def last_failed(self) -> bool | None:
        """Whether the last message fed, a tool result, reports a failure (by
        :func:`~agentguard.loops.is_error_result`, the rule the detectors judge it by); ``None``
        when they did not judge it (a result naming no tool). Unspecified after other messages.
        """
        return self._detector._failed

    def feed(self, message: Message) -> list[Finding]:
        """Judge the next message of the transcript; return new findings (possibly none)."""
        # (the state in locals, written back once: this runs per message)
        index = self._index
        self._index = index + 1
        reported = self._reported
        last, last_detector = _OK, None
        found: list[Finding] = []
        for verdict in self._detector.observe(message):
            subject = verdict.tool
            detector = verdict.detector
            if detector is None:  # judged OK: progress, a new loop is reported afresh
                reported.pop(subject, None)
                continue
            severity = verdict.severity
            if severity > last:
                last, last_detector = severity, detector
            if severity > reported.get(subject, _OK):
                reported[subject] = severity
                found.append(
                    Finding(index, severity, detector, verdict.count, verdict.message, subject)
                )
        self.last_severity, self.last_detector = last, last_detector
        return found


def scan_transcript(
    messages: Iterable[Message],
    *,
    config: GuardConfig | LoopDetectionConfig | None = None,
    tools: Iterable[Any] | Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Run every loop detector over an OpenAI-format transcript.

    Args:
        messages: the messages, in order (any iterable: it is consumed once, never held).
        config: a :class:`~agentguard.GuardConfig`, its ``loop_detection`` section, or ``None``.
        tools: per-tool declarations, as for :class:`LoopDetector`.

    Returns:
        The findings in message order, each with the index of its message.
    """
    scanner = TranscriptScanner(config, tools=tools)
    findings: list[Finding] = []
    for message in messages:
        findings.extend(scanner.feed(message))
    return findings
