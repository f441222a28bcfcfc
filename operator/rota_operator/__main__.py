"""`rota-operator`: run the kopf operator with Rota's handlers and the environment's settings."""

from __future__ import annotations

import kopf

from rota_operator import handlers as _handlers  # noqa: F401 - registers the handlers
from rota_operator.settings import Settings


def main() -> None:
    """Watch ROTA_NAMESPACES (or the whole cluster) until SIGTERM."""
    settings = Settings.from_environ()
    kopf.configure(verbose=False)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.standalone or None,
        peering_name=settings.peering_name,
    )


if __name__ == "__main__":
    main()
