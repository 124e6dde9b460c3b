"""Reduction operators: `ReduceOp`, `premul_sum`, and the op tables of both transports
(op -> ``MPI.Op``, op -> ``ncclRedOp_t``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from fcoll.runtime import mpi


class ReduceOp(enum.Enum):
    """The reductions of torch.distributed's ``ReduceOp``.

    Strings are accepted wherever an op is (case-insensitive): ``"sum"``, ``"avg"``
    (alias ``"mean"``), ``"product"`` (alias ``"prod"``), ``"min"``, ``"max"``,
    ``"band"``, ``"bor"``, ``"bxor"``.

    Example:
        >>> fc.ReduceOp("Mean") is fc.ReduceOp.AVG
        True
    """

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    @classmethod
    def _missing_(cls, value: object) -> ReduceOp | None:
        if isinstance(value, str):
            name = _ALIASES.get(value.lower(), value.lower())
            for member in cls:
                if member.value == name:
                    return member
        return None

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


_ALIASES = {"mean": "avg", "prod": "product"}


@dataclass(frozen=True)
class PremulSum:
    """Multiply every rank's input by ``factor``, then sum (made by `premul_sum`)."""

    factor: float | complex

    def __repr__(self) -> str:
        return f"premul_sum({self.factor!r})"


def premul_sum(factor: float | complex) -> PremulSum:
    """The op "multiply by ``factor``, then sum" (NCCL's ``ncclRedOpCreatePreMulSum``).

    Example:
        >>> fc.all_reduce(np.ones(2), fc.premul_sum(0.5))   # 2 ranks: 0.5 + 0.5
        array([1., 1.])
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float, complex)):
        raise TypeError(
            f"premul_sum: expected factor to be a real or complex number, "
            f"got {type(factor).__name__}"
        )
    return PremulSum(factor)


Op = ReduceOp | PremulSum | str | np.ufunc
Resolved = ReduceOp | PremulSum | np.ufunc  # what `resolve_op` gives: a ufunc only if unnamed

# The ufunc of a named op acts as that op (identity, bool meaning, half-precision accumulation).
NAMED_UFUNCS: dict[np.ufunc, ReduceOp] = {
    np.add: ReduceOp.SUM, np.multiply: ReduceOp.PRODUCT, np.minimum: ReduceOp.MIN,
    np.maximum: ReduceOp.MAX, np.bitwise_and: ReduceOp.BAND, np.bitwise_or: ReduceOp.BOR,
    np.bitwise_xor: ReduceOp.BXOR}


def is_custom(op: object) -> bool:
    """Whether ``op`` is a numpy ufunc other than a named op's (folded by fcoll everywhere).

    Example:
        >>> is_custom(np.logaddexp), is_custom(np.add), is_custom("sum")
        (True, False, False)
    """
    return isinstance(op, np.ufunc) and op not in NAMED_UFUNCS


def op_name(op: Resolved) -> str:
    """What errors and fingerprints call ``op``: ``"sum"``, ``"premul_sum"``, a ufunc's name."""
    if isinstance(op, np.ufunc):
        return str(op.__name__)
    return "premul_sum" if isinstance(op, PremulSum) else op.value


def resolve_op(op: object, fn: str) -> Resolved:
    """Turn the ``op`` argument into a `ReduceOp`, a `PremulSum` or a binary ufunc, or raise
    (`TypeError` for a unary ufunc or any other callable, before anything is sent).

    Example:
        >>> resolve_op(np.maximum, "scan"), resolve_op(np.hypot, "scan")
        (ReduceOp.MAX, <ufunc 'hypot'>)
    """
    if isinstance(op, (ReduceOp, PremulSum)):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op)
        except ValueError:
            choices = sorted({m.value for m in ReduceOp} | set(_ALIASES))
            raise ValueError(f"{fn}: expected op in {choices}, got {op!r}") from None
    if isinstance(op, np.ufunc):
        if op in NAMED_UFUNCS:
            return NAMED_UFUNCS[op]
        if op.nin != 2 or op.nout != 1:
            raise TypeError(f"{fn}: expected op to be a binary ufunc (2 inputs, 1 output), got "
                            f"np.{op.__name__} with {op.nin} input(s) and {op.nout} output(s)")
        return op
    raise TypeError(
        f"{fn}: expected op to be a str, fcoll.ReduceOp, fcoll.premul_sum(...) or a binary "
        f"numpy ufunc, got {type(op).__name__}"
    )


_MPI_OP_NAMES = {
    ReduceOp.SUM: "SUM",
    ReduceOp.AVG: "SUM",
    ReduceOp.PRODUCT: "PROD",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}

# bool travels as uint8 0/1: "or" is max, "and" is min, "xor" is bitwise xor.
_BOOL_AS_UINT8 = {
    ReduceOp.SUM: ReduceOp.MAX,
    ReduceOp.MAX: ReduceOp.MAX,
    ReduceOp.BOR: ReduceOp.MAX,
    ReduceOp.PRODUCT: ReduceOp.MIN,
    ReduceOp.MIN: ReduceOp.MIN,
    ReduceOp.BAND: ReduceOp.MIN,
    ReduceOp.BXOR: ReduceOp.BXOR,
}


def bool_op(op: ReduceOp) -> ReduceOp:
    """The uint8 op that gives numpy's logical meaning of ``op`` on bool data."""
    return _BOOL_AS_UINT8[op]


def mpi_op(op: Resolved) -> Any:
    """The ``MPI.Op`` that carries ``op`` on the wire (avg and premul_sum travel as SUM);
    None for a ufunc, which fcoll always folds itself."""
    if isinstance(op, np.ufunc):
        return None
    name = "SUM" if isinstance(op, PremulSum) else _MPI_OP_NAMES[op]
    return getattr(mpi(), name)


class NcclOp(enum.IntEnum):
    """NCCL's ``ncclRedOp_t`` codes (``nccl.h``; stable since NCCL 2.0, ``AVG`` from 2.10)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


# avg travels as a sum (divided afterwards) where NCCL has no ncclAvg.
_NCCL_OPS = {ReduceOp.SUM: NcclOp.SUM, ReduceOp.AVG: NcclOp.SUM, ReduceOp.PRODUCT: NcclOp.PROD,
             ReduceOp.MIN: NcclOp.MIN, ReduceOp.MAX: NcclOp.MAX}


def nccl_op(op: ReduceOp) -> NcclOp:
    """The ``ncclRedOp_t`` that carries ``op`` (`KeyError` for the bitwise ops NCCL lacks)."""
    return _NCCL_OPS[op]
