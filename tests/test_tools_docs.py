"""The custom agent loop in docs/tools.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "tools.md"


def test_the_documented_agent_loop_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The example executes offline and ends with the model's final answer."""
    blocks = re.findall(r"```python\n(# example: agent loop\n.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "docs_tools"})
    assert "Ana knows it will rain" in capsys.readouterr().out
