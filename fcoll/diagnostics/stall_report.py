"""The texts of the stall watch (`fcoll.diagnostics.watch`): a stall report, and the two verdicts that
end a job whose call can never complete (a peer ended its script without making it).

Every line starts with ``[rank R]``, so the lines of many ranks interleaved on one terminal
stay readable. Pure functions of what the watch knows: the call this rank waits in, and
the lines of its peers on this node (`fcoll.diagnostics.board`).

Example:
    >>> print(stalled(wait, 60.0, peers, watch), end="")
    [rank 0] fcoll: stalled 61 s in all_reduce (call #4 on group [0, 1]: float32[4] op=sum) ...
    [rank 0]   rank 1 (this node): outside fcoll for 58 s; its last call on the group: #3
"""

from __future__ import annotations

import time
from typing import Any

from fcoll.diagnostics import board, flight_report

PEERS_SHOWN = 8


def arguments(entry: tuple[Any, ...]) -> str:
    """A flight-recorder entry's arguments as the report shows them (``float32[4] op=sum``)."""
    args = (entry[3], entry[4], entry[5]) if len(entry) == 7 else entry[3]
    return flight_report.arguments(args)


def _call(op: str, seq: int, ranks: Any, args: str = "") -> str:
    if not seq:
        return op
    where = f"call #{seq} on group {list(ranks)}" if ranks is not None else f"call #{seq}"
    return f"{op} ({where}{': ' + args if args else ''})"


def _from_frame(wait: Any) -> str:
    """What the frame itself says of an unrecorded wait (a `Work.wait`, a point-to-point
    call): read only when a report is made."""
    local = wait.frame.f_locals
    op = getattr(local.get("self"), "_op", None)
    if op is not None and hasattr(op, "group"):
        return f"{wait.op} for {op.name} (call #{op.seq} on group {list(op.group.ranks)})"
    group = next((v for v in local.values() if hasattr(v, "ranks") and hasattr(v, "seq")), None)
    return f"{wait.op} on group {list(group.ranks)}" if group is not None else wait.op


def describe(wait: Any) -> str:
    """The call of ``wait`` (a `fcoll.diagnostics.watch.Wait`) as a report names it."""
    if wait.key is None:
        return _from_frame(wait)
    return _call(wait.op, wait.seq, wait.key[0], wait.args)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _peer(line: board.Line, serial: int | None, now: float) -> str:
    last = line.seqs.get(serial) if serial is not None else None
    on_group = f"; its last call on the group: #{last}" if last is not None else ""
    if line.state in (board.ENDED, board.FAILED):
        return f"ended its script ({line.reason}){on_group}"
    if line.state == board.NOT_STARTED:
        return "has not started fcoll"
    if line.waiting:
        group = "this" if line.serial == serial else "another"
        where = f" (call #{line.seq} on {group} group)" if line.seq else ""
        return f"waits in {line.op}{where} for {_seconds(now - line.since)}"
    return f"outside fcoll{on_group}"


def _peer_lines(me: int, wait: Any, peers: list[board.Line], now: float) -> list[str]:
    ranks = wait.key[0] if wait.key is not None else None
    serial = wait.key[1] if wait.key is not None else None
    shown = [p for p in peers if p.rank != me and (ranks is None or p.rank in ranks)]
    lines = [f"  rank {p.rank} (this node): {_peer(p, serial, now)}" for p in shown[:PEERS_SHOWN]]
    if len(shown) > PEERS_SHOWN:
        lines.append(f"  and {len(shown) - PEERS_SHOWN} more ranks of this node")
    if ranks is not None:
        here = {p.rank for p in peers}
        away = [r for r in ranks if r not in here]
        if away:
            lines.append(f"  rank(s) {', '.join(map(str, away[:PEERS_SHOWN]))}"
                         f"{' ...' if len(away) > PEERS_SHOWN else ''} (other nodes): not visible "
                         f"from here; they made call #{wait.seq - 1} on the group, as this rank did")
    return lines


def stalled(wait: Any, waited: float, peers: list[board.Line], watch: Any,
            final: bool = False) -> str:
    """The stall report after ``waited`` seconds: in full the first time (and when ending the
    job), then a line."""
    me, call = watch.rank, describe(wait)
    if wait.reports and not final:
        return f"[rank {me}] fcoll: still stalled in {call} after {_seconds(waited)}\n"
    if final:
        head = (f"fcoll: FCOLL_STALL_ABORT={watch.stall_abort:g}: stalled {_seconds(waited)} in "
                f"{call}; ending the job")
        tail = []
    else:
        head = f"fcoll: stalled {_seconds(waited)} in {call}, waiting for the other ranks"
        tail = [f"  reported again at {_seconds(watch.warn * 2)} (FCOLL_STALL_WARN="
                f"{watch.warn:g}); FCOLL_STALL_ABORT=S ends the job after S s in one call; a "
                "deadline (fc.init(timeout=...)) raises CollectiveTimeoutError instead"]
    lines = [head, *_peer_lines(me, wait, peers, time.time()), *tail]
    return "".join(f"[rank {me}] {line}\n" for line in lines)


def hopeless(wait: Any, peers: list[board.Line], me: int) -> str | None:
    """The verdict when a peer on this node ended its script before making the call this
    rank waits in (its last call number on the group is lower): the call can never complete."""
    if wait.key is None or not wait.seq:
        return None
    ranks, serial = wait.key
    for line in peers:
        last = line.seqs.get(serial)
        if (line.rank != me and line.rank in ranks and line.state in (board.ENDED, board.FAILED)
                and last is not None and last < wait.seq):
            return (f"[rank {me}] fcoll: rank {line.rank} ended its script ({line.reason}) after its "
                    f"call #{last} on group {list(ranks)}; this rank waits in {describe(wait)}, "
                    "which can never complete: ending the job (FCOLL_ABORT_ON_ERROR=0 turns this off)")
    return None


def abandoned(mine: dict[int, tuple[int, Any]], peers: list[board.Line], me: int,
              reason: str) -> str | None:
    """The verdict of a rank whose script ended (``reason``) while a peer on this node waits
    in a call on one of its groups (``mine``: serial -> (last call number, ranks)) that it
    never made."""
    for line in peers:
        if line.rank == me or not line.waiting or line.serial not in mine:
            continue
        last, ranks = mine[line.serial]
        # Serials are agreed among a group's members only: disjoint groups (a split) may
        # share one. The peer waits in this rank's group only if it is a member of it.
        if line.rank in ranks and last < line.seq:
            return (f"[rank {me}] fcoll: this rank's script ended ({reason}) while rank {line.rank} "
                    f"waits in {line.op} (call #{line.seq} on group {list(ranks)}), a call this rank "
                    f"never made (its last on that group: #{last}): ending the job so that rank "
                    f"{line.rank} does not wait forever (FCOLL_ABORT_ON_ERROR=0 turns this off)")
    return None
