{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "weir.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: the release name, with the chart name prefixed unless it already contains it. */}}
{{- define "weir.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weir.labels" -}}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: weir
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* repository[:tag][@digest]; the tag defaults to the chart's appVersion. */}}
{{- define "weir.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- .Values.image.repository -}}
{{- if $tag }}:{{ $tag }}{{ end -}}
{{- if .Values.image.digest }}@{{ .Values.image.digest }}{{ end -}}
{{- end -}}

{{/* HOST:PORT, with IPv6 literals in brackets. */}}
{{- define "weir.hostPort" -}}
{{- $host := index . 0 -}}
{{- $port := index . 1 | int64 -}}
{{- if contains ":" $host -}}
[{{ $host }}]:{{ $port }}
{{- else -}}
{{ $host }}:{{ $port }}
{{- end -}}
{{- end -}}

{{/* The ports the agent serves: kube-proxy's while Weir replaces it, others beside it. */}}
{{- define "weir.healthzPort" -}}
{{- if .Values.kubeProxyCoexistence.enabled -}}
{{- .Values.kubeProxyCoexistence.healthzPort | int64 -}}
{{- else -}}
{{- .Values.healthz.port | int64 -}}
{{- end -}}
{{- end -}}

{{- define "weir.metricsPort" -}}
{{- if .Values.kubeProxyCoexistence.enabled -}}
{{- .Values.kubeProxyCoexistence.metricsPort | int64 -}}
{{- else -}}
{{- .Values.metrics.port | int64 -}}
{{- end -}}
{{- end -}}

{{/* Cross-field checks the schema cannot express. */}}
{{- define "weir.validate" -}}
{{- $range := splitList "-" .Values.nodePortRange -}}
{{- $lo := index $range 0 | int64 -}}
{{- $hi := index $range 1 | int64 -}}
{{- if or (gt $lo $hi) (gt $hi 65535) -}}
{{- fail (printf "nodePortRange %q: want LOW-HIGH with LOW <= HIGH <= 65535" .Values.nodePortRange) -}}
{{- end -}}
{{- $snat := splitList "-" .Values.snatPortRange -}}
{{- $slo := index $snat 0 | int64 -}}
{{- $shi := index $snat 1 | int64 -}}
{{- if or (gt $slo $shi) (gt $shi 65535) -}}
{{- fail (printf "snatPortRange %q: want LOW-HIGH with LOW <= HIGH <= 65535" .Values.snatPortRange) -}}
{{- end -}}
{{- $coexist := .Values.kubeProxyCoexistence -}}
{{- if $coexist.enabled -}}
{{- if eq ($coexist.healthzPort | int64) 10256 -}}
{{- fail "kubeProxyCoexistence.healthzPort is 10256, kube-proxy's /healthz port: the agent could not bind it beside kube-proxy; pick a free port (default 10356)" -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq ($coexist.metricsPort | int64) 10249) -}}
{{- fail "kubeProxyCoexistence.metricsPort is 10249, kube-proxy's metrics port: the agent could not bind it beside kube-proxy; pick a free port (default 10349)" -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq ($coexist.metricsPort | int64) ($coexist.healthzPort | int64)) -}}
{{- fail (printf "kubeProxyCoexistence.metricsPort and kubeProxyCoexistence.healthzPort are both %d: they need their own ports" ($coexist.healthzPort | int64)) -}}
{{- end -}}
{{- if and .Values.cleanupKubeProxy.enabled (not .Values.cleanupKubeProxy.dryRun) -}}
{{- fail "cleanupKubeProxy.enabled with kubeProxyCoexistence.enabled: the cleanup would remove the rules of a kube-proxy that still runs (and serves NodePorts). Delete the kube-proxy DaemonSet, then set kubeProxyCoexistence.enabled=false in the same upgrade as the cleanup (cleanupKubeProxy.dryRun=true previews it safely)" -}}
{{- end -}}
{{- else if and .Values.metrics.enabled (eq (.Values.metrics.port | int64) (.Values.healthz.port | int64)) -}}
{{- fail (printf "metrics.port and healthz.port are both %d: they need their own ports" (.Values.healthz.port | int64)) -}}
{{- end -}}
{{- if .Values.serviceMonitor.enabled -}}
{{- if not .Values.metrics.enabled -}}
{{- fail "serviceMonitor.enabled needs metrics.enabled: there is nothing to scrape" -}}
{{- end -}}
{{- if hasPrefix "127." .Values.metrics.bindAddress | or (eq .Values.metrics.bindAddress "::1") -}}
{{- fail (printf "serviceMonitor.enabled needs metrics.bindAddress reachable from Prometheus (e.g. 0.0.0.0); %s is only reachable on the node" .Values.metrics.bindAddress) -}}
{{- end -}}
{{- end -}}
{{- end -}}
