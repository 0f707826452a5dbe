"""Build ``episodes.jsonl``: real recorded agent runs converted to OpenAI chat format, labelled by
the rubric (``RUBRIC.md``), plus minimal synthetic cases for the classes no real trace covers.

Usage: ``python benchmarks/loopbench/build.py`` (needs the source repositories as git mirrors:
``--mirror DIR`` holding ``<owner>+<name>/repo`` git directories, see ``SOURCES.md``). The output
is committed; the benchmark itself (``bench_loopbench.py``) only reads it, so it runs offline.
Deterministic: the synthetic cases use a seeded generator.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
Msg = dict[str, Any]

SOURCES = {
    "tau-bench": {
        "repo": "sierra-research/tau-bench",
        "commit": "59a200c6d575d595120f1cb70fea53cef0632f6b",
        "licence": "MIT",
    },
    "SWE-agent": {
        "repo": "SWE-agent/SWE-agent",
        "commit": "3ea751c087f32b16e039a2233dd6eefecef325d5",
        "licence": "MIT",
    },
}


def _git_show(mirror: Path, key: str, path: str) -> str:
    git_dir = mirror / SOURCES[key]["repo"].replace("/", "+") / "repo"
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{SOURCES[key]['commit']}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _git_ls(mirror: Path, key: str) -> list[str]:
    git_dir = mirror / SOURCES[key]["repo"].replace("/", "+") / "repo"
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", SOURCES[key]["commit"]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def _source(key: str, path: str, index: str = "") -> dict[str, str]:
    meta = SOURCES[key]
    url = f"https://github.com/{meta['repo']}/blob/{meta['commit']}/{path}"
    return {
        "kind": "real",
        "repo": meta["repo"],
        "commit": meta["commit"],
        "path": path,
        "index": index,
        "url": url,
    }


# -- the rubric, applied to real traces ----------------------------------------------------------


def canonical(arguments: Any) -> str:
    """Arguments as canonical JSON (key order and whitespace do not make a call different)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def rubric_label(messages: list[Msg]) -> tuple[str, int | None, str]:
    """(label, flag_by step, reason) of a real trace by rules R1-R3 of ``RUBRIC.md``.

    R1: the third call of one tool with the same canonical arguments that got the same result
    (error or not) as before — no state-changing call of another tool in between counts as
    progress only if that call's own result differed. R3: the third identical assistant text
    of 40+ characters. Steps count assistant messages from 1.
    """
    step = 0
    pending: dict[str, tuple[str, str]] = {}
    seen: Counter[tuple[str, str, str]] = Counter()
    texts: Counter[str] = Counter()
    for m in messages:
        if m["role"] == "assistant":
            step += 1
            text = (m.get("content") or "").strip()
            if len(text) >= 40 and not m.get("tool_calls"):
                texts[text] += 1
                if texts[text] == 3:
                    return "loop", step, "R3: the same assistant text a third time"
            for c in m.get("tool_calls") or ():
                fn = c["function"]
                pending[c.get("id") or ""] = (fn["name"], canonical(fn["arguments"]))
        elif m["role"] == "tool":
            call = pending.pop(m.get("tool_call_id") or "", None)
            if call is None:
                continue
            key = (*call, str(m.get("content")))
            seen[key] += 1
            if seen[key] == 3:
                kind = "an error" if str(m.get("content")).startswith("Error") else "a result"
                return (
                    "loop",
                    step,
                    (
                        f"R1: third identical call of {call[0]} with {kind} identical to the "
                        "earlier two; nothing changed in between"
                    ),
                )
    return "healthy", None, ""


# -- real sources ---------------------------------------------------------------------------------


def tau_bench(mirror: Path) -> list[dict[str, Any]]:
    """tau-bench's historical trajectories (gpt-4o, airline): customer-service runs with a
    simulated user, real tool calls against the benchmark's environment, reward 1 = solved."""
    path = "historical_trajectories/gpt-4o-airline.json"
    runs = json.loads(_git_show(mirror, "tau-bench", path))
    out = []
    for i, run in enumerate(runs):
        messages = [dict(m) for m in run["traj"]]
        # the 10 kB airline policy is the same in every run and says nothing about loops
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": "[tau-bench airline agent policy, omitted]"}
        label, flag_by, reason = rubric_label(messages)
        solved = run["reward"] == 1.0
        if label == "loop":
            cls = "repeated_error" if "error" in reason else "identical_call"
        elif solved:
            cls = "healthy_real_solved"
            reason = "real run that solved its task (reward 1); no rubric loop"
        else:
            cls = "healthy_real_unsolved"
            reason = (
                "real run that failed its task (reward 0) without a rubric loop: "
                "a failure is not a loop"
            )
        errors = sum(
            1 for m in messages if m["role"] == "tool" and str(m.get("content")).startswith("Error")
        )
        if label == "healthy" and errors and solved:
            cls = "healthy_business_errors"
            reason = f"real solved run (reward 1) whose tools returned {errors} business error(s)"
        out.append(
            _episode(
                f"tau-airline-{run['task_id']:02d}-t{run['trial']}",
                cls,
                label,
                flag_by,
                _source("tau-bench", path, f"[{i}] task {run['task_id']} trial {run['trial']}"),
                "MIT",
                reason,
                messages,
                tools=None,
                notes={"reward": run["reward"]},
            )
        )
    return out


def _swe_messages(history: list[Msg]) -> list[Msg]:
    """SWE-agent history (function calling or text actions) as OpenAI chat messages."""
    out: list[Msg] = []
    pending: list[str] = []
    n = 0
    for m in history:
        role = m["role"]
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if role == "system":
            out.append({"role": "system", "content": "[SWE-agent system prompt, omitted]"})
        elif role == "assistant":
            calls = m.get("tool_calls")
            if not calls and m.get("action", "").strip():
                action = m["action"].strip()
                n += 1
                calls = [
                    {
                        "id": f"act_{n}",
                        "type": "function",
                        "function": {
                            "name": action.split()[0],
                            "arguments": json.dumps({"command": action}),
                        },
                    }
                ]
            msg: Msg = {"role": "assistant", "content": m.get("thought") or content or ""}
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": c.get("id") or f"act_{n}",
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": c["function"]["arguments"],
                        },
                    }
                    for c in calls
                ]
                pending = [c["id"] for c in msg["tool_calls"]]
            out.append(msg)
        elif pending and role in ("tool", "user"):
            out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": content or ""})
        else:
            out.append({"role": role, "content": content or ""})
    return out


def swe_agent(mirror: Path) -> list[dict[str, Any]]:
    out = []
    for path in _git_ls(mirror, "SWE-agent"):
        if not path.endswith(".traj"):
            continue
        data = json.loads(_git_show(mirror, "SWE-agent", path))
        messages = _swe_messages(data["history"])
        label, flag_by, reason = rubric_label(messages)
        cls = "healthy_real_solved" if label == "healthy" else "identical_call"
        if label == "healthy":
            reason = "real SWE-agent run shipped as a demonstration or test fixture; no rubric loop"
        out.append(
            _episode(
                "swe-agent-" + _slug(path),
                cls,
                label,
                flag_by,
                _source("SWE-agent", path),
                "MIT",
                reason,
                messages,
                tools=None,
            )
        )
    return out


def _slug(path: str) -> str:
    stem = path.rsplit("/", 1)[-1].replace(".traj", "")[:32].replace("_", "-").replace(".", "-")
    return f"{stem}-{hashlib.sha256(path.encode()).hexdigest()[:6]}"


def _episode(  # noqa: PLR0917  (one positional per field of the record)
    id_: str,
    cls: str,
    label: str,
    flag_by: int | None,
    source: dict[str, str],
    licence: str,
    reason: str,
    messages: list[Msg],
    tools: list[Msg] | None,
    notes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": id_,
        "class": cls,
        "label": label,
        "flag_by": flag_by,
        "source": source,
        "licence": licence,
        "reason": reason,
        "tools": tools,
        "notes": notes or {},
        "messages": messages,
    }


from synthetic import synthetic  # noqa: E402  (the synthetic generators live next to this file)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mirror", default="/work/.mirror", type=Path)
    parser.add_argument("--output", default=HERE / "episodes.jsonl", type=Path)
    args = parser.parse_args()
    episodes = tau_bench(args.mirror) + swe_agent(args.mirror)
    from overrides import OVERRIDES  # manual review of the rubric's automatic labels

    for ep in episodes:
        if ep["id"] in OVERRIDES:
            ep.update(OVERRIDES[ep["id"]])
    episodes += synthetic(random.Random(16))
    ids = Counter(e["id"] for e in episodes)
    assert all(n == 1 for n in ids.values()), [i for i, n in ids.items() if n > 1]
    with args.output.open("w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(json.dumps(ep, ensure_ascii=False, separators=(",", ":")) + "\n")
    by = Counter((e["label"], e["class"]) for e in episodes)
    for (label, cls), n in sorted(by.items()):
        print(f"{label:8} {cls:32} {n}")
    print(len(episodes), "episodes,", sum(e["label"] == "loop" for e in episodes), "loops")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
