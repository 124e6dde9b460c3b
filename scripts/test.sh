#!/usr/bin/env bash
# Quick start 2: the whole test suite at world sizes 1, 2, 3 and 4 (creates .venv if missing).
# World size 1 also runs the checks that need one process: ruff, mypy, the docs build.
# Extra arguments go to pytest (e.g. -k all_reduce). SIZES="2 4" picks world sizes.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$root"
status=0
for n in ${SIZES:-1 2 3 4}; do
  echo "=== world size $n"
  MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} "$MPIEXEC" -n "$n" "$PY" -m pytest -q "$@" || status=1
done
exit $status
