"""Fast paths for the most common call: blocking, a C-contiguous numpy array whose (op,
dtype) the group has already served, on the default group (keyed ``(op, dtype)``) or a
`Group` passed as such (keyed ``(group, (op, dtype))``).

The first such call goes the whole way (resolve the group, check, plan). When nothing a
later call could change would alter the outcome (no deadline, debug off, the group and the
world usable), it leaves a closure here (`key`); later calls find it with one dict lookup
and go straight to MPI or the group's on-node segment. Each closure checks the shape conditions of
its fast case and returns ``None`` when they fail, so the caller falls through to the full
path. `reset` drops every closure when a setting they rely on changes (`fcoll.init`, a
group broken by a missed deadline or destroyed). This took 8-byte calls from about 1.25 us
to 0.97 us at world size 1 (raw mpi4py: 0.50 us), see docs/performance.md.

The closures repeat their few lines on purpose: a shared helper would put one more Python
call (about 50 ns) on every call, and saving those is what this module is for. Their
branch for on-node shared memory (`fcoll.backends.shm`, messages of kilobytes) is the
exception: it is one function, `segment_call`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from fcoll import runtime
from fcoll.backends.nodes import FROM as across
from fcoll.calls import fingerprint as _fingerprint
from fcoll.calls.fingerprint import of as fingerprint
from fcoll.calls.work import fast_eligible as eligible
from fcoll.collectives import _fast_native as _native
from fcoll.collectives import _fast_nodes as _nodes
from fcoll.diagnostics import flight

if TYPE_CHECKING:
    from fcoll.groups.group import Group

Fast = Callable[[np.ndarray], "np.ndarray | None"]
T = TypeVar("T")
# keys: `key` (the default group's ``(op, dtype)``, ``dtype`` or ``(root, dtype)``, or
# ``(group, that)`` for a Group passed as such)
ALL_REDUCE: dict[Any, Fast] = {}
REDUCE_SCATTER: dict[Any, Fast] = {}
ALL_GATHER: dict[Any, Fast] = {}
ALL_TO_ALL: dict[Any, Fast] = {}
BROADCAST: dict[Any, Fast] = {}
# all_to_all_single with split sizes: ``fast(x, output_split_sizes, input_split_sizes)``
ALL_TO_ALL_V: dict[Any, Callable[[np.ndarray, Any, Any], np.ndarray | None]] = {}
# all_to_all (lists): ``fast(chunks)``, keyed by the chunks' dtype
ALL_TO_ALL_LISTS: dict[Any, Callable[[Any], list[np.ndarray] | None]] = {}
# sendrecv with like=: ``fast(x, dst, src, tag, like)``, keyed ``"like"``
# (`fcoll.collectives._fast_p2p`)
SENDRECV_LIKE: dict[Any, Callable[..., np.ndarray | None]] = {}
_TABLES: tuple[dict[Any, Any], ...] = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST,
                                       ALL_TO_ALL_V, ALL_TO_ALL_LISTS, SENDRECV_LIKE)
INF = float("inf")
RS = _fingerprint.kind_bits("reduce_scatter_tensor")  # a plan's fingerprint is an all_reduce's


def reset() -> None:
    """Forget every fast path (their assumptions may no longer hold)."""
    for table in _TABLES:
        table.clear()


runtime.on_change(reset)  # fcoll.init and broken groups drop every fast path


def key(group: Any, base: Any) -> Any:
    """The table key of a call's fast path: ``base`` (``(op, dtype)``, ``dtype``, ...) for the
    default group (``group=None``), ``(group, base)`` for a `Group` passed as such, None for a
    list of ranks (not learned: its lookup would cost more than it saves).

    Example:
        >>> key(None, ("sum", f4)), key(g, ("sum", f4)), key([0, 1], ("sum", f4))
        (('sum', dtype('float32')), (Group(...), ('sum', dtype('float32'))), None)
    """
    if group is None:
        return base
    from fcoll.groups.group import Group

    return (group, base) if type(group) is Group else None


def learn(table: dict[Any, T], key: Any, g: Group, make: Callable[..., T], *args: Any) -> None:
    """Leave ``make(g, *args)`` in ``table`` under ``key`` unless one is there or ``g`` is not
    eligible (calls that fall through a fast path, e.g. large broadcasts, do not remake it).

    Takes the factory and its arguments rather than a lambda: a lambda would turn the
    caller's locals into cells, which every call of the public function pays for. A None
    ``key`` (`key`: a list of ranks) learns nothing."""
    if key is not None and key not in table and eligible(g):
        table[key] = make(g, *args)


def learn_reduction(table: dict[Any, Fast], key: Any, g: Group, plan: Any, shared: float,
                    kernel: tuple[int, int, int, float] | None, scatter: bool) -> None:
    """Learn an all_reduce (``scatter``: reduce_scatter_tensor) closure for ``plan`` where one
    serves it: MPI's op reduces x as it is (``plan.direct``), or the compiled core folds it
    (``kernel``, `fcoll.backends.native.kernel`; the segment from ``shared`` bytes)."""
    if key is None or key in table or not eligible(g) or not (plan.direct or kernel is not None):
        return
    mpi_op = plan.op if plan.direct else None
    if kernel is None:
        make = reduce_scatter if scatter else all_reduce
        table[key] = make(g, mpi_op, shared, plan.fold_ufunc, plan.fp | (RS if scatter else 0))
    elif scatter:
        swap = _native.swapper(table, key, g, "reduce_scatter", "reduce_scatter_tensor",
                               plan.fp | RS, kernel) if shared <= 0 else None
        core = _native.call(g, "reduce_scatter_tensor", "reduce_scatter", *kernel, plan.fp | RS, -1.0,
                            swap=swap)
        table[key] = reduce_scatter(g, mpi_op, shared, native=core,
                                    spanning=_nodes.reduce_scatter(g, plan, plan.fp | RS))
    else:
        swap = _native.swapper(table, key, g, "reduce", "all_reduce", plan.fp,
                               kernel) if shared <= 0 else None
        core = _native.call(g, "all_reduce", "allreduce", *kernel, plan.fp, -1.0, swap=swap)
        mpi = all_reduce(g, mpi_op) if mpi_op is not None else None
        table[key] = _native.all_reduce(g, shared, core, mpi, _nodes.all_reduce(g, plan))


def segment_call(g: Any, recorder: flight.Recorder, name: str, step: Callable[..., np.ndarray],
                 x: np.ndarray, *args: Any) -> np.ndarray | None:
    """A fast path's call through ``g``'s on-node segment in one ``step`` (a
    `fcoll.backends.shm` ``*_step`` function), recorded as the closures record; None while
    the segment is not made or cannot hold ``x`` (the full path makes or grows it). One
    shared function here, unlike the MPI calls: it serves messages of kilobytes, where
    its 50 ns are noise.

    Example:
        >>> segment_call(g, flight.recorder(g.key), "all_reduce", shm.allreduce_step, x, np.add, fp)
    """
    seg = g.shm
    if not seg or x.nbytes > seg.capacity:
        return None
    g.seq += 1
    call = g.call
    call.fn = name
    calls, ends, pos, mask, ranks, clock = recorder
    if calls is None:
        return step(seg, call, x, *args)
    i = pos[0]
    pos[0] = i + 1
    i &= mask
    calls[i] = (ranks, g.seq, name, "numpy", x.shape, x.dtype, clock())
    y = step(seg, call, x, *args)
    ends[i] = clock()
    return y


def all_reduce(g: Any, mpi_op: Any, shared: float = INF, ufunc: Any = None, fp: int = 0) -> Fast:
    """MPI's all_reduce below ``shared`` bytes; from there on-node shared memory
    (`fcoll.backends.shm`) in one step once the group's segment exists and holds the
    message, else the full path (which makes or grows the segment, or takes several steps).
    ``fp``: the call's fingerprint, announced through the segment (`fcoll.calls.fingerprint`)."""
    comm, empty = g._comm, np.empty
    calls, ends, pos, mask, ranks, clock = recorder = flight.recorder(g.key)
    from fcoll.backends.shm import allreduce_step as step

    def run(x: np.ndarray) -> np.ndarray | None:
        if not x.flags.c_contiguous:
            return None
        if x.nbytes >= shared and g.shm is not False:  # False: spans nodes, MPI
            return segment_call(g, recorder, "all_reduce", step, x, ufunc, fp)
        g.seq += 1
        out = empty(x.shape, x.dtype)
        if calls is None:
            comm.Allreduce(x, out, mpi_op)
        else:
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_reduce", "numpy", x.shape, x.dtype, clock())
            comm.Allreduce(x, out, mpi_op)
            ends[i] = clock()
        return out

    return run


def reduce_scatter(g: Any, mpi_op: Any, shared: float = INF, ufunc: Any = None, fp: int = 0,
                   native: Fast | None = None, spanning: Fast | None = None) -> Fast:
    """MPI's reduce_scatter below ``shared`` bytes (where MPI's op reduces: ``mpi_op``, else
    the full path); from there on-node shared memory in one step once the group's segment
    exists and holds the message (``native``: through the compiled core), else the full path.
    On a group that spans nodes: ``spanning`` (`fcoll.collectives._fast_nodes`) where it
    serves."""
    comm, empty, n = g._comm, np.empty, g.size
    calls, ends, pos, mask, ranks, clock = recorder = flight.recorder(g.key)
    from fcoll.backends.shm import reduce_scatter_step as step

    def run(x: np.ndarray) -> np.ndarray | None:
        shape = x.shape
        if not shape or shape[0] % n or not x.flags.c_contiguous:
            return None
        if x.nbytes >= shared and g.shm is not False:  # False: spans nodes, MPI
            if native is not None:
                return native(x)
            return segment_call(g, recorder, "reduce_scatter_tensor", step, x, ufunc, fp)
        if g.shm is False and spanning is not None and (y := spanning(x)) is not None:
            return y
        if mpi_op is None:
            return None
        g.seq += 1
        out = empty((shape[0] // n, *shape[1:]), x.dtype)
        if calls is None:
            comm.Reduce_scatter_block(x, out, mpi_op)
        else:
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "reduce_scatter_tensor", "numpy", x.shape, x.dtype, clock())
            comm.Reduce_scatter_block(x, out, mpi_op)
            ends[i] = clock()
        return out

    return run


def all_gather(g: Any, byte: Any, shared: tuple[float, float] = (INF, INF),
               dtype: np.dtype[Any] | None = None, native: bool = False, key: Any = None) -> Fast:
    """MPI's all_gather; messages in ``shared`` (lo <= bytes < hi) through on-node shared
    memory in one step once the group's segment exists and holds them, else the full path.
    ``dtype``: the arrays' dtype, for the segment's fingerprint; ``native``: through the
    compiled core."""
    comm, empty, n = g._comm, np.empty, g.size
    fp = fingerprint("all_gather_into_tensor", "", dtype) if dtype is not None else 0
    calls, ends, pos, mask, ranks, clock = recorder = flight.recorder(g.key)
    lo, hi = shared
    from fcoll.backends.shm import allgather_step as step

    swap = _native.swapper(ALL_GATHER, key, g, "allgather", "all_gather_into_tensor", fp,
                           limit=hi) if native and key is not None and lo <= 0 else None
    core = _native.call(g, "all_gather_into_tensor", "allgather", None, fp, -1.0,
                        swap=swap) if native else None

    def run(x: np.ndarray) -> np.ndarray | None:
        shape = x.shape
        if not shape or not x.flags.c_contiguous:
            return None
        if lo <= x.nbytes < hi and g.shm is not False:  # False: spans nodes, MPI
            if core is not None:
                return core(x)  # type: ignore[no-any-return]
            return segment_call(g, recorder, "all_gather_into_tensor", step, x, fp)
        if g.nodes and x.nbytes >= across["all_gather"]:
            return None  # the full path goes through the nodes' segments
        g.seq += 1
        out = empty((shape[0] * n, *shape[1:]), x.dtype)
        if calls is None:
            comm.Allgather([x, byte], [out, byte])
        else:
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "all_gather_into_tensor", "numpy", x.shape, x.dtype, clock())
            comm.Allgather([x, byte], [out, byte])
            ends[i] = clock()
        return out

    return run


def broadcast(g: Any, byte: Any, root: int, shared: tuple[float, float] = (INF, INF),
              dtype: np.dtype[Any] | None = None, native: bool = False, key: Any = None) -> Fast:
    """MPI's broadcast, up to the size the full path pipelines; messages in ``shared``
    through on-node shared memory in one step once the segment exists and holds them
    (``dtype``: the arrays' dtype, for the segment's fingerprint)."""
    comm, empty, is_root = g._comm, np.empty, g.rank == root
    fp = fingerprint("broadcast", "", dtype, root) if dtype is not None else 0
    calls, ends, pos, mask, ranks, clock = recorder = flight.recorder(g.key)
    lo, hi = shared
    from fcoll.backends.mpi import PIPELINE_BYTES as pipeline
    from fcoll.backends.shm import broadcast_step as step

    swap = _native.swapper(BROADCAST, key, g, "broadcast", "broadcast", fp, root=root,
                           limit=hi) if native and key is not None and lo <= 0 else None
    core = _native.call(g, "broadcast", "broadcast", root, fp, -1.0, swap=swap) if native else None

    def run(x: np.ndarray) -> np.ndarray | None:
        if lo <= x.nbytes < hi and g.shm is not False:  # False: spans nodes, MPI
            if core is not None:  # the root's x C-contiguous: the core reads it as it is
                return core(x) if not is_root or x.flags.c_contiguous else None
            return segment_call(g, recorder, "broadcast", step, x, root, fp)
        if x.nbytes >= pipeline or (g.nodes and x.nbytes >= across["broadcast"]):
            return None  # the full path pipelines large broadcasts, or uses the nodes' segments
        g.seq += 1
        buf = x.copy() if is_root else empty(x.shape, x.dtype)  # copy(): C order
        if calls is None:
            comm.Bcast([buf, byte], root)
        else:
            i = pos[0]
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, "broadcast", "numpy", x.shape, x.dtype, clock())
            comm.Bcast([buf, byte], root)
            ends[i] = clock()
        return buf

    return run
