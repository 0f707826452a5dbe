"""The front door for development: ``nox -s tests``, ``lint``, ``typecheck``, ``bench``, ``demo``.

Every session installs what it needs into its own virtualenv, so a fresh machine with only
Python (and ``pip install nox``) can run all of them.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "tests_openai2", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# Real tool schemas for the validator tests; its own dependencies (model runners) are not needed.
BFCL = "bfcl-eval==2026.3.23"
# The newest OpenHands SDK that installs from the package index here: 1.58.1 and 1.58.2 require
# certifi>=2026.10.19, which the index does not have yet. 1.58.0 brings litellm<1.106 (never a
# 1.107.x, which was reported compromised).
OPENHANDS_SDK = "openhands-sdk==1.58.0"


def _install_for_tests(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.install("--no-deps", BFCL)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the whole test suite (extra pytest arguments are passed through)."""
    _install_for_tests(session)
    session.run("pytest", *session.posargs)


@nox.session(python="3.11")
def tests_openai2(session: nox.Session) -> None:
    """The suite against openai 2.x on httpx (CrewAI and OpenHands still pin it)."""
    _install_for_tests(session)
    session.install("openai>=2,<3")
    session.run("pytest", *session.posargs)


@nox.session(python="3.12")
def openhands(session: nox.Session) -> None:
    """The OpenHands adapter against the real SDK (Python >= 3.12), offline."""
    session.install("-e", ".[dev]", OPENHANDS_SDK)
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}
    session.run("pytest", "tests/test_integration_openhands.py", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "benchmarks", "tools", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "tools", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on src/."""
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark and rewrite docs/benchmarks.md (``-- --quick`` for a smoke run)."""
    session.install("-e", ".[dev]")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on its embedded default: scan the bundled looping-agent transcript."""
    session.install(".")
    session.run("agentguard", "scan", "examples/looping_agent.jsonl", *session.posargs)
