"""A job that spawn mode started (`fcoll.testing.spawn`): run the parent's tests, record results.

The parent sets ``FCOLL_TESTING_JOB`` to the job's folder. There ``select.json`` lists the
node ids to run (every rank keeps those, in collection order); rank 0 appends one JSON
record per line to ``records.jsonl`` as the session goes: ``collected``, ``missing`` (ids
the job did not collect), ``start``, ``report`` (pytest's serialized report, with the rank
it comes from: rank 0's own, and the failures of the others that rank 0 receives),
``done``, ``hang`` (rank 0's watchdog, when rank 0 itself is stuck), ``collect`` (a
collection error) and ``end``.

The job writes no junit XML and no cache of its own: the parent reports every test.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

JOB_ENV = "FCOLL_TESTING_JOB"
SELECT = "select.json"
RECORDS = "records.jsonl"
_RANK = re.compile(r"@rank(\d+)$")


def folder() -> Path | None:
    """The job's folder when this process is a rank of a job spawn mode started, else None.

    Example:
        >>> folder()                              # FCOLL_TESTING_JOB=/tmp/spawn0/n2-1
        PosixPath('/tmp/spawn0/n2-1')
    """
    value = os.environ.get(JOB_ENV, "").strip()
    return Path(value) if value else None


def rank_of(report: Any) -> int:
    """The rank a report comes from: fcoll.testing's mark, else its ``@rankK`` suffix, else 0.

    Example:
        >>> rank_of(report)                       # report.nodeid == "t.py::test_x@rank2"
        2
    """
    rank = getattr(report, "mpi_rank", None)
    if isinstance(rank, int):
        return rank
    found = _RANK.search(str(report.nodeid))
    return int(found.group(1)) if found else 0


class Child:
    """The plugin of a spawned job, on every rank (records are written by rank 0 only).

    Example:
        >>> config.pluginmanager.register(Child(config, folder(), rank), "fcoll.testing.child")
    """

    def __init__(self, config: pytest.Config, where: Path, rank: int) -> None:
        self.config = config
        self.wanted: list[str] = json.loads((where / SELECT).read_text())
        self.lock = threading.Lock()  # rank 0's watchdog thread writes too
        self.out = open(where / RECORDS, "a", encoding="utf-8") if rank == 0 else None  # noqa: SIM115
        config.option.xmlpath = None  # the parent writes the junit XML

    def write(self, record: dict[str, Any]) -> None:
        if self.out is None:
            return
        line = json.dumps(record, default=repr)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        wanted = set(self.wanted)
        keep = [item for item in items if item.nodeid in wanted]
        dropped = [item for item in items if item.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        missing = sorted(wanted - {item.nodeid for item in keep})
        if missing:
            self.write({"kind": "missing", "ids": missing})
        self.write({"kind": "collected", "ids": [item.nodeid for item in keep]})

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write({"kind": "collect", "rank": rank_of(report),
                        "text": f"{report.nodeid}: {report.longreprtext}"})

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.write({"kind": "start", "nodeid": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.write({"kind": "report", "nodeid": _RANK.sub("", report.nodeid),
                    "rank": rank_of(report), "data": data})

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.write({"kind": "done", "nodeid": nodeid})

    def hang(self, label: str, texts: dict[int, str]) -> None:
        """Rank 0 is stuck in ``label``: its watchdog's report, before the process ends."""
        self.write({"kind": "hang", "nodeid": label, "texts": {str(k): v for k, v in texts.items()}})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.write({"kind": "end", "status": int(exitstatus)})
