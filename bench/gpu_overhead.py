"""fcoll's host-side cost per cupy call, measured without a GPU.

    python bench/gpu_overhead.py [--calls 20000]

cupy is replaced by the CPU stand-in of the test suite (``tests/fake_cupy.py``) and the
default group's NCCL communicator by one whose calls return at once, so what is timed is
fcoll's own Python work per call: dispatch, checks, planning, allocating the result and
issuing the NCCL call. Columns (µs per call, best of 5 runs of ``--calls`` calls):

- ``fcoll``: the public function on a fake cupy array;
- ``raw``: the no-op NCCL call with preallocated buffers (the floor);
- ``raw+new``: the no-op call into a fresh array each call (the floor for a function that
  returns a new array);
- ``overhead``: fcoll - raw+new, fcoll's own share.

The fake's allocation is numpy's, not cupy's pool, so absolute numbers differ from a GPU
host's; the overhead column is what the fast paths (`fcoll.gpu.fast`) cut. World size 1.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import fake_cupy  # the stand-in must be in place before fcoll

fake_cupy.install()
import fcoll as fc  # noqa: E402


class NoopComm:
    """An NCCL communicator whose every call returns at once."""

    def allReduce(self, *args: Any) -> None: ...
    def reduceScatter(self, *args: Any) -> None: ...
    def allGather(self, *args: Any) -> None: ...
    def broadcast(self, *args: Any) -> None: ...
    def send(self, *args: Any) -> None: ...
    def recv(self, *args: Any) -> None: ...
    def destroy(self) -> None: ...


def _calls(cp: Any, x: Any, comm: NoopComm) -> dict[str, tuple[Any, Any, Any]]:
    """op -> (fcoll call, raw call, raw call into a fresh array)."""
    out = cp.ndarray(x.shape, x.dtype)
    s = cp.cuda.get_current_stream

    def fresh(method: Any) -> Any:
        def call() -> Any:
            y = cp.ndarray(x.shape, x.dtype)
            method(x.data.ptr, y.data.ptr, x.size, 7, 0, s().ptr)
            return y
        return call

    def raw(method: Any) -> Any:
        return lambda: method(x.data.ptr, out.data.ptr, x.size, 7, 0, s().ptr)

    return {
        "all_reduce": (lambda: fc.all_reduce(x), raw(comm.allReduce), fresh(comm.allReduce)),
        "reduce_scatter_tensor": (lambda: fc.reduce_scatter_tensor(x), raw(comm.reduceScatter),
                                  fresh(comm.reduceScatter)),
        "all_gather_into_tensor": (lambda: fc.all_gather_into_tensor(x), raw(comm.allGather),
                                   fresh(comm.allGather)),
        "all_to_all_single": (lambda: fc.all_to_all_single(x), raw(comm.send), fresh(comm.send)),
        "broadcast": (lambda: fc.broadcast(x), raw(comm.broadcast), fresh(comm.broadcast)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    import cupy as cp

    x = cp.asarray(np.ones(2, np.float32))
    for op in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single",
               "broadcast"):
        getattr(fc, op)(x)  # the first call creates the communicator (and learns fast paths)
    world = fc.world()
    world.nccl = NoopComm()
    try:
        from fcoll.gpu import fast
    except ImportError:  # fcoll before its GPU fast paths (for before/after comparisons)
        pass
    else:
        fast.reset()  # closures hold the communicator: learn them again around the no-op one
    print(f"{'op':24}{'fcoll us':>10}{'raw us':>10}{'raw+new us':>12}{'overhead us':>13}")
    for op, calls in _calls(cp, x, world.nccl).items():
        calls[0]()  # learns the fast path, if there is one
        best = [min(timeit.repeat(c, number=args.calls, repeat=5)) / args.calls * 1e6 for c in calls]
        print(f"{op:24}{best[0]:>10.2f}{best[1]:>10.2f}{best[2]:>12.2f}{best[0] - best[2]:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
