"""Holds: a version no split routes, served by its id for a while (`agentrl.deploy.hold`).

Why: `agentrl loop` measures the held-out success of every trained version, also ones no
split routes any more (rejected by validation, rolled back). The loop asks the deploy
service over the bus (`HoldRequest` on `hold_subject(public)`); it reached into the service
through a process-local map before, so worker processes and the compiled front could not.

How: one replica answers (a queue group). It writes the hold into the registry bucket (key
`holds`: model id -> until, epoch seconds), and every gateway process (each replica, each
worker; the front routes by its process's table) reads that key once a second (its sync),
loads what it holds and unloads what expired (`ServingManager`). The replica answers once every gateway
that reported lately lists the version loaded (or one says why it cannot). A hold ends by a
release (`ttl_s` 0) or by its expiry: a caller that died leaves nothing loaded for longer than
one TTL. Expiry compares wall clocks of two processes: hosts out of step by seconds shift it
by as much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from agentrl.contracts.deployment import HoldReply, HoldRequest, hold_subject
from agentrl.serving.registry import Registry

log = logging.getLogger(__name__)

KEY = "holds"
QUEUE = "agentrl-deploy"  # one replica of the deployment answers each request
LOAD_WAIT_S = 120.0  # how long a hold waits for every gateway to load the version
REPORT_MAX_AGE_S = 6.0  # gateways that reported within this long count (they do every 2 s)


class Holds(BaseModel):
    """The registry's `holds` key: model id -> the hold's end (epoch seconds)."""

    until: dict[str, float] = Field(default_factory=dict)


async def read_holds(registry: Registry, now: float | None = None) -> dict[str, float]:
    """The holds in force (expired ones are left out; the next write drops them)."""
    holds, _ = await registry._get(KEY, Holds)
    now = time.time() if now is None else now
    return {m: t for m, t in (holds.until if holds else {}).items() if t > now}


async def set_hold(registry: Registry, model_id: str, ttl_s: float) -> float:
    """Hold `model_id` for `ttl_s` seconds from now (0: release); returns the end."""
    now = time.time()
    until = now + ttl_s

    def apply(current: Holds | None) -> Holds:
        kept = {m: t for m, t in (current.until if current else {}).items() if t > now}
        if ttl_s > 0:
            kept[model_id] = until
        else:
            kept.pop(model_id, None)
        return Holds(until=kept)

    await registry._mutate(KEY, Holds, apply)
    return until


class HoldServer:
    """Answers `HoldRequest`s for one deployment (`serve` runs it in every replica)."""

    def __init__(self, registry: Registry, public: str, load_wait_s: float = LOAD_WAIT_S) -> None:
        self.registry = registry
        self.public = public
        self.subject = hold_subject(public)
        self.load_wait_s = load_wait_s
        self.tasks: set[asyncio.Task[None]] = set()
        self.bad = 0  # malformed requests answered with an error

    async def run(self, bus: Any, stop: asyncio.Event) -> None:
        """Subscribe until `stop`; each request is answered in a task of its own (a hold
        waits for the gateways to load; a renewal meanwhile must not queue behind it)."""

        async def on_msg(msg: Any) -> None:
            task = asyncio.create_task(self._answer(msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        sub = await bus.nc.subscribe(self.subject, queue=QUEUE, cb=on_msg)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            for task in list(self.tasks):
                task.cancel()

    async def _answer(self, msg: Any) -> None:
        try:
            reply = await self.handle(msg.data)
        except Exception as exc:  # never a crash: the caller hears why
            log.exception("hold request failed")
            reply = HoldReply(ok=False, why=f"{type(exc).__name__}: {exc}")
        if not msg.reply:
            log.warning("hold request without a reply subject: %s", reply.why or "done")
            return
        with contextlib.suppress(Exception):
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

    async def handle(self, data: bytes) -> HoldReply:
        """One request: hold (wait until served), renew, or release."""
        try:
            req = HoldRequest.model_validate_json(data)
        except ValidationError as exc:
            self.bad += 1
            where = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            log.warning("malformed hold request: %s", where)
            return HoldReply(
                ok=False,
                why=f"malformed hold request ({where}); expected "
                '{"model_id": "<version id>", "ttl_s": <seconds, 0 releases>}',
            )
        if req.ttl_s == 0:
            await set_hold(self.registry, req.model_id, 0)
            return HoldReply(ok=True, model_id=req.model_id)
        record = await self.registry.get_model(req.model_id)
        if record is None:
            return HoldReply(ok=False, model_id=req.model_id, why="no such version")
        until = await set_hold(self.registry, req.model_id, req.ttl_s)
        served, why = await self._served(req.model_id, record.public_name)
        if why is not None:
            await set_hold(self.registry, req.model_id, 0)  # nothing will measure it
            return HoldReply(ok=False, model_id=req.model_id, why=why)
        return HoldReply(ok=True, model_id=req.model_id, until=until, gateways=served)

    async def _served(self, model_id: str, public: str) -> tuple[list[str], str | None]:
        """Until every gateway that reported lately lists `model_id` loaded: their ids, or
        why not (a refusal, or none in `load_wait_s`)."""
        deadline = time.monotonic() + self.load_wait_s
        waiting: list[str] = []
        while True:
            reports = await self.registry.serving_reports(public, REPORT_MAX_AGE_S)
            for r in reports:
                if model_id in r.refused and model_id not in r.loaded:
                    return [], f"gateway {r.gateway} cannot load it: {r.refused[model_id]}"
            waiting = [r.gateway for r in reports if model_id not in r.loaded]
            if reports and not waiting:
                return sorted(r.gateway for r in reports), None
            if time.monotonic() > deadline:
                return [], (
                    f"not loaded within {self.load_wait_s:.0f} s by gateways {waiting}"
                    if reports
                    else f"no gateway of {public} reported within {self.load_wait_s:.0f} s"
                )
            await asyncio.sleep(0.25)
