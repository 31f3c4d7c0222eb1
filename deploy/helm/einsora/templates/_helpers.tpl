{{- define "einsora.name" -}}{{ .Release.Name }}-einsora{{- end -}}

{{- define "einsora.labels" -}}
app.kubernetes.io/name: einsora
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "einsora.selector" -}}
app.kubernetes.io/name: einsora
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "einsora.image" -}}
{{ .root.Values.image.registry }}/{{ .component }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{- define "einsora.natsUrl" -}}
{{- if .Values.nats.enabled -}}
nats://{{ .Release.Name }}-nats:4222
{{- else -}}
{{- required "externalNats.url is required when nats.enabled is false" .Values.externalNats.url -}}
{{- end -}}
{{- end -}}
