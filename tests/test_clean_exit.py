"""A finished job exits 0 on every MPI transport (API.md, "Never silent"): fcoll frees the
windows it made (the groups' segments, the node board) before ``MPI_Finalize``.

MPICH's ofi netmod on its tcp provider (what an Ethernet cluster uses between nodes) fails
``MPI_Finalize`` while a window is still allocated (``OFI call fabricclose failed ...
Device or resource busy``, exit status 15); the shared-memory netmod does not notice. Each
job runs inside a private network namespace (``unshare -n``, only ``lo``), so its traffic
never leaves it; where namespaces are not allowed the tests skip, saying so. Jobs of the
world-size-1 pass, with MPICH only (the variables are MPICH's).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import fcoll as fc
from tests import jobs

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}
FAKE_NODES = {"MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CLIQUES_BY_BLOCK": "1"}
WRAP = ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec bash -c "$0"']


def _namespace() -> str | None:
    """Why a private network namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    try:
        done = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unshare -n failed: {error}"
    return None if done.returncode == 0 else f"unshare -n failed: {done.stderr.strip()}"


@pytest.fixture(scope="module")
def tcp() -> dict[str, str]:
    if jobs.open_mpi():
        pytest.skip("MPICH's ofi netmod: mpi4py runs on Open MPI here")
    why = _namespace()
    if why is not None:
        pytest.skip(f"no private network namespace for MPICH's tcp provider: {why}")
    return TCP


def _clean(tmp_path: Path, body: str, n: int, env: dict[str, str]) -> str:
    code, out, _ = jobs.script(tmp_path, body, n, env, limit=120, wrap=WRAP)
    assert "MPI_Finalize failed" not in out and "fabricclose" not in out, out
    assert code == 0, out
    return out


FIN = "sys.stdout.write(f'sum {fc.all_reduce(np.ones(1000, np.float32))[:2].tolist()}\\n')\n"


@pytest.mark.parametrize("case", ["segment", "numpy segment", "mpi", "two nodes"])
def test_a_finished_job_exits_0_on_tcp(tmp_path, tcp, case):
    env = {**tcp, **{"numpy segment": {"FCOLL_NATIVE": "0"}, "mpi": {"FCOLL_SHM": "0"},
                     "two nodes": FAKE_NODES, "segment": {}}[case]}
    out = _clean(tmp_path, FIN, 2, env)
    assert out.count("sum [2.0, 2.0]") == 2, out


@pytest.mark.parametrize("n", [3, 4])
def test_every_kind_of_group_and_call_ends_clean_on_tcp(tmp_path, tcp, n):
    """Subgroups with segments (one destroyed, one dropped without destroy), a group across
    the fake nodes, async and point-to-point calls, objects, the stall watch on."""
    out = _clean(tmp_path, f"""
        n = {n}
        g = fc.new_group([0, 1])
        h = fc.new_group(list(range(n)))
        if r in (0, 1):
            assert fc.all_reduce(np.ones(8192), group=g)[0] == 2
        w = fc.all_reduce(np.full(3, r), async_op=True)
        assert fc.all_reduce(np.ones(100000), group=h)[0] == n
        assert w.wait().tolist() == [n * (n - 1) // 2] * 3
        if r == 0:
            fc.send(np.arange(4.0), dst=n - 1)
        elif r == n - 1:
            assert fc.recv(src=0).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert fc.broadcast_object([r], src=1) == [1]
        g.destroy()
        del h
        fc.barrier()
        print("done", r)
    """, n, {**tcp, **FAKE_NODES, "FCOLL_STALL_WARN": "60"})
    assert out.count("done") == n, out


def test_a_job_whose_group_missed_a_deadline_exits_0_on_tcp(tmp_path, tcp):
    """A group broken by a missed deadline (its segment made first) still has its window
    freed: every rank reaches the end of its script, so all free it together."""
    from tests.test_late_rank import BODY

    out = _clean(tmp_path, BODY.format(folder=str(tmp_path), deadline=0.5, earlier=1), 2, tcp)
    assert "rank 1 late raised" in out, out
