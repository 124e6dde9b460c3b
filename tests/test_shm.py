"""The on-node shared-memory transport (fcoll/backends/shm.py): all_reduce and
reduce_scatter_tensor give the MPI path's results (FCOLL_SHM=0) bit for bit for every
dtype, op, shape and group kind with FCOLL_SHM=1 (every size through shared memory);
steps and growth of the segment, the decision for groups that span (simulated) nodes,
errors, deadlines and the segment's lifetime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.backends import shm
from tests import jobs
from tests.helpers import ALL_DTYPES, BF16, FLOATS, reduce_error, reference, same_bits

OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]


def _set(value: str | None, name: str = shm.ENV) -> None:
    """Change a setting on this rank (every rank does the same at the same point)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    runtime.changed()  # re-read at the next call; fast paths learned under it dropped


@pytest.fixture
def forced() -> Iterator[None]:
    """Every size through shared memory (FCOLL_SHM=1); restores the setting afterwards."""
    before = os.environ.get(shm.ENV)
    _set("1")
    yield
    _set(before)


def _both(fn, *args, **kwargs):
    """``fn``'s result with FCOLL_SHM=0 (MPI) and with FCOLL_SHM=1 (shared memory)."""
    _set("0")
    mpi = fn(*args, **kwargs)
    _set("1")
    return mpi, fn(*args, **kwargs)


def _inputs(dtype: np.dtype, shape: tuple[int, ...], n: int, salt: int = 0) -> list[np.ndarray]:
    """Every rank's input: arbitrary floats (so the order of the fold shows in the low bits),
    small integers elsewhere."""
    out = []
    for r in range(n):
        rng = np.random.default_rng([salt, r])
        if dtype == np.bool_:
            out.append(rng.integers(0, 2, size=shape).astype(bool))
        elif dtype.kind in "fc" or dtype == BF16:
            wide = dtype.itemsize >= 4  # float16/bfloat16 products would overflow
            values = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4 if wide else -2,
                                                                       size=shape)
            if dtype.kind == "c":
                values = values + 1j * rng.standard_normal(shape)
            out.append(np.asarray(values).astype(dtype))
        else:
            out.append(rng.integers(0, 100, size=shape).astype(dtype))
    return out


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_and_op_is_bit_identical(group, forced, dtype):
    for shape in [(), (0,), (5, 3)]:
        inputs = _inputs(dtype, shape, group.size)
        for op in OPS:
            if reduce_error(dtype, op) is not None:
                continue
            mpi, on_node = _both(fc.all_reduce, inputs[group.rank], op, group=group.arg)
            assert same_bits(mpi, on_node), (op, shape)
            if dtype not in FLOATS and dtype.kind != "c":
                assert same_bits(on_node, reference(inputs, op)), (op, shape)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int64", "complex64"])
def test_large_messages_in_several_steps(group, forced, dtype):
    """Messages over a step's CHUNK (here 2.3 steps) are folded step by step, along the tree."""
    dtype = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    count = int(2.3 * shm.CHUNK) // dtype.itemsize
    inputs = _inputs(dtype, (count,), group.size, salt=3)
    for op in ["sum", "max"] if dtype.kind != "c" else ["sum", "avg"]:
        mpi, on_node = _both(fc.all_reduce, inputs[group.rank], op, group=group.arg)
        assert same_bits(mpi, on_node), op
        assert same_bits(on_node, reference(inputs, op)), op


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_reduce_scatter_tensor_is_bit_identical(group, forced, dtype):
    n = group.size
    for shape, dim in [((0,), 0), ((n,), 0), ((2 * n, 3), 0), ((3, 2 * n), 1), ((n, 0), 0)]:
        inputs = _inputs(dtype, shape, n, salt=11)
        for op in OPS:
            if reduce_error(dtype, op) is not None:
                continue
            mpi, on_node = _both(fc.reduce_scatter_tensor, inputs[group.rank], op,
                                 group=group.arg, scatter_dim=dim)
            assert same_bits(mpi, on_node), (op, shape, dim)


def test_reduce_scatter_in_several_steps(group, forced):
    """Blocks over a step's share (CHUNK / n) go piece by piece, each rank folding its own."""
    n = group.size
    count = (int(1.7 * shm.CHUNK) // 8 // n + 5) * n
    inputs = _inputs(np.dtype("float64"), (count,), n, salt=13)
    mpi, on_node = _both(fc.reduce_scatter_tensor, inputs[group.rank], "sum", group=group.arg)
    assert same_bits(mpi, on_node)
    assert same_bits(on_node, np.split(reference(inputs, "sum"), n)[group.rank])
    xs = [a[group.rank] for a in (_inputs(np.dtype(d), (4 * n, 3), n, salt=17)
                                  for d in (np.float32, BF16, np.int16))]
    mpi, on_node = _both(fc.reduce_scatter_tensor_coalesced, xs, "sum", group=group.arg)
    assert all(same_bits(a, b) for a, b in zip(mpi, on_node, strict=True))


def test_non_contiguous_and_read_only_inputs(group, forced):
    base = _inputs(np.dtype("float64"), (12, 10), group.size, salt=5)
    inputs = [b[::2, 1::3] for b in base]
    x = inputs[group.rank]
    x.flags.writeable = False
    mpi, on_node = _both(fc.all_reduce, x, "sum", group=group.arg)
    assert same_bits(mpi, on_node) and same_bits(on_node, reference(inputs, "sum"))
    assert not np.shares_memory(on_node, x)
    fortran = np.asfortranarray(base[group.rank])
    mpi, on_node = _both(fc.all_reduce, fortran, "max", group=group.arg)
    assert same_bits(mpi, on_node)


def test_coalesced_forms_are_bit_identical(group, forced):
    xs = [a[group.rank] for a in (_inputs(np.dtype(d), s, group.size, salt=7) for d, s in
          [("float32", (100, 3)), ("float16", (7,)), ("int32", (50,)), ("float32", ())])]
    mpi, on_node = _both(fc.all_reduce_coalesced, xs, "sum", group=group.arg)
    assert all(same_bits(a, b) for a, b in zip(mpi, on_node, strict=True))


def test_mesh_axis_group(world_size, forced):
    with fc.Mesh((world_size,), ("dp",)):
        x = _inputs(np.dtype("float32"), (40,), world_size, salt=9)
        mpi, on_node = _both(fc.all_reduce, x[fc.get_rank()], "sum", group="dp")
        assert same_bits(mpi, on_node) and same_bits(on_node, reference(x, "sum"))


def test_the_segment_grows_and_serves_each_call(world_size):
    """Under the default (auto) setting, sizes from MIN_BYTES go through the segment, which
    grows to fit a step; smaller ones (and every call at world size 1) through MPI."""
    if os.environ.get(shm.ENV, "auto") != "auto":
        pytest.skip("checks the default setting")
    g = fc.new_group()
    try:
        lo = shm.limit(g)  # MIN_BYTES; 0 with the compiled core; NEVER at world size 1
        small = np.ones(8, np.float32)
        assert fc.all_reduce(small, group=g).tolist() == [world_size] * 8
        assert (g.shm is None) == (small.nbytes < lo)  # made at the first call of its sizes
        first = 1 if lo == shm.NEVER else max(int(lo), 4) // 4  # the window's first size
        for count in [first, 200_000, shm.CHUNK // 2]:  # the last: 2 steps
            y = fc.all_reduce(np.full(count, 2.0, np.float32), group=g)
            assert y.shape == (count,) and (y == 2.0 * world_size).all()
        if world_size == 1:
            assert g.shm is None
            return
        seg = g.shm
        assert seg and seg.capacity == shm.CHUNK
        steps = seg.step
        fc.all_reduce(small, group=g)
        assert seg.step == steps + (small.nbytes >= lo)  # below the window: MPI
    finally:
        g.destroy()
    assert g.shm is False and (world_size == 1 or seg.win is None)


def test_fast_path_hands_large_calls_to_shared_memory(world_size):
    if world_size == 1 or os.environ.get(shm.ENV, "auto") != "auto":
        pytest.skip("needs two ranks and the default setting")
    x = np.ones(shm.MIN_BYTES["all_reduce"] // 8, np.int64)
    small = np.ones(3, np.int64)
    assert (fc.all_reduce(x) == world_size).all()  # makes (or grows) the world's segment
    for _ in range(3):  # the small call learns the fast path; the large ones must leave it
        assert (fc.all_reduce(small) == world_size).all()
        steps = fc.world().shm.step
        assert (fc.all_reduce(x) == world_size).all()
        assert fc.world().shm.step == steps + 1


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float64], ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (6,), (4, 3), (1000, 5)], ids=str)
def test_the_default_groups_fast_path_steps_through_the_segment(world_size, rank, forced,
                                                                monkeypatch, dtype, shape):
    """Once the world's segment exists, one-step all_reduce and reduce_scatter_tensor calls
    of the default group go from the fast path straight to the segment (no full-path call,
    one step each), bit-identical to MPI and along the tree."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    from fcoll.collectives import _fast

    rs_shape = (world_size * shape[0], *shape[1:]) if shape else (world_size,)
    xs = _inputs(np.dtype(dtype), shape, world_size, salt=7)
    blocks = _inputs(np.dtype(dtype), rs_shape, world_size, salt=8)
    mpi = _both(fc.all_reduce, xs[rank])[0], _both(fc.reduce_scatter_tensor, blocks[rank])[0]
    fc.all_reduce(np.ones(8, dtype))  # the segment exists and the fast paths are learned
    fc.reduce_scatter_tensor(np.ones(world_size, dtype))
    full = []
    for name in ("allreduce", "reduce_scatter_block", "allreduce_native", "reduce_scatter_native"):
        monkeypatch.setattr(shm, name, lambda *a: full.append(a) or pytest.fail("full path"))
    fast = ("sum", np.dtype(dtype)) in _fast.ALL_REDUCE  # floats at n > 2 fold on the full path
    if not fast:
        monkeypatch.undo()
    seg = fc.world().shm
    for _ in range(3):  # both step parities
        steps = seg.step
        y = fc.all_reduce(xs[rank])
        z = fc.reduce_scatter_tensor(blocks[rank])
        assert seg.step == steps + 2
        assert same_bits(y, mpi[0]) and same_bits(y, reference(xs, "sum"))
        assert same_bits(z, mpi[1]) and same_bits(z, np.split(reference(blocks, "sum"),
                                                                world_size)[rank])
    assert not full and (fast or dtype != np.int64)


def test_mismatched_sizes_on_the_fast_path_raise_on_every_rank(world_size, rank, forced):
    """The fast path checks the announced sizes too: ranks whose sizes differ (both fitting
    the segment, or one fitting and one not, so one rank on the full path) all raise."""
    if world_size == 1:
        pytest.skip("needs two ranks")
    fc.all_reduce(np.ones(8, np.int64))  # segment made, fast path learned
    capacity = fc.world().shm.capacity
    for other in (16, capacity // 8 + 1):  # elements on the other ranks
        x = np.ones(8 if rank == 0 else other, np.int64)
        with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
            fc.all_reduce(x)
        with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
            fc.reduce_scatter_tensor(np.ones(world_size * len(x), np.int64))
        assert (fc.all_reduce(np.ones(3, np.int64)) == world_size).all()  # still usable


def test_mismatched_sizes_raise_on_every_rank(group, forced):
    if group.size == 1:
        pytest.skip("needs two ranks")
    x = np.ones(4 + group.rank, np.float32)
    with pytest.raises(fc.CollectiveMismatchError, match="differ in elements"):
        fc.all_reduce(x, group=group.arg)
    assert (fc.all_reduce(np.ones(3), group=group.arg) == group.size).all()  # still usable


def test_detail_still_catches_mismatches_first(group, forced):
    if group.size == 1:
        pytest.skip("needs two ranks")
    fc.init(debug="detail")
    try:
        with pytest.raises(fc.CollectiveMismatchError):
            fc.all_reduce(np.ones(4 + group.rank, np.float32), group=group.arg)
    finally:
        fc.init(debug="off")


@pytest.mark.parametrize("per_node", ["1", "2"])
def test_groups_that_span_simulated_nodes_use_mpi(world_size, rank, forced, per_node):
    """FCOLL_SHM_NODE_SIZE=k: each 'node' holds k consecutive global ranks. A group on one
    node gets a segment; one that spans nodes does not (every member agrees) and still
    gives the same result through MPI."""
    _set(per_node, shm.NODE_ENV)
    try:
        g = fc.new_group()
        pair = fc.new_group([0, 1] if world_size > 1 else [0])
        x = np.arange(6.0) + rank
        want = sum(np.arange(6.0) + r for r in range(world_size))
        assert same_bits(fc.all_reduce(x, group=g), want)
        spans = world_size > int(per_node)
        assert (g.shm is False) == spans and (bool(g.shm) == (not spans and world_size > 1))
        if rank in (0, 1):
            y = fc.all_reduce(x, group=pair)
            assert same_bits(y, want if world_size == 1 else np.arange(6.0) * 2 + 1)
            assert bool(pair.shm) == (world_size > 1 and per_node == "2")
        for made in (g, pair):
            made.destroy()
    finally:
        _set(None, shm.NODE_ENV)


def _shm_maps() -> set[str]:
    return {line.split(None, 5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "/dev/shm/" in line}


def test_segments_are_unlinked_while_mapped(world_size, forced):
    """The /dev/shm files a new segment maps are already deleted: nothing of them can outlive
    the job, however it ends (MPI's own job-wide segment is MPI's business)."""
    if world_size == 1 or not Path("/proc/self/maps").exists():
        pytest.skip("needs two ranks and Linux")
    before = _shm_maps()
    g = fc.new_group()
    fc.all_reduce(np.ones(1000), group=g)
    assert g.shm
    new = _shm_maps() - before
    assert new and all(name.endswith("(deleted)") for name in new), new
    g.destroy()
    assert not _shm_maps() - before  # destroy unmapped it


def _job(tmp_path: Path, body: str, n: int = 2) -> tuple[int, str, float]:
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nimport numpy as np\nimport fcoll as fc\n"
                      + textwrap.dedent(body))
    env = {**jobs.environment(), shm.ENV: "1"}
    start = time.monotonic()
    done = subprocess.run(jobs.command(n, sys.executable, "-m", "fcoll.run", str(script)),
                          env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
                                "broadcast", "all_to_all_single"])
def test_a_silent_peer_in_the_segment_times_out(tmp_path, op):
    code, out, took = _job(tmp_path, f"""
        fc.init(timeout=1.0)
        x = np.ones(100_000)            # 800 KB: inside every op's window
        fc.{op}(x)                      # makes the segment; both ranks take it
        assert fc.world().shm
        if fc.get_rank() == 1:
            time.sleep(20)              # alive, but never makes the second call
        fc.{op}(x)
    """)
    assert code != 0 and took < 20, out
    assert "CollectiveTimeoutError" in out and f"{op} (call #2 on the group)" in out, out
    assert "fcoll flight record" in out, out


@pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
def test_a_dead_peer_in_the_segment_ends_the_job(tmp_path):
    code, _, took = _job(tmp_path, """
        x = np.ones(300_000)
        fc.all_reduce(x)
        if fc.get_rank() == 1:
            os._exit(7)                 # dies; rank 0 waits in the segment, no deadline
        fc.all_reduce(x)
    """)
    # 7: the dead rank's status; 9: mpiexec reaped the rank it killed first (seen once under load)
    assert code in (7, 9) and took < 30, code
