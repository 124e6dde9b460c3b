"""fcoll.testing's fixtures: one directory (and file name) shared by every rank.

``mpi_tmpdir`` and ``mpi_file_name`` are pytest-mpi's fixtures of those names, so its
suites run unchanged (`fcoll.testing.pytest_mpi`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# The plugin's per-rank session (`fcoll.testing.MPISession`), stashed on the config.
SESSION = pytest.StashKey[Any]()


@pytest.fixture
def mpi_tmp_path(request: pytest.FixtureRequest) -> Path:
    """A fresh directory for this test, the same path on every rank.

    Rank 0 creates the parent at the start of the session, under its ``tmp_path_factory``
    base, and broadcasts it; each rank creates the test's directory if needed (no
    communication here, so ranks that skip the test do not matter). The ranks must share
    a filesystem; order writes and reads with a barrier.

    Example:
        >>> def test_shared(mpi_tmp_path):
        ...     if fc.get_rank() == 1:
        ...         (mpi_tmp_path / "x.txt").write_text("hi")
        ...     fc.barrier()
        ...     assert (mpi_tmp_path / "x.txt").read_text() == "hi"   # every rank
    """
    session = request.config.stash[SESSION]
    if session.shared is None:
        pytest.fail("mpi_tmp_path: expected pytest's tmp_path_factory on rank 0, got none",
                    pytrace=False)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:40]
    path: Path = session.shared / f"{session.index:04d}-{name}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def mpi_tmpdir(mpi_tmp_path: Path) -> Any:
    """`mpi_tmp_path` as a ``py.path.local`` (pytest-mpi's fixture of that name).

    Example:
        >>> def test_shared(mpi_tmpdir):
        ...     assert mpi_tmpdir.check(dir=True)          # the same directory on every rank
    """
    from _pytest.compat import legacy_path

    return legacy_path(mpi_tmp_path)


@pytest.fixture
def mpi_file_name(mpi_tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A file name in `mpi_tmp_path`, the same on every rank (pytest-mpi's fixture; like it,
    named after the test with the suffix ``.hdf5``; nothing creates the file).

    Example:
        >>> def test_file(mpi_file_name):
        ...     assert mpi_file_name.endswith(".hdf5")     # equal on every rank
    """
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:60]
    return str(mpi_tmp_path / f"{name}.hdf5")


@pytest.fixture
def _fcoll_nprocs(request: pytest.FixtureRequest) -> int:
    """The world size a test marked ``mpi`` runs at without a launcher (`fcoll.testing.spawn`
    parametrizes it: ``test_x[n=2]``); private, the test need not ask for it.

    Example:
        >>> @pytest.mark.mpi(nprocs=[2, 4])
        ... def test_x(): ...                       # test_x[n=2], test_x[n=4]
    """
    size: int = request.param
    return size
