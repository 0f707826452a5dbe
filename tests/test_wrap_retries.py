"""Retries and tier breakers through the *real* openai client, raw vs guarded where it is about
how often and how long the upstream is asked: ``Retry-After`` as an HTTP date,
``x-should-retry``, rate limits (never held against a tier's breaker), and half-open probes
that end with no outcome (a stream closed early, a call cancelled, a fault of the guard's).

The raw client's waits run on the same fake clock as the guard's (its ``time`` is swapped for
one reading and advancing the clock): nothing waits, and both read the same "now".
"""

from __future__ import annotations

import asyncio
import email.utils
import random
from collections.abc import Iterator
from importlib import import_module
from types import SimpleNamespace
from typing import Any

import pytest

import agentguard as ag
from _hostile import completion
from agentguard.guard._quality import QualityMonitor
from agentguard.testing import FakeClock, Fault, Reply, ScriptedModel, capture_events

openai = pytest.importorskip("openai")
http: Any = import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")
base_client: Any = import_module("openai._base_client")

MESSAGES = [{"role": "user", "content": "hello"}]
OK = Reply.text("hi there")
TWO_TIERS = {
    "tiers": {
        "local": {"model": "l", "base_url": "http://local.invalid/v1"},
        "cloud": {"model": "c", "base_url": "http://cloud.invalid/v1"},
    },
    "escalation": {"chain": ["local", "cloud"]},
    "memory_pressure": {"enabled": False},
}
ONE_TIER = {"memory_pressure": {"enabled": False}}
MODES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    """A fake clock that the raw openai client reads and sleeps on too."""
    fake = FakeClock()
    monkeypatch.setattr(base_client, "time", SimpleNamespace(time=fake, sleep=fake.sleep))
    return fake


def _config(data: dict[str, Any]) -> ag.GuardConfig:
    return ag.GuardConfig.from_dict(data, env={})


def _client(model: ScriptedModel, *, asynchronous: bool = False, **options: Any) -> Any:
    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    transport = model.mock_transport(http)
    http_client = (
        http.AsyncClient(transport=transport) if asynchronous else http.Client(transport=transport)
    )
    return cls(
        api_key="sk-test", base_url="http://local.invalid/v1", http_client=http_client, **options
    )


def _guarded(
    model: ScriptedModel, config: dict[str, Any], clock: FakeClock, *, asynchronous: bool = False
) -> Any:
    return ag.wrap(
        _client(model, asynchronous=asynchronous),
        _config(config),
        clock=clock,
        sleep=clock.asleep if asynchronous else clock.sleep,
        rng=random.Random(0),
    )


def _call(client: Any, *, asynchronous: bool, model: str = "m", **kwargs: Any) -> Any:
    """One chat call; the SDK object, or the exception raised."""

    async def go() -> Any:
        return await client.chat.completions.create(model=model, messages=MESSAGES, **kwargs)

    try:
        if asynchronous:
            return asyncio.run(go())
        return client.chat.completions.create(model=model, messages=MESSAGES, **kwargs)
    except Exception as exc:
        return exc


def _date(clock: FakeClock, seconds: float) -> str:
    return email.utils.formatdate(clock() + seconds, usegmt=True)


# -- Retry-After as an HTTP date -------------------------------------------------------------


@MODES
def test_an_http_date_retry_after_is_waited_as_the_raw_client_waits(
    clock: FakeClock, asynchronous: bool
) -> None:
    """nginx, Cloudflare and gateways send ``Retry-After: <HTTP date>``: the guard waits until
    then, as the raw client does (it used to ignore the date and retry within a second)."""
    raw_model = ScriptedModel([Fault(429, {"retry-after": _date(clock, 20)}), OK])
    raw = _call(_client(raw_model), asynchronous=False)
    assert raw.choices[0].message.content == "hi there"
    raw_waits, clock.sleeps[:] = list(clock.sleeps), []

    model = ScriptedModel([Fault(429, {"retry-after": _date(clock, 20)}), OK])
    answer = _call(
        _guarded(model, ONE_TIER, clock, asynchronous=asynchronous), asynchronous=asynchronous
    )
    assert answer.choices[0].message.content == "hi there"
    assert raw_waits == [20.0]
    assert clock.sleeps == raw_waits
    assert len(model.requests) == len(raw_model.requests) == 2


@MODES
def test_an_http_date_beyond_max_retry_after_escalates_at_once(
    clock: FakeClock, asynchronous: bool
) -> None:
    """A date five minutes ahead (past max_retry_after, 30 s) moves the call to the next tier
    at once, as ``Retry-After: 300`` does: the limited tier is asked once, nothing waited."""
    model = ScriptedModel({"l": [Fault(429, {"retry-after": _date(clock, 300)})], "c": [OK]})
    _assert_moved_to_cloud_at_once(model, clock, asynchronous, "rate_limited")
    assert clock.sleeps == []


def test_retry_call_reads_an_http_date_on_the_injected_clock() -> None:
    """``retry_call`` waits until the date, on the clock it was given."""
    from agentguard.resilience import RetryPolicy, retry_call

    clock = FakeClock()
    response = SimpleNamespace(status_code=429, headers={"retry-after": _date(clock, 12)})
    failures = [openai_like(response)]

    def fn() -> str:
        if failures:
            raise failures.pop()
        return "done"

    policy = RetryPolicy(rng=random.Random(0))
    assert retry_call(fn, policy, sleep=clock.sleep, clock=clock) == "done"
    assert clock.sleeps == [12.0]


def _assert_moved_to_cloud_at_once(
    model: ScriptedModel, clock: FakeClock, asynchronous: bool, reason: str
) -> None:
    """A call for the local tier was asked of it once, then answered by the cloud tier."""
    answer = _call(
        _guarded(model, TWO_TIERS, clock, asynchronous=asynchronous),
        asynchronous=asynchronous,
        model="local",
    )
    report = ag.report_of(answer)
    assert report is not None
    assert (report.tier, report.reasons) == ("cloud", (reason,))
    assert [r.model for r in model.requests] == ["l", "c"]


def openai_like(response: Any) -> Exception:
    error = RuntimeError("rate limited")
    error.response = response  # type: ignore[attr-defined]
    return error


# -- x-should-retry ----------------------------------------------------------------------------


@MODES
def test_x_should_retry_false_is_obeyed_as_by_the_raw_client(
    clock: FakeClock, asynchronous: bool
) -> None:
    """A proxy that spent its own retries answers ``x-should-retry: false``: one request, the
    same error, as from the raw client (the guard's retries would multiply the proxy's)."""
    script = [Fault(500, {"x-should-retry": "false"}), OK]
    raw_model = ScriptedModel(script)
    raw = _call(_client(raw_model), asynchronous=False)
    model = ScriptedModel(script)
    guarded = _call(
        _guarded(model, ONE_TIER, clock, asynchronous=asynchronous), asynchronous=asynchronous
    )
    assert isinstance(raw, openai.InternalServerError)
    assert type(guarded) is type(raw)
    assert len(model.requests) == len(raw_model.requests) == 1


@MODES
def test_x_should_retry_false_still_escalates(clock: FakeClock, asynchronous: bool) -> None:
    """Not retried, the error keeps its class: another tier may still serve the call."""
    model = ScriptedModel({"l": [Fault(503, {"x-should-retry": "false"})], "c": [OK]})
    _assert_moved_to_cloud_at_once(model, clock, asynchronous, "server_error")


def test_x_should_retry_true_is_retried_as_by_the_raw_client(clock: FakeClock) -> None:
    """``x-should-retry: true`` on a 400 has the raw client try again: the guard does too."""
    script = [Fault(400, {"x-should-retry": "true"}, "try again"), OK]
    raw_model = ScriptedModel(script)
    raw = _call(_client(raw_model), asynchronous=False)
    model = ScriptedModel(script)
    guarded = _call(_guarded(model, ONE_TIER, clock), asynchronous=False)
    assert raw.choices[0].message.content == guarded.choices[0].message.content == "hi there"
    assert len(model.requests) == len(raw_model.requests) == 2


# -- rate limits and the tier's breaker ------------------------------------------------------


def _metered(calls: int) -> list[Any]:
    """Every call's first try over the per-minute quota (a short wait asked), its retry fine."""
    return [Fault.rate_limit(retry_after=None, retry_after_ms=200), OK] * calls


@MODES
def test_rate_limits_waited_out_never_open_the_breaker(
    clock: FakeClock, asynchronous: bool
) -> None:
    """A busy agent under OpenAI's RPM limits: each call gets a 429 asking for 200 ms, then its
    answer. The raw client completes every call; so does the guard (a 429 used to count as a
    failure of the server: the breaker opened at the third call and refused the next ones)."""
    raw_model = ScriptedModel(_metered(6))
    raw_client = _client(raw_model)
    raw = [_call(raw_client, asynchronous=False) for _ in range(6)]
    model = ScriptedModel(_metered(6))
    client = _guarded(model, ONE_TIER, clock, asynchronous=asynchronous)
    with capture_events() as events:
        guarded = [_call(client, asynchronous=asynchronous) for _ in range(6)]
    assert [type(a).__name__ for a in guarded] == [type(a).__name__ for a in raw]
    assert all(a.choices[0].message.content == "hi there" for a in guarded)
    assert len(model.requests) == len(raw_model.requests) == 12
    assert not [e for e in events if e.kind == "breaker_state_changed"]


@MODES
def test_a_rate_limited_tier_keeps_its_traffic(clock: FakeClock, asynchronous: bool) -> None:
    """With tiers: rate limits waited out on the local tier never move traffic to the cloud."""
    model = ScriptedModel({"l": _metered(6), "c": [OK]})
    client = _guarded(model, TWO_TIERS, clock, asynchronous=asynchronous)
    answers = [_call(client, asynchronous=asynchronous, model="local") for _ in range(6)]
    assert [ag.report_of(a).tier for a in answers] == ["local"] * 6  # type: ignore[union-attr]
    assert {r.model for r in model.requests} == {"l"}


def test_a_rate_limited_probe_gives_its_slot_back(clock: FakeClock) -> None:
    """A half-open probe answered 429: not a failure of the tier (the breaker stays half-open,
    not re-opened), and its retry probes again and closes the breaker."""
    model = ScriptedModel(
        {"l": [Fault.server_error(503)] * 5 + [Fault.rate_limit(retry_after=1), OK], "c": [OK] * 2}
    )
    client = _guarded(model, TWO_TIERS, clock)
    _open_local(client)
    clock.advance(31)
    with capture_events() as events:
        answer = _call(client, asynchronous=False, model="local")
    assert ag.report_of(answer).tier == "local"  # type: ignore[union-attr]
    changes = [(e.previous, e.state) for e in events if e.kind == "breaker_state_changed"]
    assert changes == [("open", "half_open"), ("half_open", "closed")]


# -- half-open probes that end with no outcome -----------------------------------------------


def _open_local(client: Any, *, asynchronous: bool = False) -> None:
    """Two calls to a local tier failing 503: its breaker opens, the cloud serves them."""
    for _ in range(2):
        answer = _call(client, asynchronous=asynchronous, model="local")
        assert ag.report_of(answer).tier == "cloud"  # type: ignore[union-attr]


def test_a_probe_stream_closed_early_frees_the_tier(clock: FakeClock) -> None:
    """The caller reads a probe's first words and closes the stream: that says nothing of the
    tier, and the next call probes it again (it used to keep the slot: local never used
    again, all traffic to the paid cloud tier)."""
    model = ScriptedModel({"l": [Fault.server_error(503)] * 5 + [OK] * 4, "c": [OK] * 4})
    client = _guarded(model, TWO_TIERS, clock)
    _open_local(client)
    clock.advance(31)  # open_for passed: half-open
    stream = client.chat.completions.create(model="local", messages=MESSAGES, stream=True)
    next(iter(stream))
    stream.close()
    clock.advance(1)  # well within any probe lease
    answer = _call(client, asynchronous=False, model="local")
    assert ag.report_of(answer).tier == "local"  # type: ignore[union-attr]


def test_a_cancelled_probe_frees_the_tier() -> None:
    """A framework's timeout cancels the probe while the upstream thinks: the next call probes
    the tier again instead of finding its one probe slot taken for ever."""
    clock = FakeClock()
    state = {"mode": "down"}

    async def main() -> list[str | None]:
        entered, never = asyncio.Event(), asyncio.Event()

        async def handler(request: Any) -> Any:
            if request.url.host == "cloud.invalid" or state["mode"] == "up":
                return http.Response(200, json=completion(content="hi there"))
            if state["mode"] == "down":
                return http.Response(503, text="<html>503</html>")
            entered.set()
            await never.wait()  # the upstream thinks until cancelled
            raise AssertionError("not reached")

        raw = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url="http://local.invalid/v1",
            http_client=http.AsyncClient(transport=http.MockTransport(handler)),
        )
        client = ag.wrap(raw, _config(TWO_TIERS), clock=clock, sleep=clock.asleep)
        for _ in range(2):
            await client.chat.completions.create(model="local", messages=MESSAGES)
        clock.advance(31)
        state["mode"] = "slow"
        probe = asyncio.ensure_future(
            client.chat.completions.create(model="local", messages=MESSAGES)
        )
        await entered.wait()
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        state["mode"] = "up"
        clock.advance(1)
        answer = await client.chat.completions.create(model="local", messages=MESSAGES)
        return [ag.report_of(answer).tier]  # type: ignore[union-attr]

    assert asyncio.run(main()) == ["local"]


def test_a_guard_fault_during_a_probe_frees_the_tier(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the guard's own while it handles a probe's error: the call fails open (the
    caller gets the upstream's error), and the tier's probe slot is given back."""
    model = ScriptedModel({"l": [Fault.server_error(503)] * 6 + [OK] * 4, "c": [OK] * 4})
    client = _guarded(model, TWO_TIERS, clock)
    _open_local(client)
    clock.advance(31)

    def fault(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("a bug of the guard's")

    with monkeypatch.context() as patched:
        patched.setattr(QualityMonitor, "failed", fault)
        failed = _call(client, asynchronous=False, model="local")
    assert isinstance(failed, openai.InternalServerError)  # failed open: the raw client's error
    clock.advance(1)
    answer = _call(client, asynchronous=False, model="local")
    assert ag.report_of(answer).tier == "local"  # type: ignore[union-attr]


def test_a_probe_that_never_reports_lapses(clock: FakeClock) -> None:
    """The backstop: a tier's probe slot taken and never reported (a path no one foresaw)
    stops counting after its lease, in memory too, rather than wedging the tier."""
    model = ScriptedModel({"l": [Fault.server_error(503)] * 5 + [OK] * 4, "c": [OK] * 4})
    client = _guarded(model, TWO_TIERS, clock)
    _open_local(client)
    clock.advance(31)
    guard = _guard_of(client)
    breaker = guard.pipeline.breakers["local"]
    assert breaker.allow().probe  # taken, and never reported
    answer = _call(client, asynchronous=False, model="local")
    assert ag.report_of(answer).tier == "cloud"  # type: ignore[union-attr]  # the slot is taken
    clock.advance(31)
    answer = _call(client, asynchronous=False, model="local")
    assert ag.report_of(answer).tier == "local"  # type: ignore[union-attr]


def _guard_of(client: Any) -> Any:
    return client.chat.completions._guard
