"""Debug levels: ``info`` logs each collective; ``detail`` checks that every rank of the
group makes the same call before it communicates.

Under ``detail`` every collective first all-gathers a short description of the call from
each rank (the operation, array shapes and dtypes, the reduce op, the root, split sizes
and the call's sequence number on the group). Any difference raises
`CollectiveMismatchError` on every rank, with a table of what each rank passed, before
any data moves, so the group stays usable: the next matching call succeeds.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend

log = logging.getLogger("fcoll")


class CollectiveMismatchError(ValueError):
    """The ranks of a group made different calls (op, shapes, dtypes, roots, sizes, order).

    Raised on every rank of the group, before anything is sent, when ``debug="detail"``
    (`fcoll.init` or ``FCOLL_DEBUG``); a `ValueError`, with a table of each rank's call.

    Example:
        >>> fc.init(debug="detail")                  # every rank; mpiexec -n 2
        >>> fc.all_reduce(np.ones(3 if fc.get_rank() == 0 else 4))
        Traceback (most recent call last):           # on ranks 0 and 1 alike
        CollectiveMismatchError: all_reduce: the ranks of group [0, 1] made different calls ...
    """


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, np.ndarray) for v in value):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if value is None or isinstance(value, (int, str, float, list, tuple)):
        return repr(value)
    return type(value).__name__


def _table(fn: str, group: Any, rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r.get(c, "").ljust(widths[c]) for c in columns) for r in rows]
    return (f"{fn}: the ranks of group {list(group.ranks)} made different calls "
            "(debug='detail'); nothing was sent:\n    " + "\n    ".join(lines))


def _fingerprint(described: dict[str, str]) -> int:
    """A 62-bit digest of the call (without the rank), equal on ranks making the same call."""
    text = repr([(k, v) for k, v in described.items() if k != "rank"]).encode()
    return (zlib.crc32(text) << 30) ^ zlib.adler32(text)


def check(group: Any, comm: Any, fn: str, level: str, **fields: object) -> None:
    """Log the call (``info``) and, under ``detail``, compare it across the group's ranks.

    The comparison is one all-reduce of a digest (min and max); only when they differ do
    the ranks exchange their full descriptions, to build the error's table.
    """
    if level != "detail" and not log.isEnabledFor(logging.INFO):
        return
    described = {"rank": str(group.rank), "call": fn, "seq": str(group.seq + 1),
                 **{k: _describe(v) for k, v in fields.items()}}
    log.info("rank %s: %s #%s %s", group.rank, fn, group.seq + 1,
             " ".join(f"{k}={v}" for k, v in list(described.items())[3:]))
    if level != "detail":
        return
    digest = _fingerprint(described)
    low, negated_high = backend.allreduce(comm, np.array([digest, -digest]), backend.MPI.MIN)
    if low == -negated_high:
        return
    rows = backend.allgather_obj(comm, described)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    raise CollectiveMismatchError(_table(fn, group, [{k: r.get(k, "-") for k in keys}
                                                     for r in rows]))
