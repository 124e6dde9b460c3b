"""``python -m fcoll check``: launch a small job that runs every collective and verifies it.

The launcher (`launch`) starts ``mpiexec -n N python -m fcoll.cli.check_job`` with a deadline,
using the launcher of the MPI that this Python's mpi4py loads (`mpiexec`); the job (`main`,
on every rank) runs the checks of `fcoll.cli.check_cases` on numpy arrays, cupy arrays
(``--array cupy``) or both (``--array all``), collects each rank's outcome on rank 0 over
raw ``MPI.COMM_WORLD`` (so a broken fcoll group cannot hide a result), and rank 0 prints
one line per check and a summary. Checks on cupy arrays are named ``NAME [cupy]``.

Example:
    >>> launch(2, 120.0, ["--array", "all"])     # python -m fcoll check -n 2 --array all
    0
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One rank's outcome of one check: None when it passed, else what went wrong.
Outcome = str | None
# --array: what the checks run on. "all" is numpy, then cupy where a GPU is usable.
ARRAY_CHOICES = ("numpy", "cupy", "all")

_CHILD_ENV_DROP = ("PMI_", "HYDRA_", "MPI_LOCAL", "OMPI_COMM_WORLD", "PMIX_")


@dataclass(frozen=True)
class Verdict:
    """One check over the whole job: ``failures`` maps a rank to its error message."""

    name: str
    failures: dict[int, str]

    @property
    def passed(self) -> bool:
        return not self.failures


def verdicts(names: list[str], per_rank: list[list[Outcome]]) -> list[Verdict]:
    """Combine every rank's outcomes (``per_rank[r][i]`` for check ``names[i]``)."""
    results = []
    for i, name in enumerate(names):
        failures = {r: outcome for r, outcomes in enumerate(per_rank)
                    if (outcome := outcomes[i]) is not None}
        results.append(Verdict(name, failures))
    return results


def report(results: list[Verdict], size: int) -> tuple[str, int]:
    """The text rank 0 prints, and the exit code: 0 when every check passed on every rank."""
    width = max((len(v.name) for v in results), default=0)
    lines = []
    for verdict in results:
        if verdict.passed:
            lines.append(f"PASS  {verdict.name}")
            continue
        first_rank, first = next(iter(sorted(verdict.failures.items())))
        ranks = ", ".join(str(r) for r in sorted(verdict.failures))
        lines.append(f"FAIL  {verdict.name:<{width}}  on rank {ranks}: [rank {first_rank}] {first}")
    failed = sum(not v.passed for v in results)
    lines.append(f"{len(results) - failed} passed, {failed} failed on {size} rank"
                 f"{'s' if size != 1 else ''}")
    return "\n".join(lines), 1 if failed else 0


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def _run_checks(only: list[str] | None, inject: str | None,
                kind: str = "numpy") -> tuple[list[str], list[Outcome]]:
    """Run the checks on ``kind`` arrays: names (``NAME [cupy]`` on cupy) and outcomes."""
    import fcoll as fc
    from fcoll.cli import check_cases

    rank, size = fc.get_rank(), fc.get_world_size()
    names = [n for n in check_cases.CHECKS if (only is None or n in only)
             and (kind == "numpy" or n not in check_cases.HOST_ONLY)]
    try:
        check_cases.use_arrays(kind)
        ready: str | None = None
    except Exception as error:  # every check of this kind fails with it
        ready = f"{kind} arrays: {_why(error)}"
    outcomes: list[Outcome] = []
    for name in names:
        if ready is not None:
            outcomes.append(ready)
            continue
        try:
            check_cases.CHECKS[name](rank, size)
            if name == inject and rank == size - 1:
                raise AssertionError("deliberate failure (--inject-failure)")
            outcomes.append(None)
        except Exception as error:  # a check's failure is reported, never raised
            outcomes.append(_why(error))
    check_cases.use_arrays("numpy")
    return [n if kind == "numpy" else f"{n} [{kind}]" for n in names], outcomes


def _kinds(array: str, comm: Any) -> tuple[list[str], dict[int, str]]:
    """The array kinds to run for ``--array``, and why cupy is left out: ``{rank: reason}``
    for the ranks that cannot make cupy arrays (cupy runs only if every rank can)."""
    from fcoll.cli.check_cases import cupy_unavailable

    if array == "numpy":
        return ["numpy"], {}
    reasons = comm.allgather(cupy_unavailable())
    missing = {r: f"no GPU here: {reason}" for r, reason in enumerate(reasons) if reason}
    wanted = ["numpy", "cupy"] if array == "all" else ["cupy"]
    return ([k for k in wanted if k != "cupy"] if missing else wanted), missing


def main(argv: list[str] | None = None) -> int:
    """The job: every rank runs the checks; rank 0 prints the report. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m fcoll.cli.check_job")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--only", action="append")
    parser.add_argument("--inject-failure")
    parser.add_argument("--array", choices=ARRAY_CHOICES, default="numpy")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args(argv)
    import fcoll as fc
    from fcoll.runtime import mpi

    if args.gpu:
        return _gpu()
    fc.init(timeout=args.timeout)
    comm = mpi().COMM_WORLD
    kinds, missing = _kinds(args.array, comm)
    names: list[str] = []
    outcomes: list[Outcome] = []
    for kind in kinds:
        more_names, more = _run_checks(args.only, args.inject_failure, kind)
        names += more_names
        outcomes += more
    per_rank = comm.gather(outcomes, root=0)
    code = 0
    if comm.Get_rank() == 0:
        results = verdicts(names, per_rank)
        if missing and args.array == "cupy":  # asked for explicitly: a failure
            results.append(Verdict("cupy arrays", missing))
        elif missing:  # with --array all: a note
            rank, why = next(iter(missing.items()))
            print(f"SKIP  cupy arrays: [rank {rank}] {why}", flush=True)
        text, code = report(results, comm.Get_size())
        print(text, flush=True)
    return int(comm.bcast(code, root=0))


def _gpu() -> int:
    """``--gpu`` (`fcoll.cli.gpu_check`), where every rank can make cupy arrays. No per-call
    deadline (it would change what is timed); the launcher's time limit ends a stuck job."""
    from fcoll.cli.check_cases import cupy_unavailable
    from fcoll.runtime import mpi

    comm = mpi().COMM_WORLD
    missing = {r: why for r, why in enumerate(comm.allgather(cupy_unavailable())) if why}
    if missing:
        if comm.Get_rank() == 0:
            text, _ = report([Verdict("cupy arrays", {r: f"no GPU here: {why}"
                                                      for r, why in missing.items()})],
                             comm.Get_size())
            print(text, flush=True)
        return 1
    from fcoll.cli.gpu_check import main_gpu

    return main_gpu(comm)


def mpiexec(library: str | None = None) -> str:
    """The launcher of MPI ``library`` (default: the one this Python's mpi4py loads):
    ``$MPIEXEC`` if set, else `fcoll.runtime.launcher.pick_launcher` (next to this Python, then on
    ``PATH``)."""
    from fcoll.runtime import launcher

    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    found = launcher.pick_launcher(launcher.library_of() if library is None else library)
    if not found:
        raise FileNotFoundError("check: expected an mpiexec or mpirun of the MPI that mpi4py "
                                "loads next to sys.executable, on PATH or in $MPIEXEC, got none")
    return found


def launch(n: int, timeout: float, extra: list[str]) -> int:
    """Run the job on ``n`` ranks; its output goes to ours. Returns its exit code."""
    from fcoll.runtime import launcher

    if not isinstance(n, int) or n < 1:
        raise ValueError(f"check: expected -n to be a positive number of ranks, got {n!r}")
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this fcoll
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CHILD_ENV_DROP)}
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPIEXEC_TIMEOUT", str(int(timeout) + 5))
    library = launcher.library_of()
    flags, settings = launcher.launch_settings(library)
    env = {**settings, **env}
    per_call = max(1.0, min(30.0, timeout / 2))
    command = [mpiexec(library), *flags, "-n", str(n), sys.executable, "-m", "fcoll.cli.check_job",
               "--timeout", str(per_call), *extra]
    arrays = extra[extra.index("--array") + 1] if "--array" in extra else "numpy"
    what = "the routes of cupy arrays" if "--gpu" in extra else f"{arrays} arrays"
    print(f"fcoll check: {n} rank{'s' if n != 1 else ''}, {timeout:g} s limit, {what}", flush=True)
    start = time.monotonic()
    job = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        print(f"FAIL  the job timed out after {time.monotonic() - start:.0f} s", flush=True)
        return 124
    if code != 0:
        print(f"fcoll check: the job exited with code {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
