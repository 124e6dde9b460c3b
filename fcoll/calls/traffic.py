"""What this rank hands to its transports, counted while `fcoll.debug.traffic` is open.

Counters, per rank: fcoll calls, transport operations (``messages``: each MPI call fcoll makes
on the call's behalf, point-to-point or collective, and each step of an on-node segment)
and the bytes each sends (an MPI call: its send buffer; a segment step: the bytes this rank
writes into its slot). Transports report through `sent`, which costs one truth test when
no count is open. While one is open the fast paths stand aside (`fcoll.calls.work.fast_eligible`),
so every call is counted.

Example:
    >>> with traffic() as t:                          # every rank of 4, FCOLL_SHM=0
    ...     fc.all_reduce(np.ones(1000, np.float32))
    >>> t.calls, t.messages, t.bytes                  # recursive doubling: 2 exchanges of 4 kB
    (1, 2, 8000)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fcoll import runtime


@dataclass
class Row:
    """One fcoll call's share of a count."""

    fn: str
    ranks: tuple[int, ...]
    seq: int
    messages: int = 0
    bytes: int = 0


@dataclass
class Traffic:
    """A count in progress or finished: totals and one `Row` per fcoll call (`table`)."""

    calls: int = 0
    messages: int = 0
    bytes: int = 0
    rows: list[Row] = field(default_factory=list)
    _by_call: dict[tuple[Any, int], Row] = field(default_factory=dict, repr=False)

    def call(self, call: Any) -> Row:
        """The row of ``call`` (a `fcoll.calls.work.Call` that has begun), made at its first report."""
        key = (call.group.key, call.group.seq)
        row = self._by_call.get(key)
        if row is None:
            row = self._by_call[key] = Row(call.fn, tuple(call.group.ranks), call.group.seq)
            self.rows.append(row)
            self.calls += 1
        return row

    def table(self) -> str:
        """One line per fcoll call: function, group, call number, messages, bytes.

        Example:
            >>> print(t.table())
            call            group         #   messages      bytes
            all_reduce      [0, 1, 2, 3]  1          2       8000
        """
        lines = [f"{'call':<24}{'group':<16}{'#':>5}{'messages':>10}{'bytes':>14}"]
        for r in self.rows:
            group = str(list(r.ranks)) if len(r.ranks) <= 4 else f"[{r.ranks[0]}..{r.ranks[-1]}]"
            lines.append(f"{r.fn:<24}{group:<16}{r.seq:>5}{r.messages:>10}{r.bytes:>14}")
        lines.append(f"{'total':<40}{self.calls:>5}{self.messages:>10}{self.bytes:>14}")
        return "\n".join(lines)


ACTIVE: list[Traffic] = []  # the counts open on this rank (nested blocks each count)


def sent(call: Any, nbytes: int, messages: int = 1) -> None:
    """A transport reports ``messages`` operations sending ``nbytes`` in all for ``call``."""
    for count in ACTIVE:
        row = count.call(call)
        row.messages += messages
        row.bytes += nbytes
        count.messages += messages
        count.bytes += nbytes


@contextmanager
def traffic() -> Iterator[Traffic]:
    """Count what this rank hands to its transports inside the block (module docstring).

    Example:
        >>> with fc.debug.traffic() as t:        # every rank
        ...     fc.all_reduce(x)
        >>> t.messages <= 2 * math.ceil(math.log2(fc.get_world_size())) + 2
        True
    """
    count = Traffic()
    ACTIVE.append(count)
    runtime._state.counting = True
    runtime.changed()  # the fast paths' closures go; none is learned while counting
    try:
        yield count
    finally:
        ACTIVE.remove(count)
        runtime._state.counting = bool(ACTIVE)
        runtime.changed()
