"""Debug levels: ``info`` logs each collective; ``detail`` checks that every rank of the
group makes the same call before it communicates.

Under ``detail`` each collective first runs its local argument checks, then all-reduces a
digest of a short description of the call from each rank: the operation, the type name,
shape and dtype of each array, the reduce op, the root, split sizes, the call's sequence
number on the group, and the outcome of the local checks (``ok`` or the exception type).
The description holds values the contract compares, never a ``repr`` that could differ
between processes making equal calls (an object's memory address, say).

- Every rank's digest equal: the call proceeds, or, when every rank's local check failed
  the same way, every rank raises its own `TypeError`/`ValueError` (as with ``off``).
- Digests differ: a rank whose local check failed raises its own error; the others raise
  `CollectiveMismatchError` naming those ranks, or, when every rank passed its checks,
  with a table of what each rank passed. Nothing has been sent, so the group stays usable.
"""

from __future__ import annotations

import logging
import zlib
from types import TracebackType
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.backends import mpi as backend
from fcoll.calls.errors import CollectiveMismatchError
from fcoll.calls.work import Call
from fcoll.diagnostics import flight
from fcoll.policy.ops import PremulSum, ReduceOp

log = logging.getLogger("fcoll")

_PLAIN = (bool, int, float, complex, str)
__all__ = ["CollectiveMismatchError", "checked", "compare", "describe"]


def describe(value: object) -> str:
    """What the cross-rank check compares of an argument: equal for equal calls on any rank.

    Arrays of any library by type, dtype and shape; numbers, strings and ops by value;
    lists and tuples item by item; anything else by its type's name alone.

    Example:
        >>> describe(np.ones((2, 3), np.float32)), describe([1, None]), describe(object())
        ('float32[2, 3]', '[1, None]', 'object')
    """
    if value is None or type(value) in _PLAIN or isinstance(value, (ReduceOp, PremulSum)):
        return repr(value)
    if isinstance(value, np.ufunc):
        return f"np.{value.__name__}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        kind = type(value).__module__.split(".")[0]
        prefix = "" if kind == "numpy" else f"{kind} "
        return f"{prefix}{dtype}{[int(s) for s in shape]}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, _PLAIN):  # numpy scalars, bool/int subclasses
        return f"{type(value).__name__}({value!r})"
    return type(value).__name__


def _table(fn: str, group: Any, rows: list[dict[str, str]], header: str) -> str:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r.get(c, "").ljust(widths[c]) for c in columns) for r in rows]
    return f"{fn}: {header} (debug='detail'); nothing was sent:\n    " + "\n    ".join(lines)


def _fingerprint(described: dict[str, str]) -> int:
    """A 62-bit digest of the call (without the rank), equal on ranks making the same call."""
    text = repr([(k, v) for k, v in described.items() if k != "rank"]).encode()
    return (zlib.crc32(text) << 30) ^ zlib.adler32(text)


def _mismatch(fn: str, group: Any, rows: list[dict[str, str]]) -> CollectiveMismatchError:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "-") for k in keys} for r in rows]
    failed = [int(r["rank"]) for r in rows if r["check"] != "ok"]
    if failed:
        header = (f"group rank(s) {failed} of group {list(group.ranks)} failed their local "
                  "argument checks (see their own errors)")
    else:
        header = f"the ranks of group {list(group.ranks)} made different calls"
    return CollectiveMismatchError(_table(fn, group, rows, header))


def compare(group: Any, call: Call, fn: str, fields: dict[str, object],
            error: BaseException | None) -> None:
    """Log the call (``info``) and, under ``detail``, compare it across the group's ranks.

    ``error`` is what this rank's local checks raised (``None`` when they passed). Returns
    when the call may proceed or this rank should raise ``error``; raises
    `CollectiveMismatchError` when another rank disagrees. The comparison is one all-reduce
    of a digest (min and max); only when they differ do the ranks exchange their full
    descriptions, to build the error's table.
    """
    level = runtime._state.debug
    if level != "detail" and not log.isEnabledFor(logging.INFO):
        return
    described = {"rank": str(group.rank), "call": fn, "seq": str(group.seq + 1),
                 **{k: describe(v) for k, v in fields.items()},
                 "check": "ok" if error is None else type(error).__name__}
    log.info("rank %s: %s #%s %s", group.rank, fn, group.seq + 1,
             " ".join(f"{k}={v}" for k, v in list(described.items())[3:]))
    if level != "detail":
        return
    digest = _fingerprint(described)
    low, negated_high = backend.allreduce(call, np.array([digest, -digest]), backend.MPI.MIN)
    if low == -negated_high or error is not None:
        # every rank made the same call (and passed, or failed alike), or this rank failed:
        # it raises its own error, and the others learn of it from their tables
        if low != -negated_high:
            backend.allgather_obj(call, described)
        return
    raise _mismatch(fn, group, backend.allgather_obj(call, described))


class _Checked:
    """Runs the local checks inside ``with``, then `compare` (see `checked`)."""

    __slots__ = ("call", "fields", "fn", "group")

    def __init__(self, group: Any, call: Call, fn: str, fields: dict[str, object]) -> None:
        self.group, self.call, self.fn, self.fields = group, call, fn, fields

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if error is None or isinstance(error, Exception):
            compare(self.group, self.call, self.fn, self.fields, error)


class _Unchecked:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


UNCHECKED = _Unchecked()


def checked(group: Any, call: Call, fn: str, **fields: object) -> _Checked | _Unchecked:
    """A context for a collective's local argument checks, compared across ranks after them.

    With ``debug="off"`` it does nothing. Otherwise, on leaving the block (normally or by
    an exception of the checks) the call is logged and, under ``detail``, compared across
    the group (`compare`); the block must not communicate.

    Example:
        >>> g, call = member(group, "reduce")
        >>> with detail.checked(g, call, "reduce", x=x, dst=dst, op=op):
        ...     root = check_rank(dst, g.size, "reduce", "dst")   # raises before the check
    """
    if flight.RING:
        call.args = fields  # summarised when the call first communicates (fcoll.diagnostics.flight)
    if not runtime._state.checking:
        return UNCHECKED
    return _Checked(group, call, fn, fields)
