{{- define "tandem-bridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem-bridge.labels" -}}
{{ include "tandem-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tandem-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tandem-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tandem-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The names shared by the Deployment, the Service, the webhook configuration and the
     certificate machinery. */}}
{{- define "tandem-bridge.webhookName" -}}
{{- printf "%s.%s.tandem.dev" (include "tandem-bridge.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- define "tandem-bridge.webhookConfig" -}}
{{- printf "%s-%s" (include "tandem-bridge.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "tandem-bridge.tlsSecret" -}}
{{- default (printf "%s-webhook-tls" (include "tandem-bridge.fullname" .)) .Values.webhook.tls.secretName -}}
{{- end -}}
{{- define "tandem-bridge.leaseName" -}}
{{- printf "%s-leader" (include "tandem-bridge.fullname" .) -}}
{{- end -}}
{{- define "tandem-bridge.guardName" -}}
{{- printf "guard.%s" (include "tandem-bridge.webhookName" .) -}}
{{- end -}}

{{/* Usernames whose operator pods may reach pool nodes, comma-separated. */}}
{{- define "tandem-bridge.guardOperators" -}}
{{- $out := list -}}
{{- range .Values.webhook.guard.operatorServiceAccounts -}}
{{- if contains "/" . -}}
{{- $p := splitList "/" . -}}
{{- $out = append $out (printf "system:serviceaccount:%s:%s" (index $p 0) (index $p 1)) -}}
{{- else -}}
{{- $out = append $out (printf "system:serviceaccount:%s:%s" $.Release.Namespace .) -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* Usernames that may bind pods onto pool nodes: this bridge and the configured ones. */}}
{{- define "tandem-bridge.guardBinders" -}}
{{- $self := printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tandem-bridge.serviceAccountName" .) -}}
{{- join "," (prepend .Values.webhook.guard.binders $self | uniq) -}}
{{- end -}}

{{/* CEL: whether the pod `.` (object or oldObject) tolerates the pool taint key, or every
     taint; the guard's rule (bridge/src/webhook/admit.rs, tolerates_pool_key). */}}
{{- define "tandem-bridge.toleratesPool" -}}
(has({{ . }}.spec.tolerations) && {{ . }}.spec.tolerations.exists(t, (has(t.key) && t.key == 'tandem.dev/pool') || ((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists')))
{{- end -}}
