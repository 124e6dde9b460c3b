"""fcoll.testing's spawn mode: a plain ``pytest`` (no launcher) runs the ``mpi``-marked
tests in MPI jobs it starts itself (docs/testing.md). Each test here writes a small suite
and runs it as a user would, ``python -m pytest -p fcoll.testing`` in a subprocess without
the launcher's variables, then checks the outcomes, the junit XML and the exit status.
The checks of the marker itself run in this process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

import fcoll as fc
from fcoll.runtime import launcher
from fcoll.testing import TIMEOUT_ENV, markers

ROOT = Path(__file__).resolve().parents[1]
spawns = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")

SUITE = """
    import numpy as np, pytest, fcoll as fc

    def test_serial():
        assert fc.get_world_size() == 1          # the parent's own process

    @pytest.mark.mpi(nprocs=[2, 3])
    def test_sum():
        assert fc.all_reduce(np.ones(1))[0] == fc.get_world_size()

    @pytest.mark.mpi
    def test_fails_on_rank_1():
        print(f"output of rank {fc.get_rank()}")
        assert fc.get_rank() != 1, "boom on rank 1"

    @pytest.mark.mpi(min_size=3)
    @pytest.mark.parametrize("k", [1, 2])
    def test_three(k):
        assert fc.get_world_size() == 3

    @pytest.mark.mpi(nprocs=2)
    def test_skipped():
        pytest.skip("not today")
"""


@dataclass
class Run:
    code: int
    out: str
    folder: Path

    def cases(self) -> dict[str, ET.Element]:
        """The junit XML's testcases by name (the parent writes it, ``--junitxml``)."""
        tree = ET.parse(self.folder / "junit.xml")
        return {case.get("name", ""): case for case in tree.iter("testcase")}

    def jobs(self) -> list[str]:
        """The jobs the session started (one folder each under its basetemp)."""
        return sorted(p.name for p in (self.folder / "tmp").glob("**/spawn0/n*-*"))


def _pytest(folder: Path, *args: str, limit: float = 60, **env: str) -> Run:
    """Run ``python -m pytest -p fcoll.testing ARGS`` in ``folder``, not under a launcher."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "HYDRA_", "MPI", "OMPI_", "PMIX_", "PYTEST_"))}
    clean.pop(TIMEOUT_ENV, None)
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    clean.update(PYTHONPATH=path, COLUMNS="200", **env)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fcoll.testing", "-rA", f"--mpi-timeout={limit}",
         "--basetemp", str(folder / "tmp"), "--junitxml", str(folder / "junit.xml"), *args],
        cwd=folder, env=clean, capture_output=True, text=True, timeout=300)
    return Run(done.returncode, done.stdout + done.stderr, folder)


def _write(folder: Path, **files: str) -> Path:
    folder.mkdir(exist_ok=True)
    for name, source in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(source))
    return folder


@spawns
def test_each_test_and_size_is_one_report_with_every_failing_rank(tmp_path):
    run = _pytest(_write(tmp_path / "s", **{"test_s.py": SUITE}))
    out = run.out
    for name in ("test_serial", "test_sum[n=2]", "test_sum[n=3]", "test_three[1-n=3]",
                 "test_three[2-n=3]"):
        assert f"PASSED test_s.py::{name}\n" in out, out
    assert "FAILED test_s.py::test_fails_on_rank_1[n=2] - @rank1: AssertionError: boom on rank 1" \
        in out, out
    assert "--- @rank1 ---" in out and 'assert fc.get_rank() != 1, "boom on rank 1"' in out, out
    assert "Captured stdout call @rank1" in out and "output of rank 1" in out, out
    assert "SKIPPED [1] test_s.py:23: not today" in out, out
    assert "1 failed, 5 passed, 1 skipped" in out and run.code == 1, (run.code, out)
    assert run.jobs() == ["n2-1", "n3-2"], run.jobs()  # one job per world size
    cases = run.cases()
    assert sorted(cases) == sorted(["test_serial", "test_sum[n=2]", "test_sum[n=3]",
                                    "test_fails_on_rank_1[n=2]", "test_three[1-n=3]",
                                    "test_three[2-n=3]", "test_skipped[n=2]"]), sorted(cases)
    failure = cases["test_fails_on_rank_1[n=2]"].find("failure")
    assert failure is not None and failure.get("message", "").startswith(
        "@rank1: AssertionError: boom on rank 1"), ET.tostring(cases["test_fails_on_rank_1[n=2]"])
    assert "@rank1" in (failure.text or "") and "test_s.py:14: AssertionError" in (failure.text or "")
    assert cases["test_sum[n=2]"].find("failure") is None
    assert cases["test_skipped[n=2]"].find("skipped") is not None


HANGS = """
    import os, numpy as np, pytest, fcoll as fc

    @pytest.mark.mpi
    def test_others_hang():
        if fc.get_rank() != 0:
            fc.all_reduce(np.ones(1))       # rank 0 skips it

    @pytest.mark.mpi
    def test_after_the_first_hang():
        assert fc.all_reduce(np.ones(1))[0] == 2

    @pytest.mark.mpi
    def test_rank_0_hangs():
        if fc.get_rank() == 0:
            fc.all_reduce(np.ones(1))

    @pytest.mark.mpi
    def test_rank_1_dies():
        if fc.get_rank() == 1:
            os._exit(3)
        fc.barrier()

    @pytest.mark.mpi
    def test_last():
        pass
"""


@spawns
def test_a_hang_fails_that_test_and_the_rest_run_in_a_new_job(tmp_path):
    # 5 s: under CI's load (world size 1 runs as two shards on two cores) a 3 s limit once
    # passed before the launcher had ended the job whose rank 1 died.
    run = _pytest(_write(tmp_path / "h", **{"test_h.py": HANGS}), limit=5)
    out = run.out
    assert "FAILED test_h.py::test_others_hang[n=2] - @rank1: did not finish within 5 s: in fcoll " \
           "all_reduce" in out, out
    assert "rank 0: finished it and is waiting for the others" in out, out
    assert "FAILED test_h.py::test_rank_0_hangs[n=2] - @rank0: did not finish within 5 s" in out, out
    assert "FAILED test_h.py::test_rank_1_dies[n=2] - the job: the job of 2 ranks ended (exit " \
           "status 3) during this test" in out, out
    for name in ("test_after_the_first_hang", "test_last"):
        assert f"PASSED test_h.py::{name}[n=2]" in out, out
    assert "3 failed, 2 passed" in out and run.code == 1, (run.code, out)
    assert run.jobs() == ["n2-1", "n2-2", "n2-3", "n2-4"], run.jobs()
    failure = run.cases()["test_others_hang[n=2]"].find("failure")
    assert failure is not None and "not finished within the 5 s limit" in (failure.text or "")


@spawns
def test_a_job_that_gives_no_sign_is_ended_and_the_rest_go_on(tmp_path):
    """Ranks stopped outright (their watchdogs too) cannot report: the session ends the job
    after the test's limit and the grace (FCOLL_TEST_SPAWN_GRACE), and fails that test."""
    run = _pytest(_write(tmp_path / "q", **{"test_q.py": """
        import os, signal, pytest

        @pytest.mark.mpi
        def test_frozen():
            os.kill(os.getpid(), signal.SIGSTOP)

        @pytest.mark.mpi
        def test_after():
            pass
    """}), limit=1, FCOLL_TEST_SPAWN_GRACE="2")
    assert "FAILED test_q.py::test_frozen[n=2] - the job: the job of 2 ranks gave no sign for " \
           "7 s (limit 1 s); it was ended" in run.out, run.out
    assert "PASSED test_q.py::test_after[n=2]" in run.out and run.code == 1, run.out
    bad = _pytest(tmp_path / "q", FCOLL_TEST_SPAWN_GRACE="soon")
    assert "FCOLL_TEST_SPAWN_GRACE: expected seconds >= 0 (0: off), got 'soon'" in bad.out
    assert bad.code == 4, bad.out


@spawns
def test_k_x_and_last_failed_select_as_usual(tmp_path):
    folder = _write(tmp_path / "s", **{"test_s.py": SUITE})
    cache = ["-p", "cacheprovider", "-o", f"cache_dir={tmp_path / 'cache'}"]
    first = _pytest(folder, *cache, "-k", "sum or serial")
    assert "3 passed, 4 deselected" in first.out and first.code == 0, first.out
    assert first.jobs() == ["n2-1", "n3-2"], first.jobs()
    stopped = _pytest(folder, *cache, "-x")
    assert "stopping after 1 failures" in stopped.out and "1 failed, 2 passed in" in stopped.out, \
        stopped.out
    assert "test_three" not in stopped.out.split("short test summary info")[1], stopped.out
    again = _pytest(folder, *cache, "--lf")
    assert "FAILED test_s.py::test_fails_on_rank_1[n=2]" in again.out, again.out
    assert "rerun previous 1 failure" in again.out and "= 1 failed in" in again.out, again.out
    assert again.code == 1 and again.jobs() == ["n2-1"], (again.code, again.jobs())


@spawns
def test_collect_then_run_node_ids_as_vs_code_does(tmp_path):
    """VS Code's test explorer lists the tests with ``--collect-only``, then runs the ids
    the user picked."""
    folder = _write(tmp_path / "s", **{"test_s.py": SUITE})
    listed = _pytest(folder, "--collect-only", "-q")
    ids = [line for line in listed.out.splitlines() if line.startswith("test_s.py::")]
    assert ids == ["test_s.py::test_serial", "test_s.py::test_sum[n=2]", "test_s.py::test_sum[n=3]",
                   "test_s.py::test_fails_on_rank_1[n=2]", "test_s.py::test_three[1-n=3]",
                   "test_s.py::test_three[2-n=3]", "test_s.py::test_skipped[n=2]"], listed.out
    assert not list((folder / "tmp").glob("**/spawn*/n*")), "--collect-only started a job"
    run = _pytest(folder, "test_s.py::test_sum[n=3]", "test_s.py::test_fails_on_rank_1[n=2]")
    assert "PASSED test_s.py::test_sum[n=3]" in run.out, run.out
    assert "1 failed, 1 passed in" in run.out and run.code == 1, run.out
    assert sorted(run.cases()) == ["test_fails_on_rank_1[n=2]", "test_sum[n=3]"]


@spawns
def test_coverage_of_every_rank_is_merged_into_the_parents(tmp_path):
    pytest.importorskip("pytest_cov")  # in the test extra (pyproject.toml)
    folder = _write(tmp_path / "c", **{"pkg/__init__.py": """
        def serial():
            return 1

        def on_rank_1():
            return 2

        def at_size_3():
            return 3
    """, "test_c.py": """
        import pytest, fcoll as fc, pkg

        def test_serial():
            assert pkg.serial() == 1

        @pytest.mark.mpi(nprocs=[2, 3])
        def test_ranks():
            if fc.get_rank() == 1:
                assert pkg.on_rank_1() == 2
            if fc.get_world_size() == 3:
                assert pkg.at_size_3() == 3
    """})
    run = _pytest(folder, "--cov=pkg", "--cov-report=term-missing")
    assert run.code == 0 and "3 passed" in run.out, run.out
    line = next(line for line in run.out.splitlines() if line.startswith("pkg/__init__.py"))
    assert line.split()[1:4] == ["6", "0", "100%"], run.out


@spawns
def test_without_a_launcher_the_job_cannot_start_says_why(tmp_path):
    folder = _write(tmp_path / "s", **{"test_s.py": SUITE})
    run = _pytest(folder, "-k", "serial or sum", MPIEXEC=str(tmp_path / "no-such-mpiexec"))
    assert "PASSED test_s.py::test_serial" in run.out, run.out
    assert f"FAILED test_s.py::test_sum[n=2] - the job: could not start {tmp_path / 'no-such-mpiexec'}" \
        in run.out, run.out
    assert "2 failed, 1 passed" in run.out and run.code == 1, run.out


@spawns
def test_under_a_launcher_or_turned_off_nothing_is_spawned(tmp_path):
    """Under ``mpiexec -n 1`` (as scripts/test.sh runs this suite) and with
    ``--no-mpi-spawn``, marked tests keep their names and skip below their size."""
    folder = _write(tmp_path / "s", **{"test_s.py": SUITE})
    off = _pytest(folder, "--no-mpi-spawn")
    assert "needs an MPI world size >= 3, got 1" in off.out and "[n=" not in off.out, off.out
    assert "runs at MPI world sizes [2, 3], got 1" in off.out, off.out
    wrong = _pytest(folder, FCOLL_TEST_SPAWN="sometimes")
    assert "FCOLL_TEST_SPAWN: expected 0 or 1, got 'sometimes'" in wrong.out and wrong.code == 4
    from tests import jobs

    done = jobs.run(1, sys.executable, "-m", "pytest", "-p", "fcoll.testing", "-rA",
                    "-p", "no:cacheprovider", str(folder / "test_s.py"), timeout=120)
    assert "[n=" not in done.stdout and "4 skipped" in done.stdout, done.stdout


def test_marker_sizes_and_errors():
    mark = pytest.mark.mpi
    assert markers.sizes(mark.mark) == [2]
    assert markers.sizes(mark(nprocs=[4, 2, 4]).mark) == [2, 4]
    assert markers.sizes(mark(nprocs=3).mark) == [3]
    assert markers.sizes(mark(min_size=3).mark) == [3]
    assert markers.sizes(mark(max_size=1).mark) == [1]
    assert markers.sizes(mark(nprocs=[1, 2, 4], min_size=2, max_size=3).mark) == [2]
    assert markers.error(mark(nprocs=[2, 0]).mark) == \
        "mpi marker: expected nprocs to be a positive int or a list of them, got [2, 0]"
    assert markers.error(mark(nprocs=[4], max_size=2).mark) == \
        "mpi marker: expected nprocs [4] to hold a size within min_size None and max_size 2"
    assert markers.error(mark(nprocs=True).mark) is not None
    assert markers.check(mark(nprocs=[2, 4]).mark, 3) == (
        None, "runs at MPI world sizes [2, 4], got 3 (run under mpiexec -n 2, or under plain "
              "pytest, which launches it)")
    assert markers.check(mark(nprocs=[2, 4]).mark, 4) == (None, None)


def test_what_counts_as_a_launcher():
    assert launcher.launched({"PMI_SIZE": "1", "PMI_RANK": "0"})  # mpiexec -n 1
    assert launcher.launched({"OMPI_COMM_WORLD_SIZE": "1"})
    assert launcher.launched({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0"})  # srun -n 1
    assert not launcher.launched({"SLURM_STEP_ID": str(0xFFFFFFFB), "SLURM_PROCID": "0"})  # sbatch
    assert not launcher.launched({"HOME": "/root", "SLURM_NTASKS": "4"})
