{{/*
Helpers of the weft chart. Object names are fixed (weft-agent, weft-controller, ...), as in the
kustomize base: cluster-scoped objects (ClusterRoles, admission policies, webhook configurations)
carry them, so one cluster runs one weft release.
*/}}

{{/*
Labels on every object's metadata: the base's app.kubernetes.io/part-of, and Helm's own. Never in
selectors (immutable on Deployments and DaemonSets) nor in pod templates (a chart version bump
would restart every pod).
*/}}
{{- define "weft.labels" -}}
app.kubernetes.io/part-of: weft
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* A component's labels on its workload, pod template and Service. Argument: the component. */}}
{{- define "weft.componentLabels" -}}
app.kubernetes.io/name: weft-{{ . }}
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* The image of every component. */}}
{{- define "weft.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* WEFT_LOG of a component. Argument: (list $ .Values.<component>.logLevel). */}}
{{- define "weft.logLevel" -}}
{{ index . 1 | default (index . 0).Values.logLevel }}
{{- end }}

{{/* The service-account user name the admission policies confine. Argument: (list $ "weft-agent"). */}}
{{- define "weft.serviceAccountUser" -}}
system:serviceaccount:{{ (index . 0).Release.Namespace }}:{{ index . 1 }}
{{- end }}

{{/* Container securityContext of every weft container (lint-deploy.sh checks it). Argument: runAsNonRoot. */}}
{{- define "weft.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: {{ . }}
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* Probes on the ops port. Argument: (list readinessPeriod livenessPeriod). */}}
{{- define "weft.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: {{ index . 0 }}
  timeoutSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ index . 1 }}
  timeoutSeconds: 2
  failureThreshold: 3
{{- end }}

{{/* Spread a Deployment's replicas over nodes. Argument: the component. */}}
{{- define "weft.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        app.kubernetes.io/name: weft-{{ . }}
{{- end }}

{{/* Combinations of values the schema cannot express. Included by every always-rendered workload. */}}
{{- define "weft.validate" -}}
{{- if and .Values.webhook.certManager.enabled (not .Values.webhook.enabled) -}}
{{- fail "webhook.certManager.enabled needs webhook.enabled: true (the certificate is the webhook's)" -}}
{{- end -}}
{{- if and .Values.agent.sriov.enabled .Values.agent.nicDra.enabled -}}
{{- fail "agent.sriov.enabled and agent.nicDra.enabled exclude each other: both bring the ConfigMap weft-physnets; to run both on a node, use the nic-dra component with --sriov-plugin and --nic-dra-physnet (docs/deploy.md, NumaNetwork components)" -}}
{{- end -}}
{{- end }}

{{- /*
The binding of a component's extra ClusterRole (an opt-in feature's rules, deploy/components/*)
to the component's ServiceAccount: (list $ "<role name>" "<service account>").
*/ -}}
{{- define "weft.extraRoleBinding" -}}
{{- $ := index . 0 -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ index . 1 }}
  labels:
    {{- include "weft.labels" $ | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ index . 1 }}
subjects:
  - kind: ServiceAccount
    name: {{ index . 2 }}
    namespace: {{ $.Release.Namespace }}
{{- end }}
