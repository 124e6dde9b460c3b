"""Groups that span nodes (`fcoll.backends.nodes`): the split, the same bits as one node, every
collective on a simulated cluster, clean exits on TCP.

In-process (world size 4, ``FCOLL_SHM_NODE_SIZE=2``: nodes of two consecutive global ranks
on this machine): which groups get a split, results bit-equal to the flat schedules
(``FCOLL_SHM=0``), disagreements raised on every rank, destroy. From the world-size-1 pass,
jobs on `scripts/cluster-sim.sh` (MPICH's fake nodes, TCP between them inside a private
network namespace where one can be made, else the default netmod; the script says which):
tests/tree_job.py (every reduction bit-equal to the canonical tree) and tests/nodes_job.py
(every collective, the traffic across nodes), at 2 x 2, 4 x 1, 1 x 4, round-robin placement,
and 2 x 4, 4 x 2 and 3 x 2 oversubscribed; each must exit 0 with no finalize error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.backends import nodes, shm
from tests import jobs
from tests.helpers import same_bits

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "scripts" / "cluster-sim.sh"
one_process = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")


def _set(value: str | None, name: str) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    runtime.changed()


@pytest.fixture
def pairs(world_size):
    """Nodes of two consecutive global ranks (world size 4 only)."""
    if world_size != 4:
        pytest.skip("the split needs 2 nodes of 2: world size 4")
    _set("2", shm.NODE_ENV)
    yield
    _set(None, shm.NODE_ENV)


def _inputs(n: int, p: int, salt: int) -> list[np.ndarray]:
    out = []
    for k in range(p):
        g = np.random.default_rng([salt, k])
        out.append((g.standard_normal(n) * 10.0 ** g.integers(-4, 5, n)).astype(np.float32))
    return out


def test_groups_split_by_block_and_others_stay_flat(pairs, rank):
    """Block placement with equal powers of two per node splits; a group whose ranks are
    interleaved across the nodes, or with one rank per node, does not (every rank agrees)."""
    interleaved = [0, 2, 1, 3].index(rank)  # group ranks 0, 1 on different nodes
    block, mixed = fc.new_group(), fc.world().split(color=0, key=interleaved)
    ends = fc.new_group([0, 2])
    try:
        for g in (block, mixed):
            fc.all_reduce(np.ones(3, np.float32), group=g)
        h = block.nodes
        assert (h.k, h.m, h.node.rank, h.cross.rank) == (2, 2, rank % 2, rank // 2)
        assert mixed.ranks == (0, 2, 1, 3) and mixed.nodes is False and block.shm is False
        if rank in (0, 2):
            fc.all_reduce(np.ones(3, np.float32), group=ends)
            assert not ends.nodes
    finally:
        for g in (block, mixed, ends):
            g.destroy()
    assert block.nodes is False  # destroy freed the split


@pytest.mark.parametrize("n", [0, 1, 7, 4095, 70001])
def test_the_split_gives_the_flat_schedules_bits(pairs, rank, n):
    xs = _inputs(n, 4, n)
    flat, split = fc.new_group(), None
    try:
        _set("0", shm.ENV)  # the flat schedule: no segment, no split
        want = [fc.all_reduce(xs[rank], group=flat), fc.all_reduce(xs[rank], "avg", group=flat),
                fc.reduce_scatter_tensor(np.tile(xs[rank], 4), group=flat)]
        _set(None, shm.ENV)
        split = fc.new_group()
        got = [fc.all_reduce(xs[rank], group=split), fc.all_reduce(xs[rank], "avg", group=split),
               fc.reduce_scatter_tensor(np.tile(xs[rank], 4), group=split)]
        assert split.nodes and flat.nodes is False
        for a, b in zip(got, want, strict=True):
            assert same_bits(a, b)
        fc.all_reduce(xs[rank], group=split)  # the fast path, once learned
        assert same_bits(fc.all_reduce(xs[rank], group=split), want[0])
    finally:
        _set(None, shm.ENV)
        flat.destroy()
        if split is not None:
            split.destroy()


@pytest.mark.parametrize("count", [4, 5000])
def test_a_disagreement_inside_a_node_raises_on_every_rank(pairs, rank, count):
    """Sizes that differ on each node: the segment's check raises on every rank, on the full
    path and (second round) the fast path; the group stays usable."""
    g = fc.new_group()
    try:
        for _ in range(2):
            with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
                fc.all_reduce(np.ones(count + rank, np.float32), group=g)
            assert (fc.all_reduce(np.ones(count, np.float32), group=g) == 4).all()
    finally:
        g.destroy()


@pytest.fixture
def movement():
    """The split for every all_gather and broadcast (`nodes.FROM` ships them off here)."""
    saved = dict(nodes.FROM)
    nodes.FROM.update(all_gather=0, broadcast=0)
    runtime.changed()  # fast paths learned before drop
    yield
    nodes.FROM.update(saved)
    runtime.changed()


@pytest.fixture
def raising():
    """``FCOLL_ABORT_ON_ERROR=0``: a rank that finds the sizes differ raises instead of
    ending the job (the default), so the test sees every rank's error."""
    _set("0", "FCOLL_ABORT_ON_ERROR")
    yield
    _set(None, "FCOLL_ABORT_ON_ERROR")


def _returning(g):
    """``g`` with MPI's errors returned (what ``FCOLL_ABORT_ON_ERROR=0`` gives the
    communicators fcoll makes) instead of fcoll's handler that ends the job at a truncated
    message; the split's communicators inherit it."""
    g.comm("test").Set_errhandler(runtime.mpi().ERRORS_RETURN)
    return g


@pytest.mark.parametrize("count", [4, 5000])
def test_sizes_that_differ_between_nodes_raise_on_every_rank(pairs, raising, rank, count):
    """Each node agrees inside, the nodes differ: the exchange across them finds it (one side
    receives too little and raises; the other too much: MPI's truncation, which fcoll's
    handler turns into the end of the job, here returned and raised), on the full path and
    the fast path."""
    g = _returning(fc.new_group())
    try:
        for _ in range(2):
            with pytest.raises(fc.CollectiveMismatchError, match="different sizes"):
                fc.all_reduce(np.ones(count + rank // 2, np.float32), group=g)
            assert (fc.all_reduce(np.ones(count, np.float32), group=g) == 4).all()
    finally:
        g.destroy()


def test_sizes_that_differ_raise_on_the_flat_tree(world_size, rank, raising):
    """Without the segment (FCOLL_SHM=0) the tree's exchanges check what they receive,
    blocking (no deadline: MPI's blocking calls) and polled (a deadline): the ranks whose
    exchange brought another size raise. At an odd size a rank whose partner raised waits
    until its deadline instead (by default the job would have ended)."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    _set("0", shm.ENV)
    even = world_size % 2 == 0
    groups = [_returning(fc.new_group(timeout=None if even else 3))]
    if even:
        groups.append(_returning(fc.new_group(timeout=30)))
    try:
        for g in groups:
            with pytest.raises((fc.CollectiveMismatchError, fc.CollectiveTimeoutError)) as caught:
                fc.all_reduce(np.ones(4 + rank % 2, np.float32), "max", group=g)
            if even or caught.type is fc.CollectiveMismatchError:
                assert caught.type is fc.CollectiveMismatchError
                assert "different sizes" in str(caught.value)
            if even:
                assert (fc.all_reduce(np.ones(3, np.float32), "max", group=g) == 1).all()
    finally:
        _set(None, shm.ENV)
        if even:  # at an odd size the communicator keeps the unmatched message: left alone
            for g in groups:
                g.destroy()


@pytest.mark.parametrize("n", [1, 3000, 70001])
def test_movement_through_the_split(pairs, movement, rank, n):
    """all_gather, broadcast and barrier through the split: the same bytes as MPI's."""
    g = fc.new_group()
    try:
        x = np.arange(n, dtype=np.float64) + rank
        y = fc.all_gather_into_tensor(x, group=g)
        assert same_bits(y, np.concatenate([np.arange(n, dtype=np.float64) + j for j in range(4)]))
        assert g.nodes  # made by the calls above
        for root in range(4):
            assert same_bits(fc.broadcast(x, root, group=g), x - rank + root)
        fc.barrier(group=g)
    finally:
        g.destroy()


# --- a simulated cluster -------------------------------------------------------------------

TREE, NODES = ROOT / "tests" / "tree_job.py", ROOT / "tests" / "nodes_job.py"
LAYOUTS = {  # name: (nodes, ranks per node, job, flags, extra environment)
    "tree 2x2": (2, 2, TREE, ["--nodes", "2", "--pipeline", "65536"], {}),
    "tree 4x1": (4, 1, TREE, ["--nodes", "0"], {}),
    "tree 1x4": (1, 4, TREE, ["--nodes", "0"], {}),
    "tree 2x2 round-robin": (2, 2, TREE, ["--nodes", "0"], {"CLUSTER_SIM_PLACEMENT": "roundrobin"}),
    "tree 2x2 numpy": (2, 2, TREE, ["--nodes", "2"], {"FCOLL_NATIVE": "0"}),
    "tree 3x2": (3, 2, TREE, ["--nodes", "3", "--pipeline", "65536"], {}),
    "tree 2x4": (2, 4, TREE, ["--nodes", "2"], {}),
    "nodes 2x2": (2, 2, NODES, ["2"], {}),
    "nodes 4x1": (4, 1, NODES, ["0"], {}),
    "nodes 2x2 numpy": (2, 2, NODES, ["2"], {"FCOLL_NATIVE": "0"}),
    "nodes 4x2": (4, 2, NODES, ["4"], {}),
}


def _simulate(k: int, m: int, args: list[str], env: dict[str, str], limit: float = 300,
              path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**jobs.environment(), "MPIEXEC": str(jobs.BIN / "mpiexec"),
                   "FCOLL_STALL_WARN": "0", **env}
    if path is not None:
        environment["PATH"] = path
    return subprocess.run(["bash", str(SIM), str(k), str(m), "--", *args], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=limit,
                          stdin=subprocess.DEVNULL)


@one_process
@pytest.mark.skipif(jobs.open_mpi(), reason="MPICH's fake nodes")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_simulated_cluster(name):
    """Each job passes on the simulated cluster and exits 0 (no finalize error on TCP)."""
    k, m, job, flags, env = LAYOUTS[name]
    done = _simulate(k, m, [str(jobs.BIN / "python"), str(job), *flags], env)
    out = done.stdout + done.stderr
    assert "MPI_Finalize failed" not in out and "fabricclose" not in out, out[-3000:]
    assert done.returncode == 0, out[-3000:]
    assert out.count(": ok") == k * m, out[-3000:]


@one_process
@pytest.mark.skipif(jobs.open_mpi(), reason="MPICH's fake nodes")
def test_the_simulation_says_when_it_cannot_use_tcp(tmp_path):
    """Where `unshare -n` is refused, cluster-sim.sh runs on the default netmod and says so."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: not allowed' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    code = "import os; from mpi4py import MPI; print('netmod', os.environ.get('MPIR_CVAR_CH4_NETMOD'))"
    done = _simulate(2, 1, [str(jobs.BIN / "python"), "-c", code], {},
                     path=f"{fake}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert "unshare -n is refused" in done.stderr
    # the launcher forwards each rank's output in pieces that may interleave
    assert done.stdout.count("netmod") == 2 and done.stdout.count("None") == 2, done.stdout


@one_process
@pytest.mark.skipif(jobs.open_mpi(), reason="MPICH's fake nodes")
@pytest.mark.parametrize(("k", "m", "placement", "schedule"), [
    (2, 2, "block", "split: 2 nodes x 2 ranks"), (4, 1, "block", "flat schedules (one rank per node)"),
    (2, 2, "roundrobin", "flat schedules (ranks not placed by block)")])
def test_info_shows_the_nodes_and_the_schedule(k, m, placement, schedule):
    done = _simulate(k, m, [str(jobs.BIN / "python"), "-m", "fcoll", "info", "--json"],
                     {"CLUSTER_SIM_PLACEMENT": placement})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    found = json.loads(done.stdout[done.stdout.index("{"):])["nodes"]
    assert found["nodes"] == str(k) and found["ranks per node"] == str(m), found
    assert found["world group"].startswith(schedule), found


@one_process
@pytest.mark.skipif(jobs.open_mpi(), reason="MPICH's fake nodes")
@pytest.mark.parametrize("count", [3, 5000])
def test_sizes_that_differ_between_nodes_end_the_job(count):
    """By default (FCOLL_ABORT_ON_ERROR on) nodes that disagree end the job, loudly, and no
    rank goes on with a result."""
    code = ("import numpy as np, fcoll as fc\n"
            "r = fc.get_rank()\n"
            f"for _ in range(2): y = fc.all_reduce(np.ones({count} + r // 2, np.float32))\n"
            "print('RESULT-OUT', r, flush=True)\n")
    done = _simulate(2, 2, [str(jobs.BIN / "python"), "-c", code], {}, limit=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "different sizes" in out or "Message truncated" in out, out[-3000:]
    assert "RESULT-OUT" not in out, out[-3000:]


@one_process
def test_the_simulation_checks_its_arguments():
    done = subprocess.run(["bash", str(SIM), "2", "x", "--", "true"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "NODES RANKS_PER_NODE" in done.stderr
    assert shutil.which("bash")
