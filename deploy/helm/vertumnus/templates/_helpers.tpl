{{- define "vertumnus.fullname" -}}
{{- printf "%s-vertumnus-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vertumnus.serviceAccountName" -}}
{{- default (include "vertumnus.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "vertumnus.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "vertumnus.labels" -}}
app.kubernetes.io/name: vertumnus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vertumnus.selector" -}}
app.kubernetes.io/name: vertumnus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "vertumnus.adminKeySecret" -}}
{{- default (printf "%s-admin-key" (include "vertumnus.fullname" .)) .Values.operator.adminKey.existingSecret -}}
{{- end -}}
