{{/*
Names, labels and the node agent's command line.
*/}}

{{- define "mokka.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every object: the release name, plus the chart name unless
the release name already contains it.  Truncated to 63 characters (label and
DNS name limits).
*/}}
{{- define "mokka.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mokka.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the agent pods: never change them between releases. */}}
{{- define "mokka.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mokka.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/*
Labels of the agent pods: the selector labels and the user's own, never the
chart or image version.  A change to a pod template's labels rolls every
node (each old pod reverts its node first), so a chart-only upgrade must
leave them alone; an image change rolls the pods through the image anyway.
*/}}
{{- define "mokka.podLabels" -}}
{{ include "mokka.selectorLabels" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "mokka.labels" -}}
helm.sh/chart: {{ include "mokka.chart" . }}
{{ include "mokka.selectorLabels" . }}
app.kubernetes.io/version: {{ include "mokka.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mokka
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "mokka.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mokka.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The agent pods' PriorityClass: the one set, else system-node-critical only in
kube-system. Clusters that quota the critical classes (GKE) admit them only
there, so a default that names one elsewhere installs nowhere on them.
*/}}
{{- define "mokka.priorityClassName" -}}
{{- if .Values.priorityClassName }}
{{- .Values.priorityClassName }}
{{- else if eq .Release.Namespace "kube-system" }}
{{- "system-node-critical" }}
{{- end }}
{{- end }}

{{- define "mokka.imageTag" -}}
{{- default .Chart.AppVersion .Values.nodeAgent.image.tag }}
{{- end }}

{{- define "mokka.image" -}}
{{- printf "%s:%s" .Values.nodeAgent.image.repository (include "mokka.imageTag" .) }}
{{- end }}

{{/*
A tri-state mode (on/off/auto) as the flag value.  A values file that says
`mode: on` without quotes hands the chart a YAML 1.1 boolean, so booleans are
accepted and mean on/off.
*/}}
{{- define "mokka.mode" -}}
{{- if kindIs "bool" . }}
{{- ternary "on" "off" . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* A boolean as the flag value on/off. */}}
{{- define "mokka.onOff" -}}
{{- ternary "on" "off" (eq (toString .) "true") }}
{{- end }}

{{/* True (non-empty) when the runtime setup restarts containerd through the host's systemd. */}}
{{- define "mokka.hostSystemd" -}}
{{- if and .Values.nodeAgent.containerRuntime.enabled (eq .Values.nodeAgent.containerRuntime.restartMode "systemd") }}true{{ end }}
{{- end }}

{{/* True (non-empty) when an IMEX archive image is delivered by the init container. */}}
{{- define "mokka.imexImage" -}}
{{- with .Values.nodeAgent.imex.binaries.image }}
{{- if .repository }}
{{- printf "%s:%s" .repository (default "latest" .tag) }}
{{- end }}
{{- end }}
{{- end }}

{{/* True (non-empty) when /etc/mokka is mounted (a custom profile or the topology document). */}}
{{- define "mokka.configVolume" -}}
{{- if or .Values.nodeAgent.customProfile .Values.topology.enabled }}true{{ end }}
{{- end }}

{{/* The agent's health port: /healthz, /readyz, /metrics. */}}
{{- define "mokka.healthPort" -}}
9091
{{- end }}

{{/* Built-in profiles without an infiniband block: no HCAs, so no relay. */}}
{{- define "mokka.profilesWithoutIb" -}}
a100 l40s t4
{{- end }}

{{/*
True (non-empty) when the InfiniBand relay runs (nodeAgent.ib.fabric): the
fabric is enabled, the topology document (whose nodes are the fabric) is
rendered, IB is not off, and the profile has HCAs (a custom profile is
trusted to).  mokka.validate refuses the first without the next two.
*/}}
{{/*
The relay key's Secret (nodeAgent.ib.fabric.key): the user's, or the chart's
own (templates/secret-ib-relay.yaml), and where the agent mounts it.
*/}}
{{- define "mokka.ibRelaySecret" -}}
{{- .Values.nodeAgent.ib.fabric.key.existingSecret | default (printf "%s-ib-relay" (include "mokka.fullname" .)) }}
{{- end }}

{{- define "mokka.ibRelayKeyDir" -}}
/etc/mokka-ib-relay
{{- end }}

{{- define "mokka.ibFabric" -}}
{{- $a := .Values.nodeAgent }}
{{- $ibOff := or (kindIs "bool" $a.ib.mode) (eq (toString $a.ib.mode) "off") }}
{{- $noHcas := and (not $a.customProfile) (eq (toString $a.ib.mode) "auto") (has $a.profile (splitList " " (include "mokka.profilesWithoutIb" .))) }}
{{- if and $a.ib.fabric.enabled .Values.topology.enabled (not $ibOff) (not $noHcas) }}true{{ end }}
{{- end }}

{{/* Where the init container leaves the IMEX archive inside the agent container. */}}
{{- define "mokka.imexArchiveDir" -}}
/var/lib/mokka-imex-archive
{{- end }}

{{/*
The node agent's flags, one list item each, in the order `mokka-node-agent
--help` lists them.  Every flag name here is part of the agent's fixed command
line contract (tests parse these with the agent's own argument parser).
*/}}
{{- define "mokka.args" -}}
{{- $a := .Values.nodeAgent -}}
- "--root=/host"
{{- if $a.customProfile }}
- "--profile=/etc/mokka/config.yaml"
{{- else }}
- {{ printf "--profile=%s" $a.profile | quote }}
{{- end }}
{{- if .Values.topology.enabled }}
- "--topology=/etc/mokka/topology.yaml"
{{- end }}
- "--node-name=$(NODE_NAME)"
{{- /*
Explicit, because the agent's own default is loopback only.  0.0.0.0 rather
than the pod IP: the pod has its own network namespace (no hostNetwork), so
this reaches only the pod's interfaces, and it serves every client the health
port has: the kubelet's httpGet probes and Prometheus (both dial the pod IP)
and `kubectl port-forward` (which dials localhost inside the pod).
*/}}
{{- if include "mokka.ibFabric" . }}
{{- /*
On the host network 0.0.0.0 would open the health port on every interface
of the node.  The node IP (status.hostIP, in NODE_IP) is the pod IP there,
which is what the kubelet's probes and Prometheus dial; only `kubectl
port-forward` (localhost) no longer reaches it.
*/}}
- "--health-addr=$(NODE_IP):{{ include "mokka.healthPort" . }}"
{{- else }}
- "--health-addr=0.0.0.0:{{ include "mokka.healthPort" . }}"
{{- end }}
- {{ printf "--resync-interval=%v" $a.resyncInterval | quote }}
- {{ printf "--shutdown-timeout=%v" $a.shutdownTimeout | quote }}
- {{ printf "--log-format=%s" $a.logFormat | quote }}
- {{ printf "--log-level=%s" $a.logLevel | quote }}
{{- with $a.featureGates }}
{{- $gates := list }}
{{- range $name, $on := . }}
{{- $gates = append $gates (printf "%s=%t" $name $on) }}
{{- end }}
- {{ printf "--feature-gates=%s" (join "," $gates) | quote }}
{{- end }}
- {{ printf "--imex=%s" (include "mokka.mode" $a.imex.mode) | quote }}
{{- if include "mokka.imexImage" . }}
- {{ printf "--imex-archive-dir=%s" (include "mokka.imexArchiveDir" .) | quote }}
{{- end }}
{{- with $a.imex.archive.url }}
- {{ printf "--imex-archive-url=%s" . | quote }}
{{- end }}
{{- with $a.imex.archive.sha256 }}
- {{ printf "--imex-archive-sha256=%s" . | quote }}
{{- end }}
- {{ printf "--fabric-manager=%s" (include "mokka.mode" $a.fabricManager.mode) | quote }}
- {{ printf "--fabric-manager-init-delay=%v" $a.fabricManager.initDelay | quote }}
- {{ printf "--kmsg-style=%s" $a.kernelLog.style | quote }}
{{- /* An unquoted `off` arrives as the boolean false. */}}
- {{ printf "--ib-mode=%s" (ternary "off" $a.ib.mode (kindIs "bool" $a.ib.mode)) | quote }}
{{- if include "mokka.ibFabric" . }}
- {{ printf "--ib-relay-port=%v" $a.ib.fabric.port | quote }}
- {{ printf "--ib-relay-key-file=%s/key" (include "mokka.ibRelayKeyDir" .) | quote }}
{{- range $node, $address := $a.ib.fabric.peers }}
- {{ printf "--ib-peer=%s=%s" $node $address | quote }}
{{- end }}
{{- end }}
- {{ printf "--workload=%s" (ternary "off" $a.workload.mode (kindIs "bool" $a.workload.mode)) | quote }}
- {{ printf "--workload-socket=%s" $a.workload.socket | quote }}
- {{ printf "--workload-poll-interval=%v" $a.workload.pollInterval | quote }}
- {{ printf "--workload-memory-share=%v" $a.workload.memoryShare | quote }}
- {{ printf "--workload-utilization=%v" $a.workload.utilization | quote }}
- {{ printf "--driver-publish=%s" $a.driverPublish | quote }}
- {{ printf "--idle-signature=%s" (include "mokka.onOff" $a.idleSignature) | quote }}
- {{ printf "--nfd-features-dir=%s" $a.nfdFeaturesDir | quote }}
- {{ printf "--container-runtime=%s" (include "mokka.onOff" $a.containerRuntime.enabled) | quote }}
{{- if $a.containerRuntime.enabled }}
- {{ printf "--containerd-config-dir=%s" $a.containerRuntime.containerd.configDir | quote }}
- {{ printf "--restart-mode=%s" $a.containerRuntime.restartMode | quote }}
{{- end }}
- {{ printf "--nri=%s" (include "mokka.onOff" $a.nri.enabled) | quote }}
{{- if $a.nri.enabled }}
- {{ printf "--nri-socket=%s" $a.nri.socketPath | quote }}
{{- end }}
- {{ printf "--nri-plugin=%s" (include "mokka.onOff" (include "mokka.nriPlugin" .)) | quote }}
{{- if include "mokka.nriPlugin" . }}
- {{ printf "--nri-plugin-socket=%s" $a.nri.socketPath | quote }}
- {{ printf "--nri-ambient=%s" (include "mokka.onOff" $a.nri.ambient) | quote }}
{{- end }}
{{- range $a.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Refuse values that would break nodes, with a message saying what to change.
*/}}
{{- define "mokka.validate" -}}
{{- /* Seconds may arrive as strings (--set shutdownTimeout=2.5); the schema
       checks the form, this the range. */}}
{{- $a := .Values.nodeAgent }}
{{- range $name, $bounds := dict "nodeAgent.resyncInterval" (list $a.resyncInterval 0.0 86400.0 true) "nodeAgent.shutdownTimeout" (list $a.shutdownTimeout 0.0 600.0 false) "nodeAgent.fabricManager.initDelay" (list $a.fabricManager.initDelay 0.0 3600.0 true) }}
{{- $v := float64 (index $bounds 0) }}
{{- $lo := index $bounds 1 }}
{{- $hi := index $bounds 2 }}
{{- if or (gt $v $hi) (lt $v $lo) (and (not (index $bounds 3)) (eq $v $lo)) }}
{{- fail (printf "%s=%v: expected seconds %s %v and at most %v" $name (index $bounds 0) (ternary "of at least" "above" (index $bounds 3)) $lo $hi) }}
{{- end }}
{{- end }}
{{- $m := .Values.metrics }}
{{- if and $m.serviceMonitor.enabled $m.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled are both true: Prometheus would scrape every agent twice. Enable one of them." }}
{{- end }}
{{- if and $m.serviceMonitor.enabled (not $m.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled=true needs metrics.service.enabled=true (a ServiceMonitor selects the Service), or use metrics.podMonitor.enabled=true instead." }}
{{- end }}
{{- $rt := .Values.nodeAgent.containerRuntime }}
{{- if eq .Values.updateStrategy.type "RollingUpdate" }}
{{- $surge := toString (dig "rollingUpdate" "maxSurge" 0 .Values.updateStrategy | default 0) }}
{{- if and $rt.enabled (not (has $surge (list "0" "0%" ""))) }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%s cannot be used while nodeAgent.containerRuntime.enabled=true: during a surge the old and the new agent pod run on the same node, and the old pod's teardown reverts the containerd setup (it deletes the containerd drop-in and restarts containerd) that the new pod has just made. Keep maxSurge at 0 and raise updateStrategy.rollingUpdate.maxUnavailable to go faster, or set nodeAgent.containerRuntime.enabled=false." $surge) }}
{{- end }}
{{- end }}
{{- if and (include "mokka.imexImage" .) (not .Values.nodeAgent.imex.archive.sha256) }}
{{- fail "nodeAgent.imex.binaries.image is set but nodeAgent.imex.archive.sha256 is empty: the agent installs an IMEX archive only when its SHA-256 is pinned. Set nodeAgent.imex.archive.sha256 to the archive's 64-hex-digit SHA-256." }}
{{- end }}
{{- $fabric := .Values.nodeAgent.ib.fabric }}
{{- if $fabric.enabled }}
{{- if not .Values.topology.enabled }}
{{- fail "nodeAgent.ib.fabric.enabled=true needs topology.enabled=true: the topology document's nodes are the fabric's nodes (without it every node is a fabric of its own)." }}
{{- end }}
{{- if or (kindIs "bool" .Values.nodeAgent.ib.mode) (eq (toString .Values.nodeAgent.ib.mode) "off") }}
{{- fail "nodeAgent.ib.fabric.enabled=true with nodeAgent.ib.mode=off: there are no HCAs to join into a fabric. Set nodeAgent.ib.mode to auto, sysfs or full, or the fabric off." }}
{{- end }}
{{- if eq (int $fabric.port) (int (include "mokka.healthPort" .)) }}
{{- fail (printf "nodeAgent.ib.fabric.port=%v: expected a port other than the health port %s (both listen on the node's network)." $fabric.port (include "mokka.healthPort" .)) }}
{{- end }}
{{- end }}
{{- with .Values.nodeAgent.customProfile }}
{{- if kindIs "string" . }}
{{- $doc := fromYaml . }}
{{- if hasKey $doc "Error" }}
{{- fail (printf "nodeAgent.customProfile: expected a profile as a YAML mapping (version, system, device_defaults, devices, ...), but it does not parse as one: %s" (get $doc "Error")) }}
{{- end }}
{{- if not $doc }}
{{- fail "nodeAgent.customProfile: expected a profile as a YAML mapping (version, system, device_defaults, devices, ...), but the document is empty" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Whether the NRI plugin runs: containerd's NRI on and the plugin enabled.
Empty when not (a string, for `if`).
*/}}
{{- define "mokka.nriPlugin" -}}
{{- if and .Values.nodeAgent.nri.enabled .Values.nodeAgent.nri.plugin.enabled -}}true{{- end -}}
{{- end }}
