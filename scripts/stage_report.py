"""The closing table of scripts/test.sh: each stage's wall time, exit status and test counts,
and the time budget (issue 36: a slow suite is found by the one who made it slow).

Reads ``STAGES/stages.tsv`` (written by scripts/stages.sh: name, seconds, exit status, group)
and each stage's log, where pytest's closing lines give the counts. Prints the table, the
slowest stages, and a last line ``total: N passed, N failed, N skipped``. Exits 1 when the
whole run took longer than the budget (``FCOLL_CI_BUDGET_MIN``, default 45 minutes), after
printing which stages took the most.

Usage::

    python scripts/stage_report.py STAGES_DIR TOTAL_SECONDS

Example (what it prints, shortened)::

    stage                       wall s  status   passed  failed  skipped
    install                         71       0        -       -        -
    n1 (side by side)              190       0     4072       0      814
      n1.shard1                    181       0     2036       0      407
    ...
    total: 27841 passed, 0 failed, 6012 skipped
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

BUDGET_ENV = "FCOLL_CI_BUDGET_MIN"
DEFAULT_BUDGET_MIN = 45.0
KINDS = ("passed", "failed", "skipped", "error")
# pytest's closing line, -q or not: "3863 passed, 1023 skipped, 1 warning in 164.39s (0:02:44)"
CLOSING = re.compile(r"^=*\s*(\d+ \w+(, \d+ \w+)*) in [\d.]+s( \([\d:]+\))?\s*=*$")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")


@dataclass
class Stage:
    name: str
    seconds: int
    status: int
    group: str  # "" alone, "*" a side-by-side group, "&" in the background, else its group
    counts: dict[str, int] = field(default_factory=dict)


def counts(log: Path) -> dict[str, int]:
    """The tests pytest counted in ``log``, summed over its closing lines (a stage may run
    pytest more than once); empty if it ran no pytest.

    Example:
        >>> counts(Path("n2.log"))          # ends with "3821 passed, 1065 skipped ... in 67s"
        {'passed': 3821, 'skipped': 1065}
    """
    found: dict[str, int] = {}
    if not log.exists():
        return found
    for line in log.read_text(errors="replace").splitlines():
        if CLOSING.match(line.strip()):
            for number, kind in COUNT.findall(line):
                kind = "error" if kind.startswith("error") else kind
                found[kind] = found.get(kind, 0) + int(number)
    return found


def read(directory: Path) -> list[Stage]:
    """The stages in the order they finished, side-by-side members after their group."""
    stages = []
    for line in (directory / "stages.tsv").read_text().splitlines():
        name, seconds, status, group = line.split("\t")
        stages.append(Stage(name, int(seconds), int(status), group, counts(directory / f"{name}.log")))
    for stage in stages:
        if stage.group == "*":
            for member in (s for s in stages if s.group == stage.name):
                for kind, n in member.counts.items():
                    stage.counts[kind] = stage.counts.get(kind, 0) + n
    ordered = []
    for stage in stages:
        if stage.group in ("", "*", "&"):
            ordered.append(stage)
            ordered.extend(s for s in stages if s.group == stage.name)
    return ordered


def table(stages: list[Stage]) -> list[str]:
    """One line per stage; members of a side-by-side group indented under it."""
    labels = [{"": s.name, "*": f"{s.name} (side by side)",
               "&": f"{s.name} (in the background)"}.get(s.group, f"  {s.name}") for s in stages]
    width = max([len(label) for label in labels] + [28])
    lines = [f"{'stage':<{width}} {'wall s':>7} {'status':>7} " + " ".join(f"{k:>8}" for k in KINDS)]
    for s, label in zip(stages, labels, strict=True):
        cells = " ".join(f"{s.counts.get(k, 0) if s.counts else '-':>8}" for k in KINDS)
        lines.append(f"{label:<{width}} {s.seconds:>7} {s.status:>7} {cells}")
    return lines


def totals(stages: list[Stage]) -> dict[str, int]:
    """Counts over every stage that ran on its own or beside others (not the groups)."""
    total = dict.fromkeys(KINDS, 0)
    for s in stages:
        if s.group != "*":
            for kind, n in s.counts.items():
                total[kind] += n
    return total


def slowest(stages: list[Stage], k: int = 5) -> list[Stage]:
    """The ``k`` stages that held the run longest (a side-by-side group as one)."""
    return sorted((s for s in stages if s.group in ("", "*")), key=lambda s: -s.seconds)[:k]


def budget_minutes() -> float:
    text = os.environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_MIN))
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"{BUDGET_ENV}: expected minutes as a number, got {text!r}") from None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: stage_report.py STAGES_DIR TOTAL_SECONDS")
    stages = read(Path(argv[0]))
    wall = int(argv[1])
    print("\n=== stages (wall seconds; tests as pytest counted them)")
    print("\n".join(table(stages)))
    top = ", ".join(f"{s.name} {s.seconds} s" for s in slowest(stages))
    print(f"whole run: {wall} s ({wall / 60:.1f} min); slowest stages: {top}")
    limit = budget_minutes()
    status = 0
    if wall > limit * 60:
        print(f"\n!!! CI BUDGET EXCEEDED: the run took {wall / 60:.1f} min, over {limit:g} min "
              f"({BUDGET_ENV}). Slowest stages: {top}. Make the slow stage faster (its 30 slowest "
              "tests are listed at its end) before adding more.")
        status = 1
    total = totals(stages)
    failed = total["failed"] + total["error"]
    print(f"total: {total['passed']} passed, {failed} failed, {total['skipped']} skipped")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
