"""The top-level names: listed once, loaded lazily, and at home in ``agentguard``."""

from __future__ import annotations

import ast
import importlib
import json
import pickle
import re
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest

import agentguard as ag
from agentguard._exports import PUBLIC
from agentguard.types import Attempt, Choice, EscalationPrompt

INIT = Path(ag.__file__)
PUBLIC_OBJECTS = sorted(PUBLIC)


def _run(code: str) -> typing.Any:
    """Run ``code`` in a fresh interpreter and return what it printed, decoded from JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(INIT.parent.parent)},
    ).stdout
    return json.loads(out)


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of the imports under ``if TYPE_CHECKING:`` in ``agentguard/__init__.py``."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    found: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: write `X as X` (re-exported)"
            found[alias.name] = "." * node.level + (node.module or "")
    return found


def test_all_is_derived_from_the_one_list() -> None:
    """``__all__`` is the names of ``PUBLIC`` plus ``__version__``, sorted."""
    assert ag.__all__ == sorted([*PUBLIC, "__version__"])
    assert list(PUBLIC) == sorted(PUBLIC), "keep _exports.PUBLIC sorted"


def test_type_checking_imports_match_the_one_list() -> None:
    """The imports for type checkers name exactly ``PUBLIC``, each from the same module."""
    assert _type_checking_imports() == PUBLIC


@pytest.mark.parametrize("name", PUBLIC_OBJECTS)
def test_public_names_live_in_agentguard(name: str) -> None:
    """Every exported class and function says ``agentguard`` is its module."""
    obj = getattr(ag, name)
    assert f"{obj.__module__}.{obj.__qualname__}" == f"agentguard.{name}"


def test_repr_names_the_package() -> None:
    """``repr(ag.LoopDetector)`` says where users import it from."""
    assert repr(ag.LoopDetector) == "<class 'agentguard.LoopDetector'>"
    assert repr(ag.LoopDetected) == "<class 'agentguard.LoopDetected'>"


def test_repr_is_the_same_however_a_name_is_reached() -> None:
    """Importing the defining modules directly, not through ``agentguard.X``, gives the same."""
    modules = sorted(set(PUBLIC.values()))
    got = _run(
        "import importlib, json, agentguard\n"
        f"public = {PUBLIC!r}\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module, 'agentguard')\n"
        "reached = sorted(n for n in public if n in vars(agentguard))\n"
        "homes = {n: getattr(importlib.import_module(m, 'agentguard'), n).__module__\n"
        "         for n, m in public.items()}\n"
        "print(json.dumps([reached, homes]))"
    )
    reached, homes = got
    assert reached == []  # no name went through agentguard.__getattr__
    assert homes == dict.fromkeys(PUBLIC, "agentguard")


def test_import_loads_no_submodule_but_the_export_list() -> None:
    """``import agentguard`` stays lazy: no component, no pydantic, only the list of names."""
    loaded = _run(
        "import json, sys, agentguard\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('agentguard', 'pydantic'))))"
    )
    assert loaded == ["agentguard", "agentguard._exports"]


@pytest.mark.parametrize("name", PUBLIC_OBJECTS)
def test_public_names_pickle_by_reference(name: str) -> None:
    """pickle finds every exported class and function through ``agentguard``."""
    obj = getattr(ag, name)
    assert pickle.loads(pickle.dumps(obj)) is obj


_TIER = ag.Tier("fast", "m")
_VALUES = [
    ag.AgentGuardError("boom"),
    ag.ConfigError([{"path": "reliability.x", "value": 1, "allowed": "a y"}], source="f.yaml"),
    ag.ToolSchemaError("search", "no parameters"),
    ag.LoopDetected("stuck", detector="generic_repeat", count=3, retry_after=2.0, session="s"),
    ag.BudgetExceeded(budget="session", used=9, requested=5, limit=10, resets_at=None),
    ag.EscalationRequired(
        EscalationPrompt("timeout", "slow", _TIER, None, (Choice.RETRY, Choice.CANCEL))
    ),
    ag.TiersExhausted([Attempt("fast", "m", "timeout", "no answer")], "timeout"),
    ag.ToolValidationFailed(ag.ValidationReport(ok=False, tool_calls=(), errors=(), repairs=())),
    ag.ModelError("busy", status_code=503, headers={"retry-after": "2"}, model="m"),
    ag.ModelTimeout("slow", model="m"),
    ag.StoreError("down"),
    ag.StoreUnavailable("down"),
    ag.GuardFailure("validator failed", component="pipeline", error_type="RuntimeError"),
    ag.Usage(1, 2),
    ag.ToolCall("search", '{"q": "x"}', id="call_1"),
    ag.Severity.WARNING,
    ag.PressureLevel.CRITICAL,
    _TIER,
    ag.GuardConfig.from_dict({"token_budget": {"per_session": 10}}, env={}),
]


def _state(error: BaseException) -> object:
    """What makes two exceptions the same: type, arguments and attributes, as data."""
    attributes = dict(vars(error))
    if "response" in attributes:  # a slotted stand-in for an HTTP response
        attributes["response"] = (error.response.status_code, error.response.headers)  # type: ignore[attr-defined]
    return type(error), error.args, attributes


@pytest.mark.parametrize("value", _VALUES, ids=lambda v: type(v).__name__)
def test_public_values_round_trip_through_pickle(value: object) -> None:
    """Exported exceptions (with their attributes), dataclasses, enums and models unpickle equal."""
    back = pickle.loads(pickle.dumps(value))
    if isinstance(value, BaseException):
        assert isinstance(back, BaseException)
        assert _state(back) == _state(value)
    else:
        assert back == value


def test_every_public_exception_is_in_the_pickle_test() -> None:
    """The round trip above covers each exported exception class."""
    public = {getattr(ag, n) for n in PUBLIC}
    exceptions = {c for c in public if isinstance(c, type) and issubclass(c, BaseException)}
    assert exceptions == {type(v) for v in _VALUES if isinstance(v, BaseException)}


@pytest.mark.parametrize("name", [n for n in PUBLIC_OBJECTS if isinstance(getattr(ag, n), type)])
def test_type_hints_still_resolve(name: str) -> None:
    """``typing.get_type_hints`` works on every exported class, though its module moved."""
    typing.get_type_hints(getattr(ag, name))


def test_pydantic_still_reads_exported_dataclasses() -> None:
    """A user's pydantic model may hold agentguard values (their annotations resolve)."""

    class Record(pydantic.BaseModel):
        usage: ag.Usage
        call: ag.ToolCall

    record = Record.model_validate(
        {
            "usage": {"prompt_tokens": 1, "completion_tokens": 2},
            "call": {"name": "n", "arguments": "{}"},
        }
    )
    assert record.usage == ag.Usage(1, 2)


def test_reference_page_names_existing_objects() -> None:
    """Every ``::: agentguard...`` directive of docs/reference.md names something importable."""
    page = INIT.parent.parent.parent / "docs" / "reference.md"
    targets = re.findall(r"^::: (agentguard[\w.]*)$", page.read_text(encoding="utf-8"), re.M)
    assert targets
    for target in targets:
        module, _, attr = target.rpartition(".")
        try:
            importlib.import_module(target)
        except ModuleNotFoundError:
            assert hasattr(importlib.import_module(module), attr), target
