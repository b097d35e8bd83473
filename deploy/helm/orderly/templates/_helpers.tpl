{{/* Names, labels and each process's environment. */}}

{{- define "orderly.fullname" -}}
{{- if contains "orderly" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-orderly" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orderly.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Labels of every object; with a component: dict "root" $ "component" "ingest". */}}
{{- define "orderly.labels" -}}
{{ include "orderly.selector" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "orderly.selector" -}}
app.kubernetes.io/name: orderly
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A secretKeyRef env entry: dict "name" "ORDERLY_X" "ref" (dict "name" .. "key" ..). */}}
{{- define "orderly.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s: the Secret's name" .name) .ref.name }}
      key: {{ required (printf "%s: the Secret's key" .name) .ref.key }}
{{- end -}}

{{/* A plain env entry, rendered only when the value is set. */}}
{{- define "orderly.plainEnv" -}}
{{- if not (kindIs "invalid" .value) }}
- name: {{ .name }}
  value: {{ .value | toString | quote }}
{{- end }}
{{- end -}}

{{/* ORDERLY_SECRET_<GATEWAY> of each enabled gateway. */}}
{{- define "orderly.gatewaySecrets" -}}
{{- range .Values.gateways }}
{{ include "orderly.secretEnv" (dict "name" (printf "ORDERLY_SECRET_%s" (upper .)) "ref" (dict "name" $.Values.secrets.gateways.name "key" .)) }}
{{- end }}
{{- end -}}

{{/*
The environment of one process: dict "root" $ "process" "ingest". What every process reads
(Kafka, PostgreSQL, the namespace, logging), then what only this one reads, then its `env` value.
tests/integration/test_helm_chart.py holds each process's list to app/setting_uses.py's table.
*/}}
{{- define "orderly.env" -}}
{{- $v := .root.Values -}}
{{- $p := .process -}}
{{- $k := $v.kafka -}}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA" "value" (required "kafka.bootstrap" $k.bootstrap)) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_REPLICATION_FACTOR" "value" $k.replicationFactor) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_MIN_INSYNC_REPLICAS" "value" $k.minInsyncReplicas) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_PARTITIONS" "value" $k.partitions) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SECURITY_PROTOCOL" "value" $k.securityProtocol) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SASL_MECHANISM" "value" $k.sasl.mechanism) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SASL_USERNAME" "value" $k.sasl.username) }}
{{- if $k.sasl.passwordSecret }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_KAFKA_SASL_PASSWORD" "ref" $k.sasl.passwordSecret) }}
{{- end }}
{{- if $k.tls.secretName }}
{{- if $k.tls.caKey }}{{ include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SSL_CAFILE" "value" (printf "/etc/orderly/kafka-tls/%s" $k.tls.caKey)) }}{{ end }}
{{- if $k.tls.certKey }}{{ include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SSL_CERTFILE" "value" (printf "/etc/orderly/kafka-tls/%s" $k.tls.certKey)) }}{{ end }}
{{- if $k.tls.keyKey }}{{ include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SSL_KEYFILE" "value" (printf "/etc/orderly/kafka-tls/%s" $k.tls.keyKey)) }}{{ end }}
{{- end }}
{{- if $k.tls.keyPasswordSecret }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_KAFKA_SSL_KEY_PASSWORD" "ref" $k.tls.keyPasswordSecret) }}
{{- end }}
{{- if not (kindIs "invalid" $k.tls.checkHostname) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_KAFKA_SSL_CHECK_HOSTNAME" "value" (ternary "1" "0" $k.tls.checkHostname)) }}
{{- end }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_POSTGRES_DSN" "ref" $v.secrets.postgresDsn) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_NAMESPACE" "value" $v.namespace) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_PROCESSING_GUARANTEE" "value" $v.processingGuarantee) }}
{{- if ne $p "migrate" }}{{/* `orderly migrate` logs nothing but its one line */}}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_LOG_FORMAT" "value" $v.logFormat) }}
{{- end }}
{{- if has $p (list "ingest" "worker" "projector" "effects" "fetcher" "admin") }}
{{- /* /metrics on a port of its own (never the webhook port, nor the admin's console port) */}}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_METRICS_HOST" "value" "0.0.0.0") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_METRICS_PORT" "value" $v.metrics.port) }}
{{- end }}
{{- if eq $p "ingest" }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_INGEST_HOST" "value" "0.0.0.0") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_INGEST_PORT" "value" $v.ingest.port) }}
{{- if and $v.secrets.adyenBasicAuth (has "adyen" $v.gateways) }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_ADYEN_BASIC_AUTH" "ref" $v.secrets.adyenBasicAuth) }}
{{- end }}
{{- end }}
{{- if eq $p "worker" }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_DATA_DIR" "value" "/var/lib/orderly") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_WORKER_INSTANCE_ID" "value" $v.worker.instanceId) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_STORE" "value" $v.worker.store) }}
{{- end }}
{{- if has $p (list "effects" "admin") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_EFFECTS_URL" "value" $v.effects.url) }}
{{- end }}
{{- if and (eq $p "effects") $v.effects.url }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_EFFECTS_SECRET" "ref" $v.secrets.effectsSecret) }}
{{- end }}
{{- if has $p (list "fetcher" "admin") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_CARD_API_URL" "value" $v.fetcher.cardApiUrl) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_PG_API_URL" "value" $v.fetcher.pgApiUrl) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_STRIPE_API_URL" "value" $v.fetcher.stripeApiUrl) }}
{{- end }}
{{- if and (eq $p "fetcher") $v.secrets.stripeApiKey }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_STRIPE_API_KEY" "ref" $v.secrets.stripeApiKey) }}
{{- end }}
{{- if eq $p "admin" }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_HOST" "value" "0.0.0.0") }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_PORT" "value" $v.admin.port) }}
{{- if $v.secrets.adminToken }}{{/* break-glass: off unless given */}}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_ADMIN_TOKEN" "ref" $v.secrets.adminToken) }}
{{- end }}
{{- with $v.admin.oidc }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_OIDC_ISSUER" "value" .issuer) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_OIDC_CLIENT_ID" "value" .clientId) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_OIDC_REDIRECT_URL" "value" .redirectUrl) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_ROLES_CLAIM" "value" .rolesClaim) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_ROLE_MAP" "value" .roleMap) }}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_ADMIN_TRUSTED_PROXIES" "value" .trustedProxies) }}
{{- end }}
{{- if $v.secrets.adminOidcClientSecret }}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_ADMIN_OIDC_CLIENT_SECRET" "ref" $v.secrets.adminOidcClientSecret) }}
{{- end }}
{{- end }}
{{- if eq $p "ingest" }}
{{- /* the ingest checks the signatures and serves the correlation API; no other process uses them (app/setting_uses.py) */}}
{{ include "orderly.secretEnv" (dict "name" "ORDERLY_API_TOKEN" "ref" $v.secrets.apiToken) }}
{{- include "orderly.gatewaySecrets" .root }}
{{- end }}
{{- if and $v.gatewaysSetting (has $p (list "ingest" "fetcher" "admin")) }}{{/* the processes that use it */}}
{{- include "orderly.plainEnv" (dict "name" "ORDERLY_GATEWAYS" "value" (join "," $v.gateways)) }}
{{- end }}
{{- $extra := index $v $p "env" }}
{{- range $name := keys $extra | sortAlpha }}
{{- include "orderly.plainEnv" (dict "name" $name "value" (index $extra $name)) }}
{{- end }}
{{- end -}}

{{/* The Kafka TLS files' volume and mount, when kafka.tls.secretName is set. */}}
{{- define "orderly.tlsVolume" -}}
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "orderly.tlsMount" -}}
{{- if .Values.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/orderly/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/*
A pod template of one process: dict "root" $ "process" "projector" "ports" (list ...) "probes" (...)
"mounts" (list ...) "volumes" (list ...).
*/}}
{{- define "orderly.pod" -}}
{{- $v := .root.Values -}}
{{- $c := index $v .process -}}
metadata:
  labels:
    {{- include "orderly.labels" (dict "root" .root "component" .process) | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- if ne .process "migrate" }}
  terminationGracePeriodSeconds: 30
  {{- end }}
  {{- with .restartPolicy }}
  restartPolicy: {{ . }}
  {{- end }}
  containers:
    - name: {{ .process }}
      image: {{ include "orderly.image" .root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      args: [{{ .process | quote }}]
      env:
        {{- include "orderly.env" (dict "root" .root "process" .process) | trim | nindent 8 }}
      {{- with .ports }}
      ports:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .probes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      {{- with $c.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $mounts := include "orderly.tlsMount" .root | fromYamlArray | concat (default (list) .mounts) }}
      {{- with $mounts }}
      volumeMounts:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- $volumes := include "orderly.tlsVolume" .root | fromYamlArray }}
  {{- with $volumes }}
  volumes:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
Liveness on /metrics for the processes without an HTTP port of their own; dict "startupSeconds" N:
how long it may take to start (a worker restores its state first); "ready" true: readiness on the
/readyz the process serves beside /metrics (projector, effects, fetcher: 503 while they wait for
PostgreSQL, app/readiness.py), so a pod waiting is taken out of its Service, never restarted.
*/}}
{{- define "orderly.metricsProbes" -}}
startupProbe:
  httpGet: { path: /metrics, port: metrics }
  periodSeconds: 5
  failureThreshold: {{ div .startupSeconds 5 }}
livenessProbe:
  httpGet: { path: /metrics, port: metrics }
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- if .ready }}
readinessProbe:
  httpGet: { path: /readyz, port: metrics }
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end }}
{{- end -}}
