#!/usr/bin/env bash
# Timed stages for scripts/test.sh (sourced). Each stage's output goes to the terminal and to
# $FCOLL_STAGES/NAME.log, and a line "NAME <tab> seconds <tab> exit status <tab> group" to
# $FCOLL_STAGES/stages.tsv, which scripts/stage_report.py turns into the closing table.
#
#   stage NAME CMD...        run CMD now (its exit status is stage's)
#   beside GROUP NAME CMD... start CMD in the background, its output to its log only
#   background_install DIR   source DIR/env.sh for Open MPI in the background (stage
#                            openmpi.install); background_installed waits for it
#   joined GROUP             wait for GROUP's commands, then print their logs in order and
#                            record GROUP's own wall time; its status is the worst of
#                            theirs: 1 if any failed, else 5 if any ran no test (pytest's 5)
#
# A nested scripts/test.sh (the Open MPI smoke) records into the same file, each name
# prefixed with FCOLL_STAGE_PREFIX.
# FCOLL_STAGES names the folder (made here if unset; the outermost run removes a folder it
# made once every stage passed).
made_stages=0
if [ -z "${FCOLL_STAGES:-}" ]; then
  FCOLL_STAGES=$(mktemp -d "${TMPDIR:-/tmp}/fcoll-stages.XXXXXX")
  made_stages=1
fi
export FCOLL_STAGES
STAGES=$FCOLL_STAGES
prefix=${FCOLL_STAGE_PREFIX:-}
_beside_names=()
_beside_pids=()
_beside_start=0

_record() {  # NAME SECONDS STATUS GROUP
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STAGES/stages.tsv"
}

stage() {
  local name=$prefix$1 start=$SECONDS rc
  shift
  echo "=== $name"
  "$@" 2>&1 | tee "$STAGES/$name.log"
  rc=${PIPESTATUS[0]}
  _record "$name" $((SECONDS - start)) "$rc" ""
  return "$rc"
}

beside() {
  local group=$prefix$1 name=$prefix$2
  shift 2
  [ ${#_beside_pids[@]} -gt 0 ] || _beside_start=$SECONDS
  (
    start=$SECONDS
    "$@" >"$STAGES/$name.log" 2>&1
    rc=$?
    _record "$name" $((SECONDS - start)) "$rc" "$group"
    exit "$rc"
  ) &
  _beside_pids+=($!)
  _beside_names+=("$name")
}

joined() {
  local group=$prefix$1 rc=0 one pid name
  for pid in "${_beside_pids[@]}"; do
    wait "$pid"
    one=$?
    if [ "$one" = 5 ] && [ "$rc" = 0 ]; then rc=5; elif [ "$one" != 0 ] && [ "$one" != 5 ]; then rc=1; fi
  done
  for name in "${_beside_names[@]}"; do
    echo "=== $name (side by side in $group)"
    cat "$STAGES/$name.log"
  done
  _record "$group" $((SECONDS - _beside_start)) "$rc" "*"
  _beside_pids=()
  _beside_names=()
  return "$rc"
}

background_install() {
  (
    start=$SECONDS
    FCOLL_MPI=openmpi bash -c 'source "$1/env.sh"' _ "$1" >"$STAGES/openmpi.install.log" 2>&1
    rc=$?
    _record openmpi.install $((SECONDS - start)) "$rc" "&"
    exit "$rc"
  ) &
  _background=$!
}

background_installed() {
  wait "$_background" && return 0
  echo "=== openmpi.install failed:"
  cat "$STAGES/openmpi.install.log"
  return 1
}
