"""Run a script so that an uncaught exception on any rank ends the whole job.

    mpiexec -n 4 python -m fcoll.run script.py [args ...]

``import fcoll`` alone does this for an uncaught exception (`fcoll.diagnostics.excepthook`, unless
``FCOLL_ABORT_ON_ERROR=0``); this runner also does it in a job of one process, with that
setting off, and for ``sys.exit`` with a non-zero status. The failing rank prints its
traceback (prefixed with its rank) and every answering rank's flight record, then calls
``MPI_Abort``, so ``mpiexec`` stops every rank and exits non-zero. ``python -m mpi4py
script.py`` does the same without the rank prefix.
"""

from __future__ import annotations

import runpy
import sys

from fcoll.diagnostics import excepthook
from fcoll.runtime import abort


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
    except BaseException as error:
        excepthook.fail(error, runner="python -m fcoll.run")  # prints it, ends the job


if __name__ == "__main__":
    main()
