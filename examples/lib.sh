# shellcheck shell=bash
# Shared by the example scripts: start `mokka daemon` on a temporary node root,
# wait until it is ready, run the node's own nvidia-smi, and tear down.
#
# Source it from a script that runs under `set -euo pipefail`.  MOKKA names the
# mokka executable (default: `mokka` on PATH); NVIDIA_SMI, when set, the real
# nvidia-smi the daemon stages (default: the daemon's own choice: the image's,
# /usr/bin/nvidia-smi when it is NVIDIA's, else a fallback that answers fewer
# queries; the daemon's log says which).  Every root lives under one
# temporary directory, removed on exit; a daemon still running on exit (the
# script failed) gets SIGTERM too, so nothing is left behind either way.

MOKKA=${MOKKA:-mokka}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mokka-example.XXXXXX")
DAEMON_PIDS=()

# start_daemon ROOT_NAME [DAEMON FLAGS...]: starts a daemon on $WORK/ROOT_NAME
# and waits (60 s at most) until its /readyz answers 200.  Sets ROOT and PORT.
start_daemon() {
  local name=$1
  shift
  ROOT=$WORK/$name
  # The log exists before the daemon starts, so reading it never races the
  # shell's redirection.
  : >"$WORK/$name.log"
  # Port 0: any free port, so examples run beside a daemon on 9091.
  "$MOKKA" daemon --root "$ROOT" --health-addr 127.0.0.1:0 \
    ${NVIDIA_SMI:+--nvidia-smi-binary "$NVIDIA_SMI"} "$@" >"$WORK/$name.log" 2>&1 &
  DAEMON_PIDS+=("$!")
  PORT=
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    if ! kill -0 "${DAEMON_PIDS[-1]}" 2>/dev/null; then
      echo "daemon on $name exited; its log:" >&2
      cat "$WORK/$name.log" >&2
      return 1
    fi
    if [[ -z $PORT ]]; then
      PORT=$(sed -n 's/.*health probes on .* port=\([0-9]*\).*/\1/p' "$WORK/$name.log")
    fi
    if [[ -n $PORT ]] && curl -sf "127.0.0.1:$PORT/readyz" >/dev/null; then
      echo "daemon on $name ready (pid ${DAEMON_PIDS[-1]}, health port $PORT)"
      return 0
    fi
    sleep 0.2
  done
  echo "daemon on $name not ready after 60 s; its log:" >&2
  cat "$WORK/$name.log" >&2
  return 1
}

# smi ROOT [ARGS...]: the nvidia-smi the daemon staged in ROOT's driver tree,
# against the mock NVML beside it.
smi() {
  local driver=$1/var/lib/nvml-mock/driver
  shift
  LD_LIBRARY_PATH=$driver/usr/lib64 "$driver/usr/bin/nvidia-smi" "$@"
}

# ctl ROOT VERB [ARGS...]: `mokka ctl` on ROOT (exits 3 if no daemon holds it).
ctl() {
  local root=$1
  shift
  "$MOKKA" ctl --root "$root" "$@"
}

# wait_for SECONDS COMMAND...: runs COMMAND every 0.2 s until it succeeds or
# SECONDS pass; fails in the latter case.  A `mokka ctl` change is applied by
# the daemon at once, but NVML clients see it at their next read of the
# engine config: scripts wait for the effect they are about to show.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    if ((SECONDS > deadline)); then
      echo "gave up waiting for: $*" >&2
      return 1
    fi
    sleep 0.2
  done
}

# kernel_log ROOT: the Xid lines the daemon wrote to ROOT's /dev/kmsg (a plain
# file on a temporary root; the node's kernel log on a real one).
kernel_log() {
  grep 'Xid' "$1/dev/kmsg" || true
}

# teardown: SIGTERM every daemon, wait for it, and check that each root it
# made is gone (the daemon removes everything it wrote).
teardown() {
  local pid status=0
  for pid in "${DAEMON_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || status=$?
  done
  DAEMON_PIDS=()
  local left
  left=$(find "$WORK" -mindepth 1 -not -name '*.log')
  if [[ -n $left ]]; then
    echo "teardown left files behind:" >&2
    echo "$left" >&2
    return 1
  fi
  echo "teardown: daemons exited ($status), node roots removed"
  rm -rf "$WORK"
  return "$status"
}

_on_exit() {
  local pid
  for pid in "${DAEMON_PIDS[@]}"; do
    if kill -TERM "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap _on_exit EXIT
