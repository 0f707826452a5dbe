"""Manual review of the rubric's automatic labels on real traces (``build.py`` applies these).

Every real episode the rules labelled a loop was read in full; the healthy ones a detector
flagged were read too. An entry here replaces fields of the automatic label, with the reason.
"""

from __future__ import annotations

from typing import Any

OVERRIDES: dict[str, dict[str, Any]] = {
    "tau-airline-11-t2": {
        "reason": (
            "R1: book_reservation sent three times with the same payment and the same 'payment "
            "amount does not add up' error; the agent recomputes the total only after the "
            "third and then solves the task. Reviewed: a loop a hint should catch at the third "
            "call, which a block must not end (the run recovers)."
        ),
    },
    "tau-airline-13-t0": {
        "reason": (
            "R1: update_reservation_flights with the same wrong flight (HAT030, 2024-05-13) and "
            "the same 'not available' error four times while the user asks for another "
            "segment. Reviewed: a loop."
        ),
    },
    "tau-airline-09-t2": {
        "reason": (
            "R1: book_reservation / think / book_reservation ... five times, the same 'payment "
            "amount does not add up' error each time; the run ends unsolved. Reviewed: a loop "
            "(also a cycle of length 2 with the think tool)."
        ),
    },
    "tau-airline-08-t1": {
        "reason": (
            "R1: book_reservation three times with the same error, a think call between each; "
            "the agent then transfers to a human. Reviewed: a loop by the third call."
        ),
    },
    "swe-agent-eps-0e6d2e": {
        "class": "repeated_error",
        "reason": (
            "R1: a CTF demonstration that submits the same wrong flag again and again ('Wrong "
            "flag!' each time) before quoting it differently. Reviewed: a loop by the third "
            "identical submit."
        ),
    },
}
