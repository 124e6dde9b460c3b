"""The alpha-beta cost model, fitted per op from the measurements of every world size.

    t(S, n) = c + alpha * log2(n) + beta * F(op, n) * S

Only world sizes with at most one rank per core are fitted (oversubscribed timings are the
scheduler's); with a single such world size ``c`` is folded into ``alpha``.

``c`` is the per-call cost on the calling rank (Python, argument checks, allocation),
``alpha`` the cost of one communication step (latency-bound algorithms take log2(n)
steps), ``beta`` seconds per byte on the busiest link, and ``F`` nccl-tests' bus factor
(2(n-1)/n for all-reduce, (n-1)/n for gather/scatter/all-to-all, 1 for broadcast) times
nccl-tests' ``S``. The fit is least squares on relative error; a negative term is
dropped and the rest refitted.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
from common import OPS, bus_bytes, bus_factor


def design(op: str, n: int, nbytes: float) -> list[float]:
    return [1.0, math.log2(n), bus_factor(op, n) * bus_bytes(op, int(nbytes), n)]


def fit(points: list[tuple[int, float, float]], op: str) -> tuple[np.ndarray, float]:
    """points: (n, bytes, seconds) -> (coefficients [c, alpha, beta] in s, s, s/B; rms rel. error).

    With a single world size, ``c`` and ``alpha * log2(n)`` cannot be told apart: ``c`` is
    then left out, so the whole small-message time scales as log2(n) (conservative)."""
    a = np.array([design(op, n, s) for n, s, _ in points])
    t = np.array([p[2] for p in points])
    keep = [0, 1, 2] if len({p[0] for p in points}) > 1 else [1, 2]
    while True:
        coef = np.zeros(3)
        sol, *_ = np.linalg.lstsq(a[:, keep] / t[:, None], np.ones(len(t)), rcond=None)
        coef[keep] = sol
        bad = [k for k in keep if coef[k] < 0]
        if not bad:
            break
        keep.remove(bad[0])
    err = float(np.sqrt(np.mean((a @ coef / t - 1) ** 2)))
    return coef, err


def clean(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows measured with at most one rank per core (others are scheduler noise);
    all rows when there are none."""
    ok = [r for r in rows if r.get("ranks_per_node") and r.get("cores")
          and int(r["ranks_per_node"]) <= int(r["cores"])]
    return ok or rows


def predict(coef: np.ndarray, op: str, n: int, nbytes: float) -> float:
    return float(np.dot(design(op, n, nbytes), coef))


def fit_and_plot(rows: list[dict[str, str]], out: Path) -> list[dict[str, object]]:
    table: list[dict[str, object]] = []
    curves = {}
    used = clean(rows)
    for op in OPS:
        for impl in ("fcoll", "raw"):
            pts = [(int(r["n"]), float(r["bytes"]), float(r["median_us"]) * 1e-6) for r in used
                   if r["op"] == op and r["impl"] == impl and r.get("median_us")]
            if len({p[0] for p in pts}) < 1 or len(pts) < 3:
                continue
            coef, err = fit(pts, op)
            curves[op, impl] = (coef, pts)
            table.append({"op": op, "impl": impl, "c_us": coef[0] * 1e6, "alpha_us": coef[1] * 1e6,
                          "beta_ns_per_byte": coef[2] * 1e9,
                          "bandwidth_GBps": (1 / coef[2] / 1e9) if coef[2] > 0 else float("inf"),
                          "rms_rel_error": err, "t_64ranks_1MiB_us": predict(coef, op, 64, 1 << 20) * 1e6})
    if table:
        with (out / "model.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()}
                             for r in table)
        _plot(curves, out)
        for r in table:
            if r["impl"] == "fcoll":
                print(f"model {r['op']:<24} c={r['c_us']:.2f} µs  alpha={r['alpha_us']:.2f} µs  "
                      f"1/beta={r['bandwidth_GBps']:.2f} GB/s  rms error {r['rms_rel_error']:.0%}")
    return table


Curves = dict[tuple[str, str], tuple[np.ndarray, list[tuple[int, float, float]]]]


def _plot(curves: Curves, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if (op, "fcoll") in curves]
    cols = min(3, len(ops))
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops, strict=False):
        coef, pts = curves[op, "fcoll"]
        sizes = np.logspace(3, 26, 60, base=2)
        for n, color in zip([*sorted({p[0] for p in pts}), 64], ["tab:blue", "tab:green", "tab:purple", "k"],
                            strict=False):
            mine = sorted(p for p in pts if p[0] == n)
            if mine:
                ax.plot([p[1] for p in mine], [p[2] * 1e6 for p in mine], "o", ms=4, color=color,
                        label=f"measured n={n}")
            ax.plot(sizes, [predict(coef, op, n, s) * 1e6 for s in sizes], "-" if mine else "--",
                    color=color, label=f"model n={n}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("µs per call")
        ax.set_title(f"fcoll {op}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "model.png", dpi=90)
    plt.close(fig)
