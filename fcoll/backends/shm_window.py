"""Where the on-node segment (`fcoll.backends.shm`) serves: per op, the per-rank bytes from
which it measured faster than MPI here (`limit`) and up to which it did (`ceiling`), with and
without the compiled core; and the settings that move the window.

Settings, read once per process (again after `fcoll.init`): ``FCOLL_SHM`` ``auto`` (default:
on where it measured faster, messages of at least `MIN_BYTES` per op), ``1`` (every size,
for tests), ``0`` (never); ``FCOLL_SHM_NODE_SIZE=k`` pretends each node holds ``k`` consecutive
global ranks (to test groups that span nodes on one machine); ``FCOLL_SHM_DIRECT=0`` turns
off the compiled core's direct reads for large all-to-all blocks (`direct`). Every rank must
see the same settings (a rank whose all-to-all reads directly and one whose does not fail the
step's comparison: `CollectiveMismatchError`, never garbage).
"""

from __future__ import annotations

import os
from typing import Any

from fcoll import runtime
from fcoll.backends import native
from fcoll.diagnostics.board import node_size_setting

NAME = "shm"
ENV = "FCOLL_SHM"
DIRECT_ENV = "FCOLL_SHM_DIRECT"
# Per-rank bytes from which shared memory beat MPI here, and up to which (exclusive) it
# did (docs/performance.md); FCOLL_SHM=1 uses it at every size.
# (bench/shm_movement.py).
MIN_BYTES: dict[str, float] = {"all_reduce": 16 << 10, "reduce_scatter": 16 << 10, "all_gather": 8 << 10,
                               "barrier": 0, "broadcast": 128 << 10,
                               "all_to_all": float("inf")}  # the numpy steps: tests (FCOLL_SHM=1)
MAX_BYTES = {"all_gather": 3 << 19, "broadcast": 8 << 20}  # then MPI's (pipelined) copies
# With the compiled core stepping (fcoll.backends.native), from the first byte
# (bench/shm_movement.py, docs/performance.md).
NATIVE_MIN_BYTES = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "broadcast": 0,
                    "barrier": 0, "all_to_all": 0}
NATIVE_MAX_BYTES = {"all_gather": 3 << 19, "broadcast": 8 << 20,
                    "all_to_all": 4 << 20}  # n blocks of the largest (bench/alltoall.py)
# all_to_all with more ranks than cores on the node: from here MPI's copies were faster (n = 4
# on 2 cores); `ceiling`
OVERSUBSCRIBED_MAX_BYTES = {"all_to_all": 128 << 10}
NEVER = float("inf")
_MODES = {"auto": "auto", "1": "on", "on": "on", "0": "off", "off": "off"}
_SETTING: list[tuple[str, int]] = []  # (auto, on or off; simulated node size), read once


def settings() -> tuple[str, int]:
    """``FCOLL_SHM`` as ``"auto"``, ``"on"`` or ``"off"``, and the simulated node size
    (``FCOLL_SHM_NODE_SIZE``; 0: the real nodes).

    Example:
        >>> settings()                   # neither variable set
        ('auto', 0)
    """
    if _SETTING:
        return _SETTING[0]
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in _MODES:
        raise ValueError(f"{ENV}: expected one of auto, 1, 0, got {value!r}")
    _SETTING.append((_MODES[value], node_size_setting()))
    return _SETTING[0]


def forget() -> None:
    """Read the settings again at the next call (`fcoll.init` does this)."""
    _SETTING.clear()


runtime.on_change(forget)


def limit(group: Any, op: str = "all_reduce") -> float:
    """The per-rank bytes from which ``group``'s ``op`` (``all_reduce``, ``reduce_scatter``,
    ``all_gather``, ``broadcast``) uses shared memory: `NEVER` where it cannot (one rank,
    the group found to span nodes, ``FCOLL_SHM=0``), 0 with ``FCOLL_SHM=1``, else
    `MIN_BYTES`; `ceiling` is the other end."""
    if group.size < 2 or group.shm is False:
        return NEVER
    mode = settings()[0]
    if mode != "auto":
        return 0 if mode == "on" else NEVER
    return (NATIVE_MIN_BYTES if native.running() else MIN_BYTES)[op]


def ceiling(op: str) -> float:
    """The per-rank bytes from which ``op`` goes back to MPI (`MAX_BYTES`; none with
    ``FCOLL_SHM=1``, or for the reductions).

    Example:
        >>> ceiling("all_gather"), ceiling("all_reduce")       # FCOLL_SHM unset
        (1572864, inf)
    """
    if settings()[0] != "auto":
        return NEVER
    if runtime.OVERSUBSCRIBED and op in OVERSUBSCRIBED_MAX_BYTES:
        return OVERSUBSCRIBED_MAX_BYTES[op]
    return (NATIVE_MAX_BYTES if native.running() else MAX_BYTES).get(op, NEVER)


def direct() -> bool:
    """Whether the compiled core may read large all-to-all blocks straight from the peers'
    inputs (``FCOLL_SHM_DIRECT``, default on; the core uses it where the platform allows,
    `fcoll.backends._shmalltoall.c`).

    Example:
        >>> direct()                     # FCOLL_SHM_DIRECT unset
        True
    """
    value = os.environ.get(DIRECT_ENV, "1").strip().lower() or "1"
    if value not in _MODES:
        raise ValueError(f"{DIRECT_ENV}: expected 1 or 0, got {value!r}")
    return _MODES[value] != "off"
