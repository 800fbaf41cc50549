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

{{/* The agent namespace: the workflows' agent Secrets, which the CSI node plugins read. */}}
{{- define "sluice.agentNamespace" -}}
{{ required "agentNamespace is required" .Values.agentNamespace }}
{{- end -}}

{{/* The object storage endpoint (host:port). */}}
{{- define "sluice.storageEndpoint" -}}
{{- if .Values.storage.bundled -}}
sluice-minio.{{ .Release.Namespace }}.svc:9000
{{- else -}}
{{ required "storage.endpoint is required when storage.bundled is false" .Values.storage.endpoint }}
{{- end -}}
{{- end -}}

{{/* The CSI plugin container's resources: csi.resources, with limits.memory, when unset,
csi.storeSize plus 2Gi (about 40 store servers of 50 MB). The plugin's store servers store the other nodes' files in the
workflows' tmpfs mounts, and the kernel charges those pages to the plugin's container:
a limit below the store's size would have the plugin killed for workflow bytes. */}}
{{- define "sluice.csiResources" -}}
{{- $r := deepCopy (.Values.csi.resources | default dict) -}}
{{- if not (dig "limits" "memory" "" $r) -}}
{{- $size := toString .Values.csi.storeSize -}}
{{- $n := regexFind "^[0-9]+" $size -}}
{{- $unit := trimPrefix $n $size -}}
{{- $mi := 0 -}}
{{- if eq $unit "Mi" }}{{ $mi = atoi $n }}
{{- else if eq $unit "Gi" }}{{ $mi = mul (atoi $n) 1024 }}
{{- else if eq $unit "Ti" }}{{ $mi = mul (atoi $n) 1048576 }}
{{- else }}{{ fail (printf "csi.storeSize %q: give it in Mi, Gi or Ti, or set csi.resources.limits.memory" $size) }}
{{- end -}}
{{- $mi = add $mi 2048 -}}
{{- $limits := (get $r "limits") | default dict -}}
{{- $_ := set $limits "memory" (ternary (printf "%dGi" (div $mi 1024)) (printf "%dMi" $mi) (eq (mod $mi 1024) 0)) -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}
