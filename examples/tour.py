"""A tour of fcoll's collectives: run with `mpiexec -n 4 python -m mpi4py examples/tour.py`.

Each rank builds its input from its rank; rank 0 prints what it holds after each call.
"""

from __future__ import annotations

import numpy as np

import fcoll as fc


def show(name: str, value: object) -> None:
    if fc.get_rank() == 0:
        text = repr(value).replace("\n", "\n" + " " * 38)
        print(f"{name:36s}  {text}")


def main() -> None:
    fc.init()
    r, n = fc.get_rank(), fc.get_world_size()
    x = np.arange(2.0) + 10 * r  # rank r holds [10r, 10r + 1]
    if r == 0:
        print(f"fcoll {fc.__version__} on {n} ranks; rank r holds x = [10r, 10r+1]\n")
    show("all_reduce(x)", fc.all_reduce(x))
    show("all_reduce(x, 'avg')", fc.all_reduce(x, "avg"))
    show("all_reduce(x, 'max')", fc.all_reduce(x, "max"))
    show("reduce(x, dst=0)", fc.reduce(x, dst=0))
    show("broadcast(x, src=n-1)", fc.broadcast(x, src=n - 1))
    show("all_gather_into_tensor(x)", fc.all_gather_into_tensor(x))
    show("all_gather_into_tensor(sizes=auto)", fc.all_gather_into_tensor(x[: r % 2 + 1], sizes="auto"))
    show("reduce_scatter_tensor(rows)", fc.reduce_scatter_tensor(np.ones((n, 2)) * r))
    show("all_to_all_single(rows)", fc.all_to_all_single(np.arange(n) + 10 * r))
    show("all_gather(x[:r+1])", fc.all_gather(x[: r % 2 + 1]))
    show("gather(x, dst=0)", fc.gather(x))
    chunks = [np.full(2, 100 + i) for i in range(n)] if r == 0 else None
    show("scatter(chunks, src=0)", fc.scatter(chunks, src=0))
    show("reduce_scatter(chunks)", fc.reduce_scatter([np.full(i + 1, r) for i in range(n)]))
    show("all_to_all(chunks)", fc.all_to_all([np.array([10 * r + i]) for i in range(n)]))
    show("all_reduce_coalesced", fc.all_reduce_coalesced([x, np.array([r])]))
    show("all_gather_into_tensor_coalesced",
         fc.all_gather_into_tensor_coalesced([x[:1], np.array([r])]))
    show("reduce_scatter_tensor_coalesced",
         fc.reduce_scatter_tensor_coalesced([np.ones(n) * r, np.arange(2 * n)]))
    evens = fc.new_group(list(range(0, n, 2)))
    if evens.rank >= 0:  # only members call a group's collectives
        show("all_reduce(rank, group=evens)", fc.all_reduce(np.array([r]), group=evens))
    pair, _ = fc.new_subgroups(2 if n % 2 == 0 else 1)
    show("all_gather(rank, group=pair)", fc.all_gather(np.array([r]), pair))
    fc.barrier()
    show("barrier()", "all ranks arrived")


if __name__ == "__main__":
    main()
