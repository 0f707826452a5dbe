"""The configuration models: :class:`GuardConfig` and one pydantic model per section.

The shape follows ARCHITECTURE §5. Loading (files, the ``reliability:`` wrapper, environment
overrides, error reporting) lives beside these models in ``_load.py`` and works for any section:
adding one for a new component is one model here and one field on :class:`GuardConfig`.
"""

from __future__ import annotations

import os
import re
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from agentguard._redact import redact_data, register_secret

from . import _load

__all__ = [
    "EscalationConfig",
    "EscalationTrigger",
    "GuardConfig",
    "LoopDetectionConfig",
    "LoopRecoveryConfig",
    "MemoryPressureConfig",
    "ModelPrice",
    "QualityConfig",
    "RecoveryRung",
    "Section",
    "StorageConfig",
    "TierConfig",
    "TokenBudgetConfig",
    "ToolBreakerConfig",
    "ToolRetryConfig",
    "ToolTimeoutsConfig",
    "ToolValidationConfig",
    "ToolsConfig",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# A tenacity strategy is code, not data: only Python sets it. From a file any value is an error
# (it is not callable), JSON schemas leave it out, and as plain data it is its repr().
_Strategy = Annotated[
    Callable[..., Any] | None,
    SkipJsonSchema(),
    PlainSerializer(lambda v: None if v is None else repr(v), when_used="json"),
]


#: The largest fractional number a configuration accepts: 10^9 seconds is about 31 years, and
#: larger timeouts overflow the platform's timers (sockets, locks) long after loading.
MAX_FLOAT = 1e9
#: The largest whole number: 2^53 - 1, exact in JSON, in Redis's Lua and in a double.
MAX_INT = 2**53 - 1


class Section(BaseModel):
    """Base of every configuration section: unknown keys are errors, instances are immutable.

    Every number is finite and bounded (:data:`MAX_FLOAT`, :data:`MAX_INT`), so a value that
    would crash a store or a timer later is a ``ConfigError`` at load time; ``repr()`` and
    ``str()`` show strings redacted (a URL's password, a configured secret).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="after")
    @classmethod
    def _numbers_are_bounded(cls, value: Any) -> Any:
        if type(value) is float and abs(value) > MAX_FLOAT:
            raise ValueError(f"must be at most {MAX_FLOAT:.0e} (in seconds, about 31 years)")
        if type(value) is int and abs(value) > MAX_INT:
            raise ValueError(f"must be at most 2^53 - 1 ({MAX_INT})")
        return value

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redact_data(value) if isinstance(value, (str, list, tuple)) else value


#: A rung of the loop recovery ladder (``loop_detection.recovery.rungs``), mildest first.
RecoveryRung = Literal["hint", "summary", "prune", "force", "escalate", "stop"]
#: The default ladder: every rung, mildest first.
RECOVERY_RUNGS: tuple[RecoveryRung, ...] = typing.get_args(RecoveryRung)


class LoopRecoveryConfig(Section):
    """``loop_detection.recovery``: how the guard gets an agent out of a loop it detected.

    Each request that arrives while a loop goes on climbs one rung; a loop at ``BREAK`` starts
    at the first of ``force`` / ``escalate`` / ``stop`` at least. See ``docs/loops.md``.
    """

    rungs: list[RecoveryRung] = Field(
        default_factory=lambda: list(RECOVERY_RUNGS),
        min_length=1,
        description="The ladder, mildest first: hint (a note the model can see), summary (a "
        "recovery turn: what was tried, what came back), prune (the looping exchanges left out "
        "of what is sent), force (tool_choice none: answer from the results in hand), escalate "
        "(the next tier, with the summary instead of the loop), stop (LoopDetected).",
    )
    hint_placement: Literal["auto", "tool_result", "after_results"] = Field(
        "auto",
        description="Where a hint goes: after_results (a user turn after the tool results), "
        "tool_result (inside the last tool result), auto (after the results, merged into a "
        "trailing user turn rather than making two user turns in a row).",
    )
    summary_max_items: int = Field(
        8, ge=1, description="Distinct calls a recovery turn lists (the most recent)."
    )
    digest_chars: int = Field(
        200, ge=16, description="Characters of a call or its result shown in a recovery turn."
    )

    @field_validator("rungs")
    @classmethod
    def _rungs_once_each(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each rung may appear once")
        return value


class LoopDetectionConfig(Section):
    """``loop_detection``: repeated tool calls and repeated or degenerate text.

    See ``docs/loops.md`` for the model behind each setting.
    """

    enabled: bool = True
    window_size: int = Field(10, ge=2, description="Assistant responses remembered per session.")
    duplicate_threshold: int = Field(
        3,
        ge=2,
        description="Identical or near-identical responses in the window that count as a loop.",
    )
    similarity_threshold: float = Field(
        0.95,
        gt=0.0,
        le=1.0,
        description="Similarity (0-1) at which two responses are near-identical.",
    )
    tool_window: int = Field(30, ge=4, description="Recent tool calls remembered per session.")
    warn_at: int = Field(10, ge=1, description="Identical calls before a WARNING.")
    critical_at: int = Field(20, ge=1, description="Identical calls before CRITICAL.")
    break_at: int = Field(
        30, ge=1, description="Identical calls before the call is refused (BREAK)."
    )
    # Identical call AND identical result is much stronger evidence than an identical call alone
    # (a poll may legitimately repeat; re-asking for an answer already seen twice is not), so
    # the no-progress ladder acts long before warn_at/critical_at/break_at.
    no_progress_warn_at: int = Field(
        3, ge=2, description="Attempts of one call whose result has not changed before WARNING."
    )
    no_progress_critical_at: int = Field(
        5, ge=2, description="Attempts of one call with an unchanged result before CRITICAL."
    )
    no_progress_break_at: int = Field(
        7, ge=2, description="Attempts of one call with an unchanged result before BREAK."
    )
    error_warn_at: int = Field(
        3, ge=2, description="Attempts of one call after consecutive failures before WARNING."
    )
    error_critical_at: int = Field(
        4, ge=2, description="Attempts of one call after consecutive failures before CRITICAL."
    )
    error_break_at: int = Field(
        5, ge=2, description="Attempts of one call after consecutive failures before BREAK."
    )
    unknown_tool_warn_at: int = Field(
        2, ge=1, description="Calls to one unknown tool name before WARNING."
    )
    unknown_tool_critical_at: int = Field(
        3, ge=1, description="Calls to one unknown tool name before CRITICAL."
    )
    unknown_tool_break_at: int = Field(
        4, ge=1, description="Calls to one unknown tool name before BREAK."
    )
    cycle_max_period: int = Field(
        4, ge=2, le=8, description="Longest call cycle (A-B-...-A) detected; 2 is ping-pong."
    )
    cycle_warn_at: int = Field(
        3, ge=2, description="Full repetitions of a call cycle with stable results before WARNING."
    )
    cycle_critical_at: int = Field(
        4, ge=2, description="Full repetitions of a call cycle before CRITICAL."
    )
    cycle_break_at: int = Field(
        5, ge=2, description="Full repetitions of a call cycle before BREAK."
    )
    near_duplicate_threshold: float = Field(
        0.85,
        gt=0.0,
        le=1.0,
        description="Argument similarity (0-1) at which two calls of one tool are near-duplicates.",
    )
    near_duplicate_min_result_chars: int = Field(
        48,
        ge=0,
        description="Shorter results (acknowledgements like 'ok') never make near-duplicates.",
    )
    global_warn_at: int = Field(
        10, ge=1, description="No-progress outcomes among the last tool_window before WARNING."
    )
    global_critical_at: int = Field(
        15, ge=1, description="No-progress outcomes among the last tool_window before CRITICAL."
    )
    global_break_at: int = Field(
        20, ge=1, description="No-progress outcomes among the last tool_window before BREAK."
    )
    degenerate_min_repeats: int = Field(
        5,
        ge=2,
        description="Repeats of one line or chunk inside one output before WARNING "
        "(x2 CRITICAL, x4 BREAK).",
    )
    cut_degenerate_streams: bool = Field(
        True,
        description="Stop a streamed answer as soon as its text degenerates to BREAK level "
        "(finish reason 'length', a warning in the report) instead of paying for the rest.",
    )
    recovery: LoopRecoveryConfig = Field(
        LoopRecoveryConfig(), description="The recovery ladder of the guard."
    )

    @model_validator(mode="after")
    def _ladder_is_ordered(self) -> LoopDetectionConfig:
        for prefix in ("", "no_progress_", "error_", "unknown_tool_", "cycle_", "global_"):
            levels = ("warn_at", "critical_at", "break_at")
            warn, critical, brk = (getattr(self, f"{prefix}{level}") for level in levels)
            if not warn <= critical <= brk:
                raise ValueError(
                    f"thresholds must satisfy {prefix}warn_at <= {prefix}critical_at <= "
                    f"{prefix}break_at (got {warn}, {critical}, {brk})"
                )
        return self


class ToolValidationConfig(Section):
    """``tool_validation``: checking, repairing and correcting tool calls."""

    enabled: bool = True
    max_retries: int = Field(3, ge=0, description="Corrective re-asks on the same tier.")
    retry_with_correction: bool = Field(
        True, description="Re-ask with a message naming every error (else re-ask plainly)."
    )
    validate_json: bool = Field(True, description="Check that arguments are a JSON object.")
    validate_schema: bool = Field(True, description="Check arguments against the tool's schema.")
    validate_tool_names: bool = Field(True, description="Check that the called tool exists.")
    repair: bool = Field(
        True, description="Repair what is safe to repair locally, at no token cost."
    )
    coerce: bool = Field(
        True,
        description="Lossless coercions as repairs: '5' -> 5 for an integer, 'true' -> true, an "
        "object or list written as JSON text where the schema takes it and no string.",
    )
    unexpected_arguments: Literal["error", "drop", "allow"] = Field(
        "error",
        description="Arguments the schema does not declare: an error, dropped (a repair, "
        "reported; an argument whose name is close to a declared one the call left out stays an "
        "error: a misspelling), or allowed.",
    )
    name_min_score: float = Field(
        85.0,
        ge=0.0,
        le=100.0,
        description="Fuzzy score (0-100) a misspelt tool name needs to be auto-corrected.",
    )
    name_min_gap: float = Field(
        8.0,
        ge=0.0,
        le=100.0,
        description="Lead the best match needs over the runner-up to be unambiguous.",
    )
    side_effecting: list[str] = Field(
        default_factory=list,
        description="Tools never auto-corrected to (a guessed name must not write or send).",
    )
    side_effecting_by_name: bool = Field(
        True,
        description="Also count as side-effecting every tool whose name says it acts (a whole "
        "word such as shell, exec, run, write, edit, delete, send, deploy, pay) unless its "
        "annotations say it is read-only.",
    )
    placeholders: list[str] = Field(
        default_factory=list,
        description="Extra regular expressions for placeholder values (added to the built-ins).",
    )
    max_repair_bytes: int = Field(
        16_384,
        ge=0,
        description="Arguments longer than this are not repaired but re-asked: JSON repair "
        "costs about 3 µs per byte (~50 ms at the default); 0: never repair.",
    )
    answered_repeats: Literal["recover", "pass"] = Field(
        "recover",
        description="A call repeating one whose result the transcript holds: 'recover' asks "
        "the model for its answer from the results in hand (tool_choice none), then moves up a "
        "tier, then answers with those results; 'pass' hands the call back to the agent.",
    )
    answered_repeats_after: int | None = Field(
        None,
        ge=1,
        description="Times a call must have been answered, with the same result each time, "
        "before a repeat of it is recovered; null: only a repeat written with a result the "
        "model made up (recovered at once), other repeats are left to the loop ladder (a poll "
        "may repeat). 1 or 2 suit small local models.",
    )
    known_results_window: int = Field(
        40,
        ge=0,
        description="Messages from the end of the history searched for answered calls.",
    )
    empty_answer_is_failure: bool = Field(
        True,
        description="When tools were offered, an answer with neither a call nor text (an empty "
        "message, or only 'functions.NAME:' with no arguments) is a failed call and re-asked.",
    )
    enforce_tool_choice: bool = Field(
        True,
        description="An answer that breaks the request's tool_choice is a failed call and "
        "re-asked: text where 'required', a named function or allowed_tools 'required' asked "
        "for a call, a call to another tool than the one named or allowed, any call where it "
        "is 'none' (servers that ignore tool_choice, as Ollama does); with "
        "parallel_tool_calls false, the calls after an answer's first are dropped.",
    )
    # The checks below can misfire on healthy traffic (a model may rightly derive a value or
    # answer "Done." from {"status": "ok"}): off by default, on in the small-model profile
    # (docs/local-models.md).
    ungrounded_arguments: bool = Field(
        False,
        description="A short string argument (or a longer one holding HTML character "
        "references no text of the request holds: markup debris) whose value neither the user's "
        "request nor a tool result states, when the request names values (a city, a file name), "
        "is an error (ungrounded_argument); so is a number argument, when the request states "
        "numbers. The re-ask pins the tool and narrows the argument to the request's values "
        "(an enum), owed once per argument even past max_retries. Kept, with a warning, when "
        "nothing better comes back.",
    )
    ungrounded_answers: bool = Field(
        False,
        description="A final answer after tool calls that shares no value with a call's result, "
        "or that states a number (past 10) neither the user, a call's arguments nor a result "
        "states, is asked for once more from the results in hand (tool_choice none), then moved "
        "up a tier; with no tier left the results in hand are the answer, with a warning.",
    )
    uncovered_values: bool = Field(
        False,
        description="A final answer while the request names values (two cities) that no call "
        "covered: the call for them is asked for once (pinned, its arguments narrowed to the "
        "request's values); not once the answer was asked for from the results in hand.",
    )
    cut_off_text_is_failure: bool = Field(
        False,
        description="When tools were offered, a text answer cut off at the output cap "
        "(finish_reason length) and holding no call is a failed answer, and re-asked.",
    )

    @property
    def judges_answers(self) -> bool:
        """Whether a text answer may be rejected (and asked again) for what it says: a stream's
        text is then held until judged (docs/guard.md, Streaming)."""
        return self.ungrounded_answers or self.uncovered_values or self.cut_off_text_is_failure


class ModelPrice(Section):
    """The price of one model, in money per million tokens (any currency, used consistently)."""

    input: float = Field(ge=0.0, description="Price per million input (prompt) tokens.")
    output: float = Field(ge=0.0, description="Price per million output (completion) tokens.")


class TokenBudgetConfig(Section):
    """``token_budget``: per-session, per-hour and per-request token limits.

    See ``docs/budgets.md`` for the budget model, the window semantics and the policies.
    """

    enabled: bool = True
    per_session: int | None = Field(
        500_000, ge=1, description="Tokens per session; null: no limit."
    )
    per_hour: int | None = Field(
        2_000_000, ge=1, description="Tokens per rolling hour across all sessions; null: no limit."
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Output cap per request, sent in the API's own field (chat: max_completion_tokens, "
            "Responses: max_output_tokens) or lowering the caller's; null: none is sent."
        ),
    )
    reserve: Literal["learned", "strict"] = Field(
        "learned",
        description="What a reservation holds for the output: 'learned' holds a running high "
        "percentile of the outputs seen (at least reserve_floor, at most the cap) and admits a "
        "call only if its worst case fits; 'strict' holds the whole output cap.",
    )
    reserve_floor: int = Field(
        256,
        ge=0,
        le=1_000_000_000,
        description="Least output a 'learned' reservation holds (tokens).",
    )
    policy: Literal["warn_and_continue", "escalate", "hard_stop"] = Field(
        "warn_and_continue",
        description="When a budget runs out: warn and go on, move to a cheaper tier, or refuse.",
    )
    warn_ratio: float = Field(0.8, gt=0.0, le=1.0, description="Share of a budget that warns.")
    scope: str = Field(
        "default",
        min_length=1,
        description="Name of the budget; ledgers with the same scope and store share it.",
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description="Model name (or name prefix, or '*') to its price per million tokens.",
    )
    lease_seconds: float = Field(
        600.0,
        gt=0.0,
        description="Lifetime of a reservation: a caller that crashes frees its tokens after it.",
    )
    max_call_seconds: float = Field(
        3600.0,
        ge=0.0,
        description="How long a call still in flight keeps its reservation: its lease is renewed "
        "(every half lease) until it settles or this long has passed; 0: never renewed.",
    )
    window_bucket_seconds: int = Field(
        60,
        ge=1,
        le=3600,
        description="Granularity of the rolling hour (must divide 3600): usage leaves the "
        "window between 3600 - bucket and 3600 seconds after it was committed.",
    )
    session_ttl_seconds: float = Field(
        7 * 86_400.0,
        gt=0.0,
        description="A session's counters are forgotten after this long without activity.",
    )
    idempotency_ttl_seconds: float = Field(
        86_400.0,
        gt=0.0,
        description="How long a committed event id is remembered (a re-sent commit counts once).",
    )
    chars_per_token: float = Field(
        4.0,
        gt=0.0,
        description="Estimation heuristic when a response has no usage: ASCII characters per "
        "token (other characters count one token each).",
    )

    @model_validator(mode="after")
    def _bucket_divides_the_hour(self) -> TokenBudgetConfig:
        if 3600 % self.window_bucket_seconds:
            raise ValueError(
                f"window_bucket_seconds must divide 3600 (got {self.window_bucket_seconds}); "
                "e.g. 10, 60 or 300"
            )
        return self


class StorageConfig(Section):
    """``storage``: where shared state (budgets, breakers) lives."""

    backend: Literal["memory", "sqlite", "redis"] = Field(
        "memory",
        description="memory: one process; sqlite: one host, survives restarts; redis: a fleet.",
    )
    path: str | None = Field(None, description="SQLite database file (backend: sqlite).")
    url: str | None = Field(None, description="Redis URL (backend: redis).")
    fail_mode: Literal["open", "closed"] = Field(
        "open",
        description="When the store cannot be reached: 'open' falls back to local state and "
        "re-syncs later; 'closed' raises StoreUnavailable.",
    )
    retry_seconds: float = Field(
        5.0, gt=0.0, description="While falling back, how often to try the store again."
    )
    busy_timeout_seconds: float = Field(
        5.0, gt=0.0, description="SQLite: how long to wait for another process's write lock."
    )
    key_prefix: str = Field(
        "agentguard", min_length=1, description="Redis: prefix of every key agentguard writes."
    )
    timeout_seconds: float = Field(2.0, gt=0.0, description="Redis: connect and command timeout.")

    @field_validator("url")
    @classmethod
    def _password_is_a_secret(cls, url: str | None) -> str | None:
        if url:
            try:
                password = urllib.parse.urlsplit(url).password
            except ValueError:  # not a URL the store could use either; validation goes on
                password = None
            if password:
                register_secret(password, configured=True)
                register_secret(urllib.parse.unquote(password), configured=True)
        return url

    @model_validator(mode="after")
    def _backend_has_its_location(self) -> StorageConfig:
        if self.backend == "sqlite" and not self.path:
            raise ValueError("backend 'sqlite' needs 'path' (the database file)")
        if self.backend == "redis" and not self.url:
            raise ValueError("backend 'redis' needs 'url' (e.g. redis://localhost:6379/0)")
        return self


class MemoryPressureConfig(Section):
    """``memory_pressure``: watching the host for memory pressure."""

    enabled: bool = True
    sustained_seconds: float = Field(
        60.0, ge=0.0, description="Seconds of pressure before it counts as sustained."
    )
    psi_some_warning: float = Field(
        10.0,
        ge=0.0,
        le=100.0,
        description="PSI 'some avg10' (% of time some task stalled on memory) that warns.",
    )
    psi_some_critical: float = Field(
        30.0, ge=0.0, le=100.0, description="PSI 'some avg10' that is critical."
    )
    psi_full_critical: float = Field(
        5.0,
        ge=0.0,
        le=100.0,
        description="PSI 'full avg10' (% of time ALL tasks stalled on memory) that is critical.",
    )
    percent_warning: float = Field(
        90.0, ge=0.0, le=100.0, description="psutil fallback: RAM used (%) that warns."
    )
    percent_critical: float = Field(
        97.0, ge=0.0, le=100.0, description="psutil fallback: RAM used (%) that is critical."
    )

    @model_validator(mode="after")
    def _warning_below_critical(self) -> MemoryPressureConfig:
        if self.psi_some_warning > self.psi_some_critical:
            raise ValueError("psi_some_warning must not exceed psi_some_critical")
        if self.percent_warning > self.percent_critical:
            raise ValueError("percent_warning must not exceed percent_critical")
        return self


class QualityConfig(Section):
    """``quality``: a model server that keeps answering 200 while its answers get worse.

    See ``docs/local-models.md``: a prompt the server silently truncated, answers that stop
    parsing after working, a context-length 400, output far past the requested cap.
    """

    enabled: bool = True
    truncation_ratio: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="A reported prompt_tokens below this share of the guard's estimate of what "
        "was sent means the server dropped part of the prompt (as Ollama does past its context).",
    )
    truncation_min_prompt_tokens: int = Field(
        1_024,
        ge=0,
        description="Prompts estimated below this size are not judged for truncation "
        "(tokenizers differ too much on short texts).",
    )
    runaway_factor: float = Field(
        2.0,
        ge=1.0,
        description="An answer with more completion tokens than this many times the requested "
        "cap ran away: it is treated as cut off whatever its finish_reason says.",
    )
    parse_failures: int = Field(
        3,
        ge=1,
        description="Consecutive answers that fail validation, after some passed, that mean "
        "the server's answers stopped parsing.",
    )
    window: int = Field(20, ge=1, description="Recent answers per tier the signals are counted in.")
    sustained_count: int = Field(
        3,
        ge=1,
        description="Signals in the window that make degradation sustained: complex requests "
        "then start one tier up (escalate_on: quality_degraded).",
    )


class ToolBreakerConfig(Section):
    """``tools.breaker``: the circuit breaker every tool gets (each tool its own)."""

    failure_rate: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of failed calls in the window that opens it."
    )
    min_calls: int = Field(5, ge=1, description="Calls the window must hold before it can open.")
    window_seconds: float = Field(
        60.0, gt=0.0, description="Rolling window the failure rate is computed over."
    )
    open_seconds: float = Field(
        30.0, ge=0.0, description="How long an open breaker answers at once before probing."
    )
    half_open_probes: int = Field(
        1, ge=1, description="Concurrent probe calls a half-open breaker lets through."
    )
    close_after: int = Field(1, ge=1, description="Successful probes that close it again.")


class ToolRetryConfig(Section):
    """``tools.retry``: retries of one tool call (full-jitter exponential backoff)."""

    max_attempts: int = Field(3, ge=1, description="Attempts per call, the first included.")
    base_seconds: float = Field(0.5, ge=0.0, description="First backoff ceiling.")
    cap_seconds: float = Field(8.0, ge=0.0, description="Largest backoff ceiling.")
    max_retry_after_seconds: float = Field(
        30.0,
        ge=0.0,
        description="Longest Retry-After worth waiting for; a longer one fails the call at once "
        "(with the delay in the error for the model).",
    )
    wait: _Strategy = Field(
        None,
        description="Python only: a tenacity wait strategy (e.g. wait_exponential(max=10)) used "
        "instead of the full-jitter backoff; Retry-After still wins.",
    )
    stop: _Strategy = Field(
        None,
        description="Python only: a tenacity stop strategy (e.g. stop_after_attempt(5) / "
        "stop_after_delay(30)) used instead of max_attempts.",
    )

    @model_serializer(mode="wrap")
    def _unset_strategies_left_out(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        # As plain data an unset strategy is left out: the dump of a configuration read from a
        # file stays exactly what a file can say.
        data: dict[str, Any] = handler(self)
        if info.mode == "json":
            for key in ("wait", "stop"):
                if data.get(key) is None:
                    data.pop(key, None)
        return data


class ToolTimeoutsConfig(Section):
    """``tools.timeouts``: seconds per attempt, by the tool's criticality."""

    blocking: float = Field(30.0, gt=0.0, description="The agent cannot go on without it.")
    enhancing: float = Field(15.0, gt=0.0, description="It improves the answer.")
    optional: float = Field(5.0, gt=0.0, description="Nice to have.")


class ToolsConfig(Section):
    """``tools``: ToolGuard, resilient tool execution (see ``docs/tools.md``)."""

    enabled: bool = Field(
        True, description="false: tools run once, unguarded (no retries, breakers, timeouts)."
    )
    breaker: ToolBreakerConfig = Field(
        ToolBreakerConfig(), description="Each tool's circuit breaker."
    )
    retry: ToolRetryConfig = Field(ToolRetryConfig(), description="Retries of one tool call.")
    timeouts: ToolTimeoutsConfig = Field(
        ToolTimeoutsConfig(), description="Seconds per attempt by criticality."
    )
    retry_budget_per_turn: int = Field(
        5, ge=0, description="Retries across all tools within one agent turn."
    )
    idempotency_ttl_seconds: float = Field(
        86_400.0,
        gt=0.0,
        description="How long the outcome of a side-effecting call is kept for replay.",
    )
    idempotency_lease_seconds: float = Field(
        600.0,
        gt=0.0,
        description="How long a running side-effecting call holds its key (a worker that dies "
        "frees it after this).",
    )
    dead_letter_ttl_seconds: float = Field(
        7 * 86_400.0, gt=0.0, description="How long records of finally failed calls are kept."
    )
    sync_timeouts: bool = Field(
        True,
        description="Run sync tools on a worker thread so their timeout is enforced (a thread "
        "cannot be killed: a late tool is abandoned); false: run them inline, untimed.",
    )


#: Why the guard may move a request to another tier (``escalation.escalate_on``).
EscalationTrigger = Literal[
    "tool_validation_failure",
    "loop_detected",
    "timeout",
    "server_error",
    "rate_limited",
    "budget",
    "memory_pressure",
    "quality_degraded",
]


class TierConfig(Section):
    """One model tier: a model and, optionally, its own endpoint and credentials."""

    model: str = Field(description="The model name sent to this tier's endpoint.")
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint of this tier; null: the wrapped client's own."
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding this tier's API key (never the key).",
    )
    timeout: float | None = Field(
        None, gt=0, description="Per-attempt timeout in seconds; null: the client's default."
    )

    @field_validator("api_key_env")
    @classmethod
    def _names_a_variable(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            # not a variable's name: most likely the key itself, so it is never repeated
            # (the loader shows no value for this error) and redacted from now on
            register_secret(value, configured=True)
            raise PydanticCustomError(
                _load.SECRET_VALUE,
                "looks like a key, not the NAME of an environment variable: put the key in a "
                "variable (e.g. OPENROUTER_API_KEY) and give its name",
            )
        if value is not None:
            register_secret(os.environ.get(value), configured=True)  # the key the tier will send
        return value


class EscalationConfig(Section):
    """``escalation``: moving a request up (or down) the chain of model tiers."""

    enabled: bool = True
    mode: Literal["auto", "confirm", "off"] = Field(
        "auto",
        description="auto: move tiers transparently (always reported); confirm: ask first, never "
        "fail over silently; off: never change tier.",
    )
    chain: list[str] = Field(
        default_factory=lambda: list(_load.DEFAULT_CHAIN),
        min_length=1,
        description="Tier names from cheapest/weakest to strongest.",
    )
    max_retries_before_escalate: int = Field(
        3, ge=0, description="Retries of a transient error on one tier before moving up."
    )
    escalate_on: list[EscalationTrigger] = Field(
        default_factory=lambda: list(typing.get_args(EscalationTrigger)),
        description="The triggers that move a request to another tier.",
    )
    max_retry_after: float = Field(
        30.0,
        ge=0,
        description="Longest Retry-After (seconds) worth waiting for; a longer one escalates.",
    )
    complex_prompt_tokens: int = Field(
        8_000,
        ge=0,
        description="A request with at least this many prompt tokens counts as complex "
        "(memory pressure moves complex requests up).",
    )
    complex_output_tokens: int = Field(
        4_096, ge=0, description="An output cap at least this large makes a request complex."
    )

    @model_validator(mode="after")
    def _chain_has_no_duplicates(self) -> EscalationConfig:
        seen = [t for i, t in enumerate(self.chain) if t in self.chain[:i]]
        if seen:
            raise ValueError(f"chain lists tier {seen[0]!r} twice")
        return self


class GuardConfig(Section):
    """The whole ``reliability:`` block.

    Build it with defaults (``GuardConfig()``), from a mapping (:meth:`from_dict`) or a file
    (:meth:`from_file`); the latter two apply ``AGENTGUARD_*`` environment overrides.
    """

    fail_mode: Literal["open", "closed"] = Field(
        "open",
        description="On an internal fault: 'open' lets the call through unguarded and reports it; "
        "'closed' raises.",
    )
    loop_detection: LoopDetectionConfig = LoopDetectionConfig()
    tool_validation: ToolValidationConfig = ToolValidationConfig()
    token_budget: TokenBudgetConfig = TokenBudgetConfig()
    storage: StorageConfig = StorageConfig()
    memory_pressure: MemoryPressureConfig = MemoryPressureConfig()
    quality: QualityConfig = QualityConfig()
    escalation: EscalationConfig = EscalationConfig()
    tools: ToolsConfig = ToolsConfig()
    tiers: dict[str, TierConfig] = Field(
        default_factory=dict,
        description="Model tiers by name; the escalation chain walks them in chain order.",
    )

    def check(self) -> list[str]:
        """What in this configuration is valid but will do nothing, one sentence each.

        ``agentguard config check`` prints these as warnings: a chain naming tiers that are not
        defined (they are skipped), a chain with no tiers at all (no request ever changes
        tier), a tier no chain reaches, a budget policy ``escalate`` with nowhere to go.
        """
        notes: list[str] = []
        esc = self.escalation
        moving = esc.enabled and esc.mode != "off" and bool(esc.escalate_on)
        defined = [t for t in esc.chain if t in self.tiers]
        if moving and not self.tiers:
            notes.append(
                f"escalation.chain names tiers ({', '.join(esc.chain)}) but no tiers are "
                "defined: no request will ever change tier (define them under tiers, or set "
                "escalation.enabled: false)"
            )
        elif moving:
            missing = [t for t in esc.chain if t not in self.tiers]
            if missing:
                notes.append(
                    f"escalation.chain names tiers that are not defined: {', '.join(missing)} "
                    f"(defined: {', '.join(sorted(self.tiers))}); they are skipped"
                )
            if len(defined) < 2:
                notes.append(
                    "escalation.chain has fewer than two defined tiers: there is nowhere to "
                    "escalate to"
                )
        unused = sorted(set(self.tiers) - set(esc.chain))
        if unused:
            notes.append(f"tiers not in escalation.chain are never used: {', '.join(unused)}")
        budget = self.token_budget
        if budget.enabled and budget.policy == "escalate" and (not moving or len(defined) < 2):
            notes.append(
                "token_budget.policy is 'escalate' but there is no cheaper tier to move to: a "
                "spent budget only warns"
            )
        return notes

    @classmethod
    def load(
        cls,
        source: GuardConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> GuardConfig:
        """The configuration from whatever was handed in — what ``wrap`` and the proxy use.

        Args:
            source: a :class:`GuardConfig` (used as it is), a mapping (as :meth:`from_dict`), a
                file path (``str`` or ``os.PathLike``, as :meth:`from_file`), or ``None``: the
                file named by ``AGENTGUARD_CONFIG``, else the defaults — with the
                ``AGENTGUARD_*`` overrides in both cases.
            env: where ``AGENTGUARD_CONFIG`` and the overrides are read; ``None`` means
                ``os.environ``.

        Raises:
            ConfigError: the file or a value is invalid.
            TypeError: ``source`` is none of the above.
        """
        return _load.load(cls, source, env=env)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        source: str | None = None,
    ) -> GuardConfig:
        """Validate a mapping, with or without the top-level ``reliability`` key.

        Args:
            data: the configuration; ``None`` or ``{}`` gives the defaults.
            env: where ``AGENTGUARD_*`` overrides are read; ``None`` means ``os.environ``,
                ``{}`` disables overrides.
            source: a name for error messages (a file name).

        Raises:
            ConfigError: naming every bad key path, its value and what is allowed.
        """
        return _load.validate(cls, data, env=env, source=source)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
    ) -> GuardConfig:
        """Load a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON (``.json``) file.

        Raises:
            ConfigError: the file cannot be read or parsed, or a value is invalid.
        """
        return _load.load_file(cls, path, env=env)

    def to_dict(self) -> dict[str, Any]:
        """The effective configuration as plain data, under the ``reliability`` key."""
        return {_load.ROOT: self.model_dump(mode="json")}
