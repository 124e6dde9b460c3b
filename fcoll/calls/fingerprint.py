"""A call's fingerprint: what the contract says ranks must agree on, in one int64 word.

Every step through the on-node shared-memory segment announces the call's fingerprint
beside its element count (`fcoll.backends.segment`): the kind of call (``all_reduce``,
``broadcast``, ...), the reduce op, the dtype the caller passed (not the wire dtype:
float16 travels as float32, yet a float16 rank and a float32 rank disagree) and the root.
Ranks that announce different words raise `fcoll.calls.errors.CollectiveMismatchError` on every
rank, with debug off, since each sees every announcement (`mismatch`).

Layout, low bits first: kind (8 bits), op (8), dtype (16), root + 1 (24), and bit 56 set
so that no fingerprint is 0. The codes come from fixed tables (equal in every process);
an op or dtype outside them is coded by a CRC of its name, which `describe` can name when
this process has seen it.

Example:
    >>> fp = of("broadcast", "", np.dtype("float32"), root=1)
    >>> describe(fp, 4)
    {'call': 'broadcast', 'op': '-', 'dtype': 'float32', 'elements': '4', 'root': '1'}
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from fcoll.calls.errors import CollectiveMismatchError

KINDS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "scan",
         "exscan", "reduce", "all_to_all_single", "sendrecv", "barrier", "all_to_all")
OPS = ("", "sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
VALID = 1 << 56
_KIND = {name: i for i, name in enumerate(KINDS)}
_OP = {name: i for i, name in enumerate(OPS)}
_DTYPE = {name: i for i, name in enumerate(DTYPES)}
_SEEN_OPS: dict[int, str] = {}  # codes of ops outside OPS met in this process
_SEEN_DTYPES: dict[int, str] = {}


def _code(name: str, table: dict[str, int], seen: dict[int, str], base: int, span: int) -> int:
    code = table.get(name)
    if code is None:
        code = base + zlib.crc32(name.encode()) % span
        seen[code] = name
    return code


def op_code(op: str) -> int:
    """The code of a reduce op named ``op`` (a `fcoll.ReduceOp` value, ``premul_sum``, or a
    ufunc's ``__name__``; ``""`` for calls without an op).

    Example:
        >>> op_code("max"), op_code("logaddexp") >= len(OPS)
        (5, True)
    """
    return _code(op, _OP, _SEEN_OPS, 64, 192)


def dtype_code(dtype: np.dtype[Any]) -> int:
    """The code of ``dtype`` (by name: ml_dtypes' numbers differ between processes)."""
    return _code(dtype.name, _DTYPE, _SEEN_DTYPES, 256, 65280)


def of(kind: str, op: str, dtype: np.dtype[Any], root: int = -1) -> int:
    """The fingerprint of a call of ``kind`` with reduce op ``op`` on ``dtype`` from ``root``
    (-1: no root).

    Example:
        >>> of("all_reduce", "sum", np.dtype("float32")) == of("all_reduce", "max", np.dtype("float32"))
        False
    """
    return (VALID | _KIND[kind] | op_code(op) << 8 | dtype_code(dtype) << 16
            | (root + 1) << 32)


def kind_bits(kind: str) -> int:
    """``kind``'s bits alone: ``base | kind_bits(kind)`` completes a fingerprint made with
    `of` for another kind's slot 0 (``all_reduce``), as a plan keeps one per (op, dtype)."""
    return _KIND[kind]


def describe(fp: int, count: int) -> dict[str, str]:
    """What a rank's announcement ``(fp, count)`` says, as the mismatch table shows it."""
    if not fp & VALID:
        return {"call": "(none)", "op": "-", "dtype": "-", "elements": str(count), "root": "-"}
    kind, op, dtype, root = fp & 0xFF, fp >> 8 & 0xFF, fp >> 16 & 0xFFFF, (fp >> 32 & 0xFFFFFF) - 1
    return {"call": KINDS[kind] if kind < len(KINDS) else f"kind #{kind}",
            "op": (OPS[op] or "-") if op < len(OPS) else _SEEN_OPS.get(op, f"op #{op}"),
            "dtype": DTYPES[dtype] if dtype < len(DTYPES) else _SEEN_DTYPES.get(dtype, f"dtype #{dtype}"),
            "elements": str(count), "root": "-" if root < 0 else str(root)}


def mismatch(fn: str, ranks: Any, announced: list[tuple[int, int]]) -> CollectiveMismatchError:
    """The error every rank raises when the group's announcements ``announced`` (``(fp,
    count)`` by group rank) differ: a table of what each rank called.

    Example:
        >>> print(mismatch("all_reduce", (0, 1), [(of("all_reduce", "sum", f4), 4),
        ...                                       (of("all_reduce", "max", f4), 4)]))
        all_reduce: the ranks of group [0, 1] made different calls (the shared-memory check) ...
    """
    rows = [{"rank": str(r), **describe(fp, count)} for r, (fp, count) in enumerate(announced)]
    columns = list(rows[0])
    differ = [c for c in columns[1:] if len({row[c] for row in rows}) > 1]
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in columns).rstrip() for row in rows]
    return CollectiveMismatchError(
        f"{fn}: the ranks of group {list(ranks)} made different calls (they differ in "
        f"{', '.join(differ) or 'their announcements'}; seen by the shared-memory check, "
        "debug off); no rank made a result and the group stays usable:\n    " + "\n    ".join(lines))
