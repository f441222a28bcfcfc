"""`rota-operator`: run the kopf operator with Rota's handlers and the environment's settings."""

from __future__ import annotations

import kopf

from rota_operator import handlers as _handlers  # noqa: F401 - registers the handlers
from rota_operator.settings import Settings


def main() -> None:
    """Watch ROTA_NAMESPACES (or the whole cluster) until SIGTERM."""
    settings = Settings.from_environ()
    kopf.configure(verbose=False)
    # A peering name makes peering mandatory: without the kopf.dev CRDs the replicas wait
    # (paused) instead of all acting at once. Standalone needs no name and no CRDs.
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.standalone,
        peering_name=None if settings.standalone else settings.peering_name,
    )


if __name__ == "__main__":
    main()
