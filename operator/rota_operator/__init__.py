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
