"""`held_for_evaluation`: a version no split routes, served by its id while a caller
measures it, asked of the deploy service over the bus (`agentrl.deploy.hold.<public>`).

Why a request and a TTL: the deploy service may run in another process or host, with worker
processes or the compiled front; the bus reaches all of them (the hold is written where every
gateway process reads it). The hold is renewed while the caller measures and released after;
a caller that dies leaves the version loaded for one TTL at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from agentrl.contracts.deployment import HoldReply, HoldRequest, hold_subject

log = logging.getLogger(__name__)

TTL_S = 60.0
ANSWER_S = 180.0  # the service waits up to 120 s for every gateway to load the version


async def ask_hold(
    bus: Any, public: str, model_id: str, ttl_s: float, timeout_s: float = ANSWER_S
) -> HoldReply:
    """One hold request (ttl_s 0 releases); a reply saying why when none came."""
    import nats.errors

    body = HoldRequest(model_id=model_id, ttl_s=ttl_s).model_dump_json().encode()
    subject = hold_subject(public)
    try:
        msg = await bus.nc.request(subject, body, timeout=timeout_s)
    except nats.errors.NoRespondersError:
        return HoldReply(ok=False, why=f"no deploy service answers on {subject}")
    except TimeoutError:
        return HoldReply(ok=False, why=f"no answer on {subject} within {timeout_s:.0f} s")
    try:
        return HoldReply.model_validate_json(msg.data)
    except ValidationError as exc:
        return HoldReply(ok=False, why=f"unreadable answer on {subject}: {exc}")


async def _listed(gateway_url: str, model_id: str, timeout_s: float = 10.0) -> None:
    """Until the gateway's `/models` lists `model_id` (the compiled front routes by a table
    its runner rewrites within 0.2 s of the serving manager's report); at most `timeout_s`."""
    import httpx

    from agentrl.app.tls import client_tls

    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=5, verify=client_tls()) as client:
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
                r = await client.get(f"{gateway_url}/models")
                if model_id in {m["id"] for m in r.json()["data"]}:
                    return
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def held_for_evaluation(
    bus: Any, public: str, model_id: str, ttl_s: float = TTL_S, gateway_url: str | None = None
) -> AsyncIterator[str | None]:
    """Hold `model_id` in the gateways of `public`'s deployment: yields None once every
    gateway serves it by its id (and `gateway_url`'s `/models` lists it), else why it
    cannot; renewed every third of `ttl_s` while the block runs, released after it."""
    reply = await ask_hold(bus, public, model_id, ttl_s)
    if not reply.ok:
        yield reply.why or "refused"
        return
    if gateway_url is not None:
        await _listed(gateway_url, model_id)

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl_s / 3)
            again = await ask_hold(bus, public, model_id, ttl_s)
            if not again.ok:  # said, and tried again: the hold may still hold
                log.warning("hold of %s not renewed: %s", model_id, again.why)

    renewing = asyncio.create_task(renew())
    try:
        yield None
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        done = await ask_hold(bus, public, model_id, 0, timeout_s=10)
        if not done.ok:  # it expires by itself within one TTL
            log.warning("hold of %s not released: %s", model_id, done.why)
