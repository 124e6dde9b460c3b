"""The benchmark in one command: every core collective and the dp averager, fcoll against
raw mpi4py (preallocated buffers), mpi4py's pickle calls and torch.distributed's gloo.

    .venv/bin/python bench/run.py                 # world sizes 2 and 4, 8 B .. 64 MiB
    .venv/bin/python bench/run.py -n 2 --quick    # 5 sizes, shorter batches
    .venv/bin/python bench/run.py -n 2 4 --ops all_reduce --sizes 8 1M 64M --impls fcoll raw

For each world size it launches ``mpiexec -n N python -m mpi4py bench/collectives.py``
(the per-rank worker: progress bar on rank 0), then merges the CSVs, prints the table and
the target checks, draws the plots and fits the alpha-beta model. Output goes to
``bench/results/<date>/`` (git-ignored): ``results.csv``, ``summary.md``,
``latency_n{N}.png``, ``busbw_n{N}.png``, ``model.csv``, ``model.png``.
torch is optional (``pip install -e '.[bench-torch]'``); without it gloo is skipped with
a message. See bench/README.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import IMPLS, OPS  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--world-sizes", nargs="+", type=int, default=[2, 4], metavar="N")
    p.add_argument("--sizes", nargs="+", metavar="SIZE", help="bytes per rank: 8 4K 1M 64M")
    p.add_argument("--ops", nargs="+", choices=OPS)
    p.add_argument("--impls", nargs="+", choices=IMPLS)
    p.add_argument("--quick", action="store_true", help="5 sizes, fewer and shorter batches")
    p.add_argument("--batches", type=int, help="timed batches per implementation")
    p.add_argument("--max-cell-s", type=float, help="seconds per (op, size) for all impls")
    p.add_argument("--out", type=Path, help="output folder (default bench/results/<date>)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per world size")
    p.add_argument("--report-only", action="store_true",
                   help="redo table, plots and model from --out's results.csv")
    return p.parse_args(argv)


def worker_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for flag in ("sizes", "ops", "impls"):
        values = getattr(args, flag)
        if values:
            out += [f"--{flag}", *map(str, values)]
    if args.quick:
        out.append("--quick")
    if args.batches:
        out += ["--batches", str(args.batches)]
    if args.max_cell_s:
        out += ["--max-cell-s", str(args.max_cell_s)]
    return out


def launcher_flags(mpiexec: str, n: int) -> list[str]:
    """``$MPIEXEC_FLAGS``, else what the scripts use with more ranks than cores: MPICH's
    ``-bind-to core`` (bench/oversubscription.py measured it best)."""
    if "MPIEXEC_FLAGS" in os.environ:
        return os.environ["MPIEXEC_FLAGS"].split()
    if n <= len(os.sched_getaffinity(0)):
        return []
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    return ["-bind-to", "core"] if "HYDRA" in version else []


def launch(n: int, csv_path: Path, args: argparse.Namespace) -> int:
    """One mpiexec job at world size ``n``; its exit status."""
    python = sys.executable
    mpiexec = os.environ.get("MPIEXEC") or str(Path(python).parent / "mpiexec")
    cmd = [mpiexec, *launcher_flags(mpiexec, n), "-n", str(n), python, "-m", "mpi4py",
           str(HERE / "collectives.py"),
           "--csv", str(csv_path), *worker_args(args)]
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(args.timeout),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, timeout=args.timeout + 60).returncode


def read(paths: list[Path]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in paths:
        with path.open() as f:
            rows += list(csv.DictReader(f))
    return rows


def main(args: argparse.Namespace) -> int:
    out = args.out or HERE / "results" / time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    merged = out / "results.csv"
    if not args.report_only:
        parts = []
        for n in args.world_sizes:
            part = out / f"n{n}.csv"
            if launch(n, part, args) != 0:
                print(f"world size {n}: the job failed", file=sys.stderr)
                return 1
            parts.append(part)
        rows = read(parts)
        with merged.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
    rows = read([merged])
    from model import fit_and_plot
    from plots import draw
    from report import report

    report(rows, out)
    draw(rows, out)
    fit_and_plot(rows, out)
    print(f"wrote {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
