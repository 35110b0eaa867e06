#!/usr/bin/env bash
# A storm of Xids on one GPU, then recovery.
#
# Raises a double-bit ECC failure (Xid 48) on GPU 0 and then a burst of Xids,
# shows what a node's tools see (the kernel log's NVRM lines, the ECC
# counters in nvidia-smi, `mokka ctl status`), and clears it with
# `mokka ctl reset`.  Runs against a local `mokka daemon`: no cluster, no root.
set -euo pipefail
# shellcheck source=examples/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start_daemon node --profile h100 --node-name node-a

echo "== GPU 0 starts failing: uncorrectable ECC errors and Xid 48"
ctl "$ROOT" fail --gpu 0 --mode ecc_uncorrectable --xid 48

echo "== the storm: 5 more Xids on GPU 0 (48, 63, 64, 48, 94)"
for code in 48 63 64 48 94; do
  ctl "$ROOT" xid --gpu 0 --code "$code"
done

echo "== the kernel log (each Xid once, as NVRM writes it)"
xids_logged() { (($(kernel_log "$ROOT" | wc -l) >= 6)); }
# The daemon writes /dev/kmsg as it applies each change: wait for all six.
wait_for 15 xids_logged
kernel_log "$ROOT"
echo "kernel log: $(kernel_log "$ROOT" | wc -l) Xid line(s) for GPU 0"

echo "== what nvidia-smi sees"
smi "$ROOT" --query-gpu=index,uuid,temperature.gpu --format=csv --id=0
ecc() { smi "$ROOT" --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader --id=0; }
if ecc >/dev/null 2>&1; then
  ecc_counted() { (($(ecc) > 0)); }
  wait_for 15 ecc_counted
  echo "GPU 0 uncorrectable ECC errors (volatile): $(ecc)"
else
  echo "(this nvidia-smi is the fallback, which shows no ECC counters; set NVIDIA_SMI)"
fi

echo "== the overrides in force"
ctl "$ROOT" status

echo "== recovery: mokka ctl reset"
ctl "$ROOT" reset --gpu 0
ctl "$ROOT" status
smi "$ROOT" --query-gpu=index,uuid,temperature.gpu --format=csv --id=0

teardown
