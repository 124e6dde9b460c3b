"""``python -m fcoll info``: what fcoll runs on (versions, MPI, launcher, start-up, knobs, GPU,
torch).

`collect` starts MPI the way fcoll does (so the thread level shown is the one fcoll
gets) and returns sections of ``name -> text``; `render_plain`, `render_rich` and
``json.dumps`` present them. GPU facts come from `fcoll.dispatch.gpu_probe`,
else from a minimal probe that never needs a GPU to succeed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

Report = dict[str, dict[str, str]]

# Environment variables fcoll reads (all FCOLL_* that are set are shown too), and MPICH
# and Open MPI settings fcoll may set itself when ranks outnumber cores (fcoll.runtime).
KNOBS = ("FCOLL_MPI_THREAD_LEVEL", "FCOLL_DEBUG", "FCOLL_MALLOC_TUNING", "FCOLL_GPU_TRANSPORT",
         "FCOLL_GPU_DEVICE", "FCOLL_CUDA_AWARE_MPI", "FCOLL_ALLOW_SINGLETON", "FCOLL_TRACE",
         "FCOLL_SHM", "FCOLL_SHM_NODE_SIZE", "FCOLL_NATIVE", "FCOLL_ABORT_ON_ERROR",
         "FCOLL_STALL_WARN", "FCOLL_STALL_ABORT", "FCOLL_TORCH_ENGINE")
MPICH_SET = ("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM", "MPIR_CVAR_REDUCE_POSIX_INTRA_ALGORITHM",
             "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM", "MPIR_CVAR_CH4_PROGRESS_THROTTLE",
             "OMPI_MCA_mpi_yield_when_idle")
_THREAD_NAMES = ("single", "funneled", "serialized", "multiple")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cores() -> int:
    getter = getattr(os, "sched_getaffinity", None)
    return len(getter(0)) if getter is not None else (os.cpu_count() or 1)


def _mpi_section() -> dict[str, str]:
    import mpi4py

    from fcoll.runtime import mpi

    MPI = mpi()
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    local_size = local.Get_size()
    local.Free()
    provided = MPI.Query_thread()
    major, minor = MPI.Get_version()
    cores = _cores()
    return {
        "library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "standard": f"{major}.{minor}",
        "thread level": f"{_THREAD_NAMES[provided]} (requested {mpi4py.rc.thread_level})",
        "world size": str(world.Get_size()),
        "ranks on this node": str(local_size),
        "cores available": str(cores),
        "oversubscribed": (f"yes ({local_size} ranks > {cores} cores): expect slow, noisy timings"
                           if local_size > cores else "no"),
    }


def _launcher_section(MPI: Any) -> dict[str, str]:
    """Which MPI mpi4py loaded, which mpiexec is on PATH (and next to python), and whether
    they agree; the launcher to use (`fcoll.runtime.launcher.pick_launcher`) with its flags and
    variables; the job size the launcher announced and whether MPI joined it."""
    from fcoll.runtime import launcher

    library = launcher.family(str(MPI.get_vendor()[0]))
    facts = {"library loaded": f"{library or 'unknown'} ({launcher.loaded_library(MPI.__file__)})"}
    for where, (path, mpi) in launcher.launchers().items():
        text = f"{path} ({mpi or 'unknown MPI'})" if path else "none"
        agree = launcher.agree(mpi, library)
        if agree is False:
            text += f"  MISMATCH: mpi4py loaded {library}; use the {library} mpiexec"
        facts[f"mpiexec {where}"] = text
    chosen = launcher.pick_launcher(library)
    flags, env = launcher.launch_settings(library)
    facts["launch with"] = " ".join([chosen, *flags]) if chosen else f"none found for {library}"
    if env:
        facts["launch env"] = " ".join(f"{name}={value}" for name, value in env.items())
    announced = launcher.launcher_world(os.environ)
    size = MPI.COMM_WORLD.Get_size()
    if announced is None:
        facts["launcher says"] = "nothing (not started by a known launcher, or one process)"
    else:
        facts["launcher says"] = f"{announced.name}={announced.value} ({announced.setter})"
        if size == 1:
            facts["launcher says"] += ("  MISMATCH: MPI started this process alone (world of 1);"
                                       f" see fcoll.init's error, {launcher.ALLOW_SINGLETON}")
    return facts


def _startup_section(MPI: Any) -> dict[str, str]:
    """Who started MPI, the malloc tuning, and what fcoll could not set (mpi4py.MPI first)."""
    from fcoll import runtime
    from fcoll.runtime import memory

    facts = runtime.startup()
    if facts is None:
        return {"MPI started by": "not yet"}
    shown = {
        "MPI started by": ("fcoll (imported before mpi4py.MPI)" if facts.by_fcoll
                           else "the program (mpi4py.MPI imported before fcoll)"),
        "malloc tuning": memory.status(),
        "thread level": (f"{_THREAD_NAMES[MPI.Query_thread()]} "
                         f"(fcoll asks for {facts.requested})"),
    }
    late = [f"{item.name}={item.value} ({item.why}{'' if item.matters else '; no warning'})"
            for item in facts.late]
    shown["not in effect"] = "; ".join(late) if late else "nothing"
    return shown


def _transport() -> str:
    """The backend cupy arrays take here (`fcoll.dispatch.gpu_backend`), or why none."""
    from fcoll.dispatch import gpu_backend

    try:
        return gpu_backend().NAME
    except Exception as error:  # a report says what is wrong instead of raising
        return f"unavailable ({type(error).__name__}: {error})"


def _gpu_section() -> dict[str, str]:
    from fcoll.dispatch import gpu_probe

    try:
        facts, aware = gpu_probe.gpu_report(), gpu_probe.cuda_aware_mpi()
    except Exception as error:
        return {"probe": f"failed ({type(error).__name__}: {error})"}
    facts = {str(k): str(v) for k, v in facts.items()}
    if facts.get("cupy") not in ("not installed", None) and "gpu.device_count" in facts:
        facts["gpu.transport"] = _transport()
    facts["CUDA-aware MPI"] = {True: "yes", False: "no", None: "unknown"}[aware]
    return facts


def _torch_section() -> dict[str, str]:
    """torch and the backend "fcoll": the version, whether the backend is registered (after
    ``import fcoll.torch``), the entry point torch 2.14+ loads it from, CUDA. torch is
    imported only when installed (this command is about what fcoll runs on)."""
    version = _version("torch")
    points = [f"{e.name} = {e.value}" for e in
              importlib.metadata.entry_points(group="torch.distributed.backends")]
    entry = next((p for p in points if p.startswith("fcoll ")), "missing (reinstall fcoll)")
    if version == "not installed":
        return {"torch": version, "entry point": entry}
    try:
        import torch
        import torch.distributed as dist

        import fcoll.torch  # noqa: F401  (registers the backend)
    except Exception as error:
        return {"torch": f"{version} (import failed: {type(error).__name__}: {error})",
                "entry point": entry}
    major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    cuda = torch.cuda.is_available()
    return {
        "torch": f"{torch.__version__} ({os.path.dirname(torch.__file__)})",
        "torch.distributed": "available" if dist.is_available() else "not built",
        'backend "fcoll"': ("registered" if "FCOLL" in dist.Backend._plugins else "not registered"),
        "entry point": entry + ("" if major_minor >= (2, 14) else
                                " (torch < 2.14 does not load it: import fcoll.torch)"),
        "CUDA": (f"{torch.version.cuda}, {torch.cuda.device_count()} device(s)" if cuda
                 else f"not available (built for {torch.version.cuda or 'CPU'})"),
        "engine": ("off (FCOLL_TORCH_ENGINE=0: every call inline)"
                   if os.environ.get("FCOLL_TORCH_ENGINE", "1") == "0"
                   else "on (asynchronous work on fcoll's engine thread)"),
    }


def _shm_section() -> dict[str, str]:
    """The on-node shared-memory transport: its setting and which engine steps it."""
    from fcoll.backends import native, shm

    try:
        mode = shm.settings()[0]
    except ValueError as error:
        mode = f"error: {error}"
    return {"transport": {"auto": "on within measured size windows (FCOLL_SHM=auto)",
                          "on": "every size (FCOLL_SHM=1)", "off": "off (FCOLL_SHM=0)"}.get(mode, mode),
            "step": native.describe()}


def _nodes_section() -> dict[str, str]:
    """The job's nodes, and the schedules the world group takes across them (collective over
    MPI's world; the rule of `fcoll.backends.nodes.hierarchy`, without starting fcoll's
    world, so that it also reports a job whose launcher does not match)."""
    import numpy as np

    from fcoll.backends import nodes, shm
    from fcoll.diagnostics.board import split_node
    from fcoll.runtime import mpi

    MPI = mpi()
    world = MPI.COMM_WORLD
    node = split_node(world, shm.settings()[1])
    m, i, r = node.Get_size(), node.Get_rank(), world.Get_rank()
    block = int(nodes.by_block(node.allreduce(r, op=MPI.MIN), r, i, m))
    node.Free()
    facts = np.array([int(i == 0), m, -m, block], np.int64)
    world.Allreduce(MPI.IN_PLACE, facts[:1], op=MPI.SUM)
    world.Allreduce(MPI.IN_PLACE, facts[1:], op=MPI.MIN)
    k, low, high, by_block = int(facts[0]), int(facts[1]), int(-facts[2]), bool(facts[3])
    size, off = world.Get_size(), shm.settings()[0] == "off"
    if size == 1:
        schedule = "one rank"
    elif k == 1:
        schedule = "one node: MPI (FCOLL_SHM=0)" if off else "one node: the shared-memory segment"
    elif not off and low == high and nodes.splittable(high, size) and by_block:
        schedule = (f"split: {k} nodes x {high} ranks (the segment inside each node, the tree "
                    "across: fcoll.backends.nodes)")
    else:
        why = ("FCOLL_SHM=0" if off else "one rank per node" if high == 1
               else "ranks per node differ" if low != high
               else "ranks per node not a power of two" if high & (high - 1)
               else "ranks not placed by block")
        schedule = f"flat schedules ({why})"
    return {"nodes": str(k), "ranks per node": str(low) if low == high else f"{low}-{high}",
            "placement": "by block" if by_block else "not by block (round-robin or mixed)",
            "world group": schedule}


def _knobs() -> dict[str, str]:
    names = sorted(set(KNOBS) | {k for k in os.environ if k.startswith("FCOLL_")})
    shown = {name: os.environ.get(name, "(unset)") for name in names}
    shown.update({name: os.environ[name] for name in MPICH_SET if name in os.environ})
    return shown


def collect() -> Report:
    """Every fact ``info`` shows, as ``{section: {name: text}}`` (collective over the job)."""
    import fcoll

    versions = {
        "fcoll": f"{fcoll.__version__} ({os.path.dirname(fcoll.__file__)})",
        "python": f"{platform.python_version()} ({sys.executable})",
        "numpy": _version("numpy"),
        "mpi4py": _version("mpi4py"),
        "ml_dtypes": _version("ml_dtypes"),
        "platform": platform.platform(),
    }
    from fcoll.runtime import mpi

    MPI = mpi()
    return {"versions": versions, "mpi": _mpi_section(), "launcher": _launcher_section(MPI),
            "start-up": _startup_section(MPI), "shared memory": _shm_section(),
            "nodes": _nodes_section(),
            "environment": _knobs(), "gpu": _gpu_section(), "torch": _torch_section()}


def render_plain(report: Report) -> str:
    """The report as aligned ``name: value`` lines under each section's title."""
    width = max(len(k) for section in report.values() for k in section)
    lines: list[str] = []
    for title, section in report.items():
        lines.append(f"[{title}]")
        lines.extend(f"  {name:<{width}}  {value}" for name, value in section.items())
    return "\n".join(lines)


def render_rich(report: Report) -> None:
    """Print the report as one rich table per section."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, section in report.items():
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for name, value in section.items():
            table.add_row(name, value)
        console.print(table)
