{{/* Names: release-scoped so that two releases in one cluster never clash. */}}
{{- define "ckptdrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ckptdrain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; component is added per object. */}}
{{- define "ckptdrain.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "ckptdrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ckptdrain.labels" -}}
{{ include "ckptdrain.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "ckptdrain.agentLabels" -}}
{{ include "ckptdrain.commonLabels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "ckptdrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ckptdrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "ckptdrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ckptdrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image the operator runs and injects: digest wins over tag. */}}
{{- define "ckptdrain.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ckptdrain.webhookServiceName" -}}
{{- printf "%s-webhook" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The CSI node driver's DaemonSet, ServiceAccount and RBAC; also the job
label of its scrape, which its alerts select by. */}}
{{- define "ckptdrain.csiNodeName" -}}
{{- printf "%s-csi-node" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* cert-manager's Secret (kubernetes.io/tls), mounted by the operator. */}}
{{- define "ckptdrain.tlsSecretName" -}}
{{- printf "%s-webhook-tls" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret in which the operator keeps its own webhook CA and certificate. */}}
{{- /* Where the peer tier's per-policy CAs are kept (values: operator.peerCANamespace). */ -}}
{{- define "ckptdrain.peerCANamespace" -}}
{{- default (printf "%s-peer-ca" .Release.Namespace | trunc 63 | trimSuffix "-") .Values.operator.peerCANamespace -}}
{{- end -}}

{{- define "ckptdrain.certSecretName" -}}
{{- printf "%s-webhook-cert" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ckptdrain.agentImagesName" -}}
{{- printf "%s-agent-images" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ckptdrain.agentClusterRoleName" -}}
{{- printf "%s-agent" (include "ckptdrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Where both webhook configurations send their requests. */}}
{{/* The webhook Service's port (templates/service.yaml), which the webhook
configurations and the CheckpointPolicy CRD's conversion name. */}}
{{- define "ckptdrain.webhookServicePort" -}}
443
{{- end -}}

{{- define "ckptdrain.webhookClientConfig" -}}
service:
  name: {{ include "ckptdrain.webhookServiceName" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: {{ include "ckptdrain.webhookServicePort" .root }}
{{- end -}}

{{- define "ckptdrain.certManagerAnnotations" -}}
{{- if .Values.certManager.enabled }}
annotations:
  # cainjector copies the Certificate's CA into every webhook's caBundle.
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "ckptdrain.fullname" .) }}
{{- end }}
{{- end -}}

{{/* The operator's PriorityClass: the one named in values, else the chart's own. */}}
{{- define "ckptdrain.priorityClassName" -}}
{{- if .Values.operator.priorityClassName -}}
{{- .Values.operator.priorityClassName -}}
{{- else if .Values.priorityClass.create -}}
{{- include "ckptdrain.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
Kueue's manager ConfigMap as "namespace/name", or "" unless both are set.
*/}}
{{- define "ckptdrain.kueueConfigMap" -}}
{{- with .Values.kueue.configMap -}}
{{- if and .namespace .name -}}
{{ .namespace }}/{{ .name }}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Seconds in a duration the schema admits (30m, 1.5h, 2h30m, 500ms), as a
number: alert thresholds compare durations and render them for PromQL. */}}
{{- define "ckptdrain.durationSeconds" -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)" . -1 -}}
{{- $unit := regexFind "(ms|s|m|h|d)$" . -}}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get (dict "ms" 0.001 "s" 1 "m" 60 "h" 3600 "d" 86400) $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
