#!/usr/bin/env bash
# Taking one GPU out of service, and putting it back.
#
# `nvidia-smi drain -m 1` (root, as on a real node) puts GPU 2 in the
# driver's drain state: every process on the node reads it back, from
# `nvidia-smi drain -q` and NVML's nvmlDeviceQueryDrainState, until it is
# undrained or the node is torn down.  The NVIDIA device plugin does not read
# the drain state, so for it GPU 2 is also marked failed with uncorrectable
# ECC errors and Xid 48, which it treats as critical: it marks that GPU
# unhealthy and the kubelet takes it out of the node's allocatable
# nvidia.com/gpu (8 -> 7, see docs/quickstart-kind.md), so no new pod gets
# it.  `nvidia-smi drain -m 0` and `mokka ctl reset` put it back.
set -euo pipefail
# shellcheck source=examples/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start_daemon node --profile h100 --node-name node-a
# nvidia-smi drain takes the 4-digit PCI domain: 0000:75:00.0.
bus_id=$(smi "$ROOT" --query-gpu=pci.bus_id --format=csv,noheader --id=2)
bus_id=${bus_id#0000}

echo "== nvidia-smi drain -p $bus_id -q"
if smi "$ROOT" drain -p "$bus_id" -q; then
  drain=yes
  echo "== nvidia-smi drain -p $bus_id -m 1"
  smi "$ROOT" drain -p "$bus_id" -m 1
  smi "$ROOT" drain -p "$bus_id" -q
else
  drain=no
  echo "(this nvidia-smi is the fallback, which has no drain; set NVIDIA_SMI)"
fi

echo "== GPU 2 out of service: uncorrectable ECC errors and Xid 48"
ctl "$ROOT" fail --gpu 2 --mode ecc_uncorrectable --xid 48
xid_logged() { kernel_log "$ROOT" | grep ': 48,' >/dev/null; }
wait_for 15 xid_logged
kernel_log "$ROOT"
ecc() { smi "$ROOT" --query-gpu=ecc.errors.uncorrected.volatile.total --format=csv,noheader --id=2; }
if ecc >/dev/null 2>&1; then
  ecc_counted() { (($(ecc) > 0)); }
  wait_for 15 ecc_counted
  echo "GPU 2 uncorrectable ECC errors (volatile): $(ecc)"
else
  echo "(this nvidia-smi is the fallback, which shows no ECC counters; set NVIDIA_SMI)"
fi
echo "in a cluster: the device plugin marks GPU 2 unhealthy (Xid 48 is critical)" \
  "and the node's allocatable nvidia.com/gpu drops to 7"
ctl "$ROOT" status

echo "== GPU 2 back in service"
if [[ $drain == yes ]]; then
  smi "$ROOT" drain -p "$bus_id" -m 0
fi
ctl "$ROOT" reset --gpu 2
ctl "$ROOT" status

teardown
