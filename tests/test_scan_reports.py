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
from agentguard.cli._formats import InputError  # noqa: E402
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
