#!/usr/bin/env bash
# The compiled shared-memory core under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds fcoll/backends/_shmcore.c with FCOLL_SANITIZE=1 (setup.py: -fsanitize=address,undefined,
# -O1 -g, the baseline folds without the AVX2 clones) inside a copy of this checkout, then runs,
# with the sanitizers' runtimes preloaded into every process: the core's own tests
# (tests/test_native.py), the segment, reduction, movement and out= tests at one world size
# (FCOLL_SANITIZE_SIZE, default 3: an odd size, with more ranks than this machine's two cores,
# so steps interleave the most) with every size through the segment (FCOLL_SHM=1), the XLA
# FFI handler's tests inside jax.jit at n = 2 (tests/test_jit_compiled.py: jaxlib itself is not
# instrumented, the handler and the core are), and 20,000 steps of the stress job at n = 3. Any
# report ends that process with an error, so the script fails. Creates .venv if missing;
# scripts/test.sh runs it after the suite (FCOLL_SANITIZE_PASS=0 skips it there).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
set +e
work=$(mktemp -d "${TMPDIR:-/tmp}/fcoll-sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$work") || exit 1
if ! (cd "$work" && FCOLL_SANITIZE=1 "$PY" setup.py -q build_ext --inplace >build.log 2>&1) \
   || ! ls "$work"/fcoll/backends/_shmcore*.so >/dev/null 2>&1; then
  echo "sanitize: the sanitized build failed:"; cat "$work/build.log"; exit 1
fi
asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
# Python's own allocations are not instrumented and live until exit: no leak check.
# Their reports go to the terminal (pytest --capture=sys leaves file descriptor 2 alone).
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:verify_asan_link_order=0 UBSAN_OPTIONS=print_stacktrace=1
sanitized=(env LD_PRELOAD="$asan:$ubsan" PYTHONPATH="$work" FCOLL_NATIVE=1)
cd "$work"
status=0
echo "=== sanitize: tests/test_native.py"
"${sanitized[@]}" "$PY" -m pytest -q --durations=30 -p no:cacheprovider --capture=sys tests/test_native.py || status=1
for n in ${FCOLL_SANITIZE_SIZE:-3}; do
  echo "=== sanitize: segment tests, n=$n, FCOLL_SHM=1"
  FCOLL_SHM=1 MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec "$n" "${sanitized[@]}" "$PY" -m pytest -q \
    --durations=30 -p no:cacheprovider --capture=sys tests/test_shm.py tests/test_shm_movement.py tests/test_shm_alltoall.py tests/test_reductions.py \
    tests/test_coalesced.py tests/test_into.py || status=1
done
echo "=== sanitize: the XLA FFI handler (fcoll/backends/_shmxla.c) inside jax.jit, n=2"
MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec 2 "${sanitized[@]}" "$PY" -m pytest -q \
  --durations=10 -p no:cacheprovider --capture=sys tests/test_jit_compiled.py || status=1
echo "=== sanitize: stress, n=3"
FCOLL_SHM=1 MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-900} fcoll_mpiexec 3 "${sanitized[@]}" "$PY" \
  tests/stress_job.py 20000 3 || status=1
exit $status
