"""``python -m fcoll check``: launch a small job that runs every collective and verifies it.

The launcher (`launch`) starts ``mpiexec -n N python -m fcoll.cli.check_job`` with a deadline;
the job (`main`, on every rank) runs the checks of `fcoll.cli.check_cases`, collects each rank's
outcome on rank 0 over raw ``MPI.COMM_WORLD`` (so a broken fcoll group cannot hide a
result), and rank 0 prints one line per check and a summary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# One rank's outcome of one check: None when it passed, else what went wrong.
Outcome = str | None

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


def _run_checks(only: list[str] | None, inject: str | None) -> tuple[list[str], list[Outcome]]:
    import fcoll as fc
    from fcoll.cli.check_cases import CHECKS

    rank, size = fc.get_rank(), fc.get_world_size()
    names = [n for n in CHECKS if only is None or n in only]
    outcomes: list[Outcome] = []
    for name in names:
        try:
            CHECKS[name](rank, size)
            if name == inject and rank == size - 1:
                raise AssertionError("deliberate failure (--inject-failure)")
            outcomes.append(None)
        except Exception as error:  # a check's failure is reported, never raised
            outcomes.append(f"{type(error).__name__}: {error}".splitlines()[0][:300])
    return names, outcomes


def main(argv: list[str] | None = None) -> int:
    """The job: every rank runs the checks; rank 0 prints the report. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m fcoll.cli.check_job")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--only", action="append")
    parser.add_argument("--inject-failure")
    args = parser.parse_args(argv)
    import fcoll as fc
    from fcoll._runtime import mpi

    fc.init(timeout=args.timeout)
    names, outcomes = _run_checks(args.only, args.inject_failure)
    comm = mpi().COMM_WORLD
    per_rank = comm.gather(outcomes, root=0)
    code = 0
    if comm.Get_rank() == 0:
        text, code = report(verdicts(names, per_rank), comm.Get_size())
        print(text, flush=True)
    return int(comm.bcast(code, root=0))


def mpiexec() -> str:
    """``$MPIEXEC``, else the ``mpiexec`` next to this Python, else the one on ``PATH``."""
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("check: expected mpiexec next to sys.executable, on PATH or "
                                "in $MPIEXEC, got none")
    return found


def launch(n: int, timeout: float, extra: list[str]) -> int:
    """Run the job on ``n`` ranks; its output goes to ours. Returns its exit code."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"check: expected -n to be a positive number of ranks, got {n!r}")
    package = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CHILD_ENV_DROP)}
    env["PYTHONPATH"] = os.pathsep.join([package, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPIEXEC_TIMEOUT", str(int(timeout) + 5))
    per_call = max(1.0, min(30.0, timeout / 2))
    command = [mpiexec(), "-n", str(n), sys.executable, "-m", "fcoll.cli.check_job",
               "--timeout", str(per_call), *extra]
    print(f"fcoll check: {n} rank{'s' if n != 1 else ''}, {timeout:g} s limit", flush=True)
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
