{{/* The sluice image reference. */}}
{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The NATS URL the controller and the sidecars use. */}}
{{- define "sluice.natsURL" -}}
{{- if .Values.nats.bundled -}}
{{ if .Values.tls.enabled }}tls{{ else }}nats{{ end }}://sluice-nats.{{ .Release.Namespace }}.svc:4222
{{- else -}}
{{ required "nats.url is required when nats.bundled is false" .Values.nats.url }}
{{- end -}}
{{- end -}}

{{/* The object storage endpoint (host:port). */}}
{{- define "sluice.storageEndpoint" -}}
{{- if .Values.storage.bundled -}}
sluice-minio.{{ .Release.Namespace }}.svc:9000
{{- else -}}
{{ required "storage.endpoint is required when storage.bundled is false" .Values.storage.endpoint }}
{{- end -}}
{{- end -}}
