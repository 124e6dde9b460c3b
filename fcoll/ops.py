"""Reduction operators: `ReduceOp`, `premul_sum`, and the op tables of both transports
(op -> ``MPI.Op``, op -> ``ncclRedOp_t``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from fcoll._runtime import mpi


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


Op = ReduceOp | PremulSum | str


def resolve_op(op: object, fn: str) -> ReduceOp | PremulSum:
    """Turn the ``op`` argument into a `ReduceOp` or `PremulSum`, or raise."""
    if isinstance(op, (ReduceOp, PremulSum)):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op)
        except ValueError:
            choices = sorted({m.value for m in ReduceOp} | set(_ALIASES))
            raise ValueError(f"{fn}: expected op in {choices}, got {op!r}") from None
    raise TypeError(
        f"{fn}: expected op to be a str, fcoll.ReduceOp or fcoll.premul_sum(...), "
        f"got {type(op).__name__}"
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


def mpi_op(op: ReduceOp | PremulSum) -> Any:
    """The ``MPI.Op`` that carries ``op`` on the wire (avg and premul_sum travel as SUM)."""
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
