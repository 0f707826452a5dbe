"""``RedisStore``: budget state on a Redis server, shared by a fleet of workers.

Needs the ``redis`` package (``pip install agentguard[redis]``), imported when a store is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from agentguard.exceptions import StoreError, StoreUnavailable

from ._base import BudgetSpec, BudgetState, Charge, Hold

if TYPE_CHECKING:
    import redis as redis_sync
    import redis.asyncio as redis_async

__all__ = ["RedisStore"]

# Every script starts with the same helpers, so purging and counting cannot differ between
# operations. They mirror agentguard.storage._base (refusal) and MemoryStore. All keys of one
# scope share the hash tag {prefix:scope}, so a Redis Cluster keeps them in one slot and a
# script may touch them together. KEYS: 1 session, 2 window, 3 reservations, 4 leases,
# 5 held, [6 event]. ARGV[1] is always `now`.
_PRELUDE = """
local now = tonumber(ARGV[1])
local S, W, R, Z, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local function drop(id)
  local v = redis.call('HGET', R, id)
  if not v then return false end
  local sep = string.find(v, '|', 1, true)
  local n = tonumber(string.sub(v, 1, sep - 1))
  local field = 's:' .. string.sub(v, sep + 1)
  redis.call('HDEL', R, id)
  redis.call('ZREM', Z, id)
  if redis.call('HINCRBY', H, field, -n) <= 0 then redis.call('HDEL', H, field) end
  redis.call('HINCRBY', H, '*', -n)
  return true
end

local function purge()
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  for _, id in ipairs(gone) do drop(id) end
end

local function state(session, first, want_buckets)
  local st = {0, 0}
  if session ~= '' then
    local v = redis.call('HMGET', S, 't', 'c')
    st = {tonumber(v[1] or 0), tonumber(v[2] or 0)}
  end
  local sh = 0
  if session ~= '' then sh = tonumber(redis.call('HGET', H, 's:' .. session) or 0) end
  local all = redis.call('HGETALL', W)
  local tokens, cost, buckets = 0, 0, {}
  for i = 1, #all, 2 do
    local f = all[i]
    local b = tonumber(string.sub(f, 2))
    local v = tonumber(all[i + 1])
    if b < first then
      redis.call('HDEL', W, f)
    elseif string.sub(f, 1, 1) == 't' then
      tokens = tokens + v
      if want_buckets then table.insert(buckets, {b, v}) end
    else
      cost = cost + v
    end
  end
  local held = tonumber(redis.call('HGET', H, '*') or 0)
  return {st[1], st[2], sh, tokens, cost, held}, buckets
end

local function reply(st, refused, applied, buckets)
  table.insert(st, refused)
  table.insert(st, applied)
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  for _, p in ipairs(buckets) do
    table.insert(st, p[1])
    table.insert(st, p[2])
  end
  return st
end
"""

# ARGV: now, session, id, tokens, expires_at, session_limit, hour_limit, enforce, first,
#       lease_ms
_RESERVE = (
    _PRELUDE
    + """
local session, id, n = ARGV[2], ARGV[3], tonumber(ARGV[4])
local slimit, hlimit = tonumber(ARGV[6]), tonumber(ARGV[7])
local first = tonumber(ARGV[9])
purge()
drop(id)
local st = state(session, first, false)
local refused = ''
if ARGV[8] == '1' then
  if slimit >= 0 and st[1] + st[3] + n > slimit then refused = 'session'
  elseif hlimit >= 0 and st[4] + st[6] + n > hlimit then refused = 'hour' end
end
if refused ~= '' then
  local _, buckets = state(session, first, refused == 'hour')
  return reply(st, refused, 0, buckets)
end
redis.call('HSET', R, id, n .. '|' .. session)
redis.call('ZADD', Z, ARGV[5], id)
redis.call('HINCRBY', H, 's:' .. session, n)
redis.call('HINCRBY', H, '*', n)
local lease = tonumber(ARGV[10])
extend(R, lease)
extend(Z, lease)
extend(H, lease)
st[3] = st[3] + n
st[6] = st[6] + n
return reply(st, '', 1, {})
"""
)

# KEYS: + 6 event. ARGV: now, session, id, tokens, cost, bucket, first, event_ttl_ms,
#       session_ttl_ms, window_ttl_ms
_COMMIT = (
    _PRELUDE
    + """
local session, id = ARGV[2], ARGV[3]
local n, c, bucket, first = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
purge()
drop(id)
local applied = 0
if redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[8]) then
  applied = 1
  redis.call('HINCRBY', S, 't', n)
  redis.call('HINCRBY', S, 'c', c)
  redis.call('PEXPIRE', S, ARGV[9])
  redis.call('HINCRBY', W, 't' .. bucket, n)
  redis.call('HINCRBY', W, 'c' .. bucket, c)
  redis.call('PEXPIRE', W, ARGV[10])
end
local st = state(session, first, false)
return reply(st, '', applied, {})
"""
)

# ARGV: now, id
_RELEASE = (
    _PRELUDE
    + """
purge()
if drop(ARGV[2]) then return 1 end
return 0
"""
)

# ARGV: now, session, first
_SNAPSHOT = (
    _PRELUDE
    + """
purge()
local st = state(ARGV[2], tonumber(ARGV[3]), false)
return reply(st, '', 1, {})
"""
)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _state(reply: Sequence[Any]) -> BudgetState:
    refused = reply[6]
    if isinstance(refused, bytes):
        refused = refused.decode()
    flat = [int(x) for x in reply[8:]]
    return BudgetState(
        int(reply[0]),
        int(reply[1]),
        int(reply[2]),
        int(reply[3]),
        int(reply[4]),
        int(reply[5]),
        refused or None,
        bool(int(reply[7])),
        tuple(zip(flat[::2], flat[1::2], strict=True)),
    )


class RedisStore:
    """Budget state on a Redis server: a fleet of workers on many hosts shares one budget.

    Every operation is one Lua script, so the check and the reservation are atomic on the server
    however many workers race. Each key the scripts write gets its TTL in the same script (a
    crash between two commands cannot leave a key without expiry). All keys of a budget scope
    carry the hash tag ``{prefix:scope}``, so on a Redis Cluster they live in one slot. Redis 6.2
    or newer (or a compatible server such as Valkey) is needed.

    Sync calls use a ``redis.Redis`` client, async calls a ``redis.asyncio.Redis`` client; both
    are built from ``url`` unless given. Connection failures raise
    :class:`~agentguard.StoreUnavailable` at once (no client-side retries: the ledger decides
    whether to fall back).

    Args:
        url: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/socket``.
        key_prefix: prefix of every key.
        timeout: connect and command timeout in seconds.
        client: a ready sync client to use instead of building one from ``url``.
        async_client: a ready asyncio client to use instead of building one from ``url``.
    """

    name = "redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        key_prefix: str = "agentguard",
        timeout: float = 2.0,
        client: redis_sync.Redis | None = None,
        async_client: redis_async.Redis | None = None,
    ) -> None:
        try:
            import redis  # noqa: PLC0415 - optional dependency, imported on use
            from redis.backoff import NoBackoff  # noqa: PLC0415
            from redis.retry import Retry  # noqa: PLC0415
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "RedisStore needs the redis package: pip install 'agentguard[redis]'"
            ) from exc
        if url is None and client is None and async_client is None:
            raise ValueError("RedisStore needs a url or a client")
        self.url = url
        self.key_prefix = key_prefix
        self._timeout = timeout
        self._client: redis_sync.Redis | None = client
        if self._client is None and url is not None:
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
        self._given_async = async_client
        # asyncio clients are bound to the event loop that first used them: keep one per loop.
        self._async: dict[asyncio.AbstractEventLoop, redis_async.Redis] = {}
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._redis_error = redis.exceptions.RedisError
        self._sync_scripts: dict[str, Any] = {}
        self._async_scripts: dict[tuple[asyncio.AbstractEventLoop, str], Any] = {}

    # -- keys and arguments (shared by the sync and async paths) --------------------------

    def _keys(
        self, spec: BudgetSpec, session: str | None, event_id: str | None = None
    ) -> list[str]:
        base = f"{self.key_prefix}:{{{spec.scope}}}"
        keys = [f"{base}:s:{session or ''}", f"{base}:w", f"{base}:r", f"{base}:z", f"{base}:h"]
        if event_id is not None:
            keys.append(f"{base}:e:{event_id}")
        return keys

    def _reserve_call(
        self, spec: BudgetSpec, hold: Hold, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [
            repr(now),
            hold.session,
            hold.id,
            hold.tokens,
            repr(hold.expires_at),
            -1 if spec.session_limit is None else spec.session_limit,
            -1 if spec.hour_limit is None else spec.hour_limit,
            1 if spec.enforce else 0,
            spec.first_live(now),
            _ms(hold.expires_at - now + spec.bucket_seconds),
        ]
        return _RESERVE, self._keys(spec, hold.session), args

    def _commit_call(
        self, spec: BudgetSpec, charge: Charge, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [
            repr(now),
            charge.session,
            charge.reservation_id,
            charge.tokens,
            charge.cost,
            spec.bucket(now),
            spec.first_live(now),
            _ms(spec.event_ttl),
            _ms(spec.session_ttl),
            _ms(spec.span_seconds + spec.bucket_seconds),
        ]
        return _COMMIT, self._keys(spec, charge.session, charge.event_id), args

    def _release_call(
        self, spec: BudgetSpec, reservation_id: str, now: float
    ) -> tuple[str, list[str], list[Any]]:
        return _RELEASE, self._keys(spec, None), [repr(now), reservation_id]

    def _snapshot_call(
        self, spec: BudgetSpec, session: str | None, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [repr(now), session or "", spec.first_live(now)]
        return _SNAPSHOT, self._keys(spec, session), args

    # -- execution --------------------------------------------------------------------------

    def _run(self, call: tuple[str, list[str], list[Any]]) -> Any:
        source, keys, args = call
        if self._client is None:
            raise StoreError("this RedisStore has only an async client; use the a* methods")
        script = self._sync_scripts.get(source)
        if script is None:
            script = self._sync_scripts[source] = self._client.register_script(source)
        try:
            return script(keys=keys, args=args)
        except self._errors as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except self._redis_error as exc:
            raise StoreError(f"Redis store failed: {exc}") from exc

    def _aclient(self) -> redis_async.Redis:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            if self._given_async is not None:
                client = self._given_async
            elif self.url is not None:
                import redis.asyncio as aredis  # noqa: PLC0415 - optional dependency
                from redis.asyncio.retry import Retry as ARetry  # noqa: PLC0415
                from redis.backoff import NoBackoff  # noqa: PLC0415

                client = aredis.Redis.from_url(
                    self.url,
                    socket_timeout=self._timeout,
                    socket_connect_timeout=self._timeout,
                    retry=ARetry(NoBackoff(), 0),
                )
            else:
                raise StoreError("this RedisStore has only a sync client; use the sync methods")
            self._async[loop] = client
        return client

    async def _arun(self, call: tuple[str, list[str], list[Any]]) -> Any:
        source, keys, args = call
        client = self._aclient()
        loop = asyncio.get_running_loop()
        script = self._async_scripts.get((loop, source))
        if script is None:
            script = self._async_scripts[(loop, source)] = client.register_script(source)
        try:
            result: Awaitable[Any] = script(keys=keys, args=args)
            return await result
        except self._errors as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except self._redis_error as exc:
            raise StoreError(f"Redis store failed: {exc}") from exc

    # -- the Store protocol ----------------------------------------------------------------

    def reserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.reserve`."""
        return _state(self._run(self._reserve_call(spec, hold, now)))

    def commit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.commit`."""
        return _state(self._run(self._commit_call(spec, charge, now)))

    def release(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.release`."""
        return bool(self._run(self._release_call(spec, reservation_id, now)))

    def snapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """See :meth:`agentguard.storage.Store.snapshot`."""
        return _state(self._run(self._snapshot_call(spec, session, now)))

    async def areserve(self, spec: BudgetSpec, hold: Hold, now: float) -> BudgetState:
        """Async twin of :meth:`reserve`."""
        return _state(await self._arun(self._reserve_call(spec, hold, now)))

    async def acommit(self, spec: BudgetSpec, charge: Charge, now: float) -> BudgetState:
        """Async twin of :meth:`commit`."""
        return _state(await self._arun(self._commit_call(spec, charge, now)))

    async def arelease(self, spec: BudgetSpec, reservation_id: str, now: float) -> bool:
        """Async twin of :meth:`release`."""
        return bool(await self._arun(self._release_call(spec, reservation_id, now)))

    async def asnapshot(self, spec: BudgetSpec, session: str | None, now: float) -> BudgetState:
        """Async twin of :meth:`snapshot`."""
        return _state(await self._arun(self._snapshot_call(spec, session, now)))

    def close(self) -> None:
        """Close the sync client's connections (async clients close with their event loop)."""
        if self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close the asyncio client of the running event loop."""
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.key_prefix!r})"
