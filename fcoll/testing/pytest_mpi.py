"""fcoll.testing in pytest-mpi's place (docs/testing.md, "Suites written for pytest-mpi").

pytest-mpi loads itself whenever it is installed and would skip every ``mpi`` test
without ``--with-mpi``; when fcoll.testing is loaded, it takes pytest-mpi's place: it
unregisters or blocks that plugin, registers its options once, and reads its markers.
"""

from __future__ import annotations

import contextlib

import pytest

NAME = "pytest_mpi"  # pytest-mpi's plugin name (its pytest11 entry point)
REPLACED: list[str] = []  # "pytest-mpi <version>" once fcoll.testing has taken its place
MARKERS = {"mpi_skip": "skipped under MPI", "mpi_break": "skipped under MPI",
           "mpi_xfail": "expected to fail under MPI"}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Take pytest-mpi's place: unregister it if it is loaded (its options stay and keep
    their meaning), and block it if it would load later."""
    other = pluginmanager.get_plugin(NAME)
    version = _installed("pytest-mpi")
    if other is not None or version is not None:
        REPLACED[:] = [f"pytest-mpi {version or '?'}"]
    if other is not None:
        pluginmanager.unregister(other)
    pluginmanager.set_blocked(NAME)


def _installed(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def add_options(parser: pytest.Parser) -> None:
    """``--with-mpi`` and ``--only-mpi``, unless pytest-mpi added them before it was replaced."""
    for flag, what in (("--with-mpi", "run the MPI tests (always so under fcoll.testing)"),
                       ("--only-mpi", "run only the tests marked mpi")):
        with contextlib.suppress(ValueError):
            parser.addoption(flag, action="store_true", default=False,
                             help=f"{what} (pytest-mpi's option)")


def add_markers(config: pytest.Config) -> None:
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (pytest-mpi's marker)")


def mark(item: pytest.Item, skip: str | None, only_mpi: bool) -> None:
    """Skip ``item`` (``skip``: the ``mpi`` marker's reason, if any) or expect it to fail,
    by pytest-mpi's markers and ``--only-mpi``."""
    if item.get_closest_marker("mpi") is None and only_mpi:
        skip = "not marked mpi (--only-mpi)"
    if item.get_closest_marker("mpi_skip") or item.get_closest_marker("mpi_break"):
        skip = "test does not work under mpi (mpi_skip)"
    if skip is not None:
        item.add_marker(pytest.mark.skip(reason=skip))
    elif item.get_closest_marker("mpi_xfail"):
        item.add_marker(pytest.mark.xfail(reason="test fails under mpi (mpi_xfail)"))
