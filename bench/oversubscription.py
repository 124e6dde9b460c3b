"""With more ranks than cores, which MPI settings help? One job per setting, same sizes.

    .venv/bin/python bench/oversubscription.py [-n 4] [--sizes 8 64K 1M] [--suite]

Each setting is an environment (and mpiexec flags) under which `bench/collectives.py` times
fcoll and raw mpi4py; the table shows the median latency per (op, size) and setting.
``--suite`` also times the test suite (``mpiexec -n N python -m pytest -q -x``) under each
setting, which is what the scripts' defaults are chosen by. MPICH only (the CVARs are
MPICH's); under Open MPI the equivalent knob is ``OMPI_MCA_mpi_yield_when_idle``.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALGOS = ("ALLREDUCE", "REDUCE", "BCAST")
MPIR = {f"MPIR_CVAR_{a}_POSIX_INTRA_ALGORITHM": "mpir" for a in ALGOS}
AUTO = {f"MPIR_CVAR_{a}_POSIX_INTRA_ALGORITHM": "auto" for a in ALGOS}
# name -> (environment, extra mpiexec flags)
SETTINGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "MPICH defaults": (AUTO, []),
    "fcoll before (mpir algorithms)": ({"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}, []),
    "fcoll default (+ throttle)": ({}, []),
    "+ yield every 10 polls": ({"MPIR_CVAR_POSIX_POLL_FREQUENCY": "10",
                                "MPIR_CVAR_POLLS_BEFORE_YIELD": "10"}, []),
    "+ throttle, 256 idle polls": ({"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                                    "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "256"}, []),
    "+ throttle, bind to core": ({"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}, ["-bind-to", "core"]),
    "+ heavy yield": ({"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}, []),
    "+ async progress thread": ({"MPIR_CVAR_ASYNC_PROGRESS": "1"}, []),
    "+ bind to core": ({}, ["-bind-to", "core"]),
}


def run_bench(n: int, env: dict[str, str], flags: list[str],
              sizes: list[str]) -> dict[tuple[str, str, str], float]:
    python = sys.executable
    mpiexec = str(Path(python).parent / "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.csv"
        cmd = [mpiexec, *flags, "-n", str(n), python, "-m", "mpi4py", str(HERE / "collectives.py"),
               "--csv", str(out), "--impls", "fcoll", "raw", "--ops", "all_reduce",
               "all_gather_into_tensor", "broadcast", "--sizes", *sizes, "--batches", "5",
               "--max-cell-s", "4"]
        full = {**os.environ, **env, "MPIEXEC_TIMEOUT": "600"}
        done = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=660)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return {}
        with out.open() as f:
            return {(r["op"], r["bytes"], r["impl"]): float(r["median_us"]) for r in csv.DictReader(f)}


def run_suite(n: int, env: dict[str, str], flags: list[str]) -> float:
    python = sys.executable
    mpiexec = str(Path(python).parent / "mpiexec")
    cmd = [mpiexec, *flags, "-n", str(n), python, "-m", "pytest", "-q", "-x", "-p", "no:randomly"]
    start = time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, **env, "MPIEXEC_TIMEOUT": "900"},
                          capture_output=True, text=True, timeout=960, cwd=HERE.parent)
    took = time.perf_counter() - start
    return took if done.returncode == 0 else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=4)
    p.add_argument("--sizes", nargs="+", default=["8", "64K", "1M"])
    p.add_argument("--suite", action="store_true", help="also time the test suite per setting")
    p.add_argument("--only", nargs="+", help="settings to run (names as in the table)")
    args = p.parse_args()
    results, suite = {}, {}
    for name, (env, flags) in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        print(f"{name} ...", file=sys.stderr, flush=True)
        results[name] = run_bench(args.n, env, flags, args.sizes)
        if args.suite:
            suite[name] = run_suite(args.n, env, flags)
    keys = sorted({k for r in results.values() for k in r}, key=lambda k: (k[0], int(k[1]), k[2]))
    names = list(results)
    print(f"median µs per call, n={args.n} on {len(os.sched_getaffinity(0))} cores")
    print("| op | bytes | impl | " + " | ".join(names) + " |")
    print("|---|---:|---|" + "---:|" * len(names))
    for k in keys:
        cells = [f"{results[s].get(k, float('nan')):.1f}" for s in names]
        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    if suite:
        print("| test suite (s) | | | " + " | ".join(f"{suite[s]:.0f}" for s in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
