"""The fast paths for `fcoll.scan` and `fcoll.exscan`, as `fcoll.collectives._fast` has
them for all_reduce (keyed by `fcoll.collectives._fast.key`: the default group's
``(fn, op, dtype)``, a Group's ``(group, (fn, op, dtype))``): after a first call of an
``(op, dtype)`` on the group with plain arguments (no ``with_total``, blocking, no deadline, debug
off), later calls go in one dict lookup to the compiled core's scan through the segment
(`fcoll.collectives._fast_native.call`), or to MPI's ``Scan``/``Exscan`` where its op is
exact and the core does not serve. A closure answers None where its case does not hold
(the full path takes the call); every closure is dropped when a setting changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import native
from fcoll.calls.fingerprint import kind_bits
from fcoll.calls.work import fast_eligible
from fcoll.collectives._fast import Fast
from fcoll.collectives._fast_native import call as native_call
from fcoll.collectives._fold import native_kernel
from fcoll.diagnostics import flight
from fcoll.policy.plan import ReductionPlan

SCAN: dict[Any, Fast] = {}  # key -> closure
runtime.on_change(SCAN.clear)


def learn(key: Any, fn: str, g: Any, plan: ReductionPlan, fill: Any, segment: bool) -> None:
    """Leave under ``key`` a closure for ``fn`` (``scan``, ``exscan``) of ``(op, plan.dtype)``
    on group ``g``, where one serves; ``fill``: rank 0's exscan result, the op's identity;
    ``segment``: the call went through the segment (`fcoll.collectives._prefix.segment`)."""
    if key in SCAN or not fast_eligible(g):
        return
    exclusive = fn == "exscan"
    kernel = native_kernel(plan)
    if segment and kernel is not None:
        kind, code, flags, factor = kernel
        flags |= native.F_EXCLUSIVE if exclusive else 0
        fp = plan.fp | kind_bits(fn)
        run = native_call(g, fn, "scan", kind, code, flags, factor, fp, -1.0)
    elif plan.direct and not segment:
        run = _mpi(g, fn, plan.op, exclusive)
    else:
        return
    SCAN[key] = run if fill is None else _filled(run, fill)


def _filled(run: Callable[[np.ndarray], Any], fill: Any) -> Fast:
    """Rank 0 of an exscan: ``run``'s result holds nothing there; it gets ``fill``."""
    def first(x: np.ndarray) -> np.ndarray | None:
        y = run(x)
        if y is not None:
            y[...] = fill
        return y  # type: ignore[no-any-return]

    return first


def _mpi(g: Any, fn: str, mpi_op: Any, exclusive: bool) -> Fast:
    """MPI's ``Scan`` (``Exscan``) into a new array, recorded as the fast paths record."""
    method = g._comm.Exscan if exclusive else g._comm.Scan
    calls, ends, pos, mask, ranks, clock = flight.recorder(g.key)

    def run(x: np.ndarray) -> np.ndarray | None:
        if not x.flags.c_contiguous:
            return None
        g.seq += 1
        out = np.empty(x.shape, x.dtype)
        if calls is None:
            method(x, out, mpi_op)
            return out
        i = pos[0]
        pos[0] = i + 1
        i &= mask
        calls[i] = (ranks, g.seq, fn, "numpy", x.shape, x.dtype, clock())
        method(x, out, mpi_op)
        ends[i] = clock()
        return out

    return run
