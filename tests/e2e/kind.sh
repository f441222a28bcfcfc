#!/usr/bin/env bash
# Rota end to end on a throwaway kind cluster:
#   build the worker and operator images (and a worker image with test handlers),
#   load them into a new kind cluster, run PostgreSQL in it, `helm install` the
#   chart, then check that
#     - a JobSchedule becomes a schedule row,
#     - its every-minute job runs within two minutes,
#     - the WorkerPool scales the workers 0 -> at least 1 -> 0,
#     - deleting the JobSchedule removes its row.
# Everything is torn down on exit, success or not (KEEP_CLUSTER=1 keeps it to debug).
#
# Needs: docker (with a running engine), kind, kubectl, helm v3 on PATH.
# `make e2e-kind` puts the pinned helm and kubectl on PATH and runs this script.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
E2E="$ROOT/tests/e2e"
CLUSTER=${CLUSTER:-rota-e2e-$$}
NAMESPACE=rota
RELEASE=rota
WORKER_IMAGE=${WORKER_IMAGE:-rota-worker:e2e}
OPERATOR_IMAGE=${OPERATOR_IMAGE:-rota-operator:e2e}
HANDLERS_IMAGE=${HANDLERS_IMAGE:-rota-worker-e2e:e2e}
KEEP_CLUSTER=${KEEP_CLUSTER:-}
SCHEDULE_ROW="$NAMESPACE/e2e-tick"
WORKERS="$RELEASE-worker"
KUBECONFIG=$(mktemp "${TMPDIR:-/tmp}/rota-e2e-kubeconfig.XXXXXX")
export KUBECONFIG

log() { printf '\n==> %s\n' "$*" >&2; }
fail() { printf '\nFAIL: %s\n' "$*" >&2; exit 1; }

diagnose() {
  log "diagnostics"
  kubectl -n "$NAMESPACE" get all,jobschedules,workerpools -o wide || true
  kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -n 40 || true
  local component
  for component in operator scheduler worker; do
    kubectl -n "$NAMESPACE" logs "deployment/$RELEASE-$component" --all-containers \
      --tail=80 || true
  done
}

teardown() {
  local status=$?
  trap - EXIT
  if [[ $status -ne 0 ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    diagnose
  fi
  if [[ -n "$KEEP_CLUSTER" ]]; then
    log "keeping cluster $CLUSTER (KUBECONFIG=$KUBECONFIG)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -f "$KUBECONFIG"
  fi
  exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# wait_for SECONDS DESCRIPTION COMMAND...: run COMMAND until it succeeds or time runs out.
wait_for() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      fail "$what: not within ${timeout}s"
    fi
    sleep 2
  done
  log "ok: $what"
}

psql_value() {
  kubectl -n "$NAMESPACE" exec postgres-0 -- psql -U rota -d rota -tAq -c "$1"
}

schedule_rows() {
  psql_value "SELECT count(*) FROM rota.schedule WHERE name = '$SCHEDULE_ROW'"
}

schedule_row_exists() { [[ "$(schedule_rows)" == 1 ]]; }
schedule_row_gone() { [[ "$(schedule_rows)" == 0 ]]; }

scheduled_job_ran() {
  local ran
  ran=$(psql_value "SELECT count(*) FROM rota.job j JOIN rota.schedule s ON s.id = j.schedule_id
    WHERE s.name = '$SCHEDULE_ROW' AND j.started_at IS NOT NULL")
  [[ "$ran" -ge 1 ]]
}

scheduled_job_done() {
  local done_jobs
  done_jobs=$(psql_value "SELECT count(*) FROM rota.job j JOIN rota.schedule s ON s.id = j.schedule_id
    WHERE s.name = '$SCHEDULE_ROW' AND j.status = 'done'")
  [[ "$done_jobs" -ge 1 ]]
}

worker_replicas() {
  kubectl -n "$NAMESPACE" get deployment "$WORKERS" -o 'jsonpath={.spec.replicas}'
}

workers_at() { [[ "$(worker_replicas)" == "$1" ]]; }
workers_at_least_one() { [[ "$(worker_replicas)" -ge 1 ]]; }

require() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || fail "$tool is not on PATH"
  done
}

split_image() {  # "repo/name:tag" -> "repo/name tag"
  printf '%s %s\n' "${1%:*}" "${1##*:}"
}

main() {
  require docker kind kubectl helm
  docker info >/dev/null 2>&1 || fail "the Docker engine is not reachable"

  log "building images"
  docker build -f "$ROOT/Dockerfile.worker" -t "$WORKER_IMAGE" "$ROOT"
  docker build -f "$ROOT/Dockerfile.operator" -t "$OPERATOR_IMAGE" "$ROOT"
  docker build -f "$E2E/Dockerfile.handlers" --build-arg "WORKER_IMAGE=$WORKER_IMAGE" \
    -t "$HANDLERS_IMAGE" "$E2E"

  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s
  kind load docker-image --name "$CLUSTER" "$WORKER_IMAGE" "$OPERATOR_IMAGE" "$HANDLERS_IMAGE"

  log "starting PostgreSQL"
  kubectl create namespace "$NAMESPACE"
  kubectl -n "$NAMESPACE" apply -f "$E2E/postgres.yaml"
  kubectl -n "$NAMESPACE" rollout status statefulset/postgres --timeout=180s
  kubectl -n "$NAMESPACE" create secret generic rota-database \
    --from-literal=url="postgresql://rota:rota@postgres.$NAMESPACE.svc:5432/rota"

  log "installing the chart"
  local operator_repo operator_tag worker_repo worker_tag
  read -r operator_repo operator_tag < <(split_image "$OPERATOR_IMAGE")
  read -r worker_repo worker_tag < <(split_image "$HANDLERS_IMAGE")
  helm install "$RELEASE" "$ROOT/charts/rota" --namespace "$NAMESPACE" --wait --timeout 5m \
    --set operator.image.repository="$operator_repo" \
    --set operator.image.tag="$operator_tag" \
    --set operator.image.pullPolicy=Never \
    --set worker.enabled=true \
    --set worker.image.repository="$worker_repo" \
    --set worker.image.tag="$worker_tag" \
    --set worker.image.pullPolicy=Never \
    --set 'worker.handlers={e2e_handlers}' \
    --set 'worker.types={e2e.tick}' \
    --set worker.pool.minReplicas=0 \
    --set worker.pool.maxReplicas=3 \
    --set worker.pool.targetQueueAgeSeconds=10 \
    --set worker.pool.scaleDownStabilizationSeconds=20 \
    --set worker.pool.pollIntervalSeconds=5

  log "the idle WorkerPool scales the workers to 0"
  kubectl -n "$NAMESPACE" get workerpool "$WORKERS"
  wait_for 180 "workers scaled to 0 while the queue is empty" workers_at 0

  log "applying a JobSchedule that runs every minute"
  kubectl -n "$NAMESPACE" apply -f "$E2E/schedule.yaml"
  local applied_at=$SECONDS
  wait_for 60 "schedule row $SCHEDULE_ROW exists" schedule_row_exists
  wait_for 120 "the WorkerPool scales the workers to at least 1" workers_at_least_one
  wait_for $((120 - (SECONDS - applied_at))) "a scheduled job runs within two minutes" \
    scheduled_job_ran
  wait_for 60 "the scheduled job is done" scheduled_job_done

  log "suspending the schedule so the queue drains"
  kubectl -n "$NAMESPACE" patch jobschedule e2e-tick --type merge -p '{"spec":{"suspend":true}}'
  wait_for 180 "workers scaled back to 0" workers_at 0

  log "deleting the JobSchedule"
  kubectl -n "$NAMESPACE" delete jobschedule e2e-tick --wait --timeout=60s
  wait_for 60 "schedule row $SCHEDULE_ROW removed" schedule_row_gone

  log "PASS: Rota works end to end on kind"
}

main "$@"
