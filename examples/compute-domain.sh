#!/usr/bin/env bash
# A ComputeDomain across two nodes on one machine.
#
# Two daemons (node-a and node-b, each on its own root) read one topology
# document that puts both nodes in one NVLink clique; the GB200 GPUs of both
# then report the same fabric cluster UUID and clique id, which is what the
# NVIDIA DRA driver groups a ComputeDomain by.  A third name outside the
# document keeps the profile's own fabric identity.
set -euo pipefail
# shellcheck source=examples/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cat >"$WORK/topology.yaml" <<'TOPOLOGY'
version: 1
domains:
  - name: rack-a
    uuid: 00000000-0000-0000-0000-0000000000ab
    cliques:
      - id: 7
        nodes: [node-a, node-b]
TOPOLOGY
echo "== the topology document"
cat "$WORK/topology.yaml"

start_daemon node-a --profile gb200 --node-name node-a --topology "$WORK/topology.yaml"
ROOT_A=$ROOT PORT_A=$PORT
start_daemon node-b --profile gb200 --node-name node-b --topology "$WORK/topology.yaml"
ROOT_B=$ROOT PORT_B=$PORT

# readyz NODE SIMULATOR: that simulator's readiness reason from NODE's /readyz.
readyz() {
  curl -sf "127.0.0.1:$2/readyz" | grep -o "\"$3\":{\"ready\":[a-z]*,\"reason\":\"[^\"]*\"" |
    sed "s/^/$1: /"
}
readyz node-a "$PORT_A" nvlink
readyz node-b "$PORT_B" nvlink

for node in node-a node-b; do
  root=$WORK/$node
  echo "== $node: its own GPU UUIDs, the fabric registration done"
  smi "$root" -L | sed -n '1,2p'
  smi "$root" -q -i 0 | sed -n '/^    Fabric/,/^        Status/p'
done

echo "== IMEX channels on each node (gb200 is fabric-attached)"
for root in "$ROOT_A" "$ROOT_B"; do
  channels=$(find "$root/var/lib/nvml-mock/driver/dev/nvidia-caps-imex-channels" -mindepth 1 | wc -l)
  echo "$channels channels" \
    "in ${root#"$WORK"/}:/var/lib/nvml-mock/driver/dev/nvidia-caps-imex-channels"
done
readyz node-a "$PORT_A" imex

rm "$WORK/topology.yaml"

teardown
