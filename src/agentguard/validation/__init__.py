"""Tool-call validation: extract, repair, match names, validate, correct.

See ``docs/validation.md`` for the error kinds, the repair rules and the correction format.
"""

from __future__ import annotations

from agentguard._exports import publish

from ._extract import Extracted, extract_calls
from ._names import NameMatch, NameMatcher, normalise_name
from ._report import ErrorKind, Repair, ToolCallError, ValidationReport
from ._tools import ToolSpec, specs_from
from ._validator import ToolCallValidator

__all__ = [
    "ErrorKind",
    "Extracted",
    "NameMatch",
    "NameMatcher",
    "Repair",
    "ToolCallError",
    "ToolCallValidator",
    "ToolSpec",
    "ValidationReport",
    "extract_calls",
    "normalise_name",
    "specs_from",
]

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
