"""``python -m fcoll check --gpu``: the routes a cupy buffer can take here, tried, and the
route of every public collective on this machine and group, traced.

On every rank of the job (`fcoll.cli.check_job`): what decides the routes (`facts`: NCCL,
one GPU per rank, CUDA-aware MPI, ``FCOLL_GPU_TRANSPORT``); a round trip of a cupy buffer
through each route available (`round_trip`: all_reduce and all_gather_into_tensor, the
results checked against numpy on every rank, then the time per all_reduce); one call of
each public collective, traced (`fcoll.cli.gpu_routes.taken`). Rank 0 prints one line per
route and per collective: what it took, why, and the setting that would make it faster.

Example:
    >>> main_gpu(comm)           # on every rank of `mpiexec -n 2 python -m fcoll.cli.check_job --gpu`
    0
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np

import fcoll as fc
from fcoll.backends import cuda_aware, nccl, staged
from fcoll.cli.gpu_routes import ROUTES, Facts, aware_setting, calls, faster, taken, why
from fcoll.dispatch import gpu_probe, gpu_settings
from fcoll.gpu import fast, route
from fcoll.runtime import launcher, mpi

_BACKENDS: dict[str, Any] = {"nccl": nccl, "aware": cuda_aware, "staged": staged}
_N = 1024  # float32 elements in a round trip
_REPEAT = 20  # all_reduce calls timed per route


def _aware_why() -> str:
    forced = os.environ.get(gpu_probe.AWARE_ENV, "").strip()
    if forced in ("0", "1"):
        return f"{gpu_probe.AWARE_ENV}={forced}"
    return {True: "the MPI library says it takes device buffers",
            False: "the MPI library says it does not take device buffers",
            None: "the MPI library cannot tell; taken as no"}[gpu_probe.cuda_aware_mpi()]


def facts(comm: Any) -> Facts:
    """What decides the routes here, from every rank (collective over ``comm``).

    Example:
        >>> facts(comm).shared                    # two ranks on one GPU
        'ranks 0 and 1 share a GPU'
    """
    import cupy

    MPI = mpi()
    gpus = comm.allgather((MPI.Get_processor_name(), cupy.cuda.Device().pci_bus_id))
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, gpu in enumerate(gpus):
        by_gpu.setdefault(gpu, []).append(rank)
    shared = [ranks for ranks in by_gpu.values() if len(ranks) > 1]
    code = nccl.version() if nccl.available() else 0
    return Facts(setting=gpu_settings.transport(),
                 nccl=f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code else None,
                 nccl_why=nccl.why_unavailable(), shared=nccl.describe(shared) if shared else None,
                 aware=gpu_settings.aware(), aware_why=_aware_why(),
                 mpi=launcher.family(str(MPI.get_vendor()[0])) or str(MPI.get_vendor()[0]))


def _unavailable(way: str, known: Facts) -> str | None:
    """Why route ``way`` cannot carry a cupy buffer of this group, or None when it can."""
    if way == "nccl" and known.nccl is None:
        return (f"cupy has no usable NCCL ({known.nccl_why}); to enable: pip install "
                "nvidia-nccl-cu13 (or -cu12, the CUDA major of your cupy)")
    if way == "nccl" and known.shared:
        return f"{known.shared}, and NCCL allows one rank per GPU"
    if way == "aware" and not known.aware:
        return f"MPI is not CUDA-aware ({known.aware_why}); to enable: {aware_setting(known.mpi)}"
    return None


def round_trip(way: str, rank: int, size: int) -> tuple[str | None, float]:
    """A cupy buffer through route ``way`` and back: ``(error or None, µs per all_reduce)``.

    Example:
        >>> round_trip("staged", rank, size)
        (None, 58.4)
    """
    import cupy

    backend = _BACKENDS[way]
    mine = np.arange(_N, dtype=np.float32) * (rank + 1)
    x = cupy.asarray(mine)
    total = sum(np.arange(_N, dtype=np.float32) * (r + 1) for r in range(size))
    gathered = np.concatenate([np.arange(_N, dtype=np.float32) * (r + 1) for r in range(size)])
    for name, fn, want in (("all_reduce", fc.all_reduce, total),
                           ("all_gather_into_tensor", fc.all_gather_into_tensor, gathered)):
        got: Any = route.run(backend, name, fn, x)
        cupy.cuda.get_current_stream().synchronize()
        if type(got) is not cupy.ndarray or got.device.id != x.device.id:
            return f"{name}: expected a cupy array on device {x.device.id}, got {type(got)}", 0.0
        if not np.array_equal(cupy.asnumpy(got), want):
            return f"{name}: expected the numpy result, got other values", 0.0
    start = time.perf_counter()
    for _ in range(_REPEAT):
        route.run(backend, "all_reduce", fc.all_reduce, x)
    cupy.cuda.get_current_stream().synchronize()
    return None, (time.perf_counter() - start) / _REPEAT * 1e6


def _trips(known: Facts, rank: int, size: int) -> list[tuple[str, str | None, float]]:
    """``(route, why not or error or None, µs)`` for each route, fastest first."""
    found: list[tuple[str, str | None, float]] = []
    for way in ROUTES:
        reason = _unavailable(way, known)
        if reason is not None:
            found.append((way, f"SKIP {reason}", 0.0))
            continue
        try:
            error, micros = round_trip(way, rank, size)
        except Exception as problem:  # reported, never raised
            error, micros = f"{type(problem).__name__}: {problem}".splitlines()[0], 0.0
        found.append((way, error, micros))
    return found


def _traced(rank: int, size: int) -> dict[str, str]:
    """``{collective: route}`` of one call of each public collective (or ``error: ...``)."""
    import cupy

    ways = {}
    for name, call in calls(rank, size, cupy).items():
        try:
            ways[name] = taken(call)
        except Exception as problem:  # reported, never raised
            ways[name] = f"error: {type(problem).__name__}: {problem}".splitlines()[0]
    return ways


def _trip_lines(trips: list[list[tuple[str, str | None, float]]]) -> tuple[list[str], int, int]:
    """One line per route from every rank's round trips; how many passed and failed."""
    lines: list[str] = []
    passed = failed = 0
    for i, (way, error, _) in enumerate(trips[0]):
        errors = {r: e for r, t in enumerate(trips) if (e := t[i][1]) and not e.startswith("SKIP")}
        if error is not None and error.startswith("SKIP"):
            lines.append(f"SKIP  {way:<7} {error[5:]}")
        elif errors:
            failed += 1
            lines.append(f"FAIL  {way:<7} " + "; ".join(f"[rank {r}] {e}" for r, e in errors.items()))
        else:
            passed += 1
            slowest = max(t[i][2] for t in trips)
            lines.append(f"PASS  {way:<7} all_reduce, all_gather_into_tensor of float32[{_N}] "
                         f"match numpy on every rank; {slowest:.1f} us per all_reduce")
    return lines, passed, failed


def _route_lines(known: Facts, ways: list[dict[str, str]]) -> tuple[list[str], int, int]:
    """One line per public collective (and one with a faster setting, if any)."""
    lines: list[str] = []
    passed = failed = 0
    width = max(len(name) for name in ways[0])
    for name in ways[0]:
        seen = {w[name] for w in ways}
        way = seen.pop() if len(seen) == 1 else "mixed: " + ", ".join(
            f"rank {r} {w[name]}" for r, w in enumerate(ways))
        bad = way.startswith(("error", "mixed"))
        failed, passed = failed + bad, passed + (not bad)
        lines.append(f"{name:<{width}}  {way:<7} {'' if bad else why(name, way, known)}".rstrip())
        if not bad and (hint := faster(name, way, known)):
            lines.append(f"{'':<{width}}  faster: {hint}")
    return lines, passed, failed


def report(known: Facts, trips: list[list[tuple[str, str | None, float]]],
           ways: list[dict[str, str]]) -> tuple[str, int]:
    """Rank 0's text from every rank's round trips and traced routes, and the exit code.

    Example:
        >>> print(report(known, trips, ways)[0].splitlines()[-1])
        18 passed, 0 failed on 2 ranks
    """
    size = len(trips)
    ranks = f"{size} rank{'s' if size != 1 else ''}"
    routes, passed, failed = _trip_lines(trips)
    collectives, more_passed, more_failed = _route_lines(known, ways)
    passed, failed = passed + more_passed, failed + more_failed
    lines = [f"fcoll check --gpu: {ranks} of {known.mpi}, FCOLL_GPU_TRANSPORT={known.setting}",
             f"  NCCL: {known.nccl or 'none (' + known.nccl_why + ')'}; GPUs: "
             f"{known.shared or 'one per rank'}; CUDA-aware MPI: "
             f"{'yes' if known.aware else 'no'} ({known.aware_why})",
             "", "round trips (a cupy buffer through each route and back, checked on every rank):",
             *routes, "", "routes of the public collectives on the world group (each called "
             "once on cupy arrays, traced):", *collectives,
             f"{passed} passed, {failed} failed on {ranks}"]
    return "\n".join(lines), 1 if failed else 0


def main_gpu(comm: Any) -> int:
    """The ``--gpu`` job on every rank; rank 0 prints the report. Returns the exit code.

    Example:
        >>> main_gpu(mpi().COMM_WORLD)            # on every rank of the job
        0
    """
    import fcoll.gpu

    rank, size = comm.Get_rank(), comm.Get_size()
    fcoll.gpu.use_local_device()
    with warnings.catch_warnings():  # "ranks 0 and 1 share a GPU": the report says it
        warnings.simplefilter("ignore", RuntimeWarning)
        known = facts(comm)
        trips = comm.gather(_trips(known, rank, size), root=0)
        fast.reset()  # fast paths a forced route learned are not this group's choice
        ways = comm.gather(_traced(rank, size), root=0)
    code = 0
    if rank == 0:
        text, code = report(known, trips, ways)
        print(text, flush=True)
    return int(comm.bcast(code, root=0))
