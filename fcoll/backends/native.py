"""Whether the compiled shared-memory core runs, and which of its folds serves a reduction.

``fcoll.backends._shmcore`` (C11, built by the package's own build from
``fcoll/backends/_shmcore.c``) takes a whole call through a group's segment: copy in,
publish, wait, compare the fingerprints, fold or copy out. It is optional: without a
compiler at install time, or with ``FCOLL_NATIVE=0``, the numpy path in `shm` and
`fcoll.backends.segment` does the same steps. Every rank of a job must run the same one (their segments'
layouts differ), so `agree` decides it once for the whole job at `fcoll.init`: the core runs
only where every rank has it and allows it.

``FCOLL_NATIVE``: ``auto`` (default: the core where it was built), ``0`` (never), ``1``
(insist: `RuntimeError` when it is missing).

Example:
    >>> kernel(np.dtype("float32"), np.add, avg=True, factor=None)   # (type, op, flags, factor)
    (10, 0, 1, 1.0)
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np

ENV = "FCOLL_NATIVE"
_MODES = {"auto": "auto", "": "auto", "1": "on", "on": "on", "0": "off", "off": "off"}
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64, T_F16, T_BF16, T_F32, T_F64, T_C64, T_C128 = range(14)
O_ADD, O_MUL, O_MIN, O_MAX, O_AND, O_OR, O_XOR = range(7)
F_AVG, F_SCALE, F_EXCLUSIVE = 1, 2, 8
TYPES = {np.dtype(bool): T_U8, np.dtype("uint8"): T_U8, np.dtype("int8"): T_I8,
         np.dtype("uint16"): T_U16, np.dtype("int16"): T_I16, np.dtype("uint32"): T_U32,
         np.dtype("int32"): T_I32, np.dtype("uint64"): T_U64, np.dtype("int64"): T_I64,
         np.dtype("float16"): T_F16, np.dtype(ml_dtypes.bfloat16): T_BF16,
         np.dtype("float32"): T_F32, np.dtype("float64"): T_F64,
         np.dtype("complex64"): T_C64, np.dtype("complex128"): T_C128}
OPS: dict[Any, int] = {np.add: O_ADD, np.multiply: O_MUL, np.minimum: O_MIN, np.maximum: O_MAX,
                       np.bitwise_and: O_AND, np.bitwise_or: O_OR, np.bitwise_xor: O_XOR}
_FLOATS = (T_F16, T_BF16, T_F32, T_F64)
MAX_RANKS = 256  # the core folds at most this many ranks' rows
_JOB: list[bool] = []  # the job's decision (`agree`)
Kernel = tuple[int, int, int, float]


def module() -> Any:
    """The compiled core, or None where it was not built (or ``FCOLL_NATIVE=0``)."""
    mode = os.environ.get(ENV, "auto").strip().lower()
    if mode not in _MODES:
        raise ValueError(f"{ENV}: expected one of auto, 1, 0, got {mode!r}")
    if _MODES[mode] == "off":
        return None
    try:
        from fcoll.backends import _shmcore  # type: ignore[attr-defined]
    except ImportError as error:
        if _MODES[mode] == "on":
            raise RuntimeError(f"{ENV}=1: expected the compiled shared-memory core "
                               f"(fcoll.backends._shmcore), got {error}; reinstall fcoll with a "
                               "C compiler present (pip install -e .)") from None
        return None
    return _shmcore


def describe() -> str:
    """Which engine steps this process's segments, and why, for ``python -m fcoll info``
    (what this process allows; the job runs the core only where every rank does).

    Example:
        >>> describe()                  # built, FCOLL_NATIVE unset
        'compiled core (/.../fcoll/backends/_shmcore.cpython-311-x86_64-linux-gnu.so)'
    """
    try:
        core = module()
    except (ValueError, RuntimeError) as error:
        return f"error: {error}"
    if core is not None:
        return f"compiled core ({core.__file__})"
    if os.environ.get(ENV, "auto").strip().lower() in ("0", "off"):
        return f"numpy path ({ENV}=0)"
    return ("numpy path (the compiled core was not built: no C compiler at install time? "
            "reinstall fcoll with one, pip install -e .)")


def agree(comm: Any) -> bool:
    """Decide for the job whether the core runs (collective over the world communicator,
    at `fcoll.init`): only if every rank has it and allows it."""
    mine = int(module() is not None)
    _JOB[:] = [bool(comm.allreduce(mine, op=_min()))]
    return _JOB[0]


def _min() -> Any:
    from fcoll.runtime import mpi

    return mpi().MIN


def running() -> bool:
    """Whether this job's segments step in C (`agree`; False before `fcoll.init`)."""
    return bool(_JOB and _JOB[0])


def programs(n: int, rank: int) -> tuple[tuple[np.ndarray, int, int], ...]:
    """``Core.programs``' arguments for rank ``rank`` of ``n``: the canonical tree's, scan's
    and exscan's programs (`fcoll.backends.tree.order`), each ``(ops, result, temps)``, the
    order the core folds in.

    Example:
        >>> programs(3, 2)[0]
        (array([[ 3,  0,  1],
               [-1,  3,  2]], dtype=int32), -1, 1)
    """
    from fcoll.backends.tree.order import allreduce_program, scan_program  # (tree imports this)

    orders = (allreduce_program(n), scan_program(n, rank, False), scan_program(n, rank, True))
    return tuple((p.as_array(), p.result, p.temps) for p in orders)


def kernel(dtype: np.dtype[Any], ufunc: np.ufunc, avg: bool, factor: float | complex | None
           ) -> Kernel | None:
    """The core's fold for a reduction of ``dtype`` folded with ``ufunc`` (its fold ufunc:
    for bool the uint8 one) — ``(type, op, flags, factor)`` — or None where the numpy path
    serves it: complex other than sum, premul_sum on float16/bfloat16 or complex (their
    scaled data travels as the wider wire type).

    Example:
        >>> kernel(np.dtype("complex64"), np.add, avg=True, factor=None) is None
        True
    """
    kind, op = TYPES.get(dtype), OPS.get(ufunc)
    if kind is None or op is None or (op >= O_AND and kind >= T_F16):  # bitwise: integers only
        return None
    if kind in (T_C64, T_C128):
        return (kind, op, 0, 1.0) if op == O_ADD and not avg and factor is None else None
    if factor is not None:
        if kind not in (T_F32, T_F64) or isinstance(factor, complex):
            return None
        return kind, op, F_SCALE, float(factor)
    if avg and kind not in _FLOATS:
        return None
    return kind, op, F_AVG if avg else 0, 1.0
