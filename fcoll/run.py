"""Run a script so that an uncaught exception on any rank ends the whole job.

    mpiexec -n 4 python -m fcoll.run script.py [args ...]

Under plain ``python script.py`` a rank that raises exits while the others wait forever
in their next collective. Here the failing rank prints its traceback (prefixed with its
rank) and calls ``MPI_Abort``, so ``mpiexec`` stops every rank and exits non-zero.
``python -m mpi4py script.py`` does the same without the rank prefix.
"""

from __future__ import annotations

import runpy
import sys
import time
import traceback

from fcoll import _trace_report
from fcoll._runtime import abort, mpi


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args else 2)
    sys.argv = list(args)
    try:
        runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            abort(exit_.code if isinstance(exit_.code, int) else 1)
        raise
    except BaseException:
        rank = mpi().COMM_WORLD.Get_rank()
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stderr.flush()
        _flight_record(rank, text.strip().splitlines()[-1])
        time.sleep(0.2)  # the launcher forwards what was written before the abort kills it
        abort(1)


def _flight_record(rank: int, error: str) -> None:
    """Before the abort: every answering rank's last calls, printed by the lowest of them
    (`fcoll.debug`); nothing when fcoll never started or a timeout already printed them."""
    if _trace_report._COMM and "CollectiveTimeoutError" not in error:
        _trace_report.collect(f"python -m fcoll.run: rank {rank} raised {error[:80]}", 5.0,
                              always=True)


if __name__ == "__main__":
    main()
