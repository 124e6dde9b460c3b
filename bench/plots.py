"""PNG plots: latency and bus bandwidth against message size, one line per implementation."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from common import OPS

COLORS = {"fcoll": "tab:blue", "raw": "tab:gray", "raw2": "tab:olive", "pickle": "tab:orange",
          "gloo": "tab:red"}


def _series(rows: list[dict[str, str]], n: int) -> dict[str, dict[str, list[tuple[float, ...]]]]:
    """op -> impl -> [(bytes, median, q1, q3, busbw)] for world size n, sorted by size."""
    out: dict[str, dict[str, list[tuple[float, ...]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if int(r["n"]) == n and r.get("median_us"):
            out[r["op"]][r["impl"]].append((float(r["bytes"]), float(r["median_us"]),
                                            float(r["q1_us"]), float(r["q3_us"]), float(r["busbw_GBps"])))
    for impls in out.values():
        for points in impls.values():
            points.sort()
    return out


def _grid(ops: list[str]):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(ops))
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    return plt, fig, axes.flat


def draw(rows: list[dict[str, str]], out: Path) -> None:
    for n in sorted({int(r["n"]) for r in rows}):
        series = _series(rows, n)
        ops = [op for op in OPS if op in series]
        for metric in ("latency", "busbw"):
            plt, fig, axes = _grid(ops)
            for ax, op in zip(axes, ops, strict=False):
                for impl, pts in series[op].items():
                    x = [p[0] for p in pts]
                    color = COLORS.get(impl)
                    if metric == "latency":
                        ax.plot(x, [p[1] for p in pts], "o-", ms=3, label=impl, color=color)
                        ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], alpha=0.2, color=color)
                        ax.set_yscale("log")
                        ax.set_ylabel("µs per call (median, q1-q3)")
                    else:
                        ax.plot(x, [p[4] for p in pts], "o-", ms=3, label=impl, color=color)
                        ax.set_ylabel("bus bandwidth GB/s")
                ax.set_xscale("log", base=2)
                ax.set_xlabel("bytes per rank")
                ax.set_title(f"{op}, n={n}")
                ax.grid(True, which="major", alpha=0.3)
                ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / f"{metric}_n{n}.png", dpi=90)
            plt.close(fig)
