"""Waits that yield (issue 37): all_reduce latency before and after, in the same run.

    .venv/bin/python bench/waits.py --before /tmp/before [--repeat 3] [--torch]

``--before`` is a checkout of the commit to compare with, its compiled core built
(``python setup.py build_ext --inplace`` there); this checkout is "after". Each scenario
runs both trees in turns (``--repeat`` times, the order alternating), and the table gives
the median per tree and their ratio (after / before; below 1: faster):

- ``n=2 quiet``: 8 B and 64 KiB all_reduce at 2 ranks on this machine;
- ``n=4 on 2 cores``: the same at 4 ranks (more ranks than this machine's 2 cores);
- ``n=2 + 2 busy``: 2 ranks beside two processes that spin (``while True: pass``);
- ``--torch``: bench/bench_torch_backend.py (DDP step, fcoll against gloo) beside the two
  busy processes: its fcoll/gloo step ratio per tree.

Rows go to ``--csv`` (default bench/results/waits.csv).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
MPIEXEC = str(Path(PY).parent / "mpiexec")
SCENARIOS = {"n=2 quiet": (2, 0), "n=4 on 2 cores": (4, 0), "n=2 + 2 busy": (2, 2)}


@contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes that spin while the block runs."""
    procs = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.2 if procs else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run(tree: Path, n: int, args: list[str], timeout: float = 600) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "FCOLL_STALL_WARN": "0"}
    done = subprocess.run([MPIEXEC, "-n", str(n), PY, *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{args} in {tree} failed: {done.stdout}{done.stderr}")
    return done.stdout


def latencies(tree: Path, n: int, seconds: float) -> dict[int, float]:
    out = run(tree, n, [str(HERE / "waits_worker.py"), "--sizes", "8", "65536", "--seconds",
                        str(seconds)])
    return {int(a): float(b) for a, b in (line.split() for line in out.splitlines() if line.strip())}


def ddp_ratio(tree: Path) -> float:
    """bench_torch_backend.py's DDP step (hidden 1024), fcoll's time over gloo's."""
    out = run(tree, 2, [str(tree / "bench" / "bench_torch_backend.py"), "--sizes", "1KiB",
                        "--hidden", "1024", "--steps", "20", "--csv", "/tmp/fcoll-waits-torch.csv"],
              timeout=900)
    rows = [line.split("|") for line in out.splitlines() if " M |" in line]
    if not rows:
        raise RuntimeError(f"no DDP row in: {out}")
    return float(rows[-1][5])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.2, help="per timed round")
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--csv", type=Path, default=HERE / "results" / "waits.csv")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": HERE.parent}
    results: dict[tuple[str, str, str], list[float]] = {}
    for i in range(args.repeat):
        for name, (n, load) in SCENARIOS.items():
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for tree in order:
                with busy(load):
                    for size, us in latencies(trees[tree], n, args.seconds).items():
                        results.setdefault((name, f"{size} B", tree), []).append(us)
        if args.torch:
            for tree in (list(trees) if i % 2 == 0 else list(reversed(trees))):
                with busy(2):
                    results.setdefault(("DDP step + 2 busy", "fcoll/gloo", tree), []).append(
                        ddp_ratio(trees[tree]))
    rows = []
    for name, size in dict.fromkeys((k[0], k[1]) for k in results):
        before = statistics.median(results[(name, size, "before")])
        after = statistics.median(results[(name, size, "after")])
        rows.append((name, size, before, after, after / before))
    print(f"{'scenario':<20} {'size':<11} {'before':>9} {'after':>9} {'after/before':>12}")
    for name, size, before, after, ratio in rows:
        print(f"{name:<20} {size:<11} {before:>9.2f} {after:>9.2f} {ratio:>12.2f}")
    print("(latency in us per call, median of", args.repeat, "runs; DDP rows: fcoll/gloo step time)")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    new = not args.csv.exists()
    with args.csv.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["when", "scenario", "size", "before", "after", "ratio"])
        stamp = time.strftime("%Y-%m-%dT%H:%M")
        writer.writerows([(stamp, *row) for row in rows])


if __name__ == "__main__":
    main()
