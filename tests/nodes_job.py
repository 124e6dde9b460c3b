"""Every collective on a group that spans nodes, in one job (run by tests/test_nodes.py on a
simulated cluster, `scripts/cluster-sim.sh K M`):

    scripts/cluster-sim.sh K M -- python tests/nodes_job.py K

Checks, on the world and on a subgroup of the first ranks of every node (so a smaller
split): the split found (``K`` nodes; 0: none, the flat schedules), every public collective's
result against numpy, the hierarchical paths for sizes on both sides of `nodes.FROM` and
`nodes.REDUNDANT`, and what one hierarchical all_reduce of ``n`` floats sends across the nodes
(`fcoll.debug.traffic`, split by communicator): at most ``2 lg k + 2`` messages per pipelined
piece and
``2 (k-1)/k * n/m`` bytes (plus the tree's remainder) per rank, where the flat schedule sends
``2 (p-1)/p * n``, and allocates at most ``3 n`` bytes. Prints ``ok`` per rank.
"""

from __future__ import annotations

import math
import sys
import tracemalloc
from typing import Any

import numpy as np

import fcoll as fc
from fcoll import runtime
from fcoll.backends import nodes
from fcoll.calls import traffic

fc.init()
R, P = fc.get_rank(), fc.get_world_size()
K = int(sys.argv[1])


def expect(got: Any, want: Any, what: str) -> None:
    if not (np.shape(got) == np.shape(want) and np.array_equal(got, want)):
        raise AssertionError(f"rank {R} of {P}: {what}: got {got!r:.200} expected {want!r:.200}")


def collectives(g: Any, label: str) -> None:
    """Each public collective on group ``g`` (this rank a member) against numpy."""
    me, n = g.rank, g.size
    arg = None if g is fc.world() else g
    for count in (1, 5, 3000, 300_001):  # around REDUNDANT and FROM, odd: the padded path
        what = f"{label} {count}"
        x = np.arange(count, dtype=np.float64) + me
        total = sum(np.arange(count, dtype=np.float64) + j for j in range(n))
        expect(fc.all_reduce(x, group=arg), total, "all_reduce " + what)
        expect(fc.all_reduce(x.astype(np.int64), group=arg), total.astype(np.int64),
               "int all_reduce " + what)
        expect(fc.all_reduce(x, "max", group=arg), x - me + n - 1, "max " + what)
        expect(fc.reduce(x, n - 1, group=arg), total if me == n - 1 else None, "reduce " + what)
        blocks = np.tile(x, n)
        expect(fc.reduce_scatter_tensor(blocks, group=arg), total, "reduce_scatter " + what)
        gathered = np.concatenate([np.arange(count, dtype=np.float64) + j for j in range(n)])
        expect(fc.all_gather_into_tensor(x, group=arg), gathered, "all_gather " + what)
        parts = fc.all_gather(x, group=arg)
        expect(np.concatenate(parts), gathered, "all_gather list " + what)
        for root in {0, n - 1, n // 2}:
            expect(fc.broadcast(x, root, group=arg), x - me + root, f"broadcast {root} " + what)
        expect(fc.scan(x, group=arg), sum(x - me + j for j in range(me + 1)), "scan " + what)
    fc.barrier(group=arg)
    a2a = np.arange(n * 3, dtype=np.int32) + 100 * me
    want = np.concatenate([np.arange(me * 3, me * 3 + 3, dtype=np.int32) + 100 * j
                           for j in range(n)])
    expect(fc.all_to_all_single(a2a, group=arg), want, f"all_to_all_single {label}")
    expect(fc.all_gather_object(me, group=arg), list(range(n)), f"all_gather_object {label}")
    expect(fc.broadcast_object(me * 7, 0, group=arg), 0, f"broadcast_object {label}")
    expect(fc.sendrecv(np.array([me]), (me + 1) % n, (me - 1) % n, group=arg),
           np.array([(me - 1) % n]), f"sendrecv {label}")
    got = fc.gather(np.array([me]), 0, group=arg)
    expect(np.concatenate(got) if me == 0 else got, np.arange(n) if me == 0 else None,
           f"gather {label}")
    chunks = [np.array([j * 10]) for j in range(n)] if me == 0 else None
    expect(fc.scatter(chunks, 0, group=arg), np.array([me * 10]),
           f"scatter {label}")


def mixed_paths() -> None:
    """Odd ranks pass strided arrays (the full path), even ranks contiguous ones (the fast
    path once learned): the messages still match, the bits are the tree's."""
    from fcoll.testing import reference_reduce

    for count in (1000, 70_000, 200_000):
        xs = [np.random.default_rng([count, j]).standard_normal(count).astype(np.float32)
              for j in range(P)]
        x = xs[R] if R % 2 == 0 else np.repeat(xs[R], 2)[::2]
        for _ in range(2):
            expect(fc.all_reduce(x), reference_reduce(xs), f"mixed all_reduce {count}")
            blocks = np.concatenate([xs[R]] * P)
            y = blocks if R % 2 == 0 else np.repeat(blocks, 2)[::2]
            expect(fc.reduce_scatter_tensor(y), reference_reduce(xs), f"mixed reduce_scatter {count}")


def sent_across(g: Any, x: np.ndarray) -> tuple[int, int, int]:
    """(messages, bytes) this rank sent between nodes in one all_reduce of ``x``, and the
    bytes it allocated (tracemalloc's peak)."""
    h = g.nodes
    counted: list[tuple[int, int]] = []
    real = traffic.sent

    def spy(call: Any, nbytes: int, messages: int = 1) -> None:
        if call.group is h.cross:
            counted.append((messages, nbytes))
        real(call, nbytes, messages)

    traffic.sent = spy  # type: ignore[assignment]
    tracemalloc.start()
    try:
        with fc.debug.traffic():
            fc.all_reduce(x)
    finally:
        traffic.sent = real  # type: ignore[assignment]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return sum(m for m, _ in counted), sum(b for _, b in counted), peak


def scaling(g: Any) -> None:
    """Messages and bytes across nodes, and memory, of hierarchical all_reduces."""
    h = g.nodes
    k, m = h.k, h.m
    q = 1 << (k.bit_length() - 1)
    for n in (1000, 1 << 16, 1 << 19):
        x = np.ones(n, np.float32)
        fc.all_reduce(x)
        messages, nbytes, peak = sent_across(g, x)
        part = x.nbytes if x.nbytes <= nodes.REDUNDANT else x.nbytes // m
        pieces = 1 if part == x.nbytes else -(-x.nbytes // nodes.PIPELINE)  # pipelined
        most = (math.log2(q) + 1) * part if part <= 256 << 10 else 3 * part + 64 * q * pieces
        assert 1 <= messages <= pieces * (2 * math.ceil(math.log2(k)) + 2), (R, n, messages)
        assert nbytes <= most, f"rank {R}: sent {nbytes} B across nodes for {x.nbytes} B"
        if n >= 1 << 16:
            assert peak <= 3 * x.nbytes, f"rank {R}: all_reduce of {x.nbytes} B allocated {peak} B"


def main() -> None:
    world = fc.world()
    collectives(world, "world")
    h = world.nodes
    assert (h.k if h else 0) == K, f"rank {R}: expected {K} nodes, the world has {h}"
    mixed_paths()
    if h:
        scaling(world)
        nodes.FROM.update(dict.fromkeys(nodes.FROM, 0))  # every op through the split
        runtime.changed()
        collectives(world, "world, all split")
        m = h.m
        firsts = [j * m + i for j in range(h.k) for i in range(m // 2)]  # half of each node
        sub = fc.new_group(firsts)
        if R in firsts:
            collectives(sub, "half of each node")
            hs = sub.nodes
            assert (hs.k, hs.m) == (h.k, m // 2) if m >= 4 else not hs, (R, hs)
        sub.destroy()
    print(f"rank {R} of {P}: ok", flush=True)


main()
