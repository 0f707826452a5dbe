"""What the peer benchmarks share: offline flags for litellm and the OpenHands SDK, optional
imports, and the one-row table shown when a peer is not installed.

The peers (litellm, openhands-sdk) are not in the ``bench`` session: ``nox -s bench_peers``
installs them (Python >= 3.12, which openhands-sdk needs) and runs the peer modules.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from importlib import import_module
from types import ModuleType

from _harness import Table

# litellm fetches these at import unless told to use its bundled copies; no telemetry either
for _name, _value in {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_TELEMETRY": "False",
    "OPENHANDS_SUPPRESS_BANNER": "1",
    "LMNR_DISABLE": "true",
    "OTEL_SDK_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)

SESSION = "nox -s bench_peers"


def optional(module: str) -> ModuleType | None:
    """``module`` imported, or ``None`` when it (or one of its dependencies) is not installed."""
    try:
        return import_module(module)
    except ImportError:
        return None


def litellm() -> ModuleType | None:
    """The litellm package with its telemetry off and its logging quiet, or ``None``."""
    module = optional("litellm")
    if module is not None:
        module.telemetry = False
        module.suppress_debug_info = True
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
        logging.getLogger("LiteLLM Router").setLevel(logging.ERROR)
    return module


def missing(title: str, package: str, columns: Sequence[str]) -> Table:
    """The table that stands in for a peer comparison when the peer is not installed."""
    row: list[object] = [f"{package} not installed — run `{SESSION}`"]
    return Table(title, columns, [row + ["-"] * (len(columns) - 1)], placeholder=True)
