# Sourced by the set-up scripts (bootstrap, install-system-deps,
# install-consumers): step WHAT CMD... runs CMD with a line on stderr as it
# starts and one when it ends, with its duration, so a first run (minutes of
# downloads, Go builds and compiling) is never silent.  The sourcing script
# sets STEP_PREFIX (its own name) and step_total (how many steps it will run).
# shellcheck shell=bash
step_no=0
step_total=${step_total:-0}
step() {
  local what=$1 start rc=0
  shift
  step_no=$((step_no + 1))
  echo "$STEP_PREFIX: [$step_no/$step_total] $what ..." >&2
  start=$SECONDS
  "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "$STEP_PREFIX: [$step_no/$step_total] $what ... done in $((SECONDS - start)) s" >&2
  else
    echo "$STEP_PREFIX: [$step_no/$step_total] $what ... failed after $((SECONDS - start)) s" >&2
  fi
  return "$rc"
}
