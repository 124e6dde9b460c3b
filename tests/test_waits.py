"""A waiting rank does not burn a core another rank needs (API.md, "Never silent"): it spins
briefly, then yields, then sleeps (the compiled core on a futex, woken by the arriving rank;
the numpy path and MPI's polled requests with growing sleeps), with the GIL released.

Jobs of the world-size-1 pass: a rank waits 2 s in a barrier (or an all_reduce) for a peer
that sleeps; the CPU time it used (``resource.getrusage``, every thread of the process) must
stay under 10 % of the wait. A blocking ``MPI_Barrier`` spins for the whole wait (100 %).
"""

from __future__ import annotations

import re

import pytest

import fcoll as fc
from tests import jobs

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own jobs")
TRANSPORTS = {"segment": {"FCOLL_NATIVE": "1"}, "numpy segment": {"FCOLL_NATIVE": "0", "FCOLL_SHM": "1"},
              "mpi": {"FCOLL_SHM": "0"}}
WAIT = 2.0
SHARE = 0.10  # of a core, at most, over the wait

BODY = """
    import resource
    n = fc.get_world_size()
    fc.barrier()
    fc.all_reduce(np.ones(4))  # the segment (where one is used) exists before the wait
    if r == 0:
        time.sleep({wait})
    def cpu():
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime
    start, used = time.monotonic(), cpu()
    {call}
    waited, used = time.monotonic() - start, cpu() - used
    print(f"rank {{r}} waited {{waited:.3f}} s, used {{used:.3f}} s of CPU", flush=True)
"""


CASES = [("segment", "barrier"), ("segment", "all_reduce"), ("numpy segment", "barrier"),
         ("numpy segment", "all_reduce"), ("mpi", "barrier")]  # MPI's own blocking reductions spin
CALLS = {"barrier": "fc.barrier()", "all_reduce": "fc.all_reduce(np.ones(8))"}


@pytest.mark.parametrize(("transport", "call"), CASES)
def test_a_waiting_rank_sleeps(tmp_path, transport, call):
    code, out, _ = jobs.script(tmp_path, BODY.format(wait=WAIT, call=CALLS[call]), 2,
                               TRANSPORTS[transport], limit=60)
    assert code == 0, out
    found = re.search(r"rank 1 waited ([0-9.]+) s, used ([0-9.]+) s of CPU", out)
    assert found is not None, out
    waited, used = float(found[1]), float(found[2])
    assert waited > WAIT / 2, out  # it did wait for rank 0
    assert used < SHARE * waited, f"rank 1 used {used:.3f} s of CPU in a {waited:.3f} s wait: {out}"
