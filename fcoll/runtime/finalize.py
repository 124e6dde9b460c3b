"""What fcoll made in MPI, freed before ``MPI_Finalize``, so a finished job exits 0.

mpi4py finalizes MPI from ``Py_AtExit``, after every Python ``atexit`` handler. An MPI
window still allocated then keeps its memory registered with the network: MPICH's ofi
netmod (the TCP and verbs providers, across nodes) then fails ``MPI_Finalize`` with
``OFI call fabricclose failed (Device or resource busy)`` and the job exits 15, while the
shared-memory-only netmod says nothing. So each layer that makes something long-lived
registers how to free it here (`on_exit`), and `release` frees it all at exit, in stages:
first every rank waits (polling, without a core) until all ranks of the job reached the end
of their script (``FCOLL_EXIT_WAIT`` seconds at most, default 60), then the groups'
shared-memory segments are freed, then the node board (after the stall watch that reads it
has stopped), then what is left. Freeing a window is collective over its ranks, and a group
whose call missed its deadline may be broken on some ranks only: the wait makes the frees
safe whatever each rank knows (every rank frees the same windows, in the order they were
made), and where some rank does not come in time nothing is freed collectively (that job
already has a rank that lags or hangs; MPI_Finalize then reports the windows on TCP).

`install` registers `release` with ``atexit`` at ``import fcoll``, before the exception
hook's own handler (`fcoll.diagnostics.excepthook`), so it runs after that one (``atexit``
runs the last registered first), which still writes on the node board.

Example:
    >>> on_exit(SEGMENTS, seg.free)     # when a segment is made
    >>> release()                       # at exit: every rank frees it, then MPI_Finalize
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable

from fcoll import runtime

AGREE, SEGMENTS, BOARD, LAST = 0, 10, 20, 30  # the stages, in the order they run
COLLECTIVE = (SEGMENTS, BOARD)  # stages that free collectively: run only after AGREE said yes
_PENDING: list[tuple[int, int, Callable[[], object]]] = []  # (stage, order made, free)
_STATE = {"installed": False, "made": 0}
WAIT_ENV = "FCOLL_EXIT_WAIT"
DEFAULT_WAIT = 60.0


def wait_seconds() -> float:
    """How long a rank that ends its script waits for every other rank to end theirs before
    it frees collectively (``FCOLL_EXIT_WAIT``, seconds, default 60)."""
    value = os.environ.get(WAIT_ENV, "").strip()
    try:
        seconds = float(value) if value else DEFAULT_WAIT
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{WAIT_ENV}: expected seconds >= 0, got {value!r}")
    return seconds


def on_exit(stage: int, free: Callable[[], object]) -> Callable[[], None]:
    """Run ``free`` at exit in ``stage`` (in the order registered within a stage); returns
    a function that takes it back (when the object was freed before: `forget`). In stage
    `AGREE`, ``free`` returns whether every rank reached the end of its script in time: if
    not, the collective stages are left out (a peer that never comes would hold them
    forever)."""
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
    for stream in (sys.stdout, sys.stderr):  # what the script printed goes out as it ends,
        with contextlib.suppress(Exception):  # not all ranks' at once after the wait
            stream.flush()
    together = True
    for stage, _, free in pending:
        if stage in COLLECTIVE and not together:
            continue
        try:
            done = free()
        except Exception as error:  # the rest must still be freed
            sys.stderr.write(f"fcoll: freeing {free!r} before MPI_Finalize failed: {error!r}\n")
            done = stage != AGREE
        if stage == AGREE and not done:
            together = False


def install() -> None:
    """Register `release` with ``atexit`` (once per process)."""
    if not _STATE["installed"]:
        _STATE["installed"] = True
        atexit.register(release)
