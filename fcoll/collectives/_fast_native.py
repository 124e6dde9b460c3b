"""The fast paths' calls through the compiled shared-memory core (`fcoll.backends._shmcore`).

With the core running, a call of a shared-memory size is one C call: the closures here call
the group's Core directly (no shm function in between) once the segment exists and holds the
message. The first time a closure finds the segment stepped in C, it puts the core's own
callable, `_shmcore.Fast`, in its table instead of itself (`swapper`): from then on a call is
the public function, one dict lookup and one C call that also counts the call and writes the
flight record (a Python closure's frame cost about 0.6 us of a 1.9 us call at n = 2 here).
A disagreement raises from C and is told as fcoll's error (`told`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from fcoll.backends.native import module
from fcoll.calls import fingerprint
from fcoll.diagnostics import flight

Fast = Callable[[np.ndarray], "np.ndarray | None"]
NO_FOLD = (0, 0, 0, 1.0)  # (type, op, flags, factor) of the calls that do not reduce


def told(g: Any, name: str, step: int) -> BaseException:
    """The core's Mismatch at ``step`` as `fcoll.calls.errors.CollectiveMismatchError` (every rank
    alike)."""
    g.call.fn = name
    return fingerprint.mismatch(name, g.ranks, g.shm.announced(step))


def swapper(table: dict[Any, Fast], key: Any, g: Any, kind: str, name: str, fp: int,
            fold: tuple[int, int, int, float] = NO_FOLD, root: int = 0, limit: float = -1
            ) -> Callable[[], None]:
    """A function that puts in ``table[key]`` the core's callable for ``g``'s calls of
    ``kind`` (``reduce``, ``reduce_scatter``, ``allgather``, ``broadcast``; ``limit``: the
    bytes from which it leaves a call to the full path).

    Example:
        >>> swapper(ALL_REDUCE, ("sum", f4), g, "reduce", "all_reduce", fp, kernel)()
        >>> type(ALL_REDUCE[("sum", f4)]).__name__
        'Fast'
    """
    core = module()
    code = getattr(core, "K_" + kind.upper())
    bound = -1 if limit == float("inf") else int(limit)

    def swap() -> None:
        table[key] = core.Fast(code, *fold, root, fp, g, name, flight.recorder(g.key),
                               partial(told, g, name), bound)

    return swap


def all_reduce(g: Any, shared: float, core: Fast, mpi: Fast | None, spanning: Fast | None
               ) -> Fast:
    """all_reduce through the core (``core``: a `call`) from ``shared`` bytes on a group
    whose segment is made; on a group that spans nodes ``spanning``
    (`fcoll.collectives._fast_nodes`) where it serves; else ``mpi`` (the MPI fast path where
    MPI's op reduces), else the full path."""

    def run(x: np.ndarray) -> np.ndarray | None:
        if not x.flags.c_contiguous:
            return None
        if g.shm is False:  # the group spans nodes
            if spanning is not None and (y := spanning(x)) is not None:
                return y
        elif x.nbytes >= shared:
            return core(x)
        return None if mpi is None else mpi(x)

    return run


def call(g: Any, name: str, method: str, *args: Any, swap: Callable[[], None] | None = None
         ) -> Callable[[np.ndarray], Any]:
    """A closure that takes ``x`` through the group's core in one C call,
    ``core.<method>(x, *args)`` (the segment made and holding ``x``; None otherwise),
    recorded as the others record: reduce_scatter, all_gather, broadcast and scan.
    ``swap`` (`swapper`): called once the segment steps in C."""
    calls, ends, pos, mask, ranks, clock = flight.recorder(g.key)
    mismatch = module().Mismatch

    def run(x: np.ndarray) -> Any:
        seg = g.shm
        if not seg or x.nbytes > seg.capacity or (core := seg.core) is None:
            return None
        if swap is not None:
            swap()
        g.seq += 1
        i = pos[0]
        if calls is not None:
            pos[0] = i + 1
            i &= mask
            calls[i] = (ranks, g.seq, name, "numpy", x.shape, x.dtype, clock())
        try:
            y = getattr(core, method)(x, *args)
        except mismatch as error:
            raise told(g, name, error.args[0]) from None
        if calls is not None:
            ends[i] = clock()
        return y

    return run
