"""The service's jobs: `rota worker --handlers handlers` runs them."""

from __future__ import annotations

import rota


@rota.handler("email.welcome")
async def welcome(job: rota.Job) -> dict[str, str]:
    # A real service sends the email here; the return value is kept as the result.
    return {"sent_to": job.payload["email"]}
