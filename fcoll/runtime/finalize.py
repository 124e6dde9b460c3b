"""What fcoll made in MPI, freed before ``MPI_Finalize``, so a finished job exits 0.

mpi4py finalizes MPI from ``Py_AtExit``, after every Python ``atexit`` handler. An MPI
window still allocated then keeps its memory registered with the network: MPICH's ofi
netmod (the TCP and verbs providers, across nodes) then fails ``MPI_Finalize`` with
``OFI call fabricclose failed (Device or resource busy)`` and the job exits 15, while the
shared-memory-only netmod says nothing. So each layer that makes something long-lived
registers how to free it here (`on_exit`), and `release` frees it all at exit, in stages:
first the groups' shared-memory segments, then the node board (after the stall watch that
reads it has stopped), then what is left. Freeing a window is collective over its ranks:
every rank that ends its script normally runs the same stages in the same order, and what
belongs to a group whose call missed its deadline stays (its peers may never come).

`install` registers `release` with ``atexit`` at ``import fcoll``, before the exception
hook's own handler (`fcoll.diagnostics.excepthook`), so it runs after that one (``atexit``
runs the last registered first), which still writes on the node board.

Example:
    >>> on_exit(SEGMENTS, seg.free)     # when a segment is made
    >>> release()                       # at exit: every rank frees it, then MPI_Finalize
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable

from fcoll import runtime

SEGMENTS, BOARD, LAST = 10, 20, 30  # the stages, in the order they run
_PENDING: list[tuple[int, int, Callable[[], None]]] = []  # (stage, order made, free)
_STATE = {"installed": False, "made": 0}


def on_exit(stage: int, free: Callable[[], None]) -> Callable[[], None]:
    """Run ``free`` at exit in ``stage`` (in the order registered within a stage); returns
    a function that takes it back (when the object was freed before: `forget`)."""
    _STATE["made"] += 1
    entry = (stage, _STATE["made"], free)
    _PENDING.append(entry)

    def forget() -> None:
        if entry in _PENDING:
            _PENDING.remove(entry)

    return forget


def release() -> None:
    """Free everything registered, stage by stage (once; nothing after MPI finalized). An
    error freeing one thing is printed and the rest still runs."""
    MPI = runtime._MPI
    pending = sorted(_PENDING, key=lambda entry: entry[:2])
    _PENDING.clear()
    if MPI is None or MPI.Is_finalized():
        return
    for _, _, free in pending:
        try:
            free()
        except Exception as error:  # the rest must still be freed
            sys.stderr.write(f"fcoll: freeing {free!r} before MPI_Finalize failed: {error!r}\n")


def install() -> None:
    """Register `release` with ``atexit`` (once per process)."""
    if not _STATE["installed"]:
        _STATE["installed"] = True
        atexit.register(release)
