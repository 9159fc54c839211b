{{/* Chart name, for the app.kubernetes.io/name label. */}}
{{- define "toolgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, suffixed with the chart name unless it holds it. */}}
{{- define "toolgate.fullname" -}}
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

{{/* Names of the objects other templates and the injector's flags refer to. */}}
{{- define "toolgate.injectorName" -}}
{{- printf "%s-injector" (include "toolgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolgate.configMapName" -}}
{{- printf "%s-config" (include "toolgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolgate.adminSecretName" -}}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecret }}
{{- else }}
{{- printf "%s-admin" (include "toolgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Where the injector mounts the evidence Secret in the sidecar (`--evidence-secret`); the
injector's evidence mount path, and the directory of evidence.signing_key_file. */}}
{{- define "toolgate.evidenceMountPath" -}}
/var/run/secrets/toolgate/evidence
{{- end }}

{{/* Where the sidecar reads its config ConfigMap: the injector mounts it at /etc/toolgate. */}}
{{- define "toolgate.configMountPath" -}}
/etc/toolgate
{{- end }}

{{/* File name, in the config ConfigMap, of previous public key number N (from 0). */}}
{{- define "toolgate.previousKeyFile" -}}
{{- printf "evidence-previous-%d.pub.pem" (add1 .) }}
{{- end }}

{{/* The `evidence` block of the sidecar config, as JSON: {} when no evidence value is set. */}}
{{- define "toolgate.evidenceConfig" -}}
{{- $ev := .Values.evidence }}
{{- $block := dict }}
{{- if $ev.existingSecret }}
{{- $_ := set $block "signing_key_file" (printf "%s/%s" (include "toolgate.evidenceMountPath" .) $ev.secretKey) }}
{{- end }}
{{- if $ev.previousPublicKeys }}
{{- $files := list }}
{{- range $i, $_ := $ev.previousPublicKeys }}
{{- $files = append $files (printf "%s/%s" (include "toolgate.configMountPath" $) (include "toolgate.previousKeyFile" $i)) }}
{{- end }}
{{- $_ := set $block "previous_public_keys" $files }}
{{- end }}
{{- if $ev.issuer }}
{{- $_ := set $block "issuer" $ev.issuer }}
{{- end }}
{{- if and $block (hasKey .Values.config "evidence") }}
{{- fail "set the evidence.* values or config.evidence, not both: the chart builds config.evidence from evidence.*" }}
{{- end }}
{{- toJson $block }}
{{- end }}

{{- define "toolgate.tlsSecretName" -}}
{{- printf "%s-injector-tls" (include "toolgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toolgate.injectorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "toolgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "toolgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that identify this release's objects; stable across upgrades. */}}
{{- define "toolgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "toolgate.injectorSelectorLabels" -}}
{{ include "toolgate.selectorLabels" . }}
app.kubernetes.io/component: injector
{{- end }}

{{/* image reference: repository@digest, else repository:tag. Call with (list repository tag digest). */}}
{{- define "toolgate.imageRef" -}}
{{- $repo := index . 0 }}{{ $tag := index . 1 }}{{ $digest := index . 2 }}
{{- if $digest }}
{{- printf "%s@%s" $repo $digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{- define "toolgate.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- include "toolgate.imageRef" (list .Values.image.repository $tag .Values.image.digest) }}
{{- end }}

{{/* The image the injector writes into pods: sidecar.image, falling back to image field by field. */}}
{{- define "toolgate.sidecarImage" -}}
{{- $s := .Values.sidecar.image }}
{{- $repo := default .Values.image.repository $s.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) $s.tag }}
{{- $digest := $s.digest }}
{{- if and (not $s.repository) (not $s.tag) (not $s.digest) }}
{{- $digest = .Values.image.digest }}
{{- end }}
{{- include "toolgate.imageRef" (list $repo $tag $digest) }}
{{- end }}

{{/* JSON list of the namespaces whose pods are injected (the release namespace when none is set). */}}
{{- define "toolgate.injectionNamespaces" -}}
{{- if .Values.injection.namespaces }}
{{- toJson (uniq .Values.injection.namespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
The injector's serving certificate when cert-manager is off, as JSON {crt, key, ca} (base64 PEM).
An existing Secret is reused so upgrades keep the same CA; otherwise a CA and certificate are
generated. The result is kept in .Values for the rest of this render, so the Secret, the webhook's
caBundle and the Deployment's checksum all see the same material.
*/}}
{{- define "toolgate.injectorTLS" -}}
{{- if not (hasKey .Values.injector.tls "_material") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "toolgate.tlsSecretName" .) | default dict }}
{{- $crt := dig "data" "tls.crt" "" $existing }}
{{- $key := dig "data" "tls.key" "" $existing }}
{{- $ca := dig "data" "ca.crt" "" $existing }}
{{- if not (and $crt $key $ca) }}
{{- $svc := include "toolgate.injectorName" . }}
{{- $ns := .Release.Namespace }}
{{- $days := int .Values.injector.tls.validityDays }}
{{- $caCert := genCA (printf "%s-ca" $svc) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $caCert }}
{{- $crt = $cert.Cert | b64enc }}
{{- $key = $cert.Key | b64enc }}
{{- $ca = $caCert.Cert | b64enc }}
{{- end }}
{{- $_ := set .Values.injector.tls "_material" (dict "crt" $crt "key" $key "ca" $ca) }}
{{- end }}
{{- toJson (get .Values.injector.tls "_material") }}
{{- end }}

{{/* The admin token: the given value, else the one already installed (read from the first
injection namespace, where the chart put it), else a new random one. */}}
{{- define "toolgate.adminToken" -}}
{{- $token := .Values.adminToken.value }}
{{- if not $token }}
{{- $ns := include "toolgate.injectionNamespaces" . | fromJsonArray | first }}
{{- $existing := lookup "v1" "Secret" $ns (include "toolgate.adminSecretName" .) | default dict }}
{{- $token = dig "data" "token" "" $existing | b64dec }}
{{- end }}
{{- default (randAlphaNum 48) $token }}
{{- end }}
