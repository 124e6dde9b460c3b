"""fcoll's numeric-code functions against raw mpi4py, at n = 2 and 4 (issue 26).

    .venv/bin/python bench/numeric.py                       # n = 2 and 4, ~5 min here
    .venv/bin/python bench/numeric.py -n 2 --quick          # 3 sizes, short batches
    .venv/bin/python bench/numeric.py --out bench/results/x --report-only

Launches ``mpiexec -n N python bench/numeric_worker.py`` per world size (what each section
times: that file's docstring), then writes into ``bench/results/<date>/`` (git-ignored):
``numeric.csv`` (one row per n, section, case, size, implementation), ``numeric.md`` (the
tables: median time per call and fcoll/raw, the median of per-batch ratios; each the
median over ``--runs`` jobs per world size, 3 by default) and
``numeric.png`` (fcoll/raw against size, one panel per section). With more ranks than
cores timings are scheduler noise: compare ratios within one run only.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import human  # noqa: E402
from run import launcher_flags  # noqa: E402

SECTIONS = ("scan", "exscan", "sendrecv", "halo", "cg")
TARGET = 1.2  # issue 26: no worse than 1.2x raw at any size


def launch(n: int, csv_path: Path, args: argparse.Namespace, run: int) -> int:
    python = sys.executable
    mpiexec = os.environ.get("MPIEXEC") or str(Path(python).parent / "mpiexec")
    cmd = [mpiexec, *launcher_flags(mpiexec, n), "-n", str(n), python,
           str(HERE / "numeric_worker.py"), "--csv", str(csv_path), "--batches", str(args.batches),
           "--run", str(run)]
    cmd += ["--quick"] if args.quick else []
    env = {**os.environ, "MPIEXEC_TIMEOUT": str(args.timeout), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, timeout=args.timeout + 60).returncode


def read(path: Path) -> list[dict[str, str]]:
    """The rows of every run, each cell's figures the median over the runs."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    cells: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        cells[(r["n"], r["section"], r["case"], r["size"], r["impl"])].append(r)
    merged = []
    for runs in cells.values():
        row = dict(runs[0])
        for key in ("median_us", "q1_us", "q3_us", "ratio"):
            row[key] = str(statistics.median(float(r[key]) for r in runs))
        row["runs"] = str(len(runs))
        merged.append(row)
    return merged


def _label(section: str, size: str) -> str:
    return human(int(size)) if section in ("scan", "exscan", "sendrecv") else f"{size}^2"


def table(rows: list[dict[str, str]]) -> str:
    """Markdown: per section and n, one line per (case, size): each implementation's median
    and each fcoll variant's /raw (and fcoll/raw+copy for the halo)."""
    out: list[str] = []
    cells: dict[tuple[str, int], dict[tuple[str, str], dict[str, dict[str, str]]]] = \
        defaultdict(lambda: defaultdict(dict))
    for r in rows:
        cells[(r["section"], int(r["n"]))][(r["case"], r["size"])][r["impl"]] = r
    for (section, n), by_size in sorted(cells.items(), key=lambda kv: (SECTIONS.index(kv[0][0]), kv[0][1])):
        impls = list(next(iter(by_size.values())))
        ours = [i for i in impls if i.startswith("fcoll")]  # fcoll, and its variants
        head = ["case", "size", *(f"{i} µs" for i in impls), *(f"{i}/raw" for i in ours)]
        head += ["fcoll/(raw+copy)"] if "raw+copy" in impls else []
        out += [f"\n**{section}, n = {n}**\n", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        for (case, size), got in by_size.items():
            line = [case, _label(section, size)] + [f"{float(got[i]['median_us']):.1f}" for i in impls]
            line += [f"{float(got[i]['ratio']):.2f}" for i in ours]
            if "raw+copy" in got:
                line.append(f"{float(got['fcoll']['ratio']) / float(got['raw+copy']['ratio']):.2f}")
            out.append("| " + " | ".join(line) + " |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    panels = [("scan", "exscan"), ("sendrecv",), ("halo",), ("cg",)]
    for ax, sections in zip(axes, panels, strict=True):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        copies = {(r["n"], r["case"], r["size"]): float(r["ratio"]) for r in rows
                  if r["impl"] == "raw+copy"}
        for r in rows:
            if r["section"] in sections and r["impl"].startswith("fcoll"):
                variant = "" if r["impl"] == "fcoll" else f" ({r['impl']})"
                key = f"{r['section']}{variant} {r['case']} n={r['n']}"
                series[key].append((int(r["size"]), float(r["ratio"])))
                if r["section"] == "halo" and not variant:  # against raw on a copy
                    copy = copies[(r["n"], r["case"], r["size"])]
                    series[key + " vs raw+copy"].append((int(r["size"]), float(r["ratio"]) / copy))
        for name, points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points],
                    "o--" if name.endswith("copy") else "o-", ms=3, label=name)
        ax.axhline(TARGET, color="tab:red", lw=0.8, ls="--", label=f"{TARGET}x")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank" if sections[0] in ("scan", "sendrecv") else "block side / grid side")
        ax.set_ylabel("fcoll / raw mpi4py (median of batch ratios)")
        ax.set_title(" and ".join(sections))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3, help="jobs per world size; the report "
                        "gives the median over them")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--out", type=Path, help="output folder (default bench/results/<date>)")
    parser.add_argument("--report-only", action="store_true", help="redo the table and plot")
    args = parser.parse_args()
    out = args.out or HERE / "results" / time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "numeric.csv"
    if not args.report_only:
        path.unlink(missing_ok=True)
        for run in range(args.runs):  # runs interleaved across world sizes: noise spreads out
            for n in args.n:
                if launch(n, path, args, run) != 0:
                    sys.exit(f"the job at n = {n} failed")
    rows = read(path)
    text = table(rows)
    (out / "numeric.md").write_text(text)
    plot(rows, out / "numeric.png")
    print(text)
    print(f"wrote {path}, {out / 'numeric.md'}, {out / 'numeric.png'}")


if __name__ == "__main__":
    main()
