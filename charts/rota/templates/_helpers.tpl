{{/*
Names and labels shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "rota.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: fullnameOverride, or the release name plus the
chart name unless the release name already contains it. Truncated to 63
characters because some Kubernetes name fields are limited to that (DNS labels).
A Service's name must start with a letter (DNS-1035) and hold no dot, while helm
allows release names like "1prod" or "prod.eu": dots become '-', and a release
name that starts with a digit follows the chart name ("rota-1prod").
values.schema.json holds both overrides to DNS-1035 labels.
*/}}
{{- define "rota.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- $release := .Release.Name | replace "." "-" }}
{{- if regexMatch "^[0-9]" $release }}
{{- printf "%s-%s" $name $release | trunc 63 | trimSuffix "-" }}
{{- else if contains $name $release }}
{{- $release | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" $release $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's name: "<fullname>-<component>", e.g. rota-operator. */}}
{{- define "rota.componentName" -}}
{{- printf "%s-%s" (include "rota.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "rota.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Label keys the chart owns, which users' labels (commonLabels, podLabels, the
monitoring objects' labels) must not set: the selector labels (they pick a
component's pods; a pod whose labels differ from its Deployment's selector is
refused), managed-by (Helm's ownership) and rota.dev/instance (which operator
installation handles an object: operator.instance). Setting one fails the render.
Call with (dict "labels" .Values.commonLabels "where" "commonLabels").
*/}}
{{- define "rota.refuseOwnLabels" -}}
{{- $own := list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "app.kubernetes.io/managed-by" "rota.dev/instance" }}
{{- range $key, $_ := .labels }}
{{- if has $key $own }}
{{- fail (printf "%s must not set %s: the chart sets it, and the release's selectors and owners rely on it" $.where $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A resource's labels, each key once: the chart's, then commonLabels, then the
object's own (labels, named by where, e.g. metrics.dashboard.labels), each
replacing the ones before (app.kubernetes.io/part-of, say); the keys of
rota.refuseOwnLabels come last and only from the chart.
Call with (dict "root" $ "component" "worker" "labels" ... "where" ...); component,
labels and where are optional.
*/}}
{{- define "rota.labelMap" -}}
{{- $root := .root }}
{{- $labels := dict "helm.sh/chart" (include "rota.chart" $root) "app.kubernetes.io/version" (toString $root.Chart.AppVersion) "app.kubernetes.io/part-of" "rota" }}
{{- include "rota.refuseOwnLabels" (dict "labels" $root.Values.commonLabels "where" "commonLabels") }}
{{- range $key, $value := $root.Values.commonLabels }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- include "rota.refuseOwnLabels" (dict "labels" .labels "where" .where) }}
{{- range $key, $value := .labels }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- $_ := set $labels "app.kubernetes.io/name" (include "rota.name" $root) }}
{{- $_ := set $labels "app.kubernetes.io/instance" $root.Release.Name }}
{{- $_ := set $labels "app.kubernetes.io/managed-by" $root.Release.Service }}
{{- with .component }}
{{- $_ := set $labels "app.kubernetes.io/component" . }}
{{- end }}
{{- toYaml $labels }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "rota.labels" -}}
{{- include "rota.labelMap" (dict "root" .) }}
{{- end }}

{{/* Labels that select one component's pods; call with (dict "root" $ "component" "operator"). */}}
{{- define "rota.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rota.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's resources. */}}
{{- define "rota.componentLabels" -}}
{{- include "rota.labelMap" (dict "root" .root "component" .component) }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "rota.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rota.componentName" (dict "root" . "component" "operator")) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret that holds the database URL: the chart's own (database.url) or an existing one. */}}
{{- define "rota.databaseSecretName" -}}
{{- if .Values.database.url }}
{{- include "rota.componentName" (dict "root" . "component" "database") }}
{{- else }}
{{- required "set database.existingSecret (a Secret holding the URL) or database.url (trials)" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{/*
The ROTA_DATABASE_URL environment variable, read from the database Secret, and
libpq's TLS settings (database.tls): PGSSLMODE unless empty, PGSSLROOTCERT when a
CA is mounted (see rota.volumes). libpq reads both whenever the URL does not say.
*/}}
{{- define "rota.databaseEnv" -}}
- name: ROTA_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "rota.databaseSecretName" . }}
      key: {{ .Values.database.secretKey }}
{{- include "rota.tlsEnv" . }}
{{- end }}

{{- define "rota.tlsEnv" -}}
{{- $tls := .Values.database.tls }}
{{- with $tls.sslmode }}
- name: PGSSLMODE
  value: {{ . | quote }}
{{- end }}
{{- if or $tls.caSecret $tls.caConfigMap }}
- name: PGSSLROOTCERT
  value: {{ printf "/etc/rota/database-ca/%s" $tls.caKey | quote }}
{{- end }}
{{- end }}

{{/*
A component's extra environment (extraEnv), after the chart's own variables:
call with (dict "root" $ "values" .Values.worker).
*/}}
{{- define "rota.extraEnv" -}}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A container's mounts: /tmp, the database CA when set, then extraVolumeMounts. */}}
{{- define "rota.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- $tls := .root.Values.database.tls }}
{{- if or $tls.caSecret $tls.caConfigMap }}
- name: database-ca
  mountPath: /etc/rota/database-ca
  readOnly: true
{{- end }}
{{- with .values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A pod's volumes: /tmp's emptyDir, the database CA when set, then extraVolumes. */}}
{{- define "rota.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- $tls := .root.Values.database.tls }}
{{- if $tls.caSecret }}
- name: database-ca
  secret:
    secretName: {{ $tls.caSecret }}
    items:
      - key: {{ $tls.caKey }}
        path: {{ $tls.caKey }}
{{- else if $tls.caConfigMap }}
- name: database-ca
  configMap:
    name: {{ $tls.caConfigMap }}
    items:
      - key: {{ $tls.caKey }}
        path: {{ $tls.caKey }}
{{- end }}
{{- with .values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A pod template's metadata: podLabels under the selector labels (which they must
not set, see rota.refuseOwnLabels), podAnnotations. Call with (dict "root" $
"component" "migrate" "values" $mig "section" "migrations"); section (the
values.yaml section, for messages) defaults to the component.
*/}}
{{- define "rota.podMetadata" -}}
{{- $where := printf "%s.podLabels" (.section | default .component) }}
{{- include "rota.refuseOwnLabels" (dict "labels" .values.podLabels "where" $where) }}
{{- $labels := dict }}
{{- range $key, $value := .values.podLabels }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
labels:
  {{- toYaml (merge (include "rota.selectorLabels" . | fromYaml) $labels) | nindent 2 }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A component's ServiceAccount name: "<fullname>-<component>". */}}
{{- define "rota.componentAccount" -}}
{{- include "rota.componentName" (dict "root" .root "component" .component) }}
{{- end }}

{{/* The metrics settings of every process that serves Rota's measures (rota.metrics). */}}
{{- define "rota.metricsEnv" -}}
{{- with .Values.metrics.durationBuckets }}
- name: ROTA_METRICS_DURATION_BUCKETS
  value: {{ join "," . | quote }}
{{- end }}
- name: ROTA_METRICS_MAX_TYPES
  value: {{ .Values.metrics.maxTypes | quote }}
{{- end }}

{{/*
An image reference; call with (dict "root" $ "image" .Values.operator.image).
A digest (sha256:...) pins the image: repository@digest, the tag then unused.
*/}}
{{- define "rota.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* The pod-level fields every Rota pod shares. */}}
{{- define "rota.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* /tmp as an emptyDir: the root filesystem is read-only. */}}
{{- define "rota.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
{{- define "rota.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
"true" when the chart should create one of kopf's peering CRDs (crds/kopf/), else
empty. Args: root, name (the CRD), api (group/version/Kind). Only with crds.enabled
and operator.peering.enabled. In crds.kopfPeering "auto", a cluster that already
serves the kind from a CRD this release does not own (applied by hand, or by another
release or operator) keeps it: Helm could not adopt it, and must not delete it. A CRD
this release created is read back with lookup (its Helm release annotations), so it
stays in the release on upgrade instead of dropping out once the cluster serves it.
Without a cluster (helm template) lookup finds nothing: pass --api-versions only
when the CRDs are managed elsewhere, or set crds.kopfPeering to true or false.
*/}}
{{- define "rota.kopfCrdWanted" -}}
{{- $v := .root.Values }}
{{- $mode := toString $v.crds.kopfPeering }}
{{- if and $v.crds.enabled $v.operator.peering.enabled (ne $mode "false") }}
{{- if or (eq $mode "true") (not (.root.Capabilities.APIVersions.Has .api)) }}true
{{- else }}
{{- $live := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" .name }}
{{- $notes := dig "metadata" "annotations" dict $live }}
{{- $release := get $notes "meta.helm.sh/release-name" | toString }}
{{- $namespace := get $notes "meta.helm.sh/release-namespace" | toString }}
{{- if and (eq $release .root.Release.Name) (eq $namespace .root.Release.Namespace) }}true
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespaces the operator watches, comma-separated for ROTA_NAMESPACES:
operator.watchNamespaces, or the release's own namespace when it is empty; ""
(every namespace) when it is ["*"]. The chart's own WorkerPool (worker.enabled
with worker.pool.enabled) lives in the release's namespace, so a list without it
gets it added: the operator must see the pool to scale the workers.
*/}}
{{- define "rota.watchedNamespaces" -}}
{{- $list := .Values.operator.watchNamespaces | default (list .Release.Namespace) }}
{{- if not (has "*" $list) }}
{{- if and .Values.worker.enabled .Values.worker.pool.enabled }}
{{- $list = append $list .Release.Namespace | uniq }}
{{- end }}
{{- join "," $list }}
{{- end }}
{{- end }}

{{/* "true" when the operator watches every namespace (operator.watchNamespaces: ["*"]). */}}
{{- define "rota.clusterWide" -}}
{{- if has "*" (.Values.operator.watchNamespaces | default list) }}true{{- end }}
{{- end }}

{{/* The kopf peering object's name: operator.peering.name, else rota-operator[-<instance>]. */}}
{{- define "rota.peeringName" -}}
{{- if .Values.operator.peering.name }}
{{- .Values.operator.peering.name }}
{{- else if .Values.operator.instance }}
{{- printf "rota-operator-%s" .Values.operator.instance }}
{{- else }}rota-operator
{{- end }}
{{- end }}

{{/*
Labels and annotations of an object the operator handles and the release owns
(the WorkerPool, the peering objects): the instance label when
operator.instance is set.
*/}}
{{- define "rota.instanceLabel" -}}
{{- with .Values.operator.instance }}
rota.dev/instance: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
A custom object of the release whose kind may not be served yet when the chart
is rendered: its CRD is created by the same release, and Helm refuses to build
an object whose kind the cluster does not serve. Served (every upgrade, and an
install into a cluster that has the CRD): an ordinary object of the release.
Not served (the first install, or `helm template` without --api-versions): a
post-install hook, created right after the CRD, that carries the release's
ownership annotations, so that the next upgrade adopts it into the release.
Call with (dict "root" $ "api" "rota.dev/v1/WorkerPool").
*/}}
{{- define "rota.lateObjectAnnotations" -}}
{{- if not (.root.Capabilities.APIVersions.Has .api) }}
helm.sh/hook: post-install
helm.sh/hook-weight: "5"
meta.helm.sh/release-name: {{ .root.Release.Name }}
meta.helm.sh/release-namespace: {{ .root.Release.Namespace }}
{{- end }}
{{- end }}

{{/* The Secret that holds the console's signing key (ROTA_WEB_SECRET). */}}
{{- define "rota.signingSecretName" -}}
{{- if .Values.web.secret.existingSecret }}
{{- .Values.web.secret.existingSecret }}
{{- else if .Values.web.secret.value }}
{{- include "rota.componentName" (dict "root" . "component" "web-secret") }}
{{- else }}
{{- include "rota.componentName" (dict "root" . "component" "web-signing-key") }}
{{- end }}
{{- end }}
