"""Object collectives: pickled Python objects (nested builtins, user classes).

Every rank pickles its own object first and the ranks exchange the pickle sizes, with -1
for "could not pickle"; only then does any payload move. So an unpicklable object raises
its pickling error on the rank that passed it and `ValueError` (naming that rank) on the
others, instead of leaving them waiting.

Security: these functions unpickle bytes that peers sent, and unpickling can run
arbitrary code. Use them only among processes of one trusted job.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.backends import mpi as backend
from fcoll.calls.work import Call
from fcoll.groups import detail
from fcoll.groups.group import GroupArg
from fcoll.groups.membership import member
from fcoll.policy.validate import check_rank


def _dumps(obj: object) -> tuple[bytes, BaseException | None]:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), None
    except Exception as error:  # any failure to pickle: reported to every rank first
        return b"", error


def _check_sizes(sizes: Sequence[int], error: BaseException | None, fn: str,
                 owners: Sequence[int]) -> None:
    """Raise on every rank if some object could not be pickled (-1 in ``sizes``)."""
    if error is not None:
        raise error
    failed = sorted({owner for owner, size in zip(owners, sizes, strict=True) if size < 0})
    if failed:
        raise ValueError(f"{fn}: group rank(s) {failed} could not pickle their object; "
                         "nothing was sent")


def _loads(buf: np.ndarray, sizes: Sequence[int]) -> list[Any]:
    out, offset = [], 0
    for size in sizes:
        out.append(pickle.loads(buf[offset : offset + size].tobytes()))
        offset += size
    return out


def _gathered_sizes(call: Call, payload: bytes, error: BaseException | None,
                    fn: str) -> list[int]:
    sizes: list[int] = backend.allgather_ints(call, [-1 if error else len(payload)])[:, 0].tolist()
    _check_sizes(sizes, error, fn, range(len(sizes)))
    return sizes


def all_gather_object(obj: object, group: GroupArg = None) -> list[Any]:
    """Every rank's ``obj``, as a list indexed by group rank (pickled; trusted jobs only).

    Example:
        >>> fc.all_gather_object({"rank": r})     # 2 ranks, on every rank
        [{'rank': 0}, {'rank': 1}]
    """
    fn = "all_gather_object"
    g, call = member(group, fn)
    with detail.checked(g, call, fn):
        pass
    payload, error = _dumps(obj)
    sizes = _gathered_sizes(call, payload, error, fn)
    buf = backend.allgatherv(call, np.frombuffer(payload, np.uint8),
                             np.empty(sum(sizes), np.uint8), sizes)
    return _loads(buf, sizes)


def gather_object(obj: object, dst: int = 0, group: GroupArg = None) -> list[Any] | None:
    """The list of every rank's ``obj`` on group rank ``dst``; ``None`` elsewhere.

    Example:
        >>> fc.gather_object({"rank": fc.get_rank()})      # mpiexec -n 2, on rank 0
        [{'rank': 0}, {'rank': 1}]
        >>> fc.gather_object({"rank": fc.get_rank()}) is None      # on rank 1
        True
    """
    fn = "gather_object"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, dst=dst):
        root = check_rank(dst, g.size, fn, "dst")
    payload, error = _dumps(obj)
    sizes = _gathered_sizes(call, payload, error, fn)
    out = np.empty(sum(sizes), np.uint8) if g.rank == root else None
    buf = backend.gatherv(call, np.frombuffer(payload, np.uint8), out, sizes, root)
    return None if buf is None else _loads(buf, sizes)


def broadcast_object(obj: object, src: int = 0, group: GroupArg = None) -> Any:
    """Group rank ``src``'s ``obj`` on every rank (others pass anything, e.g. ``None``).

    Example:
        >>> fc.broadcast_object("/tmp/run-42" if r == 0 else None)    # on every rank
        '/tmp/run-42'
    """
    fn = "broadcast_object"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, src=src):
        root = check_rank(src, g.size, fn, "src")
    payload, error = _dumps(obj) if g.rank == root else (b"", None)
    size = backend.bcast_obj(call, -1 if error else len(payload), root)
    _check_sizes([size], error, fn, [root])
    buf = np.frombuffer(payload, np.uint8).copy() if g.rank == root else np.empty(size, np.uint8)
    return pickle.loads(backend.bcast(call, buf, root).tobytes())


def _check_objs(objs: object, is_root: bool, n: int, root: int) -> None:
    fn = "scatter_object"
    if is_root and (isinstance(objs, (str, bytes)) or not isinstance(objs, Sequence)
                    or len(objs) != n):
        raise ValueError(f"{fn}: expected objs to be a list of {n} objects on src, "
                         f"got {objs!r}")
    if not is_root and objs is not None:
        raise ValueError(f"{fn}: expected objs=None on ranks other than src={root}, "
                         f"got {type(objs).__name__}")


def scatter_object(objs: Sequence[Any] | None, src: int = 0, group: GroupArg = None) -> Any:
    """Rank ``r`` gets ``objs[r]`` of group rank ``src``; other ranks pass ``None``.

    Example:
        >>> objs = [{"shard": i} for i in range(2)] if fc.get_rank() == 0 else None
        >>> fc.scatter_object(objs, src=0)                 # on rank 1 (rank 0 gets shard 0)
        {'shard': 1}
    """
    fn = "scatter_object"
    g, call = member(group, fn)
    with detail.checked(g, call, fn, src=src):
        root = check_rank(src, g.size, fn, "src")
        _check_objs(objs, g.rank == root, g.size, root)
    if g.rank == root:
        assert objs is not None  # checked above
        pickled = [_dumps(o) for o in objs]
        error = next((e for _, e in pickled if e is not None), None)
        sizes = [-1 if e else len(p) for p, e in pickled]
    else:
        pickled, error, sizes = [], None, []
    sizes = backend.bcast_obj(call, sizes, root)
    _check_sizes(sizes, error, fn, [root] * len(sizes))
    send = np.frombuffer(b"".join(p for p, _ in pickled), np.uint8) if pickled else None
    buf = backend.scatterv(call, send, sizes, np.empty(sizes[g.rank], np.uint8), root)
    return pickle.loads(buf.tobytes())
