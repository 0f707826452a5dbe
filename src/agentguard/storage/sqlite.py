"""``SQLiteStore``: shared state in one file, shared by the processes of one host."""

from __future__ import annotations

import functools
import os
import random
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio.to_thread

from agentguard import _clock
from agentguard.exceptions import StoreError, StoreUnavailable

from ._base import (
    MAX_COST,
    MAX_TOKENS,
    BudgetSpec,
    BudgetState,
    Charge,
    Hold,
    SyncBackedStore,
    bounded,
    refusal,
)
from ._breaker import BreakerRecord, BreakerSpec

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

T = TypeVar("T")

#: The schema this code writes; kept in the file's ``PRAGMA user_version``.
SCHEMA_VERSION = 2

# Each entry migrates from version (index) to version (index + 1).
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        scope TEXT NOT NULL, session TEXT NOT NULL,
        tokens INTEGER NOT NULL, cost INTEGER NOT NULL, seen REAL NOT NULL,
        PRIMARY KEY (scope, session)) WITHOUT ROWID;
    CREATE INDEX sessions_seen ON sessions (scope, seen);
    CREATE TABLE buckets (
        scope TEXT NOT NULL, bucket INTEGER NOT NULL,
        tokens INTEGER NOT NULL, cost INTEGER NOT NULL,
        PRIMARY KEY (scope, bucket)) WITHOUT ROWID;
    CREATE TABLE reservations (
        scope TEXT NOT NULL, id TEXT NOT NULL, session TEXT NOT NULL,
        tokens INTEGER NOT NULL, expires_at REAL NOT NULL,
        PRIMARY KEY (scope, id)) WITHOUT ROWID;
    CREATE INDEX reservations_expiry ON reservations (scope, expires_at);
    CREATE INDEX reservations_session ON reservations (scope, session);
    CREATE TABLE events (
        scope TEXT NOT NULL, id TEXT NOT NULL, expires_at REAL NOT NULL,
        PRIMARY KEY (scope, id)) WITHOUT ROWID;
    CREATE INDEX events_expiry ON events (scope, expires_at);
    """,
    """
    CREATE TABLE breakers (
        name TEXT NOT NULL PRIMARY KEY, record TEXT NOT NULL, expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE records (
        namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, expires_at REAL NOT NULL,
        PRIMARY KEY (namespace, key)) WITHOUT ROWID;
    CREATE INDEX records_expiry ON records (expires_at);
    """,
)

# First open: the backoff between tries for the file's lock (seconds, doubled each try).
_FIRST_DELAY = 0.005
_MAX_DELAY = 0.25

_STATE = """
SELECT
    COALESCE((SELECT tokens FROM sessions WHERE scope = :scope AND session = :session), 0),
    COALESCE((SELECT cost FROM sessions WHERE scope = :scope AND session = :session), 0),
    (SELECT COALESCE(SUM(tokens), 0) FROM reservations WHERE scope = :scope AND session = :session),
    (SELECT COALESCE(SUM(tokens), 0) FROM buckets WHERE scope = :scope AND bucket >= :first),
    (SELECT COALESCE(SUM(cost), 0) FROM buckets WHERE scope = :scope AND bucket >= :first),
    (SELECT COALESCE(SUM(tokens), 0) FROM reservations WHERE scope = :scope)
"""


class SQLiteStore(SyncBackedStore):
    """Shared state in a SQLite file: one host, many processes, survives restarts.

    Every operation is one ``BEGIN IMMEDIATE`` transaction, so the check and the reservation
    happen under the file's write lock and concurrent processes are serialised by SQLite itself.
    The file runs in WAL mode (readers never block the writer) with ``synchronous=NORMAL``: a
    process that dies (even by SIGKILL) loses nothing committed; a power cut may lose the last
    few commits but never corrupts the file. The schema is versioned (``PRAGMA user_version``)
    and created on first use.

    Open one store per process (after any ``fork``); within a process it is thread-safe.

    Args:
        path: the database file (created if missing).
        busy_timeout: seconds to wait for another process's write lock before
            :class:`~agentguard.StoreUnavailable` (and, at first open, to keep retrying the
            set-up before leaving it to the first operation).
        sleep: how to wait between first-open tries (injected by tests).
        clock: monotonic seconds, for the first open's deadline (injected by tests).
    """

    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        sleep: Callable[[float], None] = _clock.sleep,
        clock: Callable[[], float] = _clock.monotonic,
    ) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._ready = False
        try:
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {exc}") from exc
        # Many processes opening a new file at once race for the exclusive lock that switching
        # to WAL and creating the schema need, and SQLite's busy handler does not cover every
        # step of it. Retry with a jittered backoff until one deadline, busy_timeout from now;
        # the tries do not wait in the busy handler, so the backoff is the only wait and the
        # whole set-up takes about busy_timeout at most. If the file is still locked, the
        # constructor does not fail: the first operation finishes the set-up (or raises
        # StoreUnavailable, which the outage policy handles like any other).
        deadline = clock() + busy_timeout
        delay = _FIRST_DELAY
        while True:
            try:
                with self._lock:
                    self._set_up_without_waiting(busy_timeout)
                return
            except StoreUnavailable:
                left = deadline - clock()
                if left <= 0:
                    return
                sleep(min(delay * random.uniform(0.5, 1.5), left))
                delay = min(delay * 2, _MAX_DELAY)

    @property
    def ready(self) -> bool:
        """Whether the file is set up (WAL mode, schema): ``False`` after a first open that found
        it locked by another process for the whole ``busy_timeout`` (the next operation tries
        again, waiting ``busy_timeout`` once more)."""
        return self._ready

    def _set_up_without_waiting(self, busy_timeout: float) -> None:
        """:meth:`_setup` with SQLite's busy handler off (the caller holds ``self._lock``)."""
        db = self._db
        try:
            db.execute("PRAGMA busy_timeout = 0")
            try:
                self._setup()
            finally:
                db.execute(f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _setup(self) -> None:
        """WAL mode and the schema, once per connection; the caller holds ``self._lock``."""
        db = self._db
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        with self._locked_transaction() as tx:
            version = tx.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"SQLite store {self.path!r} has schema version {version}, newer than this "
                    f"agentguard understands ({SCHEMA_VERSION}); upgrade agentguard"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        tx.execute(statement)
            if version != SCHEMA_VERSION:
                tx.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._ready = True

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and (
            "locked" in text or "busy" in text or "unable to open" in text
        ):
            return StoreUnavailable(f"SQLite store {self.path!r}: {exc}")
        return StoreError(f"SQLite store {self.path!r}: {exc}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if not self._ready:
                self._setup()
            with self._locked_transaction() as db:
                yield db

    @contextmanager
    def _locked_transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise self._error(exc) from exc

    @staticmethod
    def _expire(db: sqlite3.Connection, spec: BudgetSpec, now: float) -> None:
        scope = spec.scope
        db.execute("DELETE FROM reservations WHERE scope = ? AND expires_at <= ?", (scope, now))
        db.execute(
            "DELETE FROM buckets WHERE scope = ? AND bucket < ?", (scope, spec.first_live(now))
        )
        db.execute("DELETE FROM events WHERE scope = ? AND expires_at <= ?", (scope, now))
        db.execute(
            "DELETE FROM sessions WHERE scope = ? AND seen <= ?", (scope, now - spec.session_ttl)
        )

    @staticmethod
    def _state(
        db: sqlite3.Connection,
        spec: BudgetSpec,
        session: str | None,
        now: float,
        *,
        refused: str | None = None,
        applied: bool = True,
    ) -> BudgetState:
        row = db.execute(
            _STATE, {"scope": spec.scope, "session": session, "first": spec.first_live(now)}
        ).fetchone()
        buckets: tuple[tuple[int, int], ...] = ()
        if refused == "hour":
            buckets = tuple(
                db.execute(
                    "SELECT bucket, tokens FROM buckets WHERE scope = ? AND bucket >= ? "
                    "ORDER BY bucket",
                    (spec.scope, spec.first_live(now)),
                ).fetchall()
            )
        t, c, held, hour_t, hour_c, hour_held = row
        return BudgetState(t, c, held, hour_t, hour_c, hour_held, refused, applied, buckets)

    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.reserve`."""
        with self._transaction() as db:
            self._expire(db, spec, now)
            db.execute("DELETE FROM reservations WHERE scope = ? AND id = ?", (spec.scope, hold.id))
            state = self._state(db, spec, hold.session, now)
            tokens = bounded(hold.tokens, MAX_TOKENS)
            needed = tokens + bounded(hold.headroom, MAX_TOKENS)
            refused = refusal(spec, state.session_used, state.hour_used, needed)
            if refused is not None:
                return self._state(db, spec, hold.session, now, refused=refused, applied=False)
            db.execute(
                "INSERT INTO reservations VALUES (?, ?, ?, ?, ?)",
                (spec.scope, hold.id, hold.session, tokens, hold.expires_at),
            )
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, 0, 0, ?) "
                "ON CONFLICT (scope, session) DO UPDATE SET seen = MAX(seen, excluded.seen)",
                (spec.scope, hold.session, now),
            )
            return self._state(db, spec, hold.session, now)

    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.commit`."""
        with self._transaction() as db:
            self._expire(db, spec, now)
            db.execute(
                "DELETE FROM reservations WHERE scope = ? AND id = ?",
                (spec.scope, charge.reservation_id),
            )
            new = db.execute(
                "INSERT INTO events VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (spec.scope, charge.event_id, now + spec.event_ttl),
            ).rowcount
            if new:
                tokens = bounded(charge.tokens, MAX_TOKENS)
                cost = bounded(charge.cost, MAX_COST)
                db.execute(
                    "INSERT INTO sessions VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (scope, session) DO UPDATE SET tokens = tokens + excluded.tokens, "
                    "cost = cost + excluded.cost, seen = MAX(seen, excluded.seen)",
                    (spec.scope, charge.session, tokens, cost, now),
                )
                # (a late re-sync may add a bucket already out of the window: the next
                # operation's expiry drops it, exactly as if it had been counted in time)
                db.execute(
                    "INSERT INTO buckets VALUES (?, ?, ?, ?) ON CONFLICT (scope, bucket) "
                    "DO UPDATE SET tokens = tokens + excluded.tokens, cost = cost + excluded.cost",
                    (spec.scope, spec.bucket(now), tokens, cost),
                )
            return self._state(db, spec, charge.session, now, applied=bool(new))

    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.release`."""
        with self._transaction() as db:
            self._expire(db, spec, now)
            gone = db.execute(
                "DELETE FROM reservations WHERE scope = ? AND id = ?", (spec.scope, reservation_id)
            ).rowcount
            return bool(gone)

    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.renew`."""
        with self._transaction() as db:
            self._expire(db, spec, now)
            held = db.execute(
                "UPDATE reservations SET expires_at = MAX(expires_at, ?) "
                "WHERE scope = ? AND id = ?",
                (expires_at, spec.scope, reservation_id),
            ).rowcount
            return bool(held)

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.snapshot`."""
        with self._transaction() as db:
            self._expire(db, spec, now)
            return self._state(db, spec, session, now)

    # -- breakers and records ---------------------------------------------------------------

    def _breaker(self, spec: BreakerSpec, now: float, step: Callable[[BreakerRecord], T]) -> T:
        with self._transaction() as db:
            row = db.execute(
                "SELECT record FROM breakers WHERE name = ? AND expires_at > ?", (spec.name, now)
            ).fetchone()
            record = BreakerRecord.from_json(row[0] if row else None)
            result = step(record)
            db.execute(
                "INSERT INTO breakers VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "record = excluded.record, expires_at = excluded.expires_at",
                (spec.name, record.to_json(), now + spec.ttl),
            )
            return result

    @staticmethod
    def _expire_records(db: sqlite3.Connection, now: float) -> None:
        db.execute("DELETE FROM records WHERE expires_at <= ?", (now,))
        db.execute("DELETE FROM breakers WHERE expires_at <= ?", (now,))

    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """See :meth:`agentguard.storage.Store.claim`."""
        with self._transaction() as db:
            self._expire_records(db, now)
            row = db.execute(
                "SELECT value FROM records WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
            if row is not None:
                return str(row[0])
            db.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?)", (namespace, key, value, now + ttl)
            )
            return None

    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """See :meth:`agentguard.storage.Store.put`."""
        with self._transaction() as db:
            self._expire_records(db, now)
            db.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?) ON CONFLICT (namespace, key) DO UPDATE "
                "SET value = excluded.value, expires_at = excluded.expires_at",
                (namespace, key, value, now + ttl),
            )

    def get(self, namespace: str, key: str, now: float) -> str | None:
        """See :meth:`agentguard.storage.Store.get`."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT value FROM records WHERE namespace = ? AND key = ? AND expires_at > ?",
                (namespace, key, now),
            ).fetchone()
            return None if row is None else str(row[0])

    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """See :meth:`agentguard.storage.Store.items`."""
        with self._transaction() as db:
            self._expire_records(db, now)
            rows = db.execute(
                "SELECT key, value FROM records WHERE namespace = ? ORDER BY key", (namespace,)
            ).fetchall()
            return [(str(k), str(v)) for k, v in rows]

    def delete(self, namespace: str, key: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.delete`."""
        with self._transaction() as db:
            self._expire_records(db, now)
            gone = db.execute(
                "DELETE FROM records WHERE namespace = ? AND key = ?", (namespace, key)
            ).rowcount
            return bool(gone)

    async def _offload(self, fn: Callable[..., T], *args: object) -> T:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"
