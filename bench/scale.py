"""At scale, on paper: fcoll's reduction schedules measured here, counted, and predicted at p = 8..4096.

    .venv/bin/python bench/scale.py [--out DIR] [--no-tcp] [--quick]
    .venv/bin/python bench/scale.py --only model --out DIR       # redo the prediction from DIR/measured.json
    .venv/bin/python bench/scale.py --only traffic --traffic-p 2 3 4 5

Four parts (``--only`` runs some of them; the rest is read from ``DIR/measured.json`` where
an earlier run left it):

- ``pingpong``: this machine's alpha and beta by mpi4py ping-pong (``Send``/``Recv``, 8 B to
  4 MiB, median of ``--repeats``; alpha + s beta fitted on relative error) on shared memory
  (``mpiexec -n 2``) and over TCP between two MPICH fake nodes (``unshare -n``: a private
  network namespace, ``lo`` only; ``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo
  MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1``; skipped with a note where
  ``unshare -n`` fails, or with ``--no-tcp``); gamma, seconds per byte of a fold (``np.add``
  and ``fcoll.backends.tree.steps.combine`` on float32 arrays of 1 MiB); and fcoll's own
  cost per call over MPI's (8 B ``all_reduce`` at p = 2, ``FCOLL_SHM=0``, against
  ``comm.Allreduce``).
- ``traffic``: ``fc.debug.traffic`` around one float32 ``all_reduce`` of 1 KiB and of 1 MiB
  per rank at each p of ``--traffic-p`` (default 2..16, one job each, ``FCOLL_SHM=0``),
  checked rank by rank against the schedules' formulas (`expected`: recursive doubling up to
  ``fcoll.backends.tree.DOUBLING_LIMIT`` bytes, Rabenseifner above, ``even_blocks``
  rounding, pre/post steps); any mismatch makes the script exit 1.
- ``timing``: at p = 4 (``FCOLL_SHM=0``), float32 all_reduce of ``--sizes`` bytes per rank:
  ``comm.Allreduce`` (``mpi``), ``fc.all_reduce`` as shipped (``fcoll``), and with
  ``DOUBLING_LIMIT`` set to 2**40 (``doubling``) or 0 (``halving``); batches of about 20 ms,
  the slowest rank's time per call, implementations in rotating order, ``--repeats``
  rounds, medians; on shared memory and over TCP fake nodes (2 x 2 ranks). Prints the
  measured crossover (the smallest size from which halving stays faster than doubling).
- ``model``: the alpha-beta-gamma model (Thakur, Rabenseifner, Gropp 2005) at p = 8..4096
  (and 48, 384, 3072: not powers of two), 8 ranks per node, block placement, for 8 B,
  32 KiB, 1 MiB and 64 MiB per rank on three fabrics (`FABRICS`, with their sources): every
  step of a schedule costs alpha + bytes beta + folded bytes gamma on its slowest message;
  a message between ranks of one node uses the shared-memory alpha and beta measured here,
  one between nodes the fabric's, its bandwidth shared by every rank of the node that sends
  off the node in that step. Predicted: the old scheme (git history before the tree:
  Allgather + sequential fold up to 32 KiB, else Alltoall + fold + Allgatherv, MPI's best
  algorithm for each), the tree (fcoll's choice by ``DOUBLING_LIMIT``) and MPI's recursive
  doubling, Rabenseifner and ring; ratios tree / best MPI and old / best MPI, judged
  against 1.3. ``tree+sw`` adds, per step on the critical path, fcoll's measured cost per
  call over MPI's (an upper bound on what Python adds).

Writes to ``--out`` (default ``bench/results/<date>``): ``measured.json``, ``pingpong.csv``,
``traffic.csv``, ``timing.csv``, ``model.csv``, ``scale.md`` (every table) and
``scale_model.png`` (predicted time against p, per size and fabric, log-log),
``scale_measured.png`` (the p = 4 timings). With more ranks than cores (p > 2 here) the
jobs get ``-bind-to core``; their timings are ratios within one job, not absolute numbers.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KiB, MiB = 1 << 10, 1 << 20
PINGPONG_SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 4 * MiB]
TIMING_SIZES = [4 * KiB, 16 * KiB, 64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, MiB, 4 * MiB]
TRAFFIC_SIZES = [KiB, MiB]
MODEL_SIZES = [8, 32 * KiB, MiB, 64 * MiB]
MODEL_P = [8 << i for i in range(10)]  # 8 .. 4096
ODD_P = [48, 384, 3072]  # 6 * 2**k: pre- and post-steps
RANKS_PER_NODE = 8
OLD_GATHER_LIMIT = 32 * KiB  # git history: fcoll/collectives/_fold.py GATHER_LIMIT
TARGET = 1.3
TCP_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo",
           "MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CLIQUES_BY_BLOCK": "1"}
PREFIX = "SCALE "


@dataclass(frozen=True)
class Fabric:
    """Between nodes: one message's latency, the node's NIC bandwidth (one direction, shared
    by the node's ranks that send off the node at once) and what one process can drive."""

    name: str
    alpha: float  # s
    node_bw: float  # B/s
    flow_bw: float  # B/s
    source: str


FABRICS = [
    Fabric("InfiniBand HDR", 1.2e-6, 24e9, 24e9,
           "HDR 200 Gb/s (ConnectX-6: 200 Gb/s, sub-600 ns NIC latency, NVIDIA ConnectX-6 user "
           "manual); Azure HBv3, HDR InfiniBand: 1.2 us (1 B) and 192 Gb/s one way, OSU/perftest "
           "(learn.microsoft.com, hbv3-performance)"),
    Fabric("100 GbE RoCE", 2.0e-6, 11.5e9, 11.5e9,
           "ConnectX-5 EN product brief: 100 Gb/s, sub-600 ns NIC latency; MPI over OS-bypass "
           "Ethernet: 1.93 us half round trip (J. Squyres, Cisco blog 'MPI over 40Gb Ethernet'); "
           "11.5 GB/s = 92% of the 12.5 GB/s line rate"),
    Fabric("100 GbE TCP", 20e-6, 9e9, 5e9,
           "kernel TCP: ~10 us application latency on an idle tuned 10GbE pair (Larsen et al., "
           "SBAC-PAD 2007) plus MPI's socket progress (~19 us here between fake nodes over lo); "
           "a core cannot drive 100 Gb/s (~42 Gb/s, Cai et al., SIGCOMM 2021): 5 GB/s a flow, "
           "9 GB/s a node"),
]


# ---------------------------------------------------------------------------------------
# The schedules' arithmetic, written from their docstrings (fcoll.backends.tree), not imported:
# importing fcoll starts MPI, and the traffic check should not read the code it checks.

def split(p: int) -> tuple[int, int]:
    """``(q, m)``: ``q = 2**floor(lg p)`` leaves, ``m = p - q`` pre-step pairs."""
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def even_blocks(count: int, q: int) -> list[int]:
    """``q`` nearly equal block sizes over ``count`` elements, the larger first."""
    base, extra = divmod(count, q)
    return [base + (i < extra) for i in range(q)]


def bitrev(v: int, bits: int) -> int:
    return int(format(v, f"0{bits}b")[::-1], 2) if bits else 0


def doubling_limit(p: int, limit: int) -> int:
    """`fcoll.backends.tree.doubling_limit` for ``DOUBLING_LIMIT = limit``: ``limit`` from 9
    leaves up, 16 times it below (the traffic jobs check this against fcoll's own)."""
    return limit if split(p)[0] > 8 else limit << 4


def uses_doubling(count: int, itemsize: int, p: int, limit: int) -> bool:
    """fcoll's choice (`fcoll.backends.tree._allreduce`)."""
    return count * itemsize <= doubling_limit(p, limit) or count < split(p)[0]


def expected(p: int, count: int, itemsize: int, limit: int) -> list[tuple[int, int]]:
    """``(messages, bytes)`` each rank sends in one all_reduce of ``count`` elements.

    Recursive doubling: a pair's even rank 1 message of n bytes; a leaf lg q of n, a pair's
    odd rank one more (the post-step). Rabenseifner: a leaf sends all but its final block
    ``bitrev(v)`` while halving and, while doubling, the aligned groups of 1, 2, ..., q/2
    blocks that hold it; a pair's odd rank also n (post-step). On p <= 2 ranks a float sum has
    one possible result, and fcoll's plan hands it to MPI's own op (`fcoll.policy.plan`): one
    ``MPI_Allreduce`` per rank, counted as one message of n bytes."""
    if p <= 2:
        return [(1, count * itemsize)] * p
    q, m = split(p)
    lg, nbytes = q.bit_length() - 1, count * itemsize
    doubling = uses_doubling(count, itemsize, p, limit)
    sizes = even_blocks(count, q)
    out = []
    for r in range(p):
        if r < 2 * m and r % 2 == 0:
            out.append((1, nbytes))
            continue
        post = int(r < 2 * m)
        if doubling:
            out.append((lg + post, (lg + post) * nbytes))
            continue
        b = bitrev(r // 2 if r < 2 * m else r - m, lg)
        gathered = sum(sum(sizes[(b >> t) << t:((b >> t) + 1) << t]) for t in range(lg))
        out.append((2 * lg + post, (count - sizes[b] + gathered) * itemsize + post * nbytes))
    return out


# ---------------------------------------------------------------------------------------
# The model.

@dataclass(frozen=True)
class Net:
    """One node layout: ``k`` ranks per node (block placement), shared memory inside a node
    (measured here), a fabric between nodes, ``gamma`` s per byte folded."""

    k: int
    a_s: float
    b_s: float
    fabric: Fabric
    gamma: float


def step(net: Net, src: np.ndarray, dst: np.ndarray, nbytes: float, fold: float) -> float:
    """One step of concurrent messages ``src[i] -> dst[i]`` of ``nbytes`` each, the receiver
    folding ``fold`` bytes: the slowest message. Off-node messages share their node's NIC
    with the node's other off-node messages of the step (either direction's count)."""
    ns, nd = src // net.k, dst // net.k
    inter = ns != nd
    if not inter.any():
        return net.a_s + nbytes * net.b_s + fold * net.gamma
    nodes = int(max(ns.max(), nd.max())) + 1
    share = np.maximum(np.bincount(ns[inter], minlength=nodes)[ns],
                       np.bincount(nd[inter], minlength=nodes)[nd])
    f = net.fabric
    beta = np.where(inter, np.maximum(share / f.node_bw, 1 / f.flow_bw), net.b_s)
    alpha = np.where(inter, f.alpha, net.a_s)
    return float(np.max(alpha + nbytes * beta)) + fold * net.gamma


def _leaves(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Leaf numbers and the ranks that stand for them (`fcoll.backends.tree.doubling.rank_of`)."""
    q, m = split(p)
    v = np.arange(q)
    return v, np.where(v < m, 2 * v + 1, v + m)


def _pairs(net: Net, p: int, n: float, post: bool) -> float:
    m = split(p)[1]
    if not m:
        return 0.0
    even = 2 * np.arange(m)
    return step(net, even + 1, even, n, 0) if post else step(net, even, even + 1, n, n)


def t_doubling(net: Net, p: int, n: float) -> tuple[float, int]:
    """Recursive doubling (fcoll's `doubling`, MPICH's): time and steps on the critical path."""
    q, m = split(p)
    v, ranks = _leaves(p)
    t, steps, mask = _pairs(net, p, n, False), 2 * bool(m), 1
    while mask < q:
        t += step(net, ranks, ranks[v ^ mask], n, n)
        steps, mask = steps + 1, mask << 1
    return t + _pairs(net, p, n, True), steps


def t_halving(net: Net, p: int, n: float) -> tuple[float, int]:
    """Recursive halving, then doubling (fcoll's `halving`, MPICH's Rabenseifner)."""
    q, m = split(p)
    v, ranks = _leaves(p)
    t, steps, mask, size = _pairs(net, p, n, False), 2 * bool(m), 1, float(n)
    while mask < q:
        size /= 2
        t += step(net, ranks, ranks[v ^ mask], size, size)
        steps, mask = steps + 1, mask << 1
    mask = q >> 1
    while mask:
        t += step(net, ranks, ranks[v ^ mask], size, 0)
        steps, mask, size = steps + 1, mask >> 1, size * 2
    return t + _pairs(net, p, n, True), steps


def _ring_step(net: Net, p: int, nbytes: float) -> float:
    """A ring step, block placement: one off-node flow per node and direction."""
    inside = net.a_s + nbytes * net.b_s
    if p <= net.k:
        return inside
    f = net.fabric
    return max(inside, f.alpha + nbytes / min(f.node_bw, f.flow_bw))


def t_ring(net: Net, p: int, n: float) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, 2 (p - 1) steps of n / p."""
    return 2 * (p - 1) * _ring_step(net, p, n / p) + (p - 1) * n / p * net.gamma


def t_allgather(net: Net, p: int, block: float) -> float:
    """MPI's best all-gather of ``block`` bytes per rank: recursive doubling (p a power of two)
    or Bruck (else), against the ring."""
    src, t, d = np.arange(p), 0.0, 1
    while d < p:
        if p & (p - 1) == 0:
            t += step(net, src, src ^ d, block * d, 0)
        else:
            t += step(net, src, (src - d) % p, block * min(d, p - d), 0)
        d <<= 1
    return min(t, (p - 1) * _ring_step(net, p, block))


def t_alltoall(net: Net, p: int, n: float) -> float:
    """MPI's best all-to-all of ``n`` bytes per rank (blocks of n / p): pairwise exchange
    (XOR partners for a power of two) against Bruck (lg p steps of n / 2)."""
    src, pairwise = np.arange(p), 0.0
    for i in range(1, p):
        dst = src ^ i if p & (p - 1) == 0 else (src + i) % p
        pairwise += step(net, src, dst, n / p, 0)
    bruck, d = 0.0, 1
    while d < p:
        bruck += step(net, src, (src + d) % p, n / 2, 0)
        d <<= 1
    return min(pairwise, bruck)


def t_old(net: Net, p: int, n: float) -> float:
    """Before the tree: Allgather of every input + a sequential fold up to 32 KiB, else
    Alltoall of n / p blocks + fold + Allgatherv."""
    if n <= OLD_GATHER_LIMIT:
        return t_allgather(net, p, n) + (p - 1) * n * net.gamma
    return t_alltoall(net, p, n) + (p - 1) * n / p * net.gamma + t_allgather(net, p, n / p)


def predict(net: Net, p: int, n: int, limit: int, sw: float, itemsize: int = 4) -> dict[str, Any]:
    """Every algorithm's predicted time (s) for ``n`` bytes per rank at ``p`` ranks."""
    count = n // itemsize
    q = split(p)[0]
    rd, rd_steps = t_doubling(net, p, n)
    rab, rab_steps = t_halving(net, p, n) if count >= q else (math.inf, 0)
    ring = t_ring(net, p, n) if count >= p else math.inf
    mpi = {"recursive doubling": rd, "Rabenseifner": rab, "ring": ring}
    best = min(mpi, key=lambda k: mpi[k])
    doubling = uses_doubling(count, itemsize, p, limit)
    tree, steps = (rd, rd_steps) if doubling else (rab, rab_steps)
    old = t_old(net, p, n)
    return {"fabric": net.fabric.name, "p": p, "bytes": n, "old": old, "tree": tree, "sw": sw,
            "net": {"k": net.k, "a_s": net.a_s, "b_s": net.b_s, "gamma": net.gamma},
            "tree_alg": "doubling" if doubling else "halving", "tree_sw": tree + steps * sw,
            "mpi_rd": rd, "mpi_rab": rab, "mpi_ring": ring, "mpi_best": mpi[best],
            "mpi_best_alg": best, "tree_over_mpi": tree / mpi[best],
            "tree_sw_over_mpi": (tree + steps * sw) / mpi[best], "old_over_mpi": old / mpi[best]}


def model_crossover(net: Net, p: int, sw: float = 0.0) -> int | None:
    """The smallest power-of-two size (bytes per rank, float32) from which halving stays
    cheaper than doubling in the model, each step costing ``sw`` more (None: never)."""
    sizes = [1 << k for k in range(3, 27)]
    cheaper = []
    for n in sizes:
        rd, rd_steps = t_doubling(net, p, n)
        rab, rab_steps = t_halving(net, p, n) if n // 4 >= split(p)[0] else (math.inf, 0)
        cheaper.append(rab + rab_steps * sw < rd + rd_steps * sw)
    for i, n in enumerate(sizes):
        if all(cheaper[i:]):
            return n
    return None


def why(row: dict[str, Any], limit: int) -> str:
    """Why the tree misses the target in ``row``."""
    p = row["p"]
    if row["mpi_best_alg"] == "ring" and p & (p - 1):
        return ("p not a power of two: the pairs' odd ranks stand for the first m leaves, so leaf "
                "distance 4 is rank distance 8 and halving sends n/8 off node where a power of two "
                "sends n/16 (MPI's Rabenseifner alike); the ring keeps one off-node flow per node")
    if row["mpi_best_alg"] == "ring":
        return ("ring: one off-node flow per node and no NIC sharing; the tree's off-node levels "
                "share the NIC 8 ways")
    if row["tree_alg"] == "doubling":
        return (f"limit: {row['bytes']} B <= doubling_limit(p) ({limit} B, x16 up to 8 leaves) "
                "takes recursive doubling "
                "(lg p steps of n over the shared NIC) where Rabenseifner (2 lg p alpha, ~n/4 off node) wins")
    return "halving above the limit where recursive doubling's lg p alpha wins"


# ---------------------------------------------------------------------------------------
# Workers (run under mpiexec; rank 0 prints ``SCALE <json>`` lines).

def _emit(kind: str, **row: Any) -> None:
    print(PREFIX + json.dumps({"kind": kind, **row}), flush=True)


def _agreed_iters(comm: Any, fn: Callable[[], Any], seconds: float, lo: int, hi: int) -> int:
    """Calls in about ``seconds``, from a probe, the same on every rank (the slowest's)."""
    from mpi4py import MPI

    fn()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    probe = comm.allreduce((time.perf_counter() - start) / 3, op=MPI.MAX)
    return int(max(lo, min(hi, seconds / max(probe, 1e-7))))


def worker_pingpong(sizes: list[int], repeats: int, gamma: bool) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    for size in sizes:
        buf = np.zeros(size, np.uint8)

        def bounce(buf: np.ndarray = buf) -> None:
            if me == 0:
                comm.Send(buf, 1, 7)
                comm.Recv(buf, 1, 7)
            elif me == 1:
                comm.Recv(buf, 0, 7)
                comm.Send(buf, 0, 7)

        iters = _agreed_iters(comm, bounce, 0.02, 3, 5000)
        times = []
        for _ in range(repeats):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(iters):
                bounce()
            times.append((time.perf_counter() - start) / iters / 2)
        if me == 0:
            _emit("pingpong", bytes=size, seconds=statistics.median(times), iters=iters)
    if not gamma:
        return
    import fcoll as fc
    from fcoll.backends.tree import steps

    x = np.ones(2, np.float32)
    out = np.empty_like(x)
    # p = 2: a sum goes to MPI's own op (fcoll's per-call cost); an unnamed ufunc (np.fmax, a
    # fold as cheap as np.add) takes the tree: one exchange step of the Python schedule
    calls: dict[str, Callable[[], Any]] = {"fcoll": lambda: fc.all_reduce(x),
                                           "tree": lambda: fc.all_reduce(x, op=np.fmax),
                                           "mpi": lambda: comm.Allreduce(x, out, MPI.SUM)}
    per_call: dict[str, list[float]] = {k: [] for k in calls}
    counts = {k: _agreed_iters(comm, f, 0.02, 10, 20000) for k, f in calls.items()}
    for r in range(max(repeats, 5)):
        for k in list(calls)[r % 3:] + list(calls)[: r % 3]:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(counts[k]):
                calls[k]()
            per_call[k].append(comm.allreduce((time.perf_counter() - start) / counts[k], op=MPI.MAX))
    comm.Barrier()
    if me == 0:
        a, b = np.ones(MiB // 4, np.float32), np.full(MiB // 4, 2.0, np.float32)
        c = np.empty_like(a)
        folds: dict[str, Callable[[], Any]] = {"np.add": lambda: np.add(a, b, out=c),
                                               "combine": lambda: steps.combine(np.add, a, b, c)}
        result = {}
        for name, fold in folds.items():
            fold()
            ts = []
            for _ in range(max(repeats, 5)):
                start = time.perf_counter()
                for _ in range(20):
                    fold()
                ts.append((time.perf_counter() - start) / 20 / MiB)
            result[name] = statistics.median(ts)
        native = steps._kernel(np.dtype(np.float32), np.add) is not None
        _emit("gamma", np_add=result["np.add"], combine=result["combine"], combine_native=native,
              fcoll_8B=statistics.median(per_call["fcoll"]), tree_8B=statistics.median(per_call["tree"]),
              mpi_8B=statistics.median(per_call["mpi"]))
    comm.Barrier()


def worker_traffic(sizes: list[int]) -> None:
    from mpi4py import MPI

    import fcoll as fc
    from fcoll.backends import tree

    comm = MPI.COMM_WORLD
    p, me = comm.Get_size(), comm.Get_rank()
    rows = []
    for size in sizes:
        x = np.full(size // 4, me + 1.0, np.float32)
        fc.all_reduce(x)
        with fc.debug.traffic() as t:
            y = fc.all_reduce(x)
        ok = bool(np.all(y == p * (p + 1) / 2))
        rows.append({"bytes": size, "calls": t.calls, "messages": t.messages, "sent": t.bytes, "ok": ok})
    everyone = comm.gather(rows)
    if me == 0:
        assert everyone is not None
        for i, size in enumerate(sizes):
            _emit("traffic", p=p, bytes=size, limit=tree.DOUBLING_LIMIT,
                  limit_p=tree.doubling_limit(p) if hasattr(tree, "doubling_limit") else tree.DOUBLING_LIMIT,
                  ranks=[r[i] for r in everyone])


def worker_timing(sizes: list[int], repeats: int) -> None:
    from mpi4py import MPI

    import fcoll as fc
    from fcoll.backends import tree

    comm = MPI.COMM_WORLD
    p, me = comm.Get_size(), comm.Get_rank()
    shipped = tree.DOUBLING_LIMIT
    limits = {"fcoll": shipped, "doubling": 1 << 40, "halving": 0}
    for size in sizes:
        x = np.full(size // 4, me + 1.0, np.float32)
        out = np.empty_like(x)
        want = p * (p + 1) / 2

        def mpi(x: np.ndarray = x, out: np.ndarray = out) -> None:
            comm.Allreduce(x, out, MPI.SUM)

        def ours(x: np.ndarray = x) -> None:
            fc.all_reduce(x)

        impls: dict[str, Callable[[], None]] = {"mpi": mpi, "fcoll": ours, "doubling": ours, "halving": ours}
        iters: dict[str, int] = {}
        times: dict[str, list[float]] = {k: [] for k in impls}
        ok: dict[str, bool] = {}
        for k, fn in impls.items():
            tree.DOUBLING_LIMIT = limits.get(k, shipped)
            if k == "mpi":
                mpi()
                ok[k] = bool(np.all(out == want))
            else:
                ok[k] = bool(np.all(fc.all_reduce(x) == want))
            iters[k] = _agreed_iters(comm, fn, 0.02, 3, 2000)
        for r in range(repeats):
            names = list(impls)[r % len(impls):] + list(impls)[: r % len(impls)]
            for k in names:
                tree.DOUBLING_LIMIT = limits.get(k, shipped)
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(iters[k]):
                    impls[k]()
                times[k].append(comm.allreduce((time.perf_counter() - start) / iters[k], op=MPI.MAX))
        tree.DOUBLING_LIMIT = shipped
        if me == 0:
            for k, ts in times.items():
                _emit("timing", p=p, bytes=size, impl=k, seconds=statistics.median(ts),
                      lo=min(ts), hi=max(ts), ok=ok[k], limit=shipped)


# ---------------------------------------------------------------------------------------
# The launcher.

def tcp_available() -> str | None:
    """None where a private network namespace works here, else why not."""
    try:
        done = subprocess.run(["unshare", "-n", "bash", "-c", "ip link set lo up"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def launch(n: int, args: list[str], tcp: bool = False, shm: bool = True,
           timeout: float = 180) -> list[dict[str, Any]]:
    """One job of ``n`` ranks running this file's worker with ``args``; rank 0's rows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env.update({"OMP_NUM_THREADS": "1", "FCOLL_STALL_WARN": "0",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if not shm:
        env["FCOLL_SHM"] = "0"
    if tcp:
        env.update(TCP_ENV)
    mpiexec = [str(Path(sys.executable).parent / "mpiexec")]
    mpiexec += ["-bind-to", "core"] if n > (os.cpu_count() or 1) else []
    cmd = [*mpiexec, "-n", str(n), sys.executable, str(Path(__file__).resolve()), "--worker", *args]
    if tcp:  # lo in a namespace of its own: nothing leaves this machine
        cmd = ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "bash", *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode:
        sys.exit(f"bench/scale.py: the job {' '.join(args)} at n={n}{' (tcp)' if tcp else ''} "
                 f"failed:\n{done.stdout}\n{done.stderr}")
    return [json.loads(line[len(PREFIX):]) for line in done.stdout.splitlines() if line.startswith(PREFIX)]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """``(alpha, beta)`` of ``t = alpha + s beta`` by least squares on relative error."""
    s = np.array([float(b) for b, _ in points])
    t = np.array([sec for _, sec in points])
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    return float(alpha), float(beta)


def shipped_limit() -> int:
    """``DOUBLING_LIMIT`` as written in fcoll/backends/tree/__init__.py (without starting MPI)."""
    text = (ROOT / "fcoll" / "backends" / "tree" / "__init__.py").read_text()
    found = re.search(r"^DOUBLING_LIMIT\s*=\s*(\d+)(?:\s*<<\s*(\d+))?\s*(?:#.*)?$", text, re.M)
    if not found:
        raise SystemExit("bench/scale.py: DOUBLING_LIMIT (N or N << K) not found in fcoll/backends/tree")
    return int(found.group(1)) << int(found.group(2) or 0)


def run_pingpong(args: argparse.Namespace, m: dict[str, Any]) -> None:
    sizes = [str(s) for s in args.pingpong_sizes]
    rows = launch(2, ["pingpong", "--repeats", str(args.repeats), "--gamma", "--sizes", *sizes], shm=False)
    m["pingpong"] = {"shm": [r for r in rows if r["kind"] == "pingpong"]}
    m["gamma"] = next(r for r in rows if r["kind"] == "gamma")
    m["tcp_note"] = None if args.tcp else "skipped (--no-tcp)"
    if args.tcp and (reason := tcp_available()) is not None:
        m["tcp_note"] = f"skipped: unshare -n fails here ({reason})"
    if m["tcp_note"] is None:
        rows = launch(2, ["pingpong", "--repeats", str(args.repeats), "--sizes", *sizes], tcp=True)
        m["pingpong"]["tcp"] = rows
    for link, rows in m["pingpong"].items():
        alpha, beta = fit([(r["bytes"], r["seconds"]) for r in rows])
        m.setdefault("fit", {})[link] = {"alpha": alpha, "beta": beta}


def run_traffic(args: argparse.Namespace, m: dict[str, Any]) -> bool:
    rows, good = [], True
    for p in args.traffic_p:
        for r in launch(p, ["traffic", "--sizes", *map(str, TRAFFIC_SIZES)], shm=False):
            want = expected(p, r["bytes"] // 4, 4, r["limit"])
            got = [(x["messages"], x["sent"]) for x in r["ranks"]]
            match = got == want and all(x["ok"] and x["calls"] == 1 for x in r["ranks"])
            match &= r["limit_p"] == doubling_limit(p, r["limit"])  # this file's mirror of fcoll's rule
            good &= match
            rows.append({"p": p, "bytes": r["bytes"], "limit": r["limit_p"],
                         "alg": "MPI_Allreduce" if p <= 2 else
                         "doubling" if uses_doubling(r["bytes"] // 4, 4, p, r["limit"]) else "halving",
                         "max_messages": max(g[0] for g in got), "want_max_messages": max(w[0] for w in want),
                         "max_bytes": max(g[1] for g in got), "want_max_bytes": max(w[1] for w in want),
                         "match": match, "got": got, "want": want})
    m["traffic"] = rows
    return good


def run_timing(args: argparse.Namespace, m: dict[str, Any]) -> None:
    job = ["timing", "--repeats", str(args.repeats), "--sizes", *map(str, args.sizes)]
    m.setdefault("timing", {})["shm"] = launch(4, job, shm=False)
    if args.tcp and tcp_available() is None:  # else an earlier run's TCP rows stay
        m["timing"]["tcp"] = launch(4, job, shm=False, tcp=True)


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """The smallest size from which halving's median stays below doubling's (None: never)."""
    t = {(r["bytes"], r["impl"]): r["seconds"] for r in rows}
    sizes: list[int] = sorted({int(r["bytes"]) for r in rows})
    for i, s in enumerate(sizes):
        if all(t[(b, "halving")] < t[(b, "doubling")] for b in sizes[i:]):
            return s
    return None


def run_model(m: dict[str, Any]) -> list[dict[str, Any]]:
    shm, gamma = m["fit"]["shm"], m["gamma"]
    sw = max(0.0, gamma["tree_8B"] - gamma["mpi_8B"])
    rows = []
    for fabric in FABRICS:
        net = Net(RANKS_PER_NODE, shm["alpha"], shm["beta"], fabric, gamma["np_add"])
        for p in sorted(MODEL_P + ODD_P):
            for n in MODEL_SIZES:
                rows.append(predict(net, p, n, m["limit"], sw))
    return rows


# ---------------------------------------------------------------------------------------
# Report.

def _size(n: float) -> str:
    n = int(n)
    return f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB" if n >= KiB else f"{n} B"


def _us(s: float) -> str:
    return "—" if math.isinf(s) else f"{s * 1e6:.3g}" if s < 1e-3 else f"{s * 1e6:,.0f}"


def report(m: dict[str, Any], model: list[dict[str, Any]]) -> str:
    out = [f"# At scale ({m.get('when', '')})", ""]
    if "fit" in m:
        g = m["gamma"]
        out += ["## Measured here", "", "| link | alpha (us) | 1/beta (GB/s) |", "|---|---:|---:|"]
        for link, f in m["fit"].items():
            name = {"shm": "shared memory (mpiexec -n 2)", "tcp": "TCP between fake nodes (lo)"}[link]
            out.append(f"| {name} | {f['alpha'] * 1e6:.2f} | {1 / f['beta'] / 1e9:.2f} |")
        out += ["", f"gamma (fold, float32, 1 MiB): np.add {g['np_add'] * 1e12:.0f} ps/B "
                f"({1 / g['np_add'] / 1e9:.1f} GB/s), steps.combine {g['combine'] * 1e12:.0f} ps/B "
                f"({'compiled core' if g['combine_native'] else 'numpy'}).", "",
                f"8 B all_reduce at p = 2: comm.Allreduce {g['mpi_8B'] * 1e6:.2f} us, fc.all_reduce "
                f"{g['fcoll_8B'] * 1e6:.2f} us (a sum on 2 ranks: MPI's op), fc.all_reduce(op=np.fmax) "
                f"{g['tree_8B'] * 1e6:.2f} us (the tree: one exchange step in Python); tree+sw charges "
                f"the difference, {(g['tree_8B'] - g['mpi_8B']) * 1e6:.2f} us, to every step"]
        if m.get("tcp_note"):
            out.append(f"TCP: {m['tcp_note']}")
        out += ["", "Ping-pong, half round trip (us):", "",
                "| bytes | " + " | ".join(m["pingpong"]) + " |", "|---:|" + "---:|" * len(m["pingpong"])]
        for i, r in enumerate(m["pingpong"]["shm"]):
            cells = [f"{m['pingpong'][k][i]['seconds'] * 1e6:.2f}" for k in m["pingpong"]]
            out.append(f"| {_size(r['bytes'])} | " + " | ".join(cells) + " |")
        out.append("")
    if "traffic" in m:
        bad = [r for r in m["traffic"] if not r["match"]]
        out += ["## Traffic per all_reduce (float32, FCOLL_SHM=0; max over ranks, measured / formula)", "",
                "| p | bytes | schedule | messages | bytes sent | ranks match |",
                "|---:|---:|---|---:|---:|---|"]
        for r in m["traffic"]:
            out.append(f"| {r['p']} | {_size(r['bytes'])} | {r['alg']} | {r['max_messages']} / "
                       f"{r['want_max_messages']} | {r['max_bytes']:,} / {r['want_max_bytes']:,} | "
                       f"{'yes' if r['match'] else '**NO**'} |")
        out += ["", f"traffic check: {'every rank matches' if not bad else f'{len(bad)} MISMATCHES'}", ""]
    if "timing" in m:
        for link, rows in m["timing"].items():
            out += [f"## all_reduce at p = 4, {link} (us per call, median; FCOLL_SHM=0)", "",
                    "| bytes | mpi | fcoll | doubling | halving | fcoll/mpi |",
                    "|---:|---:|---:|---:|---:|---:|"]
            t = {(r["bytes"], r["impl"]): r["seconds"] for r in rows}
            for s in sorted({r["bytes"] for r in rows}):
                out.append(f"| {_size(s)} | " + " | ".join(_us(t[(s, k)]) for k in
                                                           ("mpi", "fcoll", "doubling", "halving"))
                           + f" | {t[(s, 'fcoll')] / t[(s, 'mpi')]:.2f} |")
            c = crossover(rows)
            where = _size(c) if c else "never (in these sizes)"
            out += ["", f"crossover ({link}): halving faster from {where}; "
                    f"fcoll's limit at p = 4: {_size(doubling_limit(4, m['limit']))} "
                    f"(DOUBLING_LIMIT {_size(m['limit'])})", ""]
    if model:
        out += model_tables(model, m["limit"])
    return "\n".join(out)


def model_tables(model: list[dict[str, Any]], limit: int) -> list[str]:
    out = ["## Predicted all_reduce time (8 ranks per node, block placement)", "",
           "Per size: best MPI algorithm's time (us) and which (rd: recursive doubling, rab: "
           "Rabenseifner), tree / best MPI, old / best MPI; **bold**: above 1.3.", ""]
    short = {"recursive doubling": "rd", "Rabenseifner": "rab", "ring": "ring"}
    for fabric in FABRICS:
        rows = [r for r in model if r["fabric"] == fabric.name]
        out += [f"### {fabric.name} (alpha {fabric.alpha * 1e6:g} us, {fabric.node_bw / 1e9:g} GB/s a node)",
                "", "| p | " + " | ".join(f"{_size(n)}: MPI | tree | old" for n in MODEL_SIZES) + " |",
                "|---:|" + "---:|---:|---:|" * len(MODEL_SIZES)]
        for p in sorted({r["p"] for r in rows}):
            cells = []
            for n in MODEL_SIZES:
                r = next(x for x in rows if x["p"] == p and x["bytes"] == n)

                def ratio(v: float) -> str:
                    return f"**{v:.2f}**" if v > TARGET else f"{v:.2f}"

                cells.append(f"{_us(r['mpi_best'])} {short[r['mpi_best_alg']]} | "
                             f"{ratio(r['tree_over_mpi'])} | {ratio(r['old_over_mpi'])}")
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append("")
    misses = [r for r in model if r["tree_over_mpi"] > TARGET]
    out += [f"Tree within {TARGET}x of MPI's best: {len(model) - len(misses)} of {len(model)} cases.", ""]
    groups: dict[tuple[str, int, str], list[int]] = {}
    for r in misses:
        groups.setdefault((r["fabric"], r["bytes"], why(r, limit)), []).append(r["p"])
    for (name, n, reason), ps in groups.items():
        worst = max(r["tree_over_mpi"] for r in misses if r["fabric"] == name and r["bytes"] == n)
        out.append(f"- {name}, {_size(n)}, p = {', '.join(map(str, ps))} (up to {worst:.2f}x): {reason}")
    sw = [r for r in model if r["tree_sw_over_mpi"] > TARGET]
    out += ["", f"With fcoll's measured per-call cost charged to every step (tree+sw, an upper bound): "
            f"{len(model) - len(sw)} of {len(model)} within {TARGET}x.", ""]
    out += crossover_table(model)
    out += ["Sources:", ""]
    out += [f"- {f.name}: {f.source}" for f in FABRICS]
    out += ["- Formulas: Thakur, Rabenseifner, Gropp, 'Optimization of Collective Communication Operations "
            "in MPICH', IJHPCA 19(1), 2005; shared memory alpha/beta and gamma measured here", ""]
    return out


def crossover_table(model: list[dict[str, Any]]) -> list[str]:
    """The model's doubling/halving crossover per fabric and p (the rows carry the inputs)."""
    if not model or "net" not in model[0]:
        return []
    ps = [8, 64, 512, 4096]
    out = ["Model crossover, doubling -> halving (bytes per rank from which halving is cheaper; "
           "MPI's steps / with fcoll's per-call cost on every step):", "",
           "| fabric | " + " | ".join(f"p = {p}" for p in ps) + " |", "|---|" + "---:|" * len(ps)]
    for fabric in FABRICS:
        row = next(r for r in model if r["fabric"] == fabric.name)
        net = Net(row["net"]["k"], row["net"]["a_s"], row["net"]["b_s"], fabric, row["net"]["gamma"])
        cells = []
        for p in ps:
            a, b = model_crossover(net, p), model_crossover(net, p, row["sw"])
            cells.append(f"{_size(a) if a else 'never'} / {_size(b) if b else 'never'}")
        out.append(f"| {fabric.name} | " + " | ".join(cells) + " |")
    return [*out, ""]


def plots(out: Path, m: dict[str, Any], model: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if model:
        fig, axes = plt.subplots(len(FABRICS), len(MODEL_SIZES), figsize=(4 * len(MODEL_SIZES),
                                                                          3.2 * len(FABRICS)), squeeze=False)
        for i, fabric in enumerate(FABRICS):
            for j, n in enumerate(MODEL_SIZES):
                ax = axes[i][j]
                rows = sorted((r for r in model if r["fabric"] == fabric.name and r["bytes"] == n
                               and r["p"] in MODEL_P), key=lambda r: r["p"])
                ps = [r["p"] for r in rows]
                for key, label, style in (("old", "old (gather/alltoall + fold)", "tab:orange"),
                                          ("tree", "tree (fcoll now)", "tab:blue"),
                                          ("mpi_best", "MPI best", "black")):
                    ax.plot(ps, [r[key] * 1e6 for r in rows], label=label, color=style, marker="o", ms=3)
                for key, label in (("mpi_rd", "MPI rec. doubling"), ("mpi_rab", "MPI Rabenseifner"),
                                   ("mpi_ring", "MPI ring")):
                    ys = [r[key] * 1e6 for r in rows]
                    if not all(math.isinf(y) for y in ys):
                        ax.plot(ps, ys, label=label, ls=":", lw=1)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_title(f"{fabric.name}, {_size(n)} per rank", fontsize=9)
                ax.grid(True, which="both", alpha=0.3)
                if j == 0:
                    ax.set_ylabel("predicted time (us)")
                if i == len(FABRICS) - 1:
                    ax.set_xlabel("ranks p (8 per node)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "scale_model.png", dpi=110)
        plt.close(fig)
    if "timing" in m:
        links = list(m["timing"])
        fig, axes = plt.subplots(1, len(links), figsize=(6 * len(links), 4), squeeze=False)
        for ax, link in zip(axes[0], links, strict=True):
            rows = m["timing"][link]
            for impl in ("mpi", "fcoll", "doubling", "halving"):
                pts = sorted((r["bytes"], r["seconds"] * 1e6) for r in rows if r["impl"] == impl)
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"all_reduce at p = 4, {link}")
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel("us per call (median)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "scale_measured.png", dpi=110)
        plt.close(fig)


def write_csvs(out: Path, m: dict[str, Any], model: list[dict[str, Any]]) -> None:
    def dump(name: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            with open(out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)

    if "pingpong" in m:
        dump("pingpong.csv", [{"link": k, **r} for k, rows in m["pingpong"].items() for r in rows])
    if "traffic" in m:
        dump("traffic.csv", [{k: v for k, v in r.items() if k not in ("got", "want")} for r in m["traffic"]])
    if "timing" in m:
        dump("timing.csv", [{"link": k, **r} for k, rows in m["timing"].items() for r in rows])
    dump("model.csv", [{k: v for k, v in r.items() if k != "net"} for r in model])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / str(datetime.date.today()))
    parser.add_argument("--only", nargs="+", choices=["pingpong", "traffic", "timing", "model"])
    parser.add_argument("--no-tcp", dest="tcp", action="store_false", help="skip the TCP fake nodes")
    parser.add_argument("--quick", action="store_true", help="few sizes, 2 repeats, p = 2..5 (a smoke run)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--sizes", nargs="+", type=int, default=TIMING_SIZES, help="timing: bytes per rank")
    parser.add_argument("--pingpong-sizes", nargs="+", type=int, default=PINGPONG_SIZES)
    parser.add_argument("--traffic-p", nargs="+", type=int, default=list(range(2, 17)))
    parser.add_argument("--worker", choices=["pingpong", "traffic", "timing"], help=argparse.SUPPRESS)
    parser.add_argument("--gamma", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "pingpong":
        worker_pingpong(args.sizes, args.repeats, args.gamma)
        return
    if args.worker == "traffic":
        worker_traffic(args.sizes)
        return
    if args.worker == "timing":
        worker_timing(args.sizes, args.repeats)
        return
    if args.quick:
        args.repeats, args.sizes = 2, [4 * KiB, 256 * KiB]
        args.pingpong_sizes, args.traffic_p = [8, 64 * KiB, MiB], [2, 3, 4, 5]
    parts = args.only or ["pingpong", "traffic", "timing", "model"]
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "measured.json"
    m: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() and args.only else {}
    m["when"] = time.strftime("%Y-%m-%d %H:%M")
    m["limit"] = shipped_limit()
    m["fabrics"] = [asdict(f) for f in FABRICS]
    good = True
    if "pingpong" in parts:
        run_pingpong(args, m)
    if "traffic" in parts:
        good = run_traffic(args, m)
    if "timing" in parts:
        run_timing(args, m)
    saved.write_text(json.dumps(m, indent=1))
    model = run_model(m) if "model" in parts and "fit" in m else []
    text = report(m, model)
    (args.out / "scale.md").write_text(text + "\n")
    write_csvs(args.out, m, model)
    plots(args.out, m, model)
    print(text)
    for link, rows in m.get("timing", {}).items():
        c = crossover(rows)
        print(f"measured crossover ({link}, p = 4): halving faster from {_size(c) if c else 'never'}")
    if not good:
        sys.exit("bench/scale.py: traffic differs from the schedules' formulas (see scale.md)")


if __name__ == "__main__":
    main()
