"""The table (rich on stdout, markdown in summary.md) and the target checks (issues 7, 17)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from common import (
    CORE_OPS,
    DP_TARGET,
    GLOO_LARGE_TARGET,
    GLOO_SMALL_TARGET,
    LARGE,
    LARGE_TARGET,
    OPS,
    SHM_FROM,
    SHM_MID,
    SHM_MID_TARGET,
    SHM_TARGET,
    SMALL_GLOO,
    SMALL_TARGET,
    human,
)

Cells = dict[tuple[int, str, int], dict[str, dict[str, str]]]  # (n, op, bytes) -> impl -> row


def cells(rows: list[dict[str, str]]) -> Cells:
    out: Cells = defaultdict(dict)
    for r in rows:
        out[int(r["n"]), r["op"], int(r["bytes"])][r["impl"]] = r
    return out


def us(row: dict[str, str] | None) -> float | None:
    return float(row["median_us"]) if row and row.get("median_us") else None


def ratios(impls: dict[str, dict[str, str]]) -> tuple[float | None, float | None]:
    """(fcoll/raw paired median, gloo/fcoll ratio of medians)."""
    f = impls.get("fcoll")
    vs_raw = float(f["vs_raw"]) if f and f.get("vs_raw") else None
    tf, tg = us(f), us(impls.get("gloo"))
    return vs_raw, (tg / tf if tf and tg else None)


def fmt_us(row: dict[str, str] | None) -> str:
    if not row:
        return "—"
    if not row.get("median_us"):
        return "n/a"
    t = float(row["median_us"])
    return f"{t:.1f}" if t < 1000 else f"{t:,.0f}"


def checks(c: Cells) -> list[tuple[bool, str]]:
    """Every target of issues 7 and 17 that the measured cells can judge: (met, line)."""
    found: list[tuple[bool, str]] = []
    for (n, op, nbytes), impls in sorted(c.items()):
        vs_raw, gloo = ratios(impls)
        where = f"n={n} {op} {human(nbytes)}"
        if op in CORE_OPS and vs_raw is not None:
            if nbytes < 64:
                found.append((vs_raw <= SMALL_TARGET, f"{where}: fcoll/raw {vs_raw:.2f} (<= {SMALL_TARGET})"))
            if nbytes >= LARGE:
                found.append((vs_raw <= LARGE_TARGET, f"{where}: fcoll/raw {vs_raw:.2f} (<= {LARGE_TARGET})"))
        if op in CORE_OPS and gloo is not None:
            if nbytes <= SMALL_GLOO:
                found.append((gloo >= GLOO_SMALL_TARGET,
                              f"{where}: gloo/fcoll {gloo:.1f} (>= {GLOO_SMALL_TARGET:g})"))
            if nbytes >= LARGE:
                found.append((gloo >= GLOO_LARGE_TARGET,
                              f"{where}: gloo/fcoll {gloo:.1f} (>= {GLOO_LARGE_TARGET:g})"))
        if op == "dp_average" and vs_raw is not None and nbytes >= LARGE:
            found.append((vs_raw <= DP_TARGET, f"{where}: fcoll/raw fused {vs_raw:.2f} (<= {DP_TARGET})"))
        found += shm_checks(n, op, nbytes, vs_raw)
    return found


def shm_checks(n: int, op: str, nbytes: int, vs_raw: float | None) -> list[tuple[bool, str]]:
    """Issue 17's targets for the on-node shared-memory path: all_reduce at n = 2."""
    if n != 2 or op != "all_reduce" or vs_raw is None:
        return []
    where = f"n={n} {op} {human(nbytes)} (shared memory)"
    found = []
    if nbytes >= SHM_FROM:
        found.append((vs_raw <= SHM_TARGET, f"{where}: fcoll/raw {vs_raw:.2f} (<= {SHM_TARGET:g})"))
    if SHM_MID[0] <= nbytes <= SHM_MID[1]:
        found.append((vs_raw <= SHM_MID_TARGET, f"{where}: fcoll/raw {vs_raw:.2f} (<= {SHM_MID_TARGET:g})"))
    return found


HEAD = ["op", "size", "fcoll µs", "q1-q3", "raw µs", "raw2 µs", "pickle µs", "gloo µs", "fcoll/raw",
        "fcoll/raw2", "gloo/fcoll", "fcoll busbw GB/s", "raw busbw GB/s"]


def table_rows(c: Cells, n: int) -> list[list[str]]:
    out = []
    last = ""
    for (m, op, nbytes), impls in sorted(c.items(), key=lambda kv: (kv[0][0], _op_order(kv[0][1]), kv[0][2])):
        if m != n:
            continue
        f = impls.get("fcoll")
        vs_raw, gloo = ratios(impls)
        spread = f"{float(f['q1_us']):.4g}-{float(f['q3_us']):.4g}" if f and f.get("q1_us") else ""
        bus = [f"{float(impls[k]['busbw_GBps']):.3f}" if k in impls and impls[k].get("busbw_GBps") else "—"
               for k in ("fcoll", "raw")]
        raw2 = impls.get("raw2")
        vs_raw2 = float(f["vs_raw"]) / float(raw2["vs_raw"]) if f and raw2 and raw2.get("vs_raw") \
            and f.get("vs_raw") else None
        out.append([op if op != last else "", human(nbytes), fmt_us(f), spread, fmt_us(impls.get("raw")),
                    fmt_us(raw2), fmt_us(impls.get("pickle")), fmt_us(impls.get("gloo")),
                    f"{vs_raw:.2f}" if vs_raw is not None else "—",
                    f"{vs_raw2:.2f}" if vs_raw2 is not None else "—",
                    f"{gloo:.1f}" if gloo is not None else "—", *bus])
        last = op
    return out


def _op_order(op: str) -> int:
    return OPS.index(op) if op in OPS else len(OPS)


def notes(rows: list[dict[str, str]]) -> list[str]:
    seen = dict.fromkeys(f"{r['impl']}: {r['note']}" for r in rows if r.get("note"))
    return list(seen)


def report(rows: list[dict[str, str]], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    c = cells(rows)
    console = Console(width=160)
    md: list[str] = []
    first = rows[0]
    setup = (f"{first.get('mpi_library', '')}, thread level {first.get('thread_level', '')}, "
             f"{first.get('cores', '?')} cores, measured {first.get('date', '')}")
    for n in sorted({k[0] for k in c}):
        per_node = next((r.get("ranks_per_node") for r in rows if int(r["n"]) == n), "?")
        title = f"n = {n} ({per_node} ranks on this node), {setup}"
        table = Table(title=title)
        for h in HEAD:
            table.add_column(h, justify="left" if h in ("op", "size") else "right")
        body = table_rows(c, n)
        for i, r in enumerate(body):
            table.add_row(*r, end_section=i + 1 < len(body) and body[i + 1][0] != "")
        console.print(table)
        md += [f"**{title}**", "", "| " + " | ".join(HEAD) + " |",
               "|" + "|".join("---" if h in ("op", "size") else "---:" for h in HEAD) + "|"]
        md += ["| " + " | ".join(r) + " |" for r in body] + [""]
    results = checks(c)
    met = sum(ok for ok, _ in results)
    console.print(f"targets: {met} of {len(results)} met", highlight=False)
    for ok, line in results:
        if not ok:
            console.print(f"  MISS {line}", highlight=False)
    for line in notes(rows):
        console.print(f"note: {line}", highlight=False)
    md += [f"Targets: {met} of {len(results)} met.", ""]
    md += [f"- MISS {line}" for ok, line in results if not ok] + [""]
    md += [f"- note: {line}" for line in notes(rows)]
    (out / "summary.md").write_text("\n".join(md) + "\n")
