"""The offline demo behind ``agentguard demo``: a small agent, its tools, and scripted faults.

Private: the CLI renders it; tests drive it through the CLI. Nothing here talks to a network:
the model is :class:`agentguard.testing.ScriptedModel` served to the real openai client through
an HTTP mock transport.
"""

from __future__ import annotations

from ._agent import DemoEvent, RunResult, run_scenario
from ._scenarios import SCENARIOS, Scenario

__all__ = ["SCENARIOS", "DemoEvent", "RunResult", "Scenario", "run_scenario"]
