"""The scan's reports, frozen: a faster scan must find the same things at the same steps.

Every trace sample in ``tests/data``, the loop benchmark's episodes and the scan benchmark's
generated files (each file shape) are scanned as ``agentguard scan`` does, and the reports are
compared with ``tests/data/scan_reports.json``, written by main's code before the scan was made
faster (issue 18): the findings (where, at which step, what the guard does, what it cost), the
recovery rungs, the tokens and money, the per-tool tallies, and (hashed, they are large) the
finding texts, the HTML report, its timeline and the messages around each finding; the
benchmarks' files of many sessions keep their summary, the rest of their reports hashed.

A change that is meant to change the findings rewrites the file (``python
tests/test_scan_reports.py``) and shows the difference in review.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
FROZEN = DATA / "scan_reports.json"
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scan  # noqa: E402 - after its directory is on the path
from agentguard.cli import _html, _output  # noqa: E402
from agentguard.cli._audit import SessionAudit  # noqa: E402
from agentguard.cli._formats import InputError, open_counted, records  # noqa: E402
from agentguard.cli._scan import _prices, scan_file  # noqa: E402
from agentguard.config import GuardConfig  # noqa: E402


def _hash(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _files(tmp: Path) -> dict[str, Path]:
    """Name -> file: the samples, the loop benchmark, the scan benchmark's shapes."""
    files = {p.name: p for p in sorted(DATA.iterdir()) if p.suffix in (".json", ".jsonl", ".traj")}
    files.pop(FROZEN.name, None)
    files["loopbench/episodes.jsonl"] = ROOT / "benchmarks" / "loopbench" / "episodes.jsonl"
    shapes = bench_scan._shapes(tmp, [bench_scan.transcript(r) for r in range(30)])
    for _, path in shapes:
        files[f"bench/{path.name}"] = path
    files["bench/huge.json"] = bench_scan._huge_item(tmp, 10_000)
    return files


def reports(tmp: Path) -> dict[str, Any]:
    """Every file's reports, as the frozen file holds them."""
    config = GuardConfig.from_dict({}, env={})
    prices = _prices(config, ["*=1.5,6", "gpt-4o=2.5,10"])
    out: dict[str, Any] = {}
    for name, path in _files(tmp).items():
        try:
            plain = scan_file(str(path), config)
        except InputError as exc:
            out[name] = {"error": str(exc).replace(str(path), name)}
            continue
        report = _output.report(name, plain)
        for session in report["transcripts"]:
            for finding in session["findings"]:
                finding["message"] = _hash(finding["message"])
        priced = scan_file(str(path), config, timeline=True, prices=prices)
        if len(report["transcripts"]) > 10:  # the benchmarks' files: their summary, hashed
            report = {"summary": report["summary"], "hash": _hash(report)}
        out[name] = {
            "report": report,
            "priced": _hash(_output.report(name, priced)),
            "html": _hash(_html.render(name, priced)),
            "timelines": _hash([bytes(a.timeline or b"").hex() for a in priced]),
            "contexts": _hash([[i.context for i in a.issues] for a in priced]),
        }
    return out


def test_the_reports_are_those_main_gave(tmp_path: Path) -> None:
    expected = json.loads(FROZEN.read_text(encoding="utf-8"))
    found = json.loads(json.dumps(reports(tmp_path)))  # tuples as JSON has them
    assert found.keys() == expected.keys()
    for name in expected:
        assert found[name] == expected[name], name


if __name__ == "__main__":  # rewrite the frozen reports (a change meant to change findings)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp_name:
        FROZEN.write_text(json.dumps(reports(Path(tmp_name)), sort_keys=True) + "\n")


def _by_records(path: Path, config: GuardConfig) -> list[SessionAudit]:
    """The audit fed one record at a time (:func:`records`), as the scan read files before."""
    audits: dict[str, SessionAudit] = {}
    with open_counted(str(path))[0] as stream:
        for r in records(stream, str(path)):
            audit = audits.get(r.session)
            if audit is None:
                audit = audits[r.session] = SessionAudit(r.session, config)
            if r.tools:
                audit.declare(r.tools)
            if r.message is None:
                audit.retry_tokens += r.retry_tokens
                audit.tokens += r.tokens or 0
                continue
            audit.feed(r.message, r.tokens, r.retry_tokens, model=r.model,
                       prompt_tokens=r.prompt_tokens)  # fmt: skip
    for audit in audits.values():
        audit.finish()
    return list(audits.values())


def test_runs_of_messages_read_as_records_are(tmp_path: Path) -> None:
    """The scan reads a transcript, or consecutive message lines of one session, as one run;
    interleaved sessions, transcripts among message lines and every sample read the same as
    one record at a time."""
    config = GuardConfig.from_dict({}, env={})
    lines = []
    for turn in range(12):
        for run in range(3):  # three sessions, interleaved message by message
            for m in bench_scan.transcript(run)[turn * 3 : turn * 3 + 3]:
                lines.append(json.dumps({**m, "session": f"run-{run}"}))
        lines.append(json.dumps({"role": "user", "content": f"no session {turn}"}))
        if turn % 4 == 0:
            lines.append(json.dumps({"id": f"t{turn}", "messages": bench_scan.transcript(9)}))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(lines) + "\n")
    for path in [mixed, *(p for n, p in _files(tmp_path).items() if not n.startswith("loop"))]:
        try:
            expected = _output.report("f", _by_records(path, config))
        except InputError:
            continue
        assert _output.report("f", scan_file(str(path), config)) == expected, path.name
