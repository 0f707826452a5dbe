"""What ``agentguard serve`` keeps per conversation for Python's garbage collector.

A full collection walks every object the collector tracks, and stops the server's event loop
while it does; behind ``serve`` each new conversation is a session the guard remembers (up to
10,000 per caller), so the objects each one keeps set the length of those pauses (see
docs/benchmarks.md, "garbage-collection pauses"). Objects are counted here, not timed.
"""

from __future__ import annotations

import collections
import gc
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason='needs the serve extra: pip install "agentguard[serve]"')

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_serve

#: Tracked objects one new conversation may leave behind. Today it is 9: the run, its message
#: marks and its place among the runs' tips (a list), the budget store's session counters, the
#: loop detector, its two text detectors in a tuple and the response window (the tool
#: detectors and their bookkeeping are built on a run's first tool event; the window's
#: responses are a tuple of strings, which the collector stops tracking). Before this bound
#: the count was 38; 12 leaves room for a field or two, not for a container per detector again.
MAX_TRACKED_PER_CONVERSATION = 12


def _tracked() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def test_a_new_conversation_keeps_few_objects_the_collector_walks() -> None:
    """Each clean one-turn conversation through the guarded route (the benchmark's request: a
    system prompt, a user turn, one tool) leaves at most MAX_TRACKED_PER_CONVERSATION objects
    the garbage collector tracks in the server."""
    with bench_serve._asgi_app() as call:
        for _ in range(100):  # warm-up: the caller's guard, caches, the connection pool
            call(bench_serve.GUARDED)
        before = _tracked()
        conversations = 400
        for _ in range(conversations):
            call(bench_serve.GUARDED)
        kept = _tracked() - before
    per_conversation = sum(kept.values()) / conversations
    assert per_conversation <= MAX_TRACKED_PER_CONVERSATION, kept.most_common(12)
    assert kept["LoopDetector"] == conversations  # one run each: all of them are remembered
