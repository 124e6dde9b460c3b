#!/usr/bin/env bash
# Create .venv (if missing) with fcoll installed editable plus MPICH, test and docs tools.
# Sourced by the other scripts; sets PY and MPIEXEC.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
stamp="$venv/.fcoll-installed"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$root[mpich,test,bench,docs,examples]"
  touch "$stamp"
fi
PY="$venv/bin/python"
MPIEXEC="$venv/bin/mpiexec"
export PY MPIEXEC
