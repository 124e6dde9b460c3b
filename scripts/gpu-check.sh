#!/usr/bin/env bash
# One command for a machine with a GPU (docs/gpu.md, "Checking a GPU machine"):
#   1. the GPU tests (tests/test_gpu.py, tests/test_gpu_*.py) at n=1 on NCCL, at n=1 on the
#      MPI transport and at n=2 on the MPI transport (FCOLL_GPU_TRANSPORT=nccl|mpi);
#   2. python -m fcoll check --array cupy at n=1 (the default transport) and n=2 (MPI), then
#      python -m fcoll check --gpu at n=1 and n=2 (each route a cupy buffer can take, tried,
#      and the route of every collective, traced, with the setting that would be faster);
#   3. bench/bench_gpu.py, as it is (BENCH_ARGS="..." passes options).
# Then one summary line per part; the exit status is 1 if any part failed (or no GPU).
#
# It uses the Python in $PYTHON (default python3) as it is: no venv is made and nothing is
# installed; fcoll runs from this checkout (PYTHONPATH). Jobs start with the launcher of the
# MPI that this Python's mpi4py loads, with the flags and variables it needs (Open MPI:
# --oversubscribe, and as root OMPI_ALLOW_RUN_AS_ROOT*), as `python -m fcoll info` reports;
# MPIEXEC=... overrides. Each part runs under MPIEXEC_TIMEOUT (default 900 s) and timeout(1).
# Logs (and info.json) go to $FCOLL_GPU_CHECK_LOGS (default: a new folder under /tmp).
#
# Without a GPU: FCOLL_FAKE_CUPY=1 runs parts 1 and 2 on the CPU stand-in for cupy and NCCL
# (tests/fake_cupy.py); the benchmark is skipped. Example, in a checkout with .venv:
#   PYTHON=.venv/bin/python FCOLL_FAKE_CUPY=1 bash scripts/gpu-check.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# $PYTHON as an absolute path (relative to where this was started): Open MPI's launcher,
# started by its absolute path, puts its own bin/ first on the ranks' PATH, where a bare
# "python3" would be the system's Python.
if ! found=$(command -v "${PYTHON:-python3}"); then
  echo "gpu-check: expected a Python in \$PYTHON, got '${PYTHON:-python3}' (not found)" >&2
  exit 1
fi
case "$found" in /*) PYTHON=$found ;; *) PYTHON="$PWD/$found" ;; esac
cd "$root"
limit=${MPIEXEC_TIMEOUT:-900}
fake=0
[ "${FCOLL_FAKE_CUPY:-}" = 1 ] && fake=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The stand-in reaches processes that pytest does not start (the check's ranks, fcoll info).
site=$PYTHONPATH
[ "$fake" = 1 ] && site="$root/tests/fake_cupy_site:$PYTHONPATH"
logs=${FCOLL_GPU_CHECK_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/fcoll-gpu-check.XXXXXX")}
mkdir -p "$logs"
summary=()
status=0

# --- what this machine has: fcoll info (MPI library, its launcher, the GPU) -------------
if ! PYTHONPATH=$site timeout 300 "$PYTHON" -m fcoll info --json >"$logs/info.json" 2>"$logs/info.err"; then
  echo "gpu-check: '$PYTHON -m fcoll info' failed (does fcoll import with this Python?):" >&2
  tail -n 20 "$logs/info.err" >&2
  exit 1
fi
mapfile -t facts < <("$PYTHON" - "$logs/info.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
launcher, gpu = report["launcher"], report["gpu"]
launch = launcher.get("launch with", "")
print("" if launch.startswith("none") else launch)
print(launcher.get("launch env", ""))
print(launcher.get("library loaded", "unknown"))
count = gpu.get("gpu.device_count", "0").split()[0]
print(count if count.isdigit() else "0")
if count.isdigit() and int(count) > 0:
    print(f"{count} x {gpu.get('gpu.devices', '?')}; cupy {gpu.get('cupy')}, CUDA runtime "
          f"{gpu.get('cuda.runtime')}, driver {gpu.get('cuda.driver')}, NCCL {gpu.get('nccl')}")
else:
    print(f"none (cupy {gpu.get('cupy', '?')}; {gpu.get('gpu.device_count', 'no devices')})")
EOF
)
read -r -a launch <<<"${facts[0]:-}"
for setting in ${facts[1]:-}; do export "${setting?}"; done
library=${facts[2]:-unknown}
devices=${facts[3]:-0}
echo "gpu-check: python $PYTHON; MPI $library; launch with ${launch[*]:-(none)}"
echo "gpu-check: gpu ${facts[4]:-none}; logs in $logs"
if [ "$devices" -gt 0 ]; then
  summary+=("gpu: ${facts[4]}")
else
  summary+=("gpu: ${facts[4]:-none}: FAILED (set FCOLL_FAKE_CUPY=1 for the CPU stand-in)")
  status=1
fi
if [ ${#launch[@]} -eq 0 ]; then
  summary+=("launcher: FAILED: none of $library found (set MPIEXEC=/path/to/its/mpiexec)")
  status=1
fi

# run NAME COMMAND...: COMMAND's output to the terminal and to $logs/NAME.log; its status.
run() {
  local name=$1
  shift
  echo "=== $name"
  timeout -k 30 $((limit + 60)) "$@" 2>&1 | tee "$logs/$name.log"
  return "${PIPESTATUS[0]}"
}

# counts LOG: "120 passed, 0 failed" (and skipped, errors) from pytest's last summary line.
counts() {
  "$PYTHON" - "$1" <<'EOF'
import re, sys
text = re.sub(r"\x1b\[[0-9;]*m", "", open(sys.argv[1], errors="replace").read())
lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)
         and re.search(r" in [\d.]+s", line)]
if not lines:
    sys.exit(1)
found = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1])}
errors = found.get("error", 0) + found.get("errors", 0)
text = f"{found.get('passed', 0)} passed, {found.get('failed', 0)} failed"
text += f", {found['skipped']} skipped" if found.get("skipped") else ""
print(text + (f", {errors} errors" if errors else ""))
EOF
}

# --- 1. the GPU tests -------------------------------------------------------------------
tests=(tests/test_gpu.py)
for file in tests/test_gpu_*.py; do [ -e "$file" ] && tests+=("$file"); done
# The gpu-marked tests of the transformations: CUDA tensors' gradients, jitted collectives
# on GPU arrays; and of the torch backend "fcoll": CUDA tensors through dist.* and DDP,
# asynchronous CUDA work on the engine thread and a sparse CUDA all_reduce (issue 41).
tests+=(tests/test_autograd.py tests/test_jit.py tests/test_torch_training.py)
for part in "1 nccl" "1 mpi" "2 mpi"; do
  read -r n transport <<<"$part"
  name="gpu tests n=$n $transport"
  if [ "$devices" -eq 0 ] || [ ${#launch[@]} -eq 0 ]; then
    summary+=("$name: skipped (no GPU or no launcher)")
    continue
  fi
  FCOLL_GPU_TRANSPORT=$transport MPIEXEC_TIMEOUT=$limit run "tests-n$n-$transport" \
    "${launch[@]}" -n "$n" "$PYTHON" -m pytest -q --color=no -m gpu "${tests[@]}"
  code=$?
  line=$(counts "$logs/tests-n$n-$transport.log") || line="no pytest summary"
  if [ "$code" -eq 0 ]; then
    summary+=("$name: $line")
  else
    summary+=("$name: $line: FAILED (exit $code; log $logs/tests-n$n-$transport.log)")
    status=1
  fi
done

# --- 2. python -m fcoll check on cupy arrays, and check --gpu (the routes) -----------------
# Each part: ranks, FCOLL_GPU_TRANSPORT, what to check (--array cupy, or --gpu: the routes).
for part in "1 auto cupy" "2 mpi cupy" "1 auto gpu" "2 auto gpu"; do
  read -r n transport what <<<"$part"
  if [ "$what" = gpu ]; then
    name="check --gpu n=$n" log="check-gpu-n$n" args=(--gpu)
  else
    name="check cupy n=$n $transport" log="check-n$n-$transport" args=(--array cupy)
  fi
  if [ "$devices" -eq 0 ]; then
    summary+=("$name: skipped (no GPU)")
    continue
  fi
  PYTHONPATH=$site FCOLL_GPU_TRANSPORT=$transport run "$log" \
    "$PYTHON" -m fcoll check -n "$n" "${args[@]}" --timeout "$limit"
  code=$?
  line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$logs/$log.log" | tail -n 1)
  if [ "$code" -eq 0 ]; then
    summary+=("$name: ok (${line:-no summary})")
  else
    summary+=("$name: FAILED (exit $code; ${line:-no summary}; log $logs/$log.log)")
    status=1
  fi
done

# --- 3. the GPU benchmark ---------------------------------------------------------------
if [ "$fake" = 1 ]; then
  summary+=("bench: skipped (no GPU: the CPU stand-in serves the tests and the check, not timings)")
elif [ "$devices" -eq 0 ]; then
  summary+=("bench: skipped (no GPU)")
else
  # shellcheck disable=SC2086  # BENCH_ARGS: words for the benchmark
  run bench "$PYTHON" bench/bench_gpu.py ${BENCH_ARGS:-}
  code=$?
  skipped=$(grep -m 1 -E "^bench_gpu: skipped" "$logs/bench.log")
  if [ "$code" -ne 0 ]; then
    summary+=("bench: FAILED (exit $code; log $logs/bench.log)")
    status=1
  elif [ -n "$skipped" ]; then  # e.g. no NCCL: the NCCL tests say so too
    summary+=("bench: skipped (${skipped#bench_gpu: })")
  else
    summary+=("bench: ok (log $logs/bench.log)")
  fi
fi

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
exit $status
