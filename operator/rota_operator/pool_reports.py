"""What a WorkerPool's poll reports beside its decision: conditions and Events.

Paused, limited and unhandled types, a pause of the pool itself and other
controllers on its target: each is a condition or words in the Ready message,
and an Event only when it is new (the pool's state remembers what was said).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rota import status as queue_status
from rota_operator.conditions import with_condition
from rota_operator.kube import Kube, ObjectRef
from rota_operator.pool_inputs import TypeCoverage

if TYPE_CHECKING:
    from rota_operator.pools import PoolState


def report_types(
    kube: Kube,
    ref: ObjectRef,
    state: PoolState,
    age: queue_status.QueueAge,
    cover: TypeCoverage,
) -> str:
    """Paused, limited and unhandled types: a condition, an Event when new, and the
    words appended to the Ready condition's message."""
    message = ""
    if age.paused_types:
        paused = ", ".join(age.paused_types)
        message += f"; paused types (not scaled for): {paused}"
        if tuple(age.paused_types) != state.paused:
            kube.post_event(ref, "Normal", "Paused", f"jobs of {paused} are paused: not scaled for")
    state.paused = tuple(age.paused_types)
    if age.limited_types:
        limited = ", ".join(age.limited_types)
        message += f"; held back by limits (not scaled for): {limited}"
        if tuple(age.limited_types) != state.limited:
            kube.post_event(
                ref, "Normal", "Limited", f"a limit holds jobs of {limited} back: not scaled for"
            )
    state.limited = tuple(age.limited_types)
    if cover.unhandled:
        text = f"no live worker handles {', '.join(cover.unhandled)}: their jobs are not counted"
        message += f"; {text}"
        if cover.unhandled != state.unhandled:
            kube.post_event(ref, "Warning", "UnhandledTypes", text)
        condition = (False, "UnhandledTypes", text)
    elif cover.handled is None:
        condition = (True, "NoWorkerSeen", "no worker has registered its types yet: all counted")
    else:
        condition = (True, "AllTypesHandled", f"workers handle {', '.join(cover.handled)}")
    state.unhandled = cover.unhandled
    state.conditions = with_condition(state.conditions, "TypesHandled", *condition)
    return message


def report_holds(
    kube: Kube, ref: ObjectRef, state: PoolState, paused: bool, conflicts: tuple[str, ...]
) -> None:
    """An Event when the pool is paused, and a Warning when another controller appears."""
    if paused and not state.held:
        kube.post_event(ref, "Normal", "PoolPaused", "spec.paused: the replicas are left alone")
    state.held = paused
    if conflicts and conflicts != state.conflicts:
        kube.post_event(
            ref,
            "Warning",
            "ConflictingController",
            f"not scaling: the target is also scaled by {', '.join(conflicts)}",
        )
    state.conflicts = conflicts
