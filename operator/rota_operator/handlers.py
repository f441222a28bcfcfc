"""The kopf handlers: the operator's only contact with kopf.

Each handler is thin: it turns kopf's keyword arguments into calls of
`jobschedules`, `pools` and the rota core, and turns their outcomes into kopf's
control flow (a patch, or `TemporaryError` to retry). A database outage is
retried with exponential backoff and an invalid spec becomes a condition and an
Event: neither ever stops the operator. (`rota-operator` exits at start on a
connection option libpq refuses; run as `kopf run -m rota_operator`, such an
option is reported and retried as an outage is, object by object.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
from collections.abc import Mapping
from typing import Any

import kopf

from rota import schedule_store as core
from rota.db import RefusedByDatabase
from rota.errors import ConnectionOptionRefused, DatabaseError, DatabaseUnavailable, InvalidInput
from rota_operator import jobschedules, kube, metrics, pools
from rota_operator.settings import INSTANCE_LABEL, Settings

SCHEDULES = ("rota.dev", "v1", "jobschedules")
POOLS = ("rota.dev", "v1", "workerpools")
DATABASE_ERRORS = (DatabaseUnavailable, DatabaseError, ConnectionOptionRefused)

# Timer intervals and filters are fixed when the handlers are declared: these are read at import.
_DECLARED = Settings.from_environ()
SCHEDULE_SYNC_SECONDS = _DECLARED.schedule_sync_seconds
OWNED: dict[str, Any] = {INSTANCE_LABEL: _DECLARED.instance or kopf.ABSENT}
"""Which objects this installation handles: those labelled with its instance, or
(without an instance) those that carry no instance label at all."""


class PayloadDigested(kopf.AnnotationsDiffBaseStorage):
    """kopf's record of the spec it handled, with a JobSchedule's payload as its
    digest: an object holds at most 256 KiB of annotations, and `kubectl apply`
    keeps a copy of the spec too, so a full copy of a large payload made every
    patch of the object fail. A change of the payload still changes the digest,
    and is handled as any change."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        spec = essence.get("spec")
        if isinstance(spec, dict) and "payload" in spec:
            text = json.dumps(spec["payload"], sort_keys=True, separators=(",", ":"))
            spec["payload"] = {"sha256": hashlib.sha256(text.encode()).hexdigest()}
        return essence


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Read the settings, prepare the API client, start /metrics; tune kopf's storage."""
    config = Settings.from_environ()
    memo.config = config
    memo.kube = kube.Kube(await asyncio.to_thread(kube.load_client))
    # kopf's bookkeeping goes to annotations: the structural schemas would prune it from status.
    # Each installation has its own keys: two operators never strip each other's finalizer.
    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=config.domain)
    settings.persistence.diffbase_storage = PayloadDigested(
        prefix=config.domain, key="last-handled-configuration"
    )
    settings.peering.name = config.peering_name
    settings.peering.standalone = config.standalone or settings.peering.standalone
    if not settings.peering.priority:  # unless `kopf run --priority` chose one
        settings.peering.priority = config.peering_priority or random.randint(1, 2**31 - 1)
    settings.posting.level = logging.WARNING
    memo.metrics_runner = None
    if config.metrics_port >= 0:
        metrics.serve_database_measures(config.database_url)
        memo.metrics_runner, memo.metrics_port = await metrics.serve(
            config.metrics_host, config.metrics_port
        )


@kopf.on.cleanup()
async def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("metrics_runner") is not None:
        await memo.metrics_runner.cleanup()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account, else $KUBECONFIG as it is when the operator starts."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.resume(*SCHEDULES, labels=OWNED)
@kopf.on.create(*SCHEDULES, labels=OWNED)
@kopf.on.update(*SCHEDULES, labels=OWNED)
def apply_schedule(
    *, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int, **_: Any
) -> None:
    """Upsert the schedule row; an invalid spec leaves the row alone and says why."""
    _apply(body, patch, memo, retry)


def _apply(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, retry: int) -> None:
    config: Settings = memo.config
    namespace, name = body.meta.namespace or "", body.meta.name or ""
    generation = body.meta.get("generation")
    try:
        wanted = jobschedules.to_spec(namespace, name, body.spec)
    except InvalidInput as exc:
        _refused(body, patch, memo, exc)
        return
    try:
        row = core.upsert(config.database_url, wanted, namespaced=True)
    except RefusedByDatabase as exc:  # a rule only the database keeps: no retry mends the spec
        _refused(body, patch, memo, exc)
        return
    except DATABASE_ERRORS as exc:
        patch.status.update(jobschedules.unavailable_status(body.status, generation, str(exc)))
        raise _retry_later("jobschedules", exc, config, retry) from exc
    patch.status.update(jobschedules.synced_status(row, body.status, generation))


def _refused(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, exc: InvalidInput) -> None:
    """Ready=False and a Warning Event for a spec that cannot be stored as it is."""
    reason = "ReservedName" if isinstance(exc, jobschedules.ReservedName) else "InvalidSpec"
    generation = body.meta.get("generation")
    patch.status.update(jobschedules.invalid_status(body.status, generation, str(exc), reason))
    memo.kube.post_event(_ref_of(body), "Warning", reason, str(exc))


@kopf.on.delete(*SCHEDULES, labels=OWNED)
def remove_schedule(*, body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    """Remove the row; the finalizer holds the object until the database said yes.
    An object refused for a built-in's name never had the row: it is left alone."""
    namespace, name = body.meta.namespace or "", body.meta.name or ""
    if jobschedules.reserved(namespace, name):
        return
    name = jobschedules.row_name(namespace, name)
    try:
        core.remove(memo.config.database_url, name)
    except DATABASE_ERRORS as exc:
        raise _retry_later("jobschedules", exc, memo.config, retry) from exc


@kopf.timer(
    *SCHEDULES,
    interval=SCHEDULE_SYNC_SECONDS,
    initial_delay=SCHEDULE_SYNC_SECONDS,
    labels=OWNED,
)
def sync_schedule_status(*, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Mirror the row's progress (next run, last slot, missed slots) into the status."""
    status, generation = body.status, body.meta.get("generation")
    namespace, name = body.meta.namespace or "", body.meta.name or ""
    if jobschedules.reserved(namespace, name):
        return  # refused: the built-in's row is not this object's
    name = jobschedules.row_name(namespace, name)
    try:
        row = core.get(memo.config.database_url, name)
    except DATABASE_ERRORS as exc:
        metrics.record_error("jobschedules", type(exc).__name__)
        patch.status.update(jobschedules.unavailable_status(status, generation, str(exc)))
        return
    if row is None:
        if jobschedules.is_ready(status):  # removed behind the operator's back: put it back
            _apply(body, patch, memo, retry=0)
    elif _recovering(status, body.meta):
        patch.status.update(jobschedules.synced_status(row, status, generation))
    else:
        patch.status.update(jobschedules.row_status(row))


@kopf.daemon(*POOLS, cancellation_timeout=10.0, labels=OWNED)
async def run_pool(*, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Poll the queue and scale the target every pollIntervalSeconds, for the pool's lifetime.

    `body` is a live view: a changed spec is used from the next poll on.
    """
    config: Settings = memo.config
    ref = _ref_of(body)
    state = pools.PoolState(conditions=[dict(c) for c in body.status.get("conditions") or ()])
    try:
        while True:
            interval = await asyncio.to_thread(
                pools.poll_once,
                memo.kube,
                config.database_url,
                ref,
                dict(body.spec),
                config.poll_interval_seconds,
                state,
            )
            if interval is None:
                return  # the WorkerPool is gone
            await asyncio.sleep(interval)
    finally:
        metrics.forget_pool(f"{ref.namespace}/{ref.name}")


def _without_finalizer(fn: Any) -> None:
    """Declare the daemon `fn` as needing no finalizer on its objects.

    kopf puts its finalizer on every object a daemon runs for, so that the daemon
    stops before the object goes. A WorkerPool needs no cleanup, and with a
    finalizer a pool deleted together with its operator (`helm uninstall`
    deletes both at once) would stay Terminating for ever. Its loop notices by
    itself that the object is gone (pools.poll_once), and kopf takes the
    finalizer of an earlier version off the pools it finds.
    tests/operator/test_pool_lifecycle.py fails if a kopf release changes this.
    """
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.fn is fn else h
        for h in spawning._handlers
    ]


_without_finalizer(run_pool)


def _retry_later(
    resource: str, exc: Exception, config: Settings, retry: int
) -> kopf.TemporaryError:
    metrics.record_error(resource, type(exc).__name__)
    return kopf.TemporaryError(f"database: {exc}", delay=config.retry_delay(retry))


def _recovering(status: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    """Ready=False only because the database was away, for the current generation."""
    conditions = status.get("conditions") or ()
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    current = status.get("observedGeneration") == meta.get("generation")
    return current and ready.get("reason") == "DatabaseUnavailable"


def _ref_of(body: kopf.Body) -> kube.ObjectRef:
    meta = body.meta
    api_version, kind = body.get("apiVersion") or "", body.get("kind") or ""
    return kube.ObjectRef(api_version, kind, meta.namespace or "", meta.name or "", meta.uid or "")
