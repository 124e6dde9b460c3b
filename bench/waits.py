"""Waits that yield (issue 37): all_reduce latency before and after, in the same run.

    .venv/bin/python bench/waits.py --before /tmp/before [--repeat 3] [--torch]

``--before`` is a checkout of the commit to compare with, its compiled core built
(``python setup.py build_ext --inplace`` there); this checkout is "after". Each scenario
runs both trees in turns (``--repeat`` times, the order alternating), and the table gives
the median per tree and their ratio (after / before; below 1: faster):

- ``n=2 quiet``: 8 B and 64 KiB all_reduce at 2 ranks on this machine;
- ``n=4 on 2 cores``: the same at 4 ranks (more ranks than this machine's 2 cores);
- ``n=2 + 2 busy``: 2 ranks beside two processes that spin (``while True: pass``);
- ``n=4, rank 0 late 1 ms``: 4 ranks on the 2 cores, rank 0 computing 1 ms before each call
  (the others wait for it: what they do meanwhile decides how much core it gets);
- per scenario also the ranks' CPU time over the wall time (``cpu`` rows);
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
# name -> (ranks, busy processes beside, ms rank 0 computes before each call)
SCENARIOS = {"n=2 quiet": (2, 0, 0.0), "n=4 on 2 cores": (4, 0, 0.0), "n=2 + 2 busy": (2, 2, 0.0),
             "n=4, rank 0 late 1 ms": (4, 0, 1.0)}


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


def latencies(tree: Path, n: int, seconds: float, late: float) -> dict[str, float]:
    """Per size: latency (``"8 B"``) and the ranks' CPU share (``"8 B cpu"``)."""
    out = run(tree, n, [str(HERE / "waits_worker.py"), "--sizes", "8", "65536", "--seconds",
                        str(seconds), "--late", str(late)])
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return {**{f"{a} B": float(b) for a, b, _ in rows}, **{f"{a} B cpu": float(c) for a, _, c in rows}}


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
        for name, (n, load, late) in SCENARIOS.items():
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for tree in order:
                with busy(load):
                    for size, value in latencies(trees[tree], n, args.seconds, late).items():
                        results.setdefault((name, size, tree), []).append(value)
        if args.torch:
            for tree in (list(trees) if i % 2 == 0 else list(reversed(trees))):
                with busy(2):
                    results.setdefault(("DDP step + 2 busy", "fcoll/gloo", tree), []).append(
                        ddp_ratio(trees[tree]))
    rows, spans = [], []
    for name, size in dict.fromkeys((k[0], k[1]) for k in results):
        old, new = results[(name, size, "before")], results[(name, size, "after")]
        rows.append((name, size, statistics.median(old), statistics.median(new),
                     statistics.median(new) / statistics.median(old)))
        spans.append(f"{min(old):.2f}-{max(old):.2f} / {min(new):.2f}-{max(new):.2f}")
    print(f"{'scenario':<22} {'size':<11} {'before':>9} {'after':>9} {'after/before':>12}  "
          "range (before / after)")
    for (name, size, before, after, ratio), span in zip(rows, spans, strict=True):
        print(f"{name:<22} {size:<11} {before:>9.2f} {after:>9.2f} {ratio:>12.2f}  {span}")
    print(f"(latency in us per call, median of {args.repeat} runs; 'cpu' rows: the ranks' CPU time "
          "over wall time, 1.0 = a core each; DDP rows: fcoll/gloo step time)")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    first = not args.csv.exists()
    with args.csv.open("a", newline="") as f:
        writer = csv.writer(f)
        if first:
            writer.writerow(["when", "scenario", "size", "before", "after", "ratio"])
        stamp = time.strftime("%Y-%m-%dT%H:%M")
        writer.writerows([(stamp, *row) for row in rows])


if __name__ == "__main__":
    main()
