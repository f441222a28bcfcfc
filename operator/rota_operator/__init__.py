"""Rota's Kubernetes operator: JobSchedule objects into schedule rows, WorkerPool autoscaling.

Importing the package registers the kopf handlers, so both `rota-operator` and
`kopf run -m rota_operator` run the same operator.
"""

import sys

from rota_operator.settings import SettingsError

try:
    from rota_operator import handlers as handlers
except SettingsError as exc:  # read as the handlers are declared: say it in one line
    print(f"rota-operator: error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None
except ModuleNotFoundError as exc:  # `pip install rota` installs the script without them
    missing = (exc.name or "").partition(".")[0]
    if missing not in ("kopf", "kubernetes"):
        raise
    print(
        "rota-operator: error: the operator needs the 'operator' extra:"
        f" pip install 'rota[operator]' (no module named {missing!r})",
        file=sys.stderr,
    )
    raise SystemExit(2) from None
