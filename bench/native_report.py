"""The tables, target checks and plots of bench/native_core.py (from its CSV rows)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

# (op, the largest size or None for a single size, target of call/raw); n = 2 unless noted
TARGETS_N2 = [((8, 8), 0.35), ((1 << 10, 1 << 10), 0.40), ((16 << 10, 64 << 10), 0.30),
              ((1 << 20, 1 << 20), 0.45)]
MODEL_TARGET, BF16_TARGET, SMALL_TARGET, BCAST_TARGET, N4_TARGET = 1.2, 1.3, 0.5, 1.0, 0.5
Row = list[str]


def _human(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def _index(rows: list[Row]) -> dict[tuple[str, int, str, str, int, str], tuple[float, float]]:
    return {(e, int(n), op, dt, int(b), impl): (float(us), float(r))
            for e, n, op, dt, b, impl, us, r in rows}


def _line(ok: bool | None, what: str, value: str, target: str) -> str:
    mark = "-" if ok is None else ("met" if ok else "MISSED")
    return f"| {what} | {value} | {target} | {mark} |"


def targets(rows: list[Row]) -> list[str]:
    """One line per target of the issue: the measured value and whether it is met."""
    idx, out = _index(rows), ["| target | measured | wanted | |", "|---|---:|---:|---|"]
    sizes = sorted({int(r[4]) for r in rows})
    for (lo, hi), goal in TARGETS_N2:
        for size in (s for s in sizes if lo <= s <= hi):
            for impl in ("call", "step"):
                got = idx.get(("native", 2, "all_reduce", "float32", size, impl))
                if got:
                    out.append(_line(got[1] <= goal, f"n=2 all_reduce {_human(size)}, {impl}/raw",
                                     f"{got[1]:.2f}", f"<= {goal}"))
    for size in (s for s in sizes if s >= 16 << 20):
        call = idx.get(("native", 2, "all_reduce", "float32", size, "call"))
        copy = idx.get(("native", 2, "all_reduce", "float32", size, "memcpy"))
        if call and copy:
            model = (2 + 3) / 2 * copy[0]
            out.append(_line(call[0] / model <= MODEL_TARGET, f"n=2 all_reduce {_human(size)}, "
                             "call/model", f"{call[0] / model:.2f}", f"<= {MODEL_TARGET}"))
    for op, goal in (("reduce_scatter_tensor", SMALL_TARGET), ("all_gather_into_tensor", SMALL_TARGET),
                     ("broadcast", BCAST_TARGET)):
        got = [idx[k][1] for k in idx if k[:3] == ("native", 2, op) and k[5] == "call"]
        if got:
            out.append(_line(max(got) <= goal, f"n=2 {op} up to 64 KiB, call/raw (worst)",
                             f"{max(got):.2f}", f"<= {goal}"))
    for op in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        got = [(idx[k][1], k[4]) for k in idx if k[:4] == ("native", 4, op, "float32")
               and k[5] == "call" and k[4] <= 1 << 20]
        if got:
            worst = max(got)
            out.append(_line(worst[0] <= N4_TARGET, f"n=4 {op} up to 1 MiB, call/raw (worst: "
                             f"{_human(worst[1])})", f"{worst[0]:.2f}", f"<= {N4_TARGET}"))
    for n in (2, 4):
        ratios = []
        for size in sizes:
            bf, f4 = (idx.get(("native", n, "all_reduce", dt, size, "call"))
                      for dt in ("bfloat16", "float32"))
            if bf and f4:
                ratios.append((bf[0] / f4[0], size))
        if ratios:
            worst = max(ratios)
            out.append(_line(worst[0] <= BF16_TARGET, f"n={n} bfloat16/float32 all_reduce, same bytes "
                             f"(worst: {_human(worst[1])})", f"{worst[0]:.2f}", f"<= {BF16_TARGET}"))
    return out


def table(rows: list[Row]) -> list[str]:
    """Per world size, float32 all_reduce: microseconds and ratios to raw, both engines."""
    idx, out = _index(rows), []
    for n in sorted({int(r[1]) for r in rows}):
        out += [f"\nall_reduce float32, n = {n} (us; ratio to raw in the same job)\n",
                "| size | raw | call | step | numpy path | gloo |", "|---:|---:|---:|---:|---:|---:|"]
        for size in sorted({int(r[4]) for r in rows}):
            cells = []
            for engine, impl in (("native", "raw"), ("native", "call"), ("native", "step"),
                                 ("numpy", "call"), ("native", "gloo")):
                got = idx.get((engine, n, "all_reduce", "float32", size, impl))
                cells.append("-" if got is None else f"{got[0]:.2f}" + (
                    "" if impl == "raw" else f" ({got[1]:.2f}x)"))
            out.append(f"| {_human(size)} | " + " | ".join(cells) + " |")
    return out


def plot(rows: list[Row], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idx = _index(rows)
    for n in sorted({int(r[1]) for r in rows}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for (engine, m, op, dt, size, impl), (us, _) in sorted(idx.items()):
            if m == n and op == "all_reduce" and dt == "float32" and impl != "memcpy":
                label = {"raw": "raw mpi4py (preallocated)", "gloo": "torch gloo",
                         "step": "fcoll C step alone"}.get(impl, "fcoll" if engine == "native"
                                                            else "fcoll without the extension")
                if impl in ("raw", "gloo") and engine == "numpy":
                    continue
                series[label].append((size, us))
        for label, points in series.items():
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="bytes per rank", ylabel="us per call",
               title=f"float32 all_reduce on one node, n = {n}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / f"native_latency_n{n}.png", dpi=110)
        plt.close(fig)


def report(rows: list[Row], folder: Path) -> str:
    plot(rows, folder)
    return "\n".join(["# The compiled core against raw mpi4py", "", *targets(rows), *table(rows)]) + "\n"
