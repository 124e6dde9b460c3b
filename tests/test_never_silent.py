"""Never silent by default (API.md, "Never silent"): whole jobs launched from the
world-size-1 pass, with nothing switched on but what the test names. A failing rank ends
the job, a rank that ends while others wait ends it too, a stall reports itself, ranks
that disagree on the shared-memory path raise everywhere, MPI's own errors name the call,
and deadlines keep their word. Each case that could hang has a short limit of its own
(FCOLL_STALL_ABORT, a deadline, the subprocess timeout), so the suite never hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fcoll as fc
from fcoll.diagnostics import excepthook
from tests import jobs

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
SIZES = [2, 3]


def _job(tmp_path: Path, body: str, n: int = 2, env: dict[str, str] | None = None,
         limit: float = 60, head: str = "") -> tuple[int, str, float]:
    """Run ``body`` after ``import fcoll as fc`` on ``n`` ranks with plain ``python``; the
    exit status, stdout + stderr, and the seconds it took."""
    script = tmp_path / "job.py"
    script.write_text(head + "import os, sys, time\nimport numpy as np\nimport fcoll as fc\n"
                      "r = fc.get_rank()\n" + textwrap.dedent(body))
    environment = {**jobs.environment(), "FCOLL_STALL_WARN": "0", **(env or {})}
    start = time.monotonic()
    done = subprocess.run(jobs.command(n, sys.executable, str(script)), env=environment,
                          capture_output=True, text=True, timeout=limit, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


# -- a failing rank ends the job --------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize("n", SIZES)
def test_an_exception_right_after_import_ends_the_job(tmp_path, n):
    code, out, took = _job(tmp_path, f"""
        if r == {n - 1}:
            raise ValueError("boom")
        fc.all_reduce(np.ones(3))        # the others would wait forever
    """, n)
    assert code != 0 and took < 30, out
    assert f"[rank {n - 1}] ValueError: boom" in out and f"[rank {n - 1}] Traceback" in out, out
    assert "the uncaught ValueError above ended this rank's script: ending the job" in out, out


def test_a_caught_exception_and_sys_exit_0_end_nothing(tmp_path):
    code, out, _ = _job(tmp_path, """
        try:
            raise ValueError("handled")
        except ValueError:
            pass
        fc.all_reduce(np.ones(3))
        print(f"rank {r} done", flush=True)
        sys.exit(0)
    """)
    assert code == 0 and "rank 0 done" in out and "rank 1 done" in out, out
    assert "ending the job" not in out, out


@pytest.mark.parametrize("case", ["off", "interactive"])
def test_the_hook_stays_quiet_when_off_or_interactive(tmp_path, case):
    """FCOLL_ABORT_ON_ERROR=0, or an interactive interpreter (``sys.ps1`` is set, as in the
    REPL and after ``python -i``; mpiexec gives no rank a terminal to read from): rank 1
    fails alone, rank 0 finishes its own work (it makes no call rank 1 would miss)."""
    env = {"FCOLL_ABORT_ON_ERROR": "0"} if case == "off" else {}
    _code, out, _ = _job(tmp_path, """
        fc.barrier()
        if r == 1:
            raise ValueError("boom")
        time.sleep(1.0)
        print("rank 0 done", flush=True)
    """, env=env, head="import sys\nsys.ps1 = '>>> '\n" if case == "interactive" else "")
    assert "ValueError: boom" in out and "rank 0 done" in out, out
    assert "ending the job" not in out and "MPI_Abort" not in out, out


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_hook_of_the_program_is_kept(tmp_path, when):
    """The program's own sys.excepthook runs; set before importing fcoll, fcoll's hook calls
    it; set after, fcoll's at-exit check still ends the job."""
    hook = ("def mine(kind, value, tb):\n    print('MY HOOK', value, file=sys.stderr, flush=True)\n"
            "sys.excepthook = mine\n")
    body = "if r == 1:\n    raise ValueError('boom')\nfc.all_reduce(np.ones(3))\n"
    code, out, took = _job(tmp_path, body if when == "before" else hook + body,
                           head="import sys\n" + hook if when == "before" else "")
    assert code != 0 and took < 30, out
    assert "MY HOOK boom" in out and "ending the job" in out, out


def test_the_hook_is_off_under_fcoll_testing():
    """This suite runs under fcoll.testing, which reports failures itself."""
    assert excepthook._STATE["testing"] and not excepthook.ends_job(ValueError)


# -- a rank that ends while others wait -------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_a_rank_that_ends_normally_while_others_wait_ends_the_job(tmp_path, n):
    code, out, took = _job(tmp_path, """
        fc.barrier()
        if r == 1:
            sys.exit(0)                  # returns, no error
        fc.all_reduce(np.ones(3))
    """, n)
    assert code != 0 and took < 20, out
    assert "rank 1 ended its script (it returned or called sys.exit) after its call #1" in out, out
    assert "all_reduce (call #2 on group" in out and "which can never complete" in out, out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize(("n", "on"), [(2, "1"), (3, "1"), (2, "0")])
def test_a_rank_whose_launcher_is_gone_ends_itself(tmp_path, n, on):
    """The launcher's process that started the ranks is killed (as when an MPI_Abort misses a
    rank and the launcher goes): the ranks, one waiting in a collective and the others
    outside fcoll, would wait forever; each ends within a few ticks of its watch, and says
    why on its stderr. With ``FCOLL_ABORT_ON_ERROR=0`` they are left be (and killed here)."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads process states from /proc")
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        import numpy as np
        import fcoll as fc
        r = fc.get_rank()
        sys.stderr = open(Path({str(tmp_path)!r}) / f"err{{r}}", "w", buffering=1)  # outlives the launcher
        fc.barrier()
        (Path({str(pids)!r}) / str(r)).write_text(f"{{os.getpid()}} {{os.getppid()}}")
        if r == 0:
            fc.all_reduce(np.ones(3))    # its peers never call it
        time.sleep(300)
    """))
    env = {**jobs.environment(), "FCOLL_STALL_WARN": "0", "FCOLL_ABORT_ON_ERROR": on}
    job = subprocess.Popen(jobs.command(n, sys.executable, str(script)), env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    ranks: list[list[int]] = []
    try:
        until = time.monotonic() + 60
        while len(list(pids.iterdir())) < n and time.monotonic() < until and job.poll() is None:
            time.sleep(0.05)
        time.sleep(0.2)  # every file written whole
        ranks = [[int(v) for v in (pids / str(r)).read_text().split()] for r in range(n)]
        assert len(ranks) == n, job.poll()
        for parent in {ppid for _, ppid in ranks}:
            os.kill(parent, signal.SIGKILL)
        until = time.monotonic() + (15 if on == "1" else 3)
        while any(_alive(pid) for pid, _ in ranks) and time.monotonic() < until:
            time.sleep(0.1)
        left = [pid for pid, _ in ranks if _alive(pid)]
    finally:
        for pid, _ in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        job.kill()
        out = job.communicate()[0]
    errors = "".join((tmp_path / f"err{r}").read_text() for r in range(n))
    if on == "0":
        assert len(left) == n and "is gone" not in errors, out + errors
        return
    assert left == [], out + errors
    for r, (_, parent) in enumerate(ranks):
        assert (f"[rank {r}] fcoll: the launcher's process that started this rank (pid {parent}) "
                "is gone, and the job with it: this rank ends") in errors, out + errors


# -- stalls report themselves ------------------------------------------------------------


def test_a_rank_that_ends_is_not_confused_with_a_group_it_is_not_in(tmp_path):
    """A split makes disjoint groups whose members agree on the same serial: rank 1 ends
    (its group [1] made no call) 2 s in, while rank 0 has waited since the start in a call
    on group [0, 2] (rank 2 comes at 3.5 s). Nobody waits for rank 1: the job must finish
    normally."""
    code, out, _ = _job(tmp_path, """
        g = fc.world().split(1 if r == 1 else 0)
        if r == 1:
            time.sleep(2)                  # rank 0's watch has published its wait by now
        else:
            if r == 2:
                time.sleep(3.5)
            assert fc.all_reduce(np.ones(2), group=g)[0] == 2
        print(f"rank {r} done", flush=True)
    """, 3)
    assert code == 0, out
    assert all(f"rank {k} done" in out for k in range(3)) and "ending the job" not in out, out


def test_a_wait_left_by_a_timeout_is_not_read_as_a_wait_at_the_end(tmp_path):
    """Rank 1 waits 1.5 s in a call on a group rank 0 never calls, until its deadline (its
    watch publishes the wait meanwhile); then rank 0 ends at once, most often before rank 1's
    watch ticks again (once a second), while rank 1 sleeps outside fcoll. Rank 0's end must
    not take that stale line for a peer waiting on it."""
    code, out, _ = _job(tmp_path, """
        g = fc.new_group([0, 1], timeout=1.5)
        if r == 1:
            try:
                fc.all_reduce(np.ones(2), group=g)
            except fc.CollectiveTimeoutError:
                print("rank 1 timed out", flush=True)
        fc.barrier()
        if r == 1:
            time.sleep(2)
        print(f"rank {r} done", flush=True)
    """)
    assert code == 0, out
    assert "rank 1 timed out" in out and "rank 0 done" in out and "ending the job" not in out, out


def test_the_stall_report_names_the_call_and_the_peers(tmp_path):
    code, out, _ = _job(tmp_path, """
        fc.all_reduce(np.ones(3))
        if r == 1:
            time.sleep(2.6)              # late, outside fcoll
        fc.all_reduce(np.ones(3))
        print(f"rank {r} done", flush=True)
    """, env={"FCOLL_STALL_WARN": "1", "FCOLL_STALL_ABORT": "20"})
    assert code == 0 and "rank 0 done" in out and "rank 1 done" in out, out
    assert ("[rank 0] fcoll: stalled 1.0 s in all_reduce (call #2 on group [0, 1]: x=float64[3]"
            in out), out
    assert "[rank 0]   rank 1 (this node): outside fcoll; its last call on the group: #1" in out, out
    assert "[rank 0] fcoll: still stalled in all_reduce (call #2 on group [0, 1]" in out, out
    assert "after 2.0 s" in out and "after 4.0 s" not in out, out


@pytest.mark.parametrize("shm", ["0", "auto"])
def test_stall_abort_ends_a_hang_the_mpi_path_cannot_see(tmp_path, shm):
    """sum on rank 0, max on rank 1, 4 floats: through MPI (FCOLL_SHM=0) the ranks wait in
    different MPI calls, which only the stall watch can tell. With the default setting and
    the compiled core, 32 bytes go through the segment, whose fingerprint tells at once."""
    from fcoll.backends import native

    code, out, took = _job(tmp_path, """
        fc.all_reduce(np.ones(4))
        fc.all_reduce(np.ones(4), "sum" if r == 0 else "max")
        print(f"rank {r} returned", flush=True)
    """, env={"FCOLL_SHM": shm, "FCOLL_STALL_ABORT": "2"})
    assert code != 0 and took < 20 and "returned" not in out, out
    if shm == "auto" and native.module() is not None:
        assert "CollectiveMismatchError: all_reduce" in out and "differ in op" in out, out
        assert "FCOLL_STALL_ABORT" not in out, out
        return
    assert "fcoll: FCOLL_STALL_ABORT=2: stalled 2.0 s in all_reduce (call #2 on group [0, 1]" in out, out
    assert "fcoll flight record" in out, out


# -- disagreement on the shared-memory path raises, even with debug off -----------------

# (the call, its disagreement); the calls fit the segment's first size (64 KiB): every
# rank's first try goes the fast path where it has learned one (rank 0), the full path else
MISMATCH = {
    "op": ('fc.all_reduce(np.ones(16384, np.float32), "sum" if r == 0 else "max")', "op"),
    "dtype": ("fc.all_reduce(np.ones(16384, np.float32 if r == 0 else np.int32))", "dtype"),
    "root": ("fc.broadcast(np.ones(8192), src=r)", "root"),
    "elements": ("fc.all_reduce(np.ones(16384 - r, np.float32))", "elements"),
}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("case", sorted(MISMATCH))
def test_disagreement_through_the_segment_raises_on_every_rank(tmp_path, n, case):
    call, what = MISMATCH[case]
    code, out, _ = _job(tmp_path, f"""
        fc.all_reduce(np.ones(16384, np.float32))    # the segment made, fast paths learned
        fc.broadcast(np.ones(8192), src=0)
        for path in ("fast", "full"):
            if path == "full":
                fc.init(timeout=60)                   # a deadline: the full path
            try:
                {call}
                print(f"rank {{r}} {{path}}: no error", flush=True)
            except fc.CollectiveMismatchError as error:
                print(f"rank {{r}} {{path}}: {{str(error).splitlines()[0]}}", flush=True)
            assert fc.all_reduce(np.ones(3))[0] == fc.get_world_size()   # still usable
    """, n, env={"FCOLL_SHM": "1"})
    assert code == 0, out
    for rank in range(n):
        for path in ("fast", "full"):
            assert (f"rank {rank} {path}: broadcast" if case == "root" else
                    f"rank {rank} {path}: all_reduce") in out, out
            assert f"made different calls (they differ in {what};" in out, out
    assert "no error" not in out, out


# -- MPI's own errors name the call -------------------------------------------------------


def test_an_error_inside_mpi_names_the_call_and_ends_the_job(tmp_path):
    """A broadcast whose ranks pass 4 and 5 elements through MPI: MPICH returns the error
    on the rank that receives too little."""
    code, out, took = _job(tmp_path, """
        fc.barrier()
        y = fc.broadcast(np.ones(4 + r), src=0)
        fc.barrier()
        print(f"rank {r} survived", flush=True)
    """, env={"FCOLL_SHM": "0"})
    assert code != 0 and took < 20 and "survived" not in out, out
    assert "fcoll: broadcast (call #2 on group [0, 1]) failed in MPI:" in out, out
    assert "Likely cause: the ranks passed different sizes" in out, out


# -- deadlines keep their word --------------------------------------------------------------


@pytest.mark.parametrize("seconds", [1.5, 5.0])
def test_a_deadline_error_arrives_within_half_a_second(tmp_path, seconds):
    # The line goes to a file too: the job's output may be lost in the abort's teardown.
    said = tmp_path / "said"
    code, out, _ = _job(tmp_path, f"""
        g = fc.new_group(timeout={seconds})
        fc.all_reduce(np.ones(3), group=g)
        if r == 1:
            time.sleep({seconds} + 3)            # late
        t0 = time.monotonic()
        try:
            fc.all_reduce(np.ones(3), group=g)
        except fc.CollectiveTimeoutError:
            line = f"rank {{r}} raised after {{time.monotonic() - t0:.3f}} s"
            print(line, flush=True)
            if r == 0:
                open({str(said)!r}, "w").write(line + "\\n")
        fc.abort(3) if r == 0 else time.sleep(60)
    """, limit=seconds + 30)
    out += said.read_text() if said.exists() else ""
    lines = [line for line in out.splitlines() if line.startswith("rank 0 raised after")]
    assert lines, f"exit status {code}: {out}"
    took = float(lines[0].split()[-2])
    assert seconds <= took <= seconds + 0.5, out


# -- the fingerprint itself ------------------------------------------------------------------


def test_fingerprints_tell_what_the_contract_compares():
    import numpy as np

    from fcoll.calls import fingerprint as fp

    f4, i4 = np.dtype("float32"), np.dtype("int32")
    calls = [fp.of("all_reduce", "sum", f4), fp.of("all_reduce", "max", f4),
             fp.of("all_reduce", "sum", i4), fp.of("broadcast", "", f4, 0),
             fp.of("broadcast", "", f4, 1), fp.of("reduce_scatter_tensor", "sum", f4),
             fp.of("all_reduce", "logaddexp", f4)]
    assert len(set(calls)) == len(calls) and all(c > 0 for c in calls)
    assert fp.describe(calls[4], 7) == {"call": "broadcast", "op": "-", "dtype": "float32",
                                        "elements": "7", "root": "1"}
    assert fp.describe(calls[-1], 1)["op"] == "logaddexp"
    assert fp.of("all_reduce", "sum", f4) | fp.kind_bits("reduce_scatter_tensor") == calls[5]
    text = str(fp.mismatch("all_reduce", (0, 2), [(calls[0], 4), (calls[1], 4)]))
    assert "they differ in op;" in text and "0     all_reduce  sum" in text, text
