{{- define "drover.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "drover.headless" -}}
{{- printf "%s-headless" (include "drover.fullname" .) -}}
{{- end -}}

{{- define "drover.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "drover.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every member's node-to-node address: ID=POD.HEADLESS.NAMESPACE.svc:PORT */}}
{{- define "drover.members" -}}
{{- $full := include "drover.fullname" . -}}
{{- $headless := include "drover.headless" . -}}
{{- $members := list -}}
{{- range $i := until (int (include "drover.formedSize" .)) -}}
{{- $member := printf "%d=%s-%d.%s.%s.svc:%d" $i $full $i $headless $.Release.Namespace (int $.Values.ports.cluster) -}}
{{- with ($.Values.locality | default dict).locations -}}
{{- if ne (len .) (int $.Values.clusterSize) -}}
{{- fail (printf "locality.locations names %d locations; give one per node (clusterSize %d), or none" (len .) (int $.Values.clusterSize)) -}}
{{- end -}}
{{- $member = printf "%s@%s" $member (index . $i) -}}
{{- end -}}
{{- $members = append $members $member -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}

{{/* The size the cluster formed with: its member list. */}}
{{- define "drover.formedSize" -}}
{{- if gt (int .Values.formedSize) 0 -}}{{ .Values.formedSize }}{{- else -}}{{ .Values.clusterSize }}{{- end -}}
{{- end -}}

{{/* Each node's cluster address, {id} standing for its ordinal. */}}
{{- define "drover.addressTemplate" -}}
{{- printf "%s-{id}.%s.%s.svc:%d" (include "drover.fullname" .) (include "drover.headless" .) .Release.Namespace (int .Values.ports.cluster) -}}
{{- end -}}

{{/* The Secret with the nodes' TLS certificate, key and CA. */}}
{{- define "drover.tlsSecret" -}}
{{- default (printf "%s-tls" (include "drover.fullname" .)) .Values.tls.secretName -}}
{{- end -}}
