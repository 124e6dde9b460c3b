"""The canonical reduction tree (API.md "Reduction order"): its programs and fcoll.testing's
references follow the definition; every float reduction follows it on every transport, at
p = 1..8 (5..8 oversubscribed, in jobs) and across fake nodes; MPICH's own recursive-doubling
and Rabenseifner MPI_Allreduce give the same bits (the oracle); an all_reduce over MPI sends
O(lg p) messages, within its schedule's bytes, and allocates O(n)."""

from __future__ import annotations

import math
import os
import re
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.backends import shm
from fcoll.backends.tree import doubling_limit
from fcoll.backends.tree.order import allreduce_program, execute, scan_program
from fcoll.testing import reference_reduce, reference_scan
from tests import jobs
from tests.helpers import BF16, same_bits, scan_tree, tree

JOB = Path(__file__).with_name("tree_job.py")
one_process = pytest.mark.skipif(fc.get_world_size() != 1, reason="one process (spawns jobs)")
SYMBOL = np.frompyfunc(lambda a, b: f"({a} {b})", 2, 1)  # shows the bracketing


def _symbols(p: int) -> list[np.ndarray]:
    return [np.array([f"x{k}"], object) for k in range(p)]


@one_process
@pytest.mark.parametrize("p", range(1, 41))
def test_programs_follow_the_definition(p):
    """The transports' programs bracket as the definition does (`tests.helpers.tree`,
    `scan_tree`, written apart from them); the last rank's scan is the all-reduce; an exscan
    is the previous rank's scan."""
    rows = _symbols(p)
    names = [f"x{k}" for k in range(p)]
    whole = execute(allreduce_program(p), rows, np.empty(1, object), SYMBOL)[0]
    assert whole == tree(names, lambda a, b: f"({a} {b})")
    if p <= 3:  # the sequential fold
        assert whole == (names[0] if p == 1 else "(" * (p - 1) + " ".join(
            [names[0]] + [f"{k})" for k in names[1:]]))
    scans = []
    for r in range(p):
        mine = execute(scan_program(p, r, False), rows, np.empty(1, object), SYMBOL)[0]
        assert mine == scan_tree(names, r, lambda a, b: f"({a} {b})")
        assert sorted(re.findall(r"x\d+", mine)) == sorted(names[: r + 1])
        before = execute(scan_program(p, r, True), rows, np.empty(1, object), SYMBOL)
        assert (before is None) if r == 0 else before[0] == scans[-1]
        scans.append(mine)
    assert scans[-1] == whole


@one_process
def test_programs_use_log_p_scratch():
    for p in (2, 3, 4, 5, 64, 1000, 4096):
        assert allreduce_program(p).temps <= max(1, p.bit_length() - 1)
        assert len(allreduce_program(p).ops) == p - 1


@one_process
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16], ids=str)
def test_references_equal_the_programs(p, dtype):
    """`fcoll.testing.reference_reduce`/`reference_scan` (from the definition) equal what the
    segment runs (the programs), and differ from the sequential fold where it matters."""
    g = np.random.default_rng(p)
    span = 2 if np.dtype(dtype).itemsize == 2 else 5  # float16 stays finite
    xs = [(g.standard_normal(64) * 10.0 ** g.integers(-span, span + 1, 64)).astype(dtype)
          for _ in range(p)]
    wires = [x.astype(np.float32 if np.dtype(dtype).itemsize == 2 else dtype) for x in xs]
    for op, ufunc in (("sum", np.add), ("max", np.maximum), (np.logaddexp, np.logaddexp)):
        out = execute(allreduce_program(p), wires, np.empty_like(wires[0]), ufunc)
        assert same_bits(reference_reduce(xs, op), out.astype(dtype))
        for r in range(p):
            prefix = execute(scan_program(p, r, False), wires, np.empty_like(wires[0]), ufunc)
            assert same_bits(reference_scan(xs, op)[r], prefix.astype(dtype))
    avg = reference_reduce(xs, "avg")
    assert same_bits(avg, (reference_reduce(wires, "sum") / np.float32(p)).astype(dtype)
                     if np.dtype(dtype).itemsize == 2 else reference_reduce(xs, "sum") / p)
    if p >= 4 and dtype == np.float32:
        sequential = xs[0].copy()
        for x in xs[1:]:
            sequential = sequential + x
        assert not same_bits(reference_reduce(xs, "sum"), sequential)


@one_process
def test_reference_errors():
    with pytest.raises(ValueError, match=r"reference_reduce: expected every rank's array to be "
                                         r"float32\[2\] as rank 0's, got float32\[3\] for rank 1"):
        reference_reduce([np.ones(2, np.float32), np.ones(3, np.float32)])
    with pytest.raises(ValueError, match="one array per rank"):
        reference_scan([])
    with pytest.raises(TypeError, match="reference_reduce: expected a floating or complex dtype"):
        reference_reduce([np.ones(2, np.int32)] * 2, "avg")


@pytest.fixture
def via_mpi() -> Iterator[None]:
    """Every size through MPI (the tree's point-to-point schedules)."""
    before = os.environ.get(shm.ENV)
    os.environ[shm.ENV] = "0"
    runtime.changed()
    yield
    if before is None:
        os.environ.pop(shm.ENV, None)
    else:
        os.environ[shm.ENV] = before
    runtime.changed()


@pytest.mark.parametrize("case", range(4))
def test_every_reduction_follows_the_tree(group, case):
    """Sizes on both sides of the doubling/halving switch, with uneven halves; every form."""
    count = [5, 2 * 8 + 2, doubling_limit(group.size) // 4 + 2,
             doubling_limit(group.size) // 4 + 7][case]
    xs = [(np.random.default_rng([count, k]).standard_normal(count)
           * 10.0 ** np.random.default_rng([k]).integers(-4, 5, count)).astype(np.float32)
          for k in group.members]
    x, want = xs[group.rank], reference_reduce(xs)
    assert same_bits(fc.all_reduce(x, group=group.arg), want)
    assert same_bits(fc.all_reduce(x, group=group.arg, async_op=True).wait(), want)
    y = fc.reduce(x, group.size - 1, group=group.arg)
    assert same_bits(y, want) if group.rank == group.size - 1 else y is None
    prefix, total = fc.exscan(x, group=group.arg, with_total=True)
    assert same_bits(total, want)
    assert group.rank == 0 or same_bits(prefix, reference_scan(xs, exclusive=True)[group.rank])
    assert same_bits(fc.scan(x, group=group.arg), reference_scan(xs)[group.rank])


def test_traffic_of_an_all_reduce_over_mpi(group, via_mpi):
    """At most 2 ceil(lg p) + 2 messages, the schedule's bytes, at most 3 n allocated."""
    p = group.size
    q = 1 << (p.bit_length() - 1)
    for n in (4096, 1 << 18):
        x = np.ones(n, np.float32)
        fc.all_reduce(x, group=group.arg)
        tracemalloc.start()
        with fc.debug.traffic() as t:
            y = fc.all_reduce(x, group=group.arg)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert y[0] == p and t.calls == 1
        assert t.messages <= 2 * math.ceil(math.log2(p)) + 2, t.table()
        if p <= 2:  # one possible sum: MPI's own Allreduce, one call
            assert t.messages == 1 and t.bytes == x.nbytes, t.table()
            continue
        doubling = x.nbytes <= doubling_limit(p)
        assert t.bytes <= ((math.log2(q) + 1) * x.nbytes if doubling else 3 * x.nbytes), t.table()
        assert t.messages >= 1 and t.rows[0].fn == "all_reduce"
        assert peak <= 3 * x.nbytes + (1 << 13), (peak, x.nbytes)


def test_traffic_counts_nothing_outside_the_block(group):
    with fc.debug.traffic() as t:
        pass
    fc.all_reduce(np.ones(3), group=group.arg)
    assert (t.calls, t.messages, t.bytes) == (0, 0, 0)
    assert "total" in t.table()


# The jobs: (ranks, environment, flags). MPI: MPICH's own allreduce by recursive doubling
# or Rabenseifner over the network module only (the oracle) and fcoll's schedules; the
# segment: compiled core or numpy path; fake nodes: two MPICH cliques, groups spanning them.
ORACLE = {"MPIR_CVAR_ALLREDUCE_COMPOSITION": "2"}
DOUBLING = {**ORACLE, "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling"}
RABENSEIFNER = {**ORACLE, "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "reduce_scatter_allgather"}
NOLOCAL = {"MPIR_CVAR_NOLOCAL": "1", "FCOLL_SHM": "0"}
CLIQUES = {"MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CLIQUES_BY_BLOCK": "1"}
JOBS = {
    "mpi-4": (4, {**DOUBLING, **NOLOCAL}, ["--oracle", "--traffic"]),
    "mpi-5": (5, {**DOUBLING, **NOLOCAL}, ["--oracle", "--traffic"]),
    "mpi-6": (6, {**RABENSEIFNER, **NOLOCAL}, ["--oracle", "--traffic"]),
    "mpi-7": (7, {"FCOLL_SHM": "0"}, ["--traffic"]),
    "mpi-8": (8, {**RABENSEIFNER, **NOLOCAL}, ["--oracle", "--traffic"]),
    "segment-5": (5, {**DOUBLING, "FCOLL_SHM": "1"}, ["--oracle"]),
    "segment-8": (8, {**RABENSEIFNER, "FCOLL_SHM": "1"}, ["--oracle"]),
    "numpy-6": (6, {**DOUBLING, "FCOLL_SHM": "1", "FCOLL_NATIVE": "0"}, ["--oracle"]),
    "nodes-6": (6, CLIQUES, []),
    "nodes-8": (8, {**CLIQUES, "FCOLL_SHM": "1"}, []),
}


@one_process
@pytest.mark.parametrize("name", list(JOBS))
def test_jobs(name):
    """tests/tree_job.py at p = 4..8 (oversubscribed): every reduction equals the reference on
    each transport and layout, the oracle agrees, the traffic holds."""
    n, env, flags = JOBS[name]
    done = jobs.run(n, str(Path(jobs.BIN) / "python"), str(JOB), *flags, timeout=240,
                    env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert out.count(": ok") == n, out[-3000:]
