{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "attnserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name: <release>-<chart>, or just <release> when it already names the chart. */}}
{{- define "attnserve.fullname" -}}
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

{{/* The headless Service's name; its length leaves room for the suffix. */}}
{{- define "attnserve.headlessName" -}}
{{- printf "%s-headless" (include "attnserve.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "attnserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attnserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "attnserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "attnserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
{{- end }}

{{- define "attnserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "attnserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* --devices: a CPU-only release (gpu.count 0) never looks for GPUs. */}}
{{- define "attnserve.devices" -}}
{{- if eq (int .Values.gpu.count) 0 }}cpu{{ else }}{{ .Values.server.devices }}{{ end }}
{{- end }}

{{/* The server's command-line flags, one list item each. */}}
{{- define "attnserve.args" -}}
- --host=0.0.0.0
- --grpc_port={{ int64 .Values.server.grpcPort }}
- --http_port={{ int64 .Values.server.httpPort }}
- --devices={{ include "attnserve.devices" . }}
- --drain_timeout_seconds={{ int64 .Values.server.drainTimeoutSeconds }}
- --max_message_bytes={{ int64 .Values.server.maxMessageBytes }}
- --max_total_tokens={{ int64 .Values.server.maxTotalTokens }}
- --max_head_dim={{ int64 .Values.server.maxHeadDim }}
- --max_num_heads={{ int64 .Values.server.maxNumHeads }}
- --max_batch={{ int64 .Values.server.maxBatch }}
- --max_request_compute_seconds={{ float64 .Values.server.maxRequestComputeSeconds }}
- --cpu_threads={{ int64 .Values.server.cpuThreads }}
- --http_threads={{ int64 .Values.server.httpThreads }}
- --context_memory_bytes={{ int64 .Values.server.contextMemoryBytes }}
- --context_ttl_seconds={{ int64 .Values.server.contextTtlSeconds }}
{{- if .Values.server.advertisePodAddress }}
- --advertise_address=$(ATTNSERVE_POD_IP):{{ int64 .Values.server.grpcPort }}
{{- end }}
{{- with .Values.security.tls }}
{{- if .secretName }}
- --tls_cert_file=/etc/attnserve/tls/tls.crt
- --tls_key_file=/etc/attnserve/tls/tls.key
{{- end }}
{{- if .clientCaSecretName }}
- --tls_client_ca_file=/etc/attnserve/client-ca/ca.crt
{{- end }}
{{- end }}
{{- with .Values.security.auth }}
{{- if .tokensSecretName }}
- --auth_tokens_file=/etc/attnserve/auth/{{ .tokensSecretKey }}
{{- end }}
{{- end }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The kubelet's SIGKILL deadline: the preStop sleep, then the server's whole drain, then slack. */}}
{{- define "attnserve.terminationGracePeriodSeconds" -}}
{{- add (int64 .Values.lifecycle.preStopSleepSeconds) (int64 .Values.server.drainTimeoutSeconds) (int64 .Values.lifecycle.terminationMarginSeconds) }}
{{- end }}

{{/*
Node affinity on GPU Feature Discovery labels. Node selector terms are ORed and the expressions
within one term ANDed, so each compute capability becomes one term carrying the shared product
and minimum-major expressions.
*/}}
{{- define "attnserve.gpuNodeAffinity" -}}
{{- $selector := .Values.gpu.selector }}
{{- $common := list (dict "key" "nvidia.com/gpu.present" "operator" "In" "values" (list "true")) }}
{{- if $selector.products }}
{{- $common = append $common (dict "key" "nvidia.com/gpu.product" "operator" "In" "values" $selector.products) }}
{{- end }}
{{- if gt (int $selector.minComputeMajor) 0 }}
{{- $common = append $common (dict "key" "nvidia.com/gpu.compute.major" "operator" "Gt" "values" (list (toString (sub (int $selector.minComputeMajor) 1)))) }}
{{- end }}
{{- $terms := list }}
{{- range $selector.computeCapabilities }}
{{- $parts := splitList "." (toString .) }}
{{- $cc := list (dict "key" "nvidia.com/gpu.compute.major" "operator" "In" "values" (list (index $parts 0))) (dict "key" "nvidia.com/gpu.compute.minor" "operator" "In" "values" (list (index $parts 1))) }}
{{- $terms = append $terms (dict "matchExpressions" (concat $common $cc)) }}
{{- end }}
{{- if not $terms }}
{{- $terms = list (dict "matchExpressions" $common) }}
{{- end }}
requiredDuringSchedulingIgnoredDuringExecution:
  nodeSelectorTerms:
    {{- toYaml $terms | nindent 4 }}
{{- end }}

{{/*
One probe's handler: gRPC health without TLS (the kubelet's gRPC probes cannot speak it), an
HTTPS GET of `path` with TLS (the kubelet does not verify the certificate), a TCP connect with
mTLS (the kubelet has no client certificate).
*/}}
{{- define "attnserve.probeHandler" -}}
{{- $values := .root.Values }}
{{- if $values.security.tls.clientCaSecretName }}
tcpSocket:
  port: {{ int64 $values.server.grpcPort }}
{{- else if $values.security.tls.secretName }}
httpGet:
  port: {{ int64 $values.server.httpPort }}
  path: {{ .path }}
  scheme: HTTPS
{{- else }}
grpc:
  port: {{ int64 $values.server.grpcPort }}
  service: {{ .service | quote }}
{{- end }}
{{- end }}

{{/* The Secrets mounted under /etc/attnserve/<dir>, as a YAML list of {name, secret, dir}. */}}
{{- define "attnserve.secretVolumes" -}}
{{- $volumes := list }}
{{- with .Values.security.tls.secretName }}
{{- $volumes = append $volumes (dict "name" "tls" "secret" . "dir" "tls") }}
{{- end }}
{{- with .Values.security.tls.clientCaSecretName }}
{{- $volumes = append $volumes (dict "name" "client-ca" "secret" . "dir" "client-ca") }}
{{- end }}
{{- with .Values.security.auth.tokensSecretName }}
{{- $volumes = append $volumes (dict "name" "auth-tokens" "secret" . "dir" "auth") }}
{{- end }}
{{- toYaml $volumes }}
{{- end }}
