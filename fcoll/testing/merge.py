"""Spawn mode's reports: one test of one job, every rank's results, as the parent's reports.

A job's rank 0 records its own reports of each test and the failed reports of the other
ranks (`fcoll.testing.child`). `reports` turns them into one report per phase (setup,
call, teardown) under the parent's node id (``test_x[n=2]``): failed if any rank failed
that phase, its text holding each failing rank's traceback under ``@rankK``, its
captured output tagged the same way. pytest's own reporting (terminal, junit XML, the
``--lf`` cache) takes them as it takes any report.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import pytest
from _pytest._code.code import ReprFileLocation, TerminalRepr
from _pytest._io import TerminalWriter

When = Literal["setup", "call", "teardown"]
PHASES: tuple[When, ...] = ("setup", "call", "teardown")
JOB = -1  # the "rank" of a failure of the job as a whole (it ended, or gave no sign)


def label(rank: int) -> str:
    """``@rank2``, or ``the job`` for `JOB`.

    Example:
        >>> label(2), label(JOB)
        ('@rank2', 'the job')
    """
    return "the job" if rank == JOB else f"@rank{rank}"


class RankedRepr(TerminalRepr):
    """The failures of several ranks in one phase of a test, each under ``@rankK``.

    Example:
        >>> str(RankedRepr([(1, "AssertionError: boom")], ("t.py", 3, "test_x")))
        '---- @rank1 ----\\nAssertionError: boom\\n'     # (the separator spans the line)
    """

    def __init__(self, parts: list[tuple[int, Any]], location: tuple[str, int | None, str]) -> None:
        self.parts = parts
        rank, first = parts[0]
        crash = getattr(first, "reprcrash", None)
        if isinstance(crash, ReprFileLocation):
            self.reprcrash = dataclasses.replace(crash, message=f"{label(rank)}: {crash.message}")
        else:
            line = (str(first).strip().splitlines() or ["failed"])[0]
            self.reprcrash = ReprFileLocation(location[0], (location[1] or 0) + 1,
                                              f"{label(rank)}: {line}")

    def toterminal(self, tw: TerminalWriter) -> None:
        for rank, longrepr in self.parts:
            tw.sep("-", label(rank))
            if hasattr(longrepr, "toterminal"):
                longrepr.toterminal(tw)
            else:
                tw.line(str(longrepr))


def _failure(item: pytest.Item, when: When, text: str) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, when)


def _combine(item: pytest.Item, when: When, ranked: list[tuple[int, Any]]) -> pytest.TestReport:
    """One phase's reports of every rank that sent one, as one report of ``item``."""
    ranked.sort(key=lambda pair: (pair[0] == JOB, pair[0]))
    base = ranked[0][1]
    failed = [(rank, report.longrepr) for rank, report in ranked if report.failed]
    outcome: Literal["passed", "failed", "skipped"] = "failed" if failed else base.outcome
    longrepr = RankedRepr(failed, item.location) if failed else base.longrepr
    sections = [(f"{title} {label(rank)}", text) for rank, report in ranked
                for title, text in report.sections if rank == ranked[0][0] or report.failed]
    report = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome,
                               longrepr, when, sections, base.duration, base.start,
                               base.stop, base.user_properties)
    if not failed and hasattr(base, "wasxfail"):
        report.wasxfail = base.wasxfail
    return report


def reports(config: pytest.Config, item: pytest.Item, records: list[dict[str, Any]],
            problem: str | None = None) -> list[pytest.TestReport]:
    """The parent's setup, call and teardown reports of ``item`` from a job's ``records``
    of it (``report`` and ``hang`` records, `fcoll.testing.child`); ``problem``: why the
    job stopped before the test finished (a failure of its call), if it did.

    Example:
        >>> [r.outcome for r in reports(config, item, records)]  # failed on rank 1 only
        ['passed', 'failed', 'passed']
    """
    phases: dict[When, list[tuple[int, Any]]] = {when: [] for when in PHASES}
    for record in records:
        if record["kind"] == "report":
            report = config.hook.pytest_report_from_serializable(config=config, data=record["data"])
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason), through JSON
                report.longrepr = tuple(report.longrepr)
            phases[report.when].append((int(record["rank"]), report))
        elif record["kind"] == "hang":
            for rank, text in sorted(record["texts"].items(), key=lambda kv: int(kv[0])):
                phases["call"].append((int(rank), _failure(item, "call", text)))
    if problem is not None and not any(record["kind"] == "hang" for record in records):
        phases["call"].append((JOB, _failure(item, "call", problem)))
    if not phases["setup"]:
        phases["setup"].append((0, pytest.TestReport(item.nodeid, item.location, {}, "passed", None,
                                                     "setup")))
    if not phases["teardown"]:
        phases["teardown"].append((0, pytest.TestReport(item.nodeid, item.location, {}, "passed",
                                                        None, "teardown")))
    return [_combine(item, when, phases[when]) for when in PHASES if phases[when]]
