#!/usr/bin/env bash
# Quick start 1: run examples/tour.py on 4 ranks (creates .venv first if missing).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$root"
MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-300} "$MPIEXEC" -n "${NP:-4}" "$PY" -m mpi4py examples/tour.py
