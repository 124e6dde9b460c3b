#!/usr/bin/env bash
# The jitted tests (tests/test_jit.py, tests/test_jit_compiled.py, tests/test_lax.py) on every
# JAX fcoll supports (fcoll.xla.primitives.TESTED), at world sizes 1 and 2:
#   0.9.2   beside .venv, first on PYTHONPATH (as scripts/test.sh's jax-0.9.2 pass)
#   0.10.2  .venv's own (Python 3.11)
#   0.11.2  in .venv-py312, a Python 3.12 venv made here (JAX 0.11 needs Python >= 3.12),
#           where a Python 3.12 is found (FCOLL_PY312, PATH, pyenv); skipped, and said so,
#           where none is
# CI runs the first two (its Python is 3.11); this script is the check of all three.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
set +e
cd "$root"
files=(tests/test_jit.py tests/test_jit_compiled.py tests/test_lax.py)
status=0
run() {  # run LABEL PYTHON MPIEXEC [ENV...]: the files at n = 1 and 2
  local label=$1 py=$2 mpiexec=$3 n
  shift 3
  for n in 1 2; do
    echo "=== JAX $label, n=$n"
    env "$@" MPIEXEC_TIMEOUT=900 "$mpiexec" -n "$n" "$py" -m pytest -q -p no:cacheprovider "${files[@]}" \
      || status=1
  done
}
old="$root/.venv-jax-0.9.2"
[ -f "$old/.installed" ] || { "$PY" -m pip install -q --target "$old" --no-deps jax==0.9.2 jaxlib==0.9.2 \
  && touch "$old/.installed"; }
run 0.9.2 "$PY" "$MPIEXEC" PYTHONPATH="$old"
run "$("$PY" -c 'import jax; print(jax.__version__)')" "$PY" "$MPIEXEC"
find_py312() {  # a working Python 3.12 (FCOLL_PY312, python3.12 on PATH, pyenv's), or none
  local c
  for c in "${FCOLL_PY312:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$c" ] && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
      && { command -v "$c"; return 0; }
  done
  return 1
}
if py312=$(find_py312); then
  new="$root/.venv-py312"
  if [ ! -f "$new/.installed" ]; then
    "$py312" -m venv "$new" && "$new/bin/python" -m pip install -q -e ".[mpich,test]" jax==0.11.2 \
      jaxlib==0.11.2 && touch "$new/.installed" || status=1
  fi
  run 0.11.2 "$new/bin/python" "$new/bin/mpiexec"
else
  echo "=== JAX 0.11.2: skipped (no python3.12 here; JAX 0.11 needs Python >= 3.12)"
fi
exit $status
