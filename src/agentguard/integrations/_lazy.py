"""Importing an optional SDK, with an error that says which extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError`` naming ``pip install "agentguard[extra]"``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this feature needs the optional dependency {module!r}: "
            f'pip install "agentguard[{extra}]"'
        ) from exc
