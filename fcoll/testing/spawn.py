"""Spawn mode: a plain ``pytest`` (no launcher) runs its ``mpi``-marked tests in MPI jobs.

Each marked test is parametrized by world size (`parametrize`: ``test_x[n=2]``,
``test_x[n=4]``, the sizes of `fcoll.testing.markers.sizes`), in the parent session and
in the jobs alike, so both name it the same. The parent runs its other tests itself, then
the marked ones size by size: the first test of a size starts one job for every selected
test of that size (`fcoll.testing.job`), and each test is reported when the job has
finished it (`fcoll.testing.merge`). A job that ends early (a hang, a crash) fails the
test it was in; the tests after it start in a new job.

``--no-mpi-spawn`` or ``FCOLL_TEST_SPAWN=0`` turn it off: marked tests are then skipped
at world size 1, as under ``mpiexec -n 1``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from fcoll.runtime import launcher as _launcher
from fcoll.runtime import mpi
from fcoll.testing import child, job, markers, merge
from fcoll.testing.sync import grace_seconds

SIZE = "_fcoll_nprocs"  # the fixture each marked test is parametrized by
ENV = "FCOLL_TEST_SPAWN"


def mode(config: pytest.Config, size: int) -> str:
    """``"child"`` in a job spawn mode started; ``"spawn"`` in a session of one process
    not under a launcher, unless turned off; else ``"launcher"``.

    Example:
        >>> mode(config, 1)           # `pytest -p fcoll.testing` from a shell
        'spawn'
    """
    if child.folder() is not None:
        return "child"
    setting = os.environ.get(ENV, "").strip().lower()
    if setting not in ("", "0", "1", "no", "yes", "off", "on", "false", "true"):
        raise pytest.UsageError(f"{ENV}: expected 0 or 1, got {setting!r}")
    off = config.getoption("no_mpi_spawn") or setting in ("0", "no", "off", "false")
    if size > 1 or off or _launcher.launched(os.environ):
        return "launcher"
    return "spawn"


def parametrize(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test with a well-formed ``mpi`` marker by its world sizes (``[n=2]``).

    Example:
        >>> parametrize(metafunc)      # @pytest.mark.mpi(nprocs=[2, 4]) def test_x(): ...
        >>> # collected: test_x[n=2], test_x[n=4]
    """
    marker = metafunc.definition.get_closest_marker("mpi")
    if marker is None or markers.error(marker) is not None:
        return  # a bad marker fails the test in the parent, with the marker's message
    sizes = markers.sizes(marker)
    metafunc.fixturenames.append(SIZE)
    metafunc.parametrize(SIZE, sizes, indirect=True, ids=[f"n={n}" for n in sizes])


def size_of(item: pytest.Item) -> int | None:
    """The world size spawn mode runs ``item`` at, or None for a test the parent runs.

    Example:
        >>> [size_of(item) for item in session.items]     # test_serial, test_x[n=2]
        [None, 2]
    """
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get(SIZE) if callspec is not None else None
    return value if isinstance(value, int) else None


def arguments(config: pytest.Config, where: Path, files: list[str]) -> list[str]:
    """pytest's arguments for a job: the parent's plugins, configuration and the options
    that shape a test's result or report; no selection, junit, cache or coverage report.

    Example:
        >>> arguments(config, Path("/tmp/spawn0/n2-1"), ["/src/tests/test_x.py"])[:4]
        ['-p', 'fcoll.testing', '--rootdir', '/src']
    """
    option = config.option
    args = ["-p", "fcoll.testing", "--rootdir", str(config.rootpath)]
    args += [arg for name in option.plugins or [] if name != "vscode_pytest" for arg in ("-p", name)]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    args += [arg for value in option.override_ini or [] for arg in ("-o", value)]
    args += ["-o", f"cache_dir={where / 'cache'}", "--basetemp", str(where / "tmp"),
             f"--import-mode={option.importmode}", f"--tb={option.tbstyle}",
             f"--capture={option.capture}", f"--assert={option.assertmode}",
             f"--verbosity={option.verbose}"]
    args += [arg for value in option.pythonwarnings or [] for arg in ("-W", value)]
    flags = {"--showlocals": option.showlocals, "--full-trace": option.fulltrace,
             "--noconftest": option.noconftest, "--with-mpi": config.getoption("--with-mpi"),
             "--only-mpi": config.getoption("--only-mpi")}
    args += [flag for flag, on in flags.items() if on]
    values = {"--confcutdir": option.confcutdir, "--mpi-timeout": config.getoption("mpi_timeout"),
              "--hypothesis-seed": getattr(option, "hypothesis_seed", None)}
    args += [f"{flag}={value}" for flag, value in values.items() if value is not None]
    if config.pluginmanager.has_plugin("_cov"):
        args.append("--no-cov")  # the ranks measure through BOOT; the parent reports
    return [*args, *files]


def coverage_settings(config: pytest.Config) -> str | None:
    """pytest-cov's settings in the parent, for the ranks' own coverage (JSON), or None.

    Example:
        >>> coverage_settings(config)            # pytest --cov=pkg
        '{"data_file": "/src/.coverage", "config_file": false, "source": ["/src/pkg"], ...}'
    """
    if not config.pluginmanager.has_plugin("_cov") or getattr(config.option, "no_cov", False):
        return None
    try:
        import coverage
    except ImportError:
        return None
    current = coverage.Coverage.current()
    if current is None:
        return None
    settings = current.config
    source = [os.path.abspath(s) if os.path.exists(s) else s for s in settings.source or []]
    return json.dumps({"data_file": os.path.abspath(settings.data_file),
                       "config_file": settings.config_file or False, "source": source or None,
                       "source_pkgs": settings.source_pkgs or None, "branch": settings.branch})


def launcher() -> tuple[list[str], dict[str, str]]:
    """The launcher with its flags, and the variables it needs, for the MPI that mpi4py
    loaded (found as ``python -m fcoll info`` finds it).

    Example:
        >>> launcher()                           # the mpich wheel's venv
        (['/src/.venv/bin/mpiexec'], {})
    """
    library = _launcher.family(str(mpi().get_vendor()[0]))
    found = _launcher.pick_launcher(library)
    if not found:
        raise FileNotFoundError(
            f"fcoll.testing: expected an mpiexec or mpirun of {library or 'the MPI mpi4py loads'} "
            "next to this Python, on PATH or in $MPIEXEC, got none (python -m fcoll info shows "
            "what it finds); or run the suite under mpiexec yourself")
    flags, env = _launcher.launch_settings(library)
    return [found, *flags], env


class Spawner:
    """The parent session's side of spawn mode (registered by `fcoll.testing.pytest_configure`
    next to its `fcoll.testing.MPISession`, whose limit and failure count it shares).

    Example:
        >>> config.pluginmanager.register(Spawner(config, session), "fcoll.testing.spawn")
    """

    def __init__(self, config: pytest.Config, session: Any) -> None:
        self.config, self.session = config, session
        self.jobs: dict[int, job.Job] = {}
        self.queues: dict[int, list[pytest.Item]] = {}  # the spawned tests of each size, in order
        self.started = 0
        self.base: Path | None = None
        try:
            self.extra = job.startup()  # seconds a silent job gets past a test's limits
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None

    def pytest_report_header(self) -> str:
        return ("fcoll.testing: not under a launcher: tests marked mpi run in MPI jobs this "
                "session starts, one per world size, each reported as test_x[n=N]")

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """The parent's own tests first, then the spawned ones size by size; end every job
        when the loop ends (before pytest-cov combines the ranks' data)."""
        spawned = sorted((i for i in session.items if size_of(i) is not None), key=size_of)  # type: ignore[arg-type]
        session.items[:] = [i for i in session.items if size_of(i) is None] + spawned
        for item in spawned:
            self.queues.setdefault(size_of(item), []).append(item)  # type: ignore[arg-type]
            if self.config.pluginmanager.has_plugin("timeout"):  # pytest-timeout: the job has limits
                item.add_marker(pytest.mark.timeout(0))
        try:
            return (yield)
        finally:
            for running in self.jobs.values():
                running.stop()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> bool | None:
        size = size_of(item)
        if size is None:
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        outcome = self._outcome(item, size)
        reports = merge.reports(self.config, item, outcome.records, outcome.problem)
        for report in reports:
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        self.session.failures += sum(report.failed for report in reports)
        if self.session.maxfail and self.session.failures >= self.session.maxfail:
            item.session.shouldfail = f"stopping after {self.session.failures} failures"
        return True

    def _outcome(self, item: pytest.Item, size: int) -> job.Outcome:
        """The job's word on ``item``: from the running job of its size, else from a new one
        for it and the tests after it (once more if the job ended before reaching it)."""
        limit = markers.limit(item.get_closest_marker("mpi"), self.session.limit)
        for _ in range(2):
            current = self.jobs.get(size)
            if current is None or (not current.alive and current.started
                                   and item.nodeid not in current.done):
                if current is not None:
                    current.stop()  # it ended: close its records
                current = self.jobs[size] = self._start(size, item)
            outcome = current.wait(item.nodeid, limit, grace_seconds(limit), self.extra)
            if outcome.problem is None or item.nodeid in current.started or not current.started:
                return outcome
        return outcome

    def _start(self, size: int, item: pytest.Item) -> job.Job:
        queue = self.queues[size]
        items = queue[queue.index(item):]
        ids = [i.nodeid for i in items]
        self.started += 1
        if self.base is None:
            factory = getattr(self.config, "_tmp_path_factory", None)
            self.base = (factory.mktemp("spawn", numbered=True) if factory is not None
                         else Path(tempfile.mkdtemp(prefix="fcoll-spawn-")))
        where = self.base / f"n{size}-{self.started}"
        try:
            launch, launch_env = launcher()
        except FileNotFoundError as error:
            return job.Job(size, ids, where, error=str(error))
        files = sorted({str(i.path) for i in items})
        command = job.command(launch, size, arguments(self.config, where, files))
        env = {**launch_env, **job.environment(where, coverage_settings(self.config))}
        return job.Job.start(command, env, size, ids, where, self.config.invocation_params.dir)
