"""How scripts/test.sh runs the suite (issue 36): shards that together run every test once,
transport passes that name their files, and the closing table with its time budget."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fcoll as fc
from tests import jobs, suite_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import stage_report  # noqa: E402

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="runs at world size 1 only")


def test_shard_reads_k_of_n_and_refuses_the_rest():
    assert suite_plan.shard("1/2") == (1, 2) and suite_plan.shard("3/3") == (3, 3)
    for bad in ("0/2", "3/2", "2", "a/b", "1/2/3"):
        with pytest.raises(pytest.UsageError, match=r"--shard: expected .*" + bad):
            suite_plan.shard(bad)


def test_passes_are_named_and_unknown_names_refused():
    assert [p.name for p in suite_plan.passes("via-numpy, via-mpi")] == ["via-numpy", "via-mpi"]
    with pytest.raises(pytest.UsageError, match="via-mpi, via-segment, via-numpy, got 'shm=0'"):
        suite_plan.passes("shm=0")


def test_every_pass_covers_every_file_the_job_runs():
    files = suite_plan.FILES
    assert all((ROOT / "tests" / name).exists() for name in files), files
    assert all(p.files == files for p in suite_plan.PASSES.values())
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert all(f"tests/{name}" in script for name in files)  # the job runs each file


def test_a_pass_leaves_out_only_the_tests_that_override_its_setting():
    """Under FCOLL_SHM=0 or 1 a test with test_scan's `transport` parameter repeats the plain
    run; under the numpy pass it does not (the engine differs), and a test without it runs."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--transport-passes", "via-mpi,via-segment,via-numpy", "tests/test_scan.py"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=jobs.environment())  # a pytest of its own, not a rank of this job
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    own = [i for i in ids if "::test_scan_order_at_every_size_and_transport[" in i]
    assert own and all("-via-numpy-" in i for i in own), own[:3]
    for name in ("via-mpi", "via-segment", "via-numpy"):  # a test without its own switch
        assert any(i.startswith("tests/test_scan.py::test_every_dtype_and_op[") and name in i
                   for i in ids), name
    assert "deselected" in done.stdout


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.suite_plan"]\n')
    (tmp_path / "test_some.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("i", range(7))
        def test_a(i):
            print("RAN", i)

        def test_b():
            print("RAN b")
    """))
    env = {**jobs.environment(), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:fcoll.testing", "-q", "-s",
                           "-p", "no:cacheprovider", *args, str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_shards_together_run_every_test_once(tmp_path):
    ran = []
    for k in (1, 2, 3):
        done = _run(tmp_path, "--shard", f"{k}/3")
        assert done.returncode == 0, done.stdout + done.stderr
        ran += re.findall(r"RAN \w", done.stdout)
        assert "deselected" in done.stdout
    assert sorted(ran) == sorted([f"RAN {i}" for i in range(7)] + ["RAN b"])


def test_a_bad_shard_is_a_usage_error(tmp_path):
    done = _run(tmp_path, "--shard", "3/2")
    assert done.returncode == 4 and "--shard: expected 1 <= K <= N, got '3/2'" in done.stderr


LOG = """\
........                                                                 [100%]
============================= slowest 30 durations =============================
2.01s call     tests/test_x.py::test_slow
3821 passed, 1065 skipped, 1 warning in 66.94s (0:01:06)
"""


def _stages(tmp_path: Path, rows: list[tuple[str, int, int, str]]) -> Path:
    lines = [f"{name}\t{seconds}\t{status}\t{group}" for name, seconds, status, group in rows]
    (tmp_path / "stages.tsv").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_the_table_counts_each_stage_and_sums_a_side_by_side_group(tmp_path):
    (tmp_path / "n2.log").write_text(LOG)
    (tmp_path / "n1.shard1.log").write_text("1 failed, 10 passed in 3.0s\n")
    (tmp_path / "n1.shard2.log").write_text("=== 12 passed, 2 skipped in 4.10s ===\n")
    stages = stage_report.read(_stages(tmp_path, [
        ("install", 70, 0, ""), ("n1.shard2", 40, 0, "n1"), ("n1.shard1", 50, 1, "n1"),
        ("n1", 51, 1, "*"), ("openmpi.install", 90, 0, "&"), ("n2", 67, 0, "")]))
    assert [s.name for s in stages] == ["install", "n1", "n1.shard2", "n1.shard1", "openmpi.install", "n2"]
    assert stages[1].counts == {"passed": 22, "failed": 1, "skipped": 2}
    assert stage_report.totals(stages) == {"passed": 3843, "failed": 1, "skipped": 1067, "error": 0}
    lines = stage_report.table(stages)
    assert lines[2].startswith("n1 (side by side)") and lines[3].startswith("  n1.shard2")
    assert lines[5].startswith("openmpi.install (in the background)")
    assert [s.name for s in stage_report.slowest(stages, 2)] == ["install", "n2"]  # not the background


def test_over_the_budget_the_report_fails_and_names_the_slowest_stages(tmp_path, monkeypatch, capsys):
    (tmp_path / "n4.log").write_text(LOG)
    directory = _stages(tmp_path, [("install", 60, 0, ""), ("n4", 2000, 0, ""), ("n3", 900, 0, "")])
    monkeypatch.setenv(stage_report.BUDGET_ENV, "45")
    assert stage_report.main([str(directory), "2960"]) == 1
    out = capsys.readouterr().out
    assert "CI BUDGET EXCEEDED: the run took 49.3 min, over 45 min" in out
    assert "Slowest stages: n4 2000 s, n3 900 s, install 60 s" in out
    assert out.splitlines()[-1] == "total: 3821 passed, 0 failed, 1065 skipped"
    monkeypatch.setenv(stage_report.BUDGET_ENV, "50")
    assert stage_report.main([str(directory), "2960"]) == 0
    monkeypatch.setenv(stage_report.BUDGET_ENV, "soon")
    with pytest.raises(SystemExit, match="FCOLL_CI_BUDGET_MIN: expected minutes as a number, got 'soon'"):
        stage_report.main([str(directory), "2960"])
