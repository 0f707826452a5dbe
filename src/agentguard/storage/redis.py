"""``RedisStore``: shared state on a Redis server, shared by a fleet of workers.

Needs the ``redis`` package (``pip install agentguard[redis]``), imported when a store is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentguard.exceptions import StoreError, StoreUnavailable

from ._base import MAX_COST, MAX_TOKENS, BudgetSpec, BudgetState, Charge, Hold, bounded
from ._breaker import BreakerOutcome, BreakerSpec, BreakerView

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
#       lease_ms, headroom
_RESERVE = (
    _PRELUDE
    + """
local session, id, n = ARGV[2], ARGV[3], tonumber(ARGV[4])
local slimit, hlimit = tonumber(ARGV[6]), tonumber(ARGV[7])
local first = tonumber(ARGV[9])
local need = n + tonumber(ARGV[11])
purge()
drop(id)
local st = state(session, first, false)
local refused = ''
if ARGV[8] == '1' then
  if slimit >= 0 and st[1] + st[3] + need > slimit then refused = 'session'
  elseif hlimit >= 0 and st[4] + st[6] + need > hlimit then refused = 'hour' end
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

# ARGV: now, id, expires_at, lease_ms
_RENEW = (
    _PRELUDE
    + """
local id, at = ARGV[2], tonumber(ARGV[3])
purge()
if redis.call('HEXISTS', R, id) == 0 then return 0 end
local score = redis.call('ZSCORE', Z, id)
if (not score) or at > tonumber(score) then redis.call('ZADD', Z, ARGV[3], id) end
local lease = tonumber(ARGV[4])
extend(R, lease)
extend(Z, lease)
extend(H, lease)
return 1
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


# One breaker, one key holding its record as JSON (the form BreakerRecord.to_json writes). The
# script mirrors agentguard.storage._breaker line for line. KEYS: 1 the breaker. ARGV: op
# (allow, success, failure, ignored, view), now, failure_rate, min_calls, width, buckets,
# open_for, half_open_probes, close_after, probe_lease (-1: none), ttl_ms.
_BREAKER = """
local op, now = ARGV[1], tonumber(ARGV[2])
local rate, min_calls, width = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local nbuckets, open_for = tonumber(ARGV[6]), tonumber(ARGV[7])
local probes, close_after, lease = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local raw = redis.call('GET', KEYS[1])
local r
if raw then r = cjson.decode(raw) else r = {s = 'closed', r = -1, f = 0, u = -1, p = 0, w = {}} end
local calls, failures = 0, 0
for _, b in ipairs(r.w) do calls = calls + b[2] + b[3]; failures = failures + b[3] end
local changes = {}

local function prune()
  local oldest = math.floor(now / width) - nbuckets
  while #r.w > 0 and r.w[1][1] <= oldest do
    local b = table.remove(r.w, 1)
    calls = calls - b[2] - b[3]
    failures = failures - b[3]
  end
end

local function move(state)
  table.insert(changes, r.s)
  table.insert(changes, state)
  r.s = state
  if state == 'open' then r.r = now + open_for
  elseif state == 'closed' then r.r = -1; r.w = {}; calls = 0; failures = 0 end
  r.f = 0
  r.u = -1
  r.p = 0
end

if r.s == 'open' and r.r >= 0 and now >= r.r then move('half_open') end
if r.u >= 0 and now >= r.u then r.f = 0; r.u = -1 end

local allowed, probe = 0, 0
if op == 'allow' then
  if r.s == 'closed' then allowed = 1
  elseif r.s == 'half_open' and r.f < probes then
    r.f = r.f + 1
    if lease >= 0 then r.u = now + lease end
    allowed, probe = 1, 1
  end
elseif op ~= 'view' then
  if r.s == 'half_open' then
    r.f = math.max(0, r.f - 1)
    if op == 'failure' then move('open')
    elseif op == 'success' then
      r.p = r.p + 1
      if r.p >= close_after then move('closed') end
    end
  elseif r.s == 'closed' and op ~= 'ignored' then
    local index = math.floor(now / width)
    prune()
    local last = r.w[#r.w]
    if last == nil or last[1] ~= index then
      last = {index, 0, 0}
      table.insert(r.w, last)
    end
    local bad = 0
    if op == 'failure' then bad = 1 end
    last[2] = last[2] + 1 - bad
    last[3] = last[3] + bad
    calls = calls + 1
    failures = failures + bad
    if failures > 0 and calls >= min_calls and failures >= rate * calls then move('open') end
  end
end
prune()
redis.call('SET', KEYS[1], cjson.encode(r), 'PX', ARGV[11])
local retry_at = r.r
if r.s == 'half_open' and allowed == 0 then retry_at = r.u end
local out = {r.s, allowed, probe, tostring(retry_at), calls, failures}
for _, c in ipairs(changes) do table.insert(out, c) end
return out
"""

# Records of a namespace: one string key each (with its TTL) plus a sorted set indexing the
# keys by expiry, so `items` can list them. KEYS: 1 the record, 2 the index. ARGV: op, now,
# key, value, ttl_ms, expires_at.
_RECORD = """
local op, now, key = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local function store()
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
  redis.call('ZADD', KEYS[2], ARGV[6], key)
  if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
end
if op == 'claim' then
  local existing = redis.call('GET', KEYS[1])
  if existing then return existing end
  store()
  return false
elseif op == 'put' then
  store()
  return false
end
redis.call('ZREM', KEYS[2], key)
return redis.call('DEL', KEYS[1])
"""


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


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(keys: list[str], values: Sequence[Any]) -> list[tuple[str, str]]:
    # a record may expire between the two reads: skip it
    found = [(k, _text(v)) for k, v in zip(keys, values, strict=True)]
    return sorted((k, v) for k, v in found if v is not None)


def _breaker_view(reply: Sequence[Any]) -> BreakerView:
    words = [_text(x) or "" for x in reply]
    changes = tuple(zip(words[6::2], words[7::2], strict=True))
    retry_at = float(words[3])
    return BreakerView(
        words[0],
        words[1] == "1",
        words[2] == "1",
        None if retry_at < 0 else retry_at,
        int(words[4]),
        int(words[5]),
        changes,
    )


class RedisStore:
    """Shared state on a Redis server: a fleet of workers on many hosts shares one budget.

    Every operation is one Lua script, so the check and the reservation are atomic on the server
    however many workers race. Each key the scripts write gets its TTL in the same script (a
    crash between two commands cannot leave a key without expiry). All keys of a budget scope
    carry the hash tag ``{prefix:scope}``, so on a Redis Cluster they live in one slot. Redis 6.2
    or newer (or a compatible server such as Valkey) is needed.

    Sync calls use a ``redis.Redis`` client, async calls a ``redis.asyncio.Redis`` client; both
    are built from ``url`` unless given. Connection failures raise
    :class:`~agentguard.StoreUnavailable` at once (no client-side retries: the ledger decides
    whether to fall back).

    Concurrency is not an outage: the clients built from ``url`` draw from a *blocking*
    connection pool of ``max_connections``, so the 101st concurrent operation waits (up to
    ``pool_timeout`` seconds) for a connection to come back instead of failing with "Too many
    connections". Only a wait past ``pool_timeout`` counts as the store being unreachable.

    An asyncio client is bound to its event loop: async calls use one per running loop, closed
    (its connections with it) when that loop shuts down: at the end of ``asyncio.run`` (or of
    any runner that shuts down the loop's async generators), or by :meth:`aclose` on the loop.
    One whose loop was closed without that is dropped when the next loop first uses the store.
    So a worker running ``asyncio.run`` per request holds one pool, not one per request.

    Args:
        url: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/socket``.
        key_prefix: prefix of every key.
        timeout: connect and command timeout in seconds.
        client: a ready sync client to use instead of building one from ``url``.
        async_client: a ready asyncio client to use instead of building one from ``url``.
        max_connections: connections per pool (one pool for sync calls, one per event loop).
        pool_timeout: seconds an operation waits for a free connection of the pool.
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
        max_connections: int = 100,
        pool_timeout: float = 30.0,
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
        self._max_connections = max_connections
        self._pool_timeout = pool_timeout
        self._client: redis_sync.Redis | None = client
        self._client_owned = client is None and url is not None
        if self._client is None and url is not None:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=pool_timeout,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
            self._client = redis.Redis(connection_pool=pool)
        self._given_async = async_client
        # asyncio clients are bound to the event loop that first used them: one per live loop,
        # closed with it (see _aclient)
        self._async: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._async_lock = threading.RLock()
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._redis_error = redis.exceptions.RedisError
        self._sync_scripts: dict[str, Any] = {}

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
            bounded(hold.tokens, MAX_TOKENS),
            repr(hold.expires_at),
            -1 if spec.session_limit is None else spec.session_limit,
            -1 if spec.hour_limit is None else spec.hour_limit,
            1 if spec.enforce else 0,
            spec.first_live(now),
            _ms(hold.expires_at - now + spec.bucket_seconds),
            bounded(hold.headroom, MAX_TOKENS),
        ]
        return _RESERVE, self._keys(spec, hold.session), args

    def _commit_call(
        self, spec: BudgetSpec, charge: Charge, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [
            repr(now),
            charge.session,
            charge.reservation_id,
            bounded(charge.tokens, MAX_TOKENS),
            bounded(charge.cost, MAX_COST),
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

    def _renew_call(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float
    ) -> tuple[str, list[str], list[Any]]:
        lease_ms = _ms(expires_at - now + spec.bucket_seconds)
        args = [repr(now), reservation_id, repr(expires_at), lease_ms]
        return _RENEW, self._keys(spec, None), args

    def _snapshot_call(
        self, spec: BudgetSpec, session: str | None, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [repr(now), session or "", spec.first_live(now)]
        return _SNAPSHOT, self._keys(spec, session), args

    def _breaker_call(
        self, spec: BreakerSpec, op: str, now: float
    ) -> tuple[str, list[str], list[Any]]:
        args = [
            op,
            repr(now),
            repr(spec.failure_rate),
            spec.min_calls,
            repr(spec.width),
            spec.buckets,
            repr(spec.open_for),
            spec.half_open_probes,
            spec.close_after,
            -1 if spec.probe_lease is None else repr(spec.probe_lease),
            _ms(spec.ttl),
        ]
        return _BREAKER, [f"{self.key_prefix}:breaker:{{{spec.name}}}"], args

    def _record_keys(self, namespace: str, key: str) -> list[str]:
        base = f"{self.key_prefix}:{{rec:{namespace}}}"
        return [f"{base}:k:{key}", f"{base}:index"]

    def _record_call(
        self, op: str, namespace: str, key: str, now: float, *, value: str = "", ttl: float = 0.0
    ) -> tuple[str, list[str], list[Any]]:
        args = [op, repr(now), key, value, _ms(ttl), repr(now + ttl)]
        return _RECORD, self._record_keys(namespace, key), args

    def _index(self, namespace: str) -> str:
        return self._record_keys(namespace, "")[1]

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

    def _aclient(self) -> _LoopClient:
        """The asyncio client of the running loop (made on the loop's first use, and closed
        when the loop shuts down: see :meth:`_closer`)."""
        loop = asyncio.get_running_loop()
        found = self._async.get(loop)
        if found is not None:
            return found
        with self._async_lock:
            found = self._async.get(loop)
            if found is None:
                self._drop_closed()
                found = _LoopClient(self._new_aclient())
                found.closer = self._closer(loop, found)
                self._async[loop] = found
                _start(found.closer)
        return found

    def _new_aclient(self) -> redis_async.Redis:
        if self._given_async is not None:
            return self._given_async
        if self.url is None:
            raise StoreError("this RedisStore has only a sync client; use the sync methods")
        import redis.asyncio as aredis  # noqa: PLC0415 - optional dependency
        from redis.asyncio.retry import Retry as ARetry  # noqa: PLC0415
        from redis.backoff import NoBackoff  # noqa: PLC0415

        pool = aredis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=self._max_connections,
            timeout=self._pool_timeout,
            socket_timeout=self._timeout,
            socket_connect_timeout=self._timeout,
            retry=ARetry(NoBackoff(), 0),
        )
        return aredis.Redis(connection_pool=pool)

    async def _closer(
        self, loop: asyncio.AbstractEventLoop, entry: _LoopClient
    ) -> AsyncGenerator[None, None]:
        """Closes ``entry``'s client when ``loop`` shuts down.

        An async generator, started on ``loop`` and left waiting: a loop shutting down closes
        the async generators it ran (``loop.shutdown_asyncgens()``, which ``asyncio.run`` and
        ``asyncio.Runner`` call while the loop still runs), so its ``finally`` closes the
        client on its own loop, as an asyncio client must be closed."""
        try:
            yield
        finally:
            with self._async_lock:
                if self._async.get(loop) is entry:
                    del self._async[loop]
            if not loop.is_closed():  # (dropped by _drop_closed: nothing can run on it now)
                client = entry.client
                with contextlib.suppress(Exception):  # a store gone away: nothing left to close
                    await client.aclose(close_connection_pool=client is not self._given_async)

    def _drop_closed(self) -> None:
        """Forget the clients of loops closed without shutting down their async generators
        (a bare ``loop.close()``): their connections close as they are collected."""
        for loop, entry in list(self._async.items()):
            if loop.is_closed():
                del self._async[loop]
                if entry.closer is not None:
                    _finish(entry.closer)

    async def _arun(self, call: tuple[str, list[str], list[Any]]) -> Any:
        source, keys, args = call
        entry = self._aclient()
        script = entry.scripts.get(source)
        if script is None:
            script = entry.scripts[source] = entry.client.register_script(source)
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

    def renew(self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.renew`."""
        return bool(self._run(self._renew_call(spec, reservation_id, expires_at, now)))

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

    async def arenew(
        self, spec: BudgetSpec, reservation_id: str, expires_at: float, now: float
    ) -> bool:
        """Async twin of :meth:`renew`."""
        return bool(await self._arun(self._renew_call(spec, reservation_id, expires_at, now)))

    # -- breakers and records ---------------------------------------------------------------

    def breaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_allow`."""
        return _breaker_view(self._run(self._breaker_call(spec, "allow", now)))

    def breaker_record(self, spec: BreakerSpec, outcome: BreakerOutcome, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_record`."""
        return _breaker_view(self._run(self._breaker_call(spec, outcome, now)))

    def breaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """See :meth:`agentguard.storage.Store.breaker_view`."""
        return _breaker_view(self._run(self._breaker_call(spec, "view", now)))

    async def abreaker_allow(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_allow`."""
        return _breaker_view(await self._arun(self._breaker_call(spec, "allow", now)))

    async def abreaker_record(
        self, spec: BreakerSpec, outcome: BreakerOutcome, now: float
    ) -> BreakerView:
        """Async twin of :meth:`breaker_record`."""
        return _breaker_view(await self._arun(self._breaker_call(spec, outcome, now)))

    async def abreaker_view(self, spec: BreakerSpec, now: float) -> BreakerView:
        """Async twin of :meth:`breaker_view`."""
        return _breaker_view(await self._arun(self._breaker_call(spec, "view", now)))

    def claim(self, namespace: str, key: str, value: str, now: float, ttl: float) -> str | None:
        """See :meth:`agentguard.storage.Store.claim`."""
        return _text(
            self._run(self._record_call("claim", namespace, key, now, value=value, ttl=ttl))
        )

    def put(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """See :meth:`agentguard.storage.Store.put`."""
        self._run(self._record_call("put", namespace, key, now, value=value, ttl=ttl))

    def get(self, namespace: str, key: str, now: float) -> str | None:
        """See :meth:`agentguard.storage.Store.get`."""
        record = self._record_keys(namespace, key)[0]
        return _text(self._command(lambda client: client.get(record)))

    def items(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """See :meth:`agentguard.storage.Store.items`."""
        index = self._index(namespace)
        found = self._command(lambda client: client.zrangebyscore(index, now, "+inf"))
        keys = [_text(k) or "" for k in found]
        if not keys:
            return []
        records = [self._record_keys(namespace, k)[0] for k in keys]
        return _pairs(keys, self._command(lambda client: client.mget(records)))

    def delete(self, namespace: str, key: str, now: float) -> bool:
        """See :meth:`agentguard.storage.Store.delete`."""
        return bool(self._run(self._record_call("delete", namespace, key, now)))

    async def aclaim(
        self, namespace: str, key: str, value: str, now: float, ttl: float
    ) -> str | None:
        """Async twin of :meth:`claim`."""
        call = self._record_call("claim", namespace, key, now, value=value, ttl=ttl)
        return _text(await self._arun(call))

    async def aput(self, namespace: str, key: str, value: str, now: float, ttl: float) -> None:
        """Async twin of :meth:`put`."""
        await self._arun(self._record_call("put", namespace, key, now, value=value, ttl=ttl))

    async def aget(self, namespace: str, key: str, now: float) -> str | None:
        """Async twin of :meth:`get`."""
        record = self._record_keys(namespace, key)[0]
        return _text(await self._acommand(lambda client: client.get(record)))

    async def aitems(self, namespace: str, now: float) -> list[tuple[str, str]]:
        """Async twin of :meth:`items`."""
        index = self._index(namespace)
        found = await self._acommand(lambda client: client.zrangebyscore(index, now, "+inf"))
        keys = [_text(k) or "" for k in found]
        if not keys:
            return []
        records = [self._record_keys(namespace, k)[0] for k in keys]
        return _pairs(keys, await self._acommand(lambda client: client.mget(records)))

    async def adelete(self, namespace: str, key: str, now: float) -> bool:
        """Async twin of :meth:`delete`."""
        return bool(await self._arun(self._record_call("delete", namespace, key, now)))

    def _command(self, command: Callable[[redis_sync.Redis], Any]) -> Any:
        if self._client is None:
            raise StoreError("this RedisStore has only an async client; use the a* methods")
        try:
            return command(self._client)
        except self._errors as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except self._redis_error as exc:
            raise StoreError(f"Redis store failed: {exc}") from exc

    async def _acommand(self, command: Callable[[redis_async.Redis], Awaitable[Any]]) -> Any:
        client = self._aclient().client
        try:
            return await command(client)
        except self._errors as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except self._redis_error as exc:
            raise StoreError(f"Redis store failed: {exc}") from exc

    def close(self) -> None:
        """Close the sync client's connections (an async client closes when its event loop
        shuts down, or by :meth:`aclose` on that loop)."""
        if self._client is not None:
            self._client.close()
            if self._client_owned:  # built here: its pool's connections are ours to close
                self._client.connection_pool.disconnect()

    async def aclose(self) -> None:
        """Close the asyncio client of the running event loop."""
        with self._async_lock:
            entry = self._async.get(asyncio.get_running_loop())
        if entry is not None and entry.closer is not None:
            await entry.closer.aclose()  # its ``finally`` closes the client

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.key_prefix!r})"


class _LoopClient:
    """The asyncio client of one event loop, its registered scripts, and its closer."""

    __slots__ = ("client", "closer", "scripts")

    def __init__(self, client: redis_async.Redis) -> None:
        self.client = client
        self.scripts: dict[str, Any] = {}
        self.closer: AsyncGenerator[None, None] | None = None


def _start(closer: AsyncGenerator[None, None]) -> None:
    """Run ``closer`` to its ``yield`` now, on the running loop, which then owns it (it is
    one of the async generators the loop closes when it shuts down)."""
    step: Any = closer.asend(None)
    with contextlib.suppress(StopIteration):  # (it never waits: it ends on its first step)
        step.send(None)


def _finish(closer: AsyncGenerator[None, None]) -> None:
    """Close ``closer`` off any loop (its loop is closed: its ``finally`` awaits nothing)."""
    step: Any = closer.aclose()
    with contextlib.suppress(StopIteration):  # (it never waits: it ends on its first step)
        step.send(None)
