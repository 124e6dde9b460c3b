"""A deadline holds on every rank of the call, including a rank that arrives after the others
gave up (API.md, "Never silent"): on every transport, the late rank raises
`CollectiveTimeoutError` within half a second of its own deadline (at once, told by the
ranks that gave up: `fcoll.calls.notices`), the group stays unusable on every rank, the world
keeps working and the job ends with status 0.

Jobs of the world-size-1 pass at n = 2 and 3: the last rank starts its call only once every
other rank has caught its error (a file each), so the order never depends on the machine's
speed; the job's own limit turns a hang into a failure.
"""

from __future__ import annotations

import subprocess

import pytest

import fcoll as fc
from tests import jobs

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
TRANSPORTS = {"segment": {"FCOLL_SHM": "1", "FCOLL_NATIVE": "1"},
              "numpy segment": {"FCOLL_SHM": "1", "FCOLL_NATIVE": "0"},
              "mpi": {"FCOLL_SHM": "0"}}
DEADLINE = 0.5
LATE_BY = 0.5  # the error arrives this long after the late rank's own deadline at most

BODY = """
    from pathlib import Path
    folder, n, deadline, earlier = Path({folder!r}), fc.get_world_size(), {deadline}, {earlier}
    g = fc.new_group(timeout=deadline)
    for _ in range(earlier):  # calls every rank makes on time: the segment exists
        assert fc.all_reduce(np.ones(4, np.float32), group=g)[0] == n
    fc.barrier()
    if r < n - 1:
        start = time.monotonic()
        try:
            fc.all_reduce(np.ones(4, np.float32), group=g)
            print(f"rank {{r}} returned")
        except fc.CollectiveTimeoutError:
            print(f"rank {{r}} gave up after {{time.monotonic() - start:.2f}} s")
        (folder / f"gave_up.{{r}}").touch()
    else:
        while len(list(folder.glob("gave_up.*"))) < n - 1:
            time.sleep(0.01)
        start = time.monotonic()
        try:
            y = fc.all_reduce(np.ones(4, np.float32), group=g)
            print(f"rank {{r}} late returned {{y}}")
        except fc.CollectiveTimeoutError as error:
            print(f"rank {{r}} late raised after {{time.monotonic() - start:.2f}} s: {{error}}")
    try:
        fc.all_reduce(np.ones(1), group=g)
        print(f"rank {{r}} used the group again")
    except RuntimeError as error:
        assert "unusable" in str(error), error
    total = fc.all_reduce(np.ones(1))[0]
    print(f"rank {{r}} world {{total:g}}")
"""


@pytest.mark.parametrize("earlier", [0, 1], ids=["first call", "later call"])
@pytest.mark.parametrize("transport", list(TRANSPORTS))
@pytest.mark.parametrize("n", [2, 3])
def test_a_late_rank_raises_by_its_own_deadline(tmp_path, n, transport, earlier):
    body = BODY.format(folder=str(tmp_path), deadline=DEADLINE, earlier=earlier)
    try:
        code, out, _ = jobs.script(tmp_path, body, n, TRANSPORTS[transport], limit=40)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the job hung (a rank waited past its deadline): {error.stdout!r} {error.stderr!r}")
    assert code == 0, out
    late = [line for line in out.splitlines() if line.startswith(f"rank {n - 1} late")]
    assert len(late) == 1 and " raised after " in late[0], out
    took = float(late[0].split(" raised after ")[1].split(" s:")[0])
    assert took <= DEADLINE + LATE_BY, out
    assert f"gave up on call #{earlier + 1}" in late[0], out
    for rank in range(n - 1):
        assert f"rank {rank} gave up after" in out, out
    assert "used the group again" not in out, out
    assert out.count(f" world {n}") == n, out
