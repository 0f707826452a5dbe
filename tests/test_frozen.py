"""fast_init: a faster __init__ for frozen, slotted dataclasses, with the same behaviour."""

from __future__ import annotations

import dataclasses

import pytest

from agentguard._frozen import fast_init


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 2
    label: str | None = None


def test_fast_init_keeps_signature_defaults_and_frozenness() -> None:
    """Positional, keyword and default arguments work; the instance stays frozen and hashable."""
    assert _Point(1) == _Point(x=1, y=2) == _Point(1, 2, None)
    assert _Point(1, label="a").label == "a"
    assert dataclasses.replace(_Point(1), y=5) == _Point(1, 5)
    assert hash(_Point(1)) == hash(_Point(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Point(1).x = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Point()  # type: ignore[call-arg]


def test_fast_init_refuses_what_it_cannot_reproduce() -> None:
    """Mutable or unslotted classes and default factories are refused, not silently changed."""

    @dataclasses.dataclass(slots=True)
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        xs: list[int] = dataclasses.field(default_factory=list)

    for cls in (Mutable, Factory):
        with pytest.raises(TypeError):
            fast_init(cls)
