"""A FastAPI service that enqueues in its request's transaction.

    DATABASE_URL=postgresql://... uvicorn app:app        # after `rota migrate`
    DATABASE_URL=postgresql://... rota worker --handlers handlers

A sign-up inserts the user and enqueues the welcome email on one connection
of the pool, in one transaction: both commit when the request succeeds, and
neither when it fails, whatever point it fails at.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

import rota

SCHEMA = "CREATE TABLE IF NOT EXISTS app_user (id bigserial PRIMARY KEY, email text UNIQUE)"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncConnectionPool(os.environ.get("DATABASE_URL", ""), open=False) as pool:
        async with pool.connection() as conn:
            await conn.execute(SCHEMA)
        app.state.pool = pool
        yield


app = FastAPI(lifespan=lifespan)


class SignUp(BaseModel):
    email: str


@app.post("/signups")
async def sign_up(body: SignUp) -> dict[str, int]:
    # The pool's connection is one transaction: committed when the block ends,
    # rolled back if anything in it raises.
    async with app.state.pool.connection() as conn:
        cursor = await conn.execute(
            "INSERT INTO app_user (email) VALUES (%s) ON CONFLICT DO NOTHING RETURNING id",
            (body.email,),
        )
        row = await cursor.fetchone()
        if row is None:
            raise HTTPException(409, "that email has signed up already")
        user_id = row[0]
        job_id = await rota.enqueue_async(
            conn,
            "email.welcome",
            {"user_id": user_id, "email": body.email},
            key=f"welcome:{user_id}",
        )
        if body.email.endswith("@blocked.example"):
            raise HTTPException(403, "that domain may not sign up")  # user and job roll back
    return {"user": user_id, "job": job_id}
