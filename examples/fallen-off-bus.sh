#!/usr/bin/env bash
# A GPU falls off the bus (Xid 79) and comes back.
#
# GPU 1's NVML calls return GPU_IS_LOST (nvidia-smi prints "[GPU is lost]"),
# the kernel log gets Xid 79; `mokka ctl reset` brings it back, as a node
# reboot or a GPU reset would.  Runs against a local `mokka daemon`.
set -euo pipefail
# shellcheck source=examples/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

query() {
  smi "$ROOT" --query-gpu=index,pci.bus_id,temperature.gpu,power.draw --format=csv
}

# Not `grep -q`: it would stop reading early, and under pipefail nvidia-smi's
# SIGPIPE would make the whole pipeline fail.
lost_gpus() {
  query | grep -c 'GPU is lost' || true
}

start_daemon node --profile h100 --node-name node-a

echo "== before: eight GPUs answer"
query

echo "== GPU 1 falls off the bus"
ctl "$ROOT" fail --gpu 1 --mode fallen_off_bus --xid 79
xid_logged() { kernel_log "$ROOT" | grep ': 79,' >/dev/null; }
wait_for 15 xid_logged
kernel_log "$ROOT"
gpu_lost() { (($(lost_gpus) > 0)); }
wait_for 15 gpu_lost
query
echo "GPUs lost: $(lost_gpus)"

echo "== GPU 1 comes back"
ctl "$ROOT" reset --gpu 1
all_back() { (($(lost_gpus) == 0)); }
wait_for 15 all_back
query
echo "GPUs lost: $(lost_gpus)"

teardown
