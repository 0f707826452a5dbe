"""Where shared state lives (budgets, breakers, idempotency keys, dead letters): the ``Store``
protocol and its three implementations.

- :class:`MemoryStore` — the default, one process.
- :class:`SQLiteStore` — one host, many processes, survives restarts.
- :class:`RedisStore` — a fleet of workers on many hosts (needs ``agentguard[redis]``).

:class:`FallbackStore` puts a shared store behind the one outage policy the ledger and
``ToolGuard`` follow (serve locally, say so, re-sync).

:func:`store_from_config` builds the one a :class:`~agentguard.config.StorageConfig` names.
"""

from __future__ import annotations

from agentguard._exports import publish
from agentguard.config import StorageConfig

from ._base import NANOS, BudgetSpec, BudgetState, Charge, Hold, Store, SyncBackedStore
from ._breaker import BreakerOutcome, BreakerRecord, BreakerSpec, BreakerView
from ._fallback import FallbackStore, with_fallback
from .memory import MemoryStore
from .redis import RedisStore
from .sqlite import SQLiteStore

__all__ = [
    "NANOS",
    "BreakerOutcome",
    "BreakerRecord",
    "BreakerSpec",
    "BreakerView",
    "BudgetSpec",
    "BudgetState",
    "Charge",
    "FallbackStore",
    "Hold",
    "MemoryStore",
    "RedisStore",
    "SQLiteStore",
    "Store",
    "SyncBackedStore",
    "store_from_config",
    "with_fallback",
]


def store_from_config(config: StorageConfig) -> Store:
    """The store a ``storage`` configuration section describes.

    Raises:
        StoreUnavailable: the SQLite file cannot be opened.
        ImportError: ``backend: redis`` without the ``redis`` package installed.
    """
    if config.backend == "sqlite":
        assert config.path is not None  # the config validator guarantees it
        return SQLiteStore(config.path, busy_timeout=config.busy_timeout_seconds)
    if config.backend == "redis":
        return RedisStore(config.url, key_prefix=config.key_prefix, timeout=config.timeout_seconds)
    return MemoryStore()


publish(globals())  # repr and pickle name these agentguard.X (see _exports.py)
