"""Every rank's flight record (`fcoll.diagnostics.flight`), gathered and printed side by side.

A rank that reports (a missed deadline, `fcoll.debug.dump`, `python -m fcoll.run`'s abort)
sends its record to every other rank on a communicator of the recorder's own (a duplicate
of ``COMM_WORLD`` made with the world group), then takes the records that arrive until every
rank has answered or its own deadline passes. A rank waiting in a polled fcoll call (any
call with a deadline) answers from inside its wait (`serve`); a rank blocked in MPI without
a deadline, busy outside fcoll or dead cannot, and the report names it. Everything is
nonblocking: a report never waits past its deadline. The report marks, per group, the first
call number at which the ranks' records differ (another op or arguments, or no such call).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from fcoll import runtime
from fcoll.diagnostics import flight

TAG = 30611
_COMM: list[Any] = []  # the recorder's communicator, made by `start`
_HEARD: dict[int, tuple[int, list[Any]]] = {}  # rank -> (my request it answered, its record)
_ASKED: dict[int, int] = {}  # rank -> its latest request seen here
_STATE: dict[str, Any] = {"request": 0, "owe": 0, "stale": []}  # this rank's requests made;
# others' requests not answered yet; ranks whose record in the last report was an older one
_SENT: list[Any] = []  # requests of records sent, completed opportunistically

# group key (ranks, serial), seq, op, arguments as shown, the arrays' part of them
# (compared), state, seconds
Key = tuple[tuple[int, ...], int]
Entry = tuple[Key, int, str, str, str, str, float]


def start(comm_world: Any) -> None:
    """Make the recorder's communicator (collective over ``comm_world``, at `fcoll.init`)."""
    if not _COMM and flight.RING:
        _COMM.append(comm_world.Dup())


def _array(value: object) -> str | None:
    """``float32[4]`` (``cupy float32[4]``) for an array's summary, else None."""
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], (type, str)) \
            and isinstance(value[1], tuple):
        kind, shape, dtype = value
        module = kind if isinstance(kind, str) else getattr(kind, "__module__", "?").split(".")[0]
        return ("" if module == "numpy" else f"{module} ") + f"{dtype}{list(shape)}"
    return None


def _value(value: object) -> str:
    """An argument other than an array as the report shows it: ops by name (``sum``, not
    ``ReduceOp.SUM``), lists item by item, the rest as ``str``."""
    if isinstance(value, list):
        return "[" + ", ".join(_array(v) or _value(v) for v in value) + "]"
    name = getattr(value, "value", None)  # an enum (fcoll.ReduceOp)
    return name if isinstance(name, str) else str(value)


def _args(args: Any) -> tuple[str, str]:
    """An entry's arguments as shown (``x=float32[4] op=sum``, named as the contract names
    them), and their arrays alone (what ranks must agree on: the fast paths keep only the
    array, and ``debug="detail"`` compares the rest)."""
    if not args:
        return "", ""
    if _array(args) is not None:  # a fast path's entry: the array alone
        args = (("x", args),)
    shown, arrays = [], []
    for name, value in args:
        text = _array(value)
        if text is None and isinstance(value, list) and any(_array(v) for v in value):
            text = _value(value)
        if text is not None:
            arrays.append(text)
        shown.append(f"{name}={text if text is not None else _value(value)}")
    return " ".join(shown), " ".join(arrays)


def arguments(args: Any) -> str:
    """A recorded call's arguments as shown (``x=float32[4] op=sum``)."""
    return _args(args)[0]


def snapshot() -> list[Entry]:
    """This rank's record, compact: per entry its state and its duration (completed) or the
    time since it started (in flight, failed)."""
    now, out = time.perf_counter(), []
    entries = list(flight.RING.entries()) if flight.RING else []
    if flight.SOURCES and flight.RING:  # records kept elsewhere (the compiled XLA handler's):
        for source in flight.SOURCES:     # the ring's size of the latest, in time order
            entries += [e for e in source() if e[4] >= flight.RING.since]
        entries = sorted(entries, key=lambda e: e[4])[-flight.RING.size:]
    for key, seq, fn, args, begun, ended in entries:
        state = "completed" if ended > 0 else ("failed" if ended < 0 else "sent")
        out.append((key, seq, fn, *_args(args), state, (ended if ended > 0 else now) - begun))
    return out


def _publish(asking: bool) -> None:
    """Send this rank's record to every other rank, with the requests it answers (and its
    own, when ``asking``)."""
    comm = _COMM[0]
    _SENT[:] = [r for r in _SENT if not r.Test()]
    message = (comm.rank, _STATE["request"] if asking else 0, dict(_ASKED), snapshot())
    for peer in range(comm.size):
        if peer != comm.rank:
            _SENT.append(comm.isend(message, dest=peer, tag=TAG))
    _STATE["owe"] = 0


def _receive() -> None:
    """Take the records that have arrived; note the requests among them."""
    comm = _COMM[0]
    MPI = runtime.mpi()
    while comm.iprobe(source=MPI.ANY_SOURCE, tag=TAG):
        rank, request, answered, record = comm.recv(source=MPI.ANY_SOURCE, tag=TAG)
        _HEARD[rank] = (int(answered.get(comm.rank, 0)), record)
        if request > _ASKED.get(rank, 0):
            _ASKED[rank] = request
            _STATE["owe"] += 1


def serve() -> None:
    """Inside a polled wait: answer the reports in progress with this rank's record."""
    if _COMM:
        _receive()
        if _STATE["owe"]:
            _publish(asking=False)


def gather(timeout: float) -> tuple[dict[int, list[Entry]], list[int]]:
    """Every rank's record that answers this request within ``timeout`` seconds (this
    rank's own included), and the ranks that never sent one.

    Each request is numbered; a record answers it when it was sent after the request
    arrived (it names the request). Where no answer comes in time, the rank's last record
    (sent earlier) stands in. While waiting, this rank answers the others' requests."""
    mine = runtime.mpi().COMM_WORLD.Get_rank()
    if not _COMM:
        return {mine: snapshot()}, []
    comm, begun = _COMM[0], time.monotonic()
    _STATE["request"] += 1
    _receive()
    _publish(asking=True)
    while time.monotonic() - begun < timeout:
        _receive()
        if _STATE["owe"]:
            _publish(asking=True)
        if sum(1 for answered, _ in _HEARD.values() if answered >= _STATE["request"]) >= comm.size - 1:
            break
        time.sleep(1e-3)
    records = {rank: record for rank, (_, record) in _HEARD.items()}
    records[mine] = snapshot()
    _STATE["stale"] = sorted(r for r, (answered, _) in _HEARD.items()
                             if answered < _STATE["request"])
    return records, [r for r in range(comm.size) if r not in records]


def _when(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else (
        f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s")


def _row(seq: int | None, rank: int, entry: Entry | None, missing: str) -> list[str]:
    """One rank's call in a group's table: call, rank, op, arguments, state, time."""
    call = f"#{seq}" if seq is not None else ""
    if entry is None:
        return [call, str(rank), "-", missing, "", ""]
    _, _, fn, args, _, state, seconds = entry
    return [call, str(rank), fn, args, state, _when(seconds)]


def _aligned(rows: list[list[str]], marks: list[str]) -> list[str]:
    """``rows`` in columns that line up (the last column unpadded), each with its mark."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row, mark in zip(rows, marks, strict=True):
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        out.append(("  " + "  ".join(cells)).rstrip() + mark)
    return out


def _key(entry: Entry) -> tuple[str, str]:
    return entry[2], entry[4]


def divergence(records: dict[int, list[Entry]], key: Key) -> tuple[int, str] | None:
    """The first call number on the group of ``key`` at which the answering members'
    records differ, and how; None where they agree on every call they all recorded."""
    calls = {r: {e[1]: e for e in records[r] if e[0] == key} for r in key[0] if r in records}
    if len(calls) < 2:
        return None
    lowest = max((min(c) for c in calls.values() if c), default=1)  # older ones scrolled out
    top = max((max(c) for c in calls.values() if c), default=0)
    for seq in range(lowest, top + 1):
        made = {r: c.get(seq) for r, c in calls.items()}
        kinds: dict[tuple[str, str] | None, list[int]] = {}
        for r, e in made.items():
            kinds.setdefault(None if e is None else _key(e), []).append(r)
        if len(kinds) > 1:
            return seq, _difference(seq, kinds, calls)
    return None


def _difference(seq: int, kinds: dict[tuple[str, str] | None, list[int]],
                calls: dict[int, dict[int, Entry]]) -> str:
    parts = []
    for key, who in sorted(kinds.items(), key=lambda item: -len(item[1])):
        names = "rank " + ", ".join(map(str, who)) if len(who) == 1 else \
            "ranks " + ", ".join(map(str, who))
        if key is None:
            last = [f"#{max(calls[r])} {calls[r][max(calls[r])][2]}" if calls[r] else "none"
                    for r in who]
            parts.append(f"{names} made no call #{seq} (last: {', '.join(last)})")
        else:
            parts.append(f"{names} made {key[0]} {key[1]}".rstrip())
    return "; ".join(parts)


def _groups(records: dict[int, list[Entry]]) -> list[Key]:
    seen = {e[0] for record in records.values() for e in record}
    return sorted(seen, key=lambda key: (-len(key[0]), key[0], key[1]))


def _table(records: dict[int, list[Entry]], key: Key, rows: int) -> list[str]:
    """One group's table: a line per rank and call, the first difference marked."""
    members = [r for r in key[0] if r in records]
    found = divergence(records, key)
    calls = {r: {e[1]: e for e in records[r] if e[0] == key} for r in members}
    seqs = sorted({s for c in calls.values() for s in c})
    stop = found[0] if found else (seqs[-1] if seqs else 0)
    table, marks = [["call", "rank", "op", "arguments", "state", "time"]], [""]
    for seq in [s for s in seqs if s <= stop + 2][-rows:]:
        for i, r in enumerate(members):
            last = max((s for s in calls[r] if s < seq), default=None)
            missing = f"(no call #{seq}; last: #{last})" if last is not None else f"(no call #{seq})"
            table.append(_row(seq if i == 0 else None, r, calls[r].get(seq), missing))
            marks.append("  <<< first difference" if found and seq == found[0] and i == 0 else "")
    return _aligned(table, marks)


def report(records: dict[int, list[Entry]], missing: Sequence[int], reason: str,
           timeout: float, rows: int = 8, stale: Sequence[int] = ()) -> str:
    """The records of every rank, one table per group: a line per rank and call (op,
    arguments as the contract names them, state, time), the first difference marked."""
    lines = [f"fcoll flight record ({reason}): the last calls of each rank, per group"]
    for key in _groups(records):
        found = divergence(records, key)
        lines.append(f"group {list(key[0])} (group #{key[1]} of the job):")
        lines += _table(records, key, rows)
        present = [r for r in key[0] if r in records]
        if found:
            lines.append(f"  first difference at call #{found[0]}: {found[1]}")
        elif len(present) == len(key[0]):
            lines.append("  the ranks' records agree on every call")
        elif len(present) > 1:
            lines.append(f"  the records of ranks {', '.join(map(str, present))} agree on every call")
    late = [r for r in stale if r in records]
    if missing or late:
        lines.append(f"no answer within {timeout:g} s from rank(s) "
                     f"{', '.join(map(str, sorted([*missing, *late])))} (blocked in MPI without a "
                     "deadline, busy outside fcoll, or dead)"
                     + (f"; shown for rank(s) {', '.join(map(str, late))}: the record each sent "
                        "earlier" if late else ""))
    return "\n".join(lines)


def collect(reason: str, timeout: float, file: TextIO | None = sys.stderr,
            always: bool = False) -> str:
    """Gather, format, and write the report to ``file`` on the lowest answering rank (on
    this rank too when ``always``: one about to end the job)."""
    records, missing = gather(timeout)
    text = report(records, missing, reason, timeout, stale=_STATE["stale"])
    me = runtime.mpi().COMM_WORLD.Get_rank()
    if file is not None and (always or me == min(records)):
        file.write(text + "\n")
        file.flush()
    return text


def local(reason: str) -> str:
    """This rank's record alone (where no message can be sent: a watchdog thread)."""
    me = runtime.mpi().COMM_WORLD.Get_rank()
    return report({me: snapshot()}, [], reason, 0.0)



