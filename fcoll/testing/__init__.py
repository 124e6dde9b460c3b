"""pytest plugin for MPI test suites: ``mpiexec -n N python -m pytest -p fcoll.testing``.

Every rank runs the same pytest session; the plugin keeps them in step and makes the job
read like one run (details in ``docs/testing.md``):

- Only rank 0 prints. After each test the ranks exchange their failures; rank 0 reports
  another rank's failure as ``tests/x.py::test_x@rank2`` with that rank's traceback.
- Every rank exits with the same status (collection errors and "no tests" included).
- ``@pytest.mark.mpi(min_size=2, max_size=None, timeout=None)`` skips a test outside that
  world size range and can give it its own time limit.
- The ``mpi_tmp_path`` fixture is one directory, the same path on every rank (the ranks
  must share a filesystem).
- A test that does not finish within ``mpi_timeout`` seconds (``--mpi-timeout``, the
  ``FCOLL_TEST_TIMEOUT`` environment variable, or the ini option; default 240) on every
  rank is reported as a failure naming the ranks that did not finish and the fcoll call
  each is in; the job then ends with ``MPI_Abort``, since a rank blocked in MPI cannot be
  interrupted. A ``fcoll.CollectiveTimeoutError`` (with ``fcoll.init(timeout=...)``) is an
  ordinary failure instead, after which the session stops cleanly.
- `reference_reduce` and `reference_scan` compute on one process what fcoll's reductions
  and scans return, bit for bit, from the list of every rank's input (the canonical tree).
- `parallel_raises` and `parallel_assert` check a condition across ranks and pass or fail
  on every rank together, so one rank's exception does not leave the others waiting.
- Hypothesis draws the same examples on every rank: one seed, chosen by rank 0, and a
  profile without example database or deadline.
- Without a launcher (a plain ``pytest``, an IDE's test explorer), the marked tests run
  in MPI jobs the session starts, one per world size (``nprocs=[2, 4]``, else
  ``min_size``, else 2), each reported as ``test_x[n=2]`` (`fcoll.testing.spawn`).
- Suites written for pytest-mpi run with the same meaning (its ``mpi`` marker, the
  ``mpi_skip``/``mpi_xfail``/``mpi_break`` markers, ``--with-mpi``/``--only-mpi`` and the
  ``mpi_tmpdir``/``mpi_file_name`` fixtures). When pytest-mpi is installed too, this plugin
  takes its place (pytest-mpi would skip every ``mpi`` test without ``--with-mpi``):
  an MPI session always runs its MPI tests, and the header says so.

Example:
    >>> # tests/test_sum.py, run as: mpiexec -n 4 python -m pytest -p fcoll.testing
    >>> @pytest.mark.mpi(min_size=2)
    ... def test_sum(mpi_tmp_path):
    ...     assert fc.all_reduce(np.ones(1))[0] == fc.get_world_size()
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

import fcoll
from fcoll.diagnostics import excepthook
from fcoll.runtime import mpi
from fcoll.testing import agree, child, markers, pytest_mpi, spawn
from fcoll.testing import sync as syncing
from fcoll.testing.asserts import RaisesInfo, parallel_assert, parallel_raises
from fcoll.testing.fixtures import SESSION as _KEY
from fcoll.testing.fixtures import _fcoll_nprocs, mpi_file_name, mpi_tmp_path, mpi_tmpdir
from fcoll.testing.pytest_mpi import pytest_addhooks
from fcoll.testing.reference import reference_reduce, reference_scan

# The fixtures and pytest_addhooks are found here by pytest, as attributes of the plugin.
__all__ = ["RaisesInfo", "_fcoll_nprocs", "mpi_file_name", "mpi_tmp_path", "mpi_tmpdir", "parallel_assert",
           "parallel_raises", "pytest_addhooks", "reference_reduce", "reference_scan"]

DEFAULT_TIMEOUT = 240.0
TIMEOUT_ENV = "FCOLL_TEST_TIMEOUT"


def pytest_addoption(parser: pytest.Parser) -> None:
    pytest_mpi.add_options(parser)
    group = parser.getgroup("fcoll.testing", "MPI test sessions (fcoll.testing)")
    help_text = (f"seconds a test may take on all ranks before it is reported as hung and the "
                 f"job ends (default {DEFAULT_TIMEOUT:g}; env {TIMEOUT_ENV})")
    group.addoption("--mpi-timeout", type=float, default=None, dest="mpi_timeout", help=help_text)
    group.addoption("--no-mpi-spawn", action="store_true", default=False, dest="no_mpi_spawn",
                    help=f"not under a launcher, skip the tests marked mpi instead of running "
                         f"them in MPI jobs of their sizes (env {spawn.ENV}=0)")
    parser.addini("mpi_timeout", help_text, default=None)


def _limit(config: pytest.Config) -> float:
    """The per-test limit: command line, then environment, then ini, then the default."""
    for name, value in (("--mpi-timeout", config.getoption("mpi_timeout")),
                        (TIMEOUT_ENV, os.environ.get(TIMEOUT_ENV)),
                        ("mpi_timeout (ini)", config.getini("mpi_timeout"))):
        if value is None or value == "":
            continue
        try:
            seconds = float(value)
        except ValueError:
            raise pytest.UsageError(f"{name}: expected seconds, got {value!r}") from None
        if not seconds > 0:
            raise pytest.UsageError(f"{name}: expected a positive number of seconds, got {value!r}")
        return seconds
    return DEFAULT_TIMEOUT


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    excepthook.under_testing()  # failures are reported here, not by ending the job
    config.addinivalue_line(
        "markers", "mpi(min_size=None, max_size=None, timeout=None, nprocs=None): run only at "
        "MPI world sizes in [min_size, max_size] (and in nprocs); without a launcher, run in "
        "MPI jobs of each size in nprocs (else min_size, else 2); timeout overrides mpi_timeout")
    pytest_mpi.add_markers(config)
    session = MPISession(config)
    config.stash[_KEY] = session
    config.pluginmanager.register(session, "fcoll.testing.session")
    if session.mode == "spawn":
        config.pluginmanager.register(spawn.Spawner(config, session), "fcoll.testing.spawn")
    where = child.folder()
    if session.mode == "child" and where is not None:
        job = child.Child(config, where, session.rank)
        session.emitters.append(job.hang)
        config.pluginmanager.register(job, "fcoll.testing.child")


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Without a launcher (and in the jobs it starts), a marked test becomes one test per
    world size, ``test_x[n=2]`` (`fcoll.testing.spawn`)."""
    if metafunc.config.stash[_KEY].mode in ("spawn", "child"):
        spawn.parametrize(metafunc)


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


class MPISession:
    """The plugin's state on one rank, registered as a pytest plugin by `pytest_configure`."""

    def __init__(self, config: pytest.Config) -> None:
        fcoll.init()
        self.config = config
        self.comm: Any = mpi().COMM_WORLD.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.limit = _limit(config)
        self.maxfail = int(config.option.maxfail or 0)
        config.option.maxfail = 0  # stopping early is decided together, see _exchange
        self.failures = 0  # failed reports on all ranks so far
        self.index = 0  # tests started; equal on every rank
        self.shared: Path | None = None
        self.hung: str | None = None
        self.mismatch: str | None = None
        self.reports: list[dict[str, Any]] = []  # this rank's failed reports of the test
        self.timed_out = False
        self.stdout = os.dup(1)  # the terminal, even while pytest captures fd 1
        if self.rank != 0:
            _silence_stdout()
        if config.option.basetemp:  # one --basetemp for all ranks: give each its own
            base = Path(config.option.basetemp).resolve()
            base.mkdir(parents=True, exist_ok=True)
            config.option.basetemp = str(base / f"rank{self.rank}")
        self.seed = self.comm.bcast(random.SystemRandom().randrange(2**32) if self.rank == 0
                                    else None, root=0)
        self.hypothesis = agree.hypothesis_profile(config, self.seed)
        self.watch = syncing.Watchdog(self.comm, None, self._emit)
        self.mode = spawn.mode(config, self.size)  # "spawn": the parent of MPI jobs
        self.emitters: list[Callable[[str, dict[int, str]], None]] = []  # also told of a hang

    def _emit(self, label: str, texts: dict[int, str]) -> None:
        """Rank 0's watchdog thread: print the report of a hang that stopped rank 0 itself
        (pytest cannot report it: its thread is blocked)."""
        body = texts[0].partition("\n")[2]
        failed = "".join(f"FAILED {label}@rank{rank} - {text.splitlines()[0]}\n"
                         for rank, text in texts.items())
        text = (f"\n{' fcoll.testing: hang ':=^80}\n{body.strip()}\n"
                f"{' short test summary info ':=^80}\n{failed}")
        os.write(self.stdout, text.encode(errors="replace"))
        for emit in self.emitters:
            emit(label, texts)

    def pytest_report_header(self) -> str:
        MPI = mpi()
        library = " ".join(MPI.Get_library_version().splitlines()[0].split())
        levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                  MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
        lines = [f"fcoll.testing: world size {self.size}, {library}, thread level "
                 f"{levels.get(MPI.Query_thread())}, per-test limit {self.limit:g} s"]
        if self.hypothesis:
            lines.append(f"fcoll.testing: {self.hypothesis}")
        if pytest_mpi.REPLACED:
            lines.append(f"fcoll.testing: {pytest_mpi.REPLACED[0]} is installed; fcoll.testing "
                         "handles its markers, options and fixtures (pytest-mpi is not loaded)")
        return "\n".join(lines)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Rank 0 makes the shared directory (``mpi_tmp_path``'s parent, hang states)."""
        path = None
        if self.rank == 0:
            factory = getattr(self.config, "_tmp_path_factory", None)
            base = factory.mktemp("mpi", numbered=True) if factory is not None else None
            if base is not None:
                (base / "hangs").mkdir()
                path = str(base)
        shared = self.comm.bcast(path, root=0)
        self.shared = Path(shared) if shared is not None else None
        self.watch.hang_dir = self.shared / "hangs" if self.shared is not None else None

    # -- collection ------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, object, object]:
        self.watch.arm("collection", 0, self.limit)
        return (yield)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and not hasattr(report, "mpi_rank"):
            self.reports.append(self._serialize(report))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        hang = syncing.sync(self.watch)
        if hang is not None:
            self._hang(session, "collection", hang)
            return
        everyone = self.comm.allgather((self.reports, [item.nodeid for item in session.items]))
        self.reports = []
        errors = [rank for rank, (reports, _) in enumerate(everyone) if reports]
        if self.rank == 0:
            for rank, (reports, _) in enumerate(everyone):
                for data in reports if rank else []:
                    self.config.hook.pytest_collectreport(report=self._deserialize(data, rank))
        if errors and not self.config.option.continue_on_collection_errors:
            self.mismatch = f"errors during collection on ranks {errors}"
        else:
            self.mismatch = agree.compare_collections([ids for _, ids in everyone])

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if self.mismatch:
            raise session.Interrupted(self.mismatch)

    # -- tests -----------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        if self.mode == "spawn" and spawn.size_of(item) is not None:
            return (yield)  # a job runs it (`spawn.Spawner`)
        self.index += 1
        self.watch.arm(item.nodeid, self.index, markers.limit(item.get_closest_marker("mpi"),
                                                              self.limit))
        return (yield)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        only_mpi = bool(self.config.getoption("--only-mpi"))
        for item in items:
            marker = item.get_closest_marker("mpi")
            if self.mode == "spawn" and spawn.size_of(item) is not None:
                continue  # its job applies the markers
            skip = markers.check(marker, self.size)[1] if marker is not None else None
            pytest_mpi.mark(item, skip, only_mpi)

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        marker = item.get_closest_marker("mpi")
        error = markers.check(marker, self.size)[0] if marker is not None else None
        if error is not None:
            pytest.fail(error, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed:
            self.reports.append(self._serialize(report))
            if self.watch.phase is not None:
                crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
                last = crash or (report.longreprtext.strip().splitlines() or ["failed"])[-1]
                self.watch.phase.notes.append(f"{call.when}: {last.splitlines()[0][:200]}")
            if call.excinfo is not None and call.excinfo.errisinstance(fcoll.CollectiveTimeoutError):
                self.timed_out = True
        if call.when == "teardown":
            self._exchange(item)
        return report

    def _exchange(self, item: pytest.Item) -> None:
        """At the end of a test: wait for every rank, then share failures and stop flags."""
        session = item.session
        hang = syncing.sync(self.watch)
        if hang is not None:
            self._hang(session, item.nodeid, hang, item)
            return
        mine = (self.reports, self.timed_out, session.shouldstop or "")
        everyone = self.comm.allgather(mine)
        self.reports, self.timed_out = [], False
        if self.rank == 0:
            for rank, (reports, _, _) in enumerate(everyone):
                for data in reports if rank else []:
                    session.testscollected += 1  # keeps the progress percentage honest
                    item.ihook.pytest_runtest_logreport(report=self._deserialize(data, rank))
        self.failures += sum(len(reports) for reports, _, _ in everyone)
        if self.maxfail and self.failures >= self.maxfail:
            session.shouldfail = f"stopping after {self.failures} failures"
        late = [rank for rank, (_, timed_out, _) in enumerate(everyone) if timed_out]
        if late:
            session.shouldstop = (f"fcoll.CollectiveTimeoutError in {item.nodeid} on ranks {late}: "
                                  "its group is unusable, so the session stops here")
        stops = [stop for _, _, stop in everyone if stop]
        if stops and not session.shouldstop:
            session.shouldstop = stops[0]

    def _hang(self, session: pytest.Session, label: str, hang: syncing.Hang,
              item: pytest.Item | None = None) -> None:
        """Rank 0, some ranks did not finish ``label`` in time: report it, stop, and abort
        the job once pytest has printed its summary (`pytest_unconfigure`)."""
        self.hung = hang.texts[hang.missing[0]]
        for rank in hang.missing:
            if item is None:
                break
            path, line, domain = item.location
            report = pytest.TestReport(f"{item.nodeid}@rank{rank}", (path, line, f"{domain}@rank{rank}"),
                                       {}, "failed", hang.texts[rank], "call")
            session.testscollected += 1
            item.ihook.pytest_runtest_logreport(report=report)
        reason = f"{label} did not finish on ranks {hang.missing}; the job is aborted"
        if item is None:
            self.mismatch = f"{reason}: {self.hung}"
        session.shouldstop = reason

    # -- end of the session ----------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Every rank exits with the same status (skipped after a hang: rank 0 aborts)."""
        if self.hung is not None:
            session.exitstatus = syncing.HANG_EXIT
            return
        self.watch.arm("the end of the session", self.index + 1, self.limit)
        hang = syncing.sync(self.watch)
        if hang is not None:
            self.hung = hang.texts[hang.missing[0]]
            session.exitstatus = syncing.HANG_EXIT
            sys.stdout.write(f"\nfcoll.testing: the end of the session hung on ranks "
                             f"{hang.missing}: {self.hung}\n")
            return
        statuses = self.comm.allgather(int(session.exitstatus))
        worst = max(statuses)
        session.exitstatus = 0 if worst == 5 and min(statuses) == 0 else worst

    def pytest_unconfigure(self) -> None:
        if self.hung is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            self.comm.Abort(syncing.HANG_EXIT)

    # -- reports of other ranks --------------------------------------------------------------

    def _serialize(self, report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any]:
        data: dict[str, Any] = self.config.hook.pytest_report_to_serializable(
            config=self.config, report=report)
        return data

    def _deserialize(self, data: dict[str, Any], rank: int) -> Any:
        """Another rank's report, renamed ``<nodeid>@rank<k>`` (its title says so too)."""
        report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        report.nodeid = f"{report.nodeid}@rank{rank}"
        if isinstance(report, pytest.TestReport):
            path, line, domain = report.location
            report.location = (path, line, f"{domain}@rank{rank}")
        report.mpi_rank = rank
        return report
