"""Configuration: one ``reliability:`` block, validated by pydantic.

The shape follows ARCHITECTURE §5. Load it from a YAML/TOML/JSON file, a dict, or build the
models directly; ``AGENTGUARD_*`` environment variables override single keys::

    AGENTGUARD_TOKEN_BUDGET__PER_SESSION=100000      # section and key joined by "__"
    AGENTGUARD_LOOP_DETECTION__ENABLED=false         # values are parsed as YAML scalars
    AGENTGUARD_FAIL_MODE=closed                      # top-level keys need no section

A bad value raises :class:`~agentguard.ConfigError` naming the key path, the value and what is
allowed. The models are in ``_models.py``; loading, environment overrides and error reporting
beside them in ``_load.py``, written once for every section.
"""

from __future__ import annotations

from agentguard._exports import publish

# ConfigError was importable from here before the split (it is raised here), so it stays.
from agentguard.exceptions import ConfigError as ConfigError

from . import _models
from ._load import ENV_PREFIX
from ._models import *  # noqa: F403 - every model, as listed in _models.__all__

__all__ = ["ENV_PREFIX"]
__all__ += _models.__all__

publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
