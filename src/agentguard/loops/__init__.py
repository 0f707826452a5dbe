"""Loop detection: repeated tool calls without progress, repeated and degenerate text.

See ``docs/loops.md`` for the model and every setting.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._detector import DETECTORS, LoopDetector, Verdict
from ._identity import (
    DEFAULT_VOLATILE_FIELDS,
    ToolLoopPolicy,
    call_fingerprint,
    is_error_result,
    result_fingerprint,
)
from ._scan import Finding, TranscriptScanner, scan_transcript

__all__ = [
    "DEFAULT_VOLATILE_FIELDS",
    "DETECTORS",
    "Finding",
    "LoopDetector",
    "ToolLoopPolicy",
    "TranscriptScanner",
    "Verdict",
    "call_fingerprint",
    "is_error_result",
    "result_fingerprint",
    "scan_transcript",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
