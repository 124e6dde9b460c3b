"""One ``mpiexec -n N python -m pytest`` job of spawn mode, seen from the parent session.

`Job.start` writes the node ids to run into the job's folder and starts the launcher
(the one ``python -m fcoll info`` names: `fcoll.runtime.launcher`) in a session of its own;
`Job.wait` reads the job's records (`fcoll.testing.child`) until a test is done, the job
ends, or it gives no sign of life for longer than the test's limit and the grace after it
(then the whole job is ended). Each rank starts through `BOOT`, which starts coverage
first when the parent measures it (pytest-cov), so the parent combines the ranks' data.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fcoll.diagnostics import watch
from fcoll.testing import child

COVERAGE_ENV = "FCOLL_TESTING_COVERAGE"
# The variables a launcher gives its ranks (dropped: the job is a fresh one), and pytest's
# (the parent passes its options itself).
_DROP = ("PMI_", "HYDRA_", "MPI_LOCAL", "OMPI_COMM_WORLD", "PMIX_", "PYTEST_ADDOPTS",
         "PYTEST_CURRENT_TEST")
STARTUP = 30.0  # seconds a job may take to start and to end after a hang, on top of the limits
STARTUP_ENV = "FCOLL_TEST_SPAWN_GRACE"  # sets STARTUP (`startup`)
BOOT = """
import json, os, sys
cov = None
if os.environ.get("FCOLL_TESTING_COVERAGE"):
    import coverage
    cov = coverage.Coverage(data_suffix=True, **json.loads(os.environ["FCOLL_TESTING_COVERAGE"]))
    cov.start()
import pytest
try:
    code = int(pytest.main(sys.argv[1:]))
finally:
    if cov is not None:
        cov.stop()
        cov.save()
sys.exit(code)
"""


@dataclass
class Outcome:
    """What a job says of one test: its records, and why it stopped first, if it did.

    Example:
        >>> job.wait("test_a.py::test_x[n=2]", 240.0, 10.0).problem is None
        True
    """

    records: list[dict[str, Any]]
    problem: str | None = None


@dataclass
class Job:
    """A running (or ended) job of ``size`` ranks for the tests ``ids``, in ``where``.

    Example:
        >>> job = Job.start(command(["mpiexec"], 2, args), env, 2, ids, where, Path.cwd())
        >>> [job.wait(nodeid, 240.0, 10.0) for nodeid in ids]; job.stop()
    """

    size: int
    ids: list[str]
    where: Path
    process: subprocess.Popen[bytes] | None = None
    error: str | None = None  # why it could not start
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    started: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)  # collection errors, ids it did not collect
    last: float = field(default_factory=time.monotonic)  # when it last gave a sign
    reader: TextIO | None = None
    partial: str = ""

    @classmethod
    def start(cls, command: list[str], env: dict[str, str], size: int, ids: list[str],
              where: Path, cwd: Path) -> Job:
        """Start ``command`` (the launcher, ``-n size``, python, `BOOT` and pytest's arguments)."""
        where.mkdir(parents=True)
        (where / child.SELECT).write_text(json.dumps(ids))
        (where / child.RECORDS).touch()
        job = cls(size, ids, where)
        try:
            with open(where / "stdout.txt", "wb") as out, open(where / "stderr.txt", "wb") as err:
                job.process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err,
                                               stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as problem:
            job.error = f"could not start {command[0]}: {problem}"
        job.reader = open(where / child.RECORDS, encoding="utf-8")  # noqa: SIM115
        return job

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _read(self) -> None:
        """Take in the records written since the last look (none once it is stopped)."""
        if self.reader is None:
            return
        text = self.partial + self.reader.read()
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in filter(None, lines):
            self._take(json.loads(line))
            self.last = time.monotonic()

    def _take(self, record: dict[str, Any]) -> None:
        kind, nodeid = record["kind"], record.get("nodeid", "")
        if kind in ("report", "hang"):
            self.records.setdefault(nodeid, []).append(record)
        elif kind == "start":
            self.started.add(nodeid)
        elif kind == "done":
            self.done.add(nodeid)
        elif kind == "missing":
            self.notes.append(f"the job did not collect {', '.join(record['ids'])}")
        elif kind == "collect":
            self.notes.append(f"collection error on rank {record['rank']}: {record['text']}")

    def wait(self, nodeid: str, limit: float, grace: float, extra: float = STARTUP) -> Outcome:
        """The records of test ``nodeid`` once the job has finished it; else (the job ended, or
        gave no sign for ``limit`` + ``4 * grace`` + ``extra`` seconds, after which it is
        ended) what it recorded, and why it stopped."""
        if self.error is not None:
            return Outcome([], self.error)
        pause = 0.005
        while True:
            self._read()
            if nodeid in self.done:
                return Outcome(self.records.pop(nodeid, []))
            assert self.process is not None
            if self.process.poll() is not None:
                self._read()
                if nodeid in self.done:
                    return Outcome(self.records.pop(nodeid, []))
                return Outcome(self.records.pop(nodeid, []), self._ended(nodeid))
            quiet = time.monotonic() - self.last
            if quiet > limit + 4 * grace + extra:
                self.stop()
                return Outcome(self.records.pop(nodeid, []),
                               f"the job of {self.size} ranks gave no sign for {quiet:.0f} s "
                               f"(limit {limit:g} s); it was ended{self._stderr()}")
            time.sleep(pause)
            pause = min(2 * pause, 0.1)

    def _ended(self, nodeid: str) -> str:
        assert self.process is not None
        code = self.process.returncode
        when = "during this test" if nodeid in self.started else "before this test started"
        notes = "".join(f"\n{note}" for note in self.notes)
        return f"the job of {self.size} ranks ended (exit status {code}) {when}{notes}{self._stderr()}"

    def _stderr(self, lines: int = 30) -> str:
        """The end of the job's standard error and output, for a failure's text."""
        parts = []
        for name in ("stderr.txt", "stdout.txt"):
            try:
                text = (self.where / name).read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                tail = "\n".join(text.splitlines()[-lines:])
                parts.append(f"\n--- the job's {name[:-4]} (last {lines} lines, {self.where / name})"
                             f" ---\n{tail}")
        return "".join(parts)

    def stop(self) -> None:
        """End the job (its launcher and every rank) if it still runs; close its records.
        A job that has finished all its tests gets `STARTUP` seconds to end by itself first
        (its ranks save their coverage data as they exit)."""
        if self.alive and self.done.issuperset(self.ids):
            assert self.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STARTUP)
        if self.alive:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def startup() -> float:
    """`STARTUP`, or ``FCOLL_TEST_SPAWN_GRACE`` seconds when set; `ValueError` naming it if bad.

    Example:
        >>> startup()                             # FCOLL_TEST_SPAWN_GRACE unset
        30.0
    """
    return watch.seconds_setting(STARTUP_ENV, STARTUP)


def environment(job_folder: Path, coverage: str | None) -> dict[str, str]:
    """This process's environment for a job's ranks: the launcher's and pytest's variables
    dropped, the job's folder and coverage settings added, this fcoll first on the path.

    Example:
        >>> environment(Path("/tmp/spawn0/n2-1"), None)["FCOLL_TESTING_JOB"]
        '/tmp/spawn0/n2-1'
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this fcoll
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env[child.JOB_ENV] = str(job_folder)
    if coverage is not None:
        env[COVERAGE_ENV] = coverage
    return env


def command(launcher: list[str], size: int, arguments: list[str]) -> list[str]:
    """``mpiexec [flags] -n size python -c BOOT arguments...``.

    Example:
        >>> command(["mpiexec"], 2, ["test_x.py"])[:3]
        ['mpiexec', '-n', '2']
    """
    return [*launcher, "-n", str(size), sys.executable, "-c", BOOT, *arguments]
