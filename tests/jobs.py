"""Launching a small mpiexec job from a test of the world-size-1 pass, with MPICH or Open MPI.

The job uses the ``mpiexec`` next to the test's Python (the one of the MPI that mpi4py
loaded). Open MPI's needs ``--oversubscribe`` for more ranks than cores and, as root,
the ``OMPI_ALLOW_RUN_AS_ROOT*`` variables; MPICH's needs neither. The variables the
outer launcher gave this process are dropped, so the job starts as a fresh one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fcoll.runtime import mpi

BIN = Path(sys.executable).parent
# Set by MPICH's and Open MPI's launchers for the process they started (this pytest).
_LAUNCHER_VARS = ("PMI_", "HYDRA_", "MPI", "PMIX_", "OMPI_COMM_WORLD_")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def open_mpi() -> bool:
    """Whether mpi4py runs on Open MPI."""
    return bool(mpi().get_vendor()[0] == "Open MPI")


def command(n: int, *args: str) -> list[str]:
    """``mpiexec -n n args...``, with the flags this MPI's launcher needs."""
    flags = ["--oversubscribe"] if open_mpi() else []
    return [str(BIN / "mpiexec"), *flags, "-n", str(n), *args]


def environment() -> dict[str, str]:
    """This process's environment for a new job: the launcher's variables dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    if open_mpi() and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


_environment = environment


def run(n: int, *args: str, timeout: float, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run ``args`` on ``n`` ranks (``env``: variables to add); stdout and stderr without
    terminal escape codes.

    Open MPI hands the ranks a terminal for stdout, so rich (in the examples) colours it.
    """
    done = subprocess.run(command(n, *args), cwd=Path(__file__).resolve().parents[1],
                          env={**environment(), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    done.stdout, done.stderr = _ANSI.sub("", done.stdout), _ANSI.sub("", done.stderr)
    return done


def script(tmp_path: Path, body: str, n: int = 2, env: dict[str, str] | None = None,
           limit: float = 60, wrap: list[str] | None = None) -> tuple[int, str, float]:
    """Run ``body`` after ``import fcoll as fc`` (with ``r`` the rank) on ``n`` ranks with
    plain ``python``; the exit status, stdout + stderr, and the seconds it took. ``wrap``:
    a command that runs the launcher's command line, given as its last argument (a shell
    that sets up a private network first, say)."""
    path = tmp_path / "job.py"
    path.write_text("import os, sys, time\nimport numpy as np\nimport fcoll as fc\n"
                    "r = fc.get_rank()\n" + textwrap.dedent(body))
    environment = {**_environment(), "FCOLL_STALL_WARN": "0", **(env or {})}
    line = command(n, sys.executable, str(path))
    if wrap is not None:
        line = [*wrap, shlex.join(line)]
    start = time.monotonic()
    done = subprocess.run(line, env=environment, capture_output=True, text=True, timeout=limit,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start
