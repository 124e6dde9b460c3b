"""What an ``mpi`` marker asks for: its checks at a world size, and the sizes it runs at.

``@pytest.mark.mpi(min_size=None, max_size=None, timeout=None, nprocs=None)``: under a
launcher a test runs at the world sizes the marker admits and is skipped at the others;
without one (spawn mode, `fcoll.testing.spawn`) it runs at each size of `sizes`.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

KEYWORDS = ("min_size", "max_size", "timeout", "nprocs")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _nprocs(value: object) -> list[int] | None:
    """``nprocs`` as a list of world sizes, or None when it is not a positive int or a
    non-empty list of them."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    found = [v for v in items if isinstance(v, int) and _whole(v)]
    return found if items and len(found) == len(items) else None


def error(marker: pytest.Mark) -> str | None:
    """Why ``marker`` is malformed (an argument it does not take, a bad value), or None.

    Example:
        >>> error(pytest.mark.mpi(nprocs=[2, 0]).mark)
        'mpi marker: expected nprocs to be a positive int or a list of them, got [2, 0]'
    """
    unknown = set(marker.kwargs) - set(KEYWORDS)
    if marker.args or unknown:
        return (f"mpi marker: expected keyword arguments {', '.join(KEYWORDS)}, got "
                f"{marker.args or ''}{sorted(unknown) if unknown else ''}")
    for name in ("min_size", "max_size", "timeout"):
        value = marker.kwargs.get(name)
        if value is not None and not _positive(value):
            return f"mpi marker: expected {name} to be a positive number, got {value!r}"
    value = marker.kwargs.get("nprocs")
    if value is not None and _nprocs(value) is None:
        return f"mpi marker: expected nprocs to be a positive int or a list of them, got {value!r}"
    if value is not None and not sizes(marker):
        return (f"mpi marker: expected nprocs {value!r} to hold a size within min_size "
                f"{marker.kwargs.get('min_size')} and max_size {marker.kwargs.get('max_size')}")
    return None


def sizes(marker: pytest.Mark) -> list[int]:
    """The world sizes a well-formed ``marker`` runs its test at without a launcher:
    ``nprocs`` (within ``min_size``/``max_size``), else ``min_size``, else 2 (at most
    ``max_size``).

    Example:
        >>> sizes(pytest.mark.mpi(nprocs=[4, 2]).mark), sizes(pytest.mark.mpi(min_size=3).mark)
        ([2, 4], [3])
    """
    low, high = marker.kwargs.get("min_size") or 1, marker.kwargs.get("max_size")
    listed = marker.kwargs.get("nprocs")
    if listed is not None:
        wanted = _nprocs(listed) or []
    elif marker.kwargs.get("min_size") is not None:
        wanted = [math.ceil(low)]
    else:
        wanted = [max(1, min(2, int(high))) if high is not None else 2]
    return sorted({n for n in wanted if n >= low and (high is None or n <= high)})


def check(marker: pytest.Mark, size: int) -> tuple[str | None, str | None]:
    """``(error, skip reason)`` of an ``mpi`` marker at world size ``size``.

    Example:
        >>> check(pytest.mark.mpi(min_size=2).mark, 1)
        (None, 'needs an MPI world size >= 2, got 1 (run under mpiexec -n 2)')
    """
    problem = error(marker)
    if problem is not None:
        return problem, None
    low, high = marker.kwargs.get("min_size"), marker.kwargs.get("max_size")
    if low is not None and size < low:
        return None, f"needs an MPI world size >= {low}, got {size} (run under mpiexec -n {low})"
    if high is not None and size > high:
        return None, f"needs an MPI world size <= {high}, got {size}"
    listed = marker.kwargs.get("nprocs")
    if listed is not None and size not in sizes(marker):
        wanted = sizes(marker)
        return None, (f"runs at MPI world sizes {wanted}, got {size} (run under mpiexec "
                      f"-n {wanted[0]}, or under plain pytest, which launches it)")
    return None, None


def limit(marker: pytest.Mark | None, default: float) -> float:
    """The time limit of a test with ``marker``: its ``timeout``, else ``default``.

    Example:
        >>> limit(pytest.mark.mpi(timeout=30).mark, 240.0), limit(None, 240.0)
        (30.0, 240.0)
    """
    value: Any = marker.kwargs.get("timeout") if marker is not None else None
    return float(value) if _positive(value) else default
