"""Rota's Kubernetes operator: JobSchedule objects into schedule rows, WorkerPool autoscaling.

Importing the package registers the kopf handlers, so both `rota-operator` and
`kopf run -m rota_operator` run the same operator.
"""

from rota_operator import handlers as handlers
