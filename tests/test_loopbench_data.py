"""benchmarks/loopbench/episodes.jsonl stays honest: its schema, its counts, its provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LOOPBENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "loopbench"
LICENCES = {"MIT", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause"}
FIELDS = {"id", "class", "label", "flag_by", "source", "licence", "reason", "tools", "messages"}


@pytest.fixture(scope="module")
def episodes() -> list[dict]:
    with (LOOPBENCH / "episodes.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_counts(episodes: list[dict]) -> None:
    """At least 400 episodes, at least 150 of them loops, every id once."""
    assert len(episodes) >= 400
    assert sum(e["label"] == "loop" for e in episodes) >= 150
    assert len({e["id"] for e in episodes}) == len(episodes)


def test_every_episode_has_source_licence_and_reason(episodes: list[dict]) -> None:
    for e in episodes:
        assert e.keys() >= FIELDS, e["id"]
        assert e["reason"].strip(), e["id"]
        assert e["licence"].split(" ")[0] in LICENCES, e["id"]
        source = e["source"]
        assert source["kind"] in {"real", "synthetic"}, e["id"]
        assert source["repo"], e["id"]
        assert source["path"], e["id"]
        if source["kind"] == "real":
            assert len(source["commit"]) == 40, e["id"]
            assert source["url"].startswith("https://"), e["id"]


def test_labels_and_rubric_steps(episodes: list[dict]) -> None:
    """A loop names the step (an assistant message) by which it must be flagged; healthy not."""
    for e in episodes:
        steps = sum(m["role"] == "assistant" for m in e["messages"])
        assert e["label"] in {"loop", "healthy"}, e["id"]
        if e["label"] == "loop":
            assert isinstance(e["flag_by"], int), e["id"]
            assert 1 <= e["flag_by"] <= steps, e["id"]
        else:
            assert e["flag_by"] is None, e["id"]
            assert e["class"].startswith("healthy_"), e["id"]


def test_messages_are_openai_chat_format(episodes: list[dict]) -> None:
    """Roles are known; every tool result answers a call made earlier in the episode."""
    for e in episodes:
        called: set[str] = set()
        for m in e["messages"]:
            assert m["role"] in {"system", "user", "assistant", "tool"}, e["id"]
            for call in m.get("tool_calls") or ():
                assert call["function"]["name"], e["id"]
                assert "arguments" in call["function"], e["id"]
                called.add(call["id"])
            if m["role"] == "tool":
                assert m["tool_call_id"] in called, e["id"]


def test_every_class_is_in_the_rubric(episodes: list[dict]) -> None:
    rubric = (LOOPBENCH / "RUBRIC.md").read_text(encoding="utf-8")
    for cls in {e["class"] for e in episodes}:
        assert f"`{cls}`" in rubric, cls
