"""One Deployer + Controller per lineage (`agentrl.release.lineage`), run by the elected
controller process.

Each lineage's controller reads and writes only its own keys (`split.<lineage>`,
`rollout.<lineage>`, its model records): one lineage's canary, promote or rollback never
touches another's split. They share the gateway's counters and the reward tracker (both keyed
by model id, and model ids carry their lineage's name). A lineage's validation uses its own
benchmark settings (`Lineage.validation` over DeploySettings). A paused lineage's controller
holds: it deploys nothing new (validated candidates wait) and its running rollout stays where
it is. A training status names its lineage (`metadata.lineage`, absent: the default one) and
goes to that lineage's controller; a status naming a lineage that does not exist (or is
retired) registers nothing and says why in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from agentrl.observability import metrics as obs_metrics
from agentrl.release.actions import Deployer
from agentrl.release.controller import Controller
from agentrl.release.lineage import Lineage, Lineages

log = logging.getLogger(__name__)

REFRESH_S = 1.0


def lineage_of_status(event: Any) -> str | None:
    """The lineage a training status names (`metadata.lineage`), or None."""
    meta = getattr(event, "metadata", None)
    extra = getattr(meta, "model_extra", None) or {}
    name = extra.get("lineage")
    return str(name) if name else None


class Fleet:
    """The controllers of every lineage that is not retired (the default lineage's is the
    deployment's own `controller`)."""

    def __init__(
        self,
        d: Any,
        bus: Any,
        endpoint: str,
        validate: Any,
        plan: Any,
        cache_dir: Path,
    ) -> None:
        self.d = d
        self.bus = bus
        self.endpoint = endpoint
        self.validate = validate
        self.plan = plan
        self.cache_dir = cache_dir
        self.default = d.settings.public_model
        obs_metrics.set_default_lineage(self.default)  # the `lineage` label of odd version ids
        self.lineages = Lineages(d.registry, self.default)
        self.controllers: dict[str, Controller] = {self.default: d.controller}
        self.lease: Any = None
        self._revision = -1
        self._refreshed = 0.0

    def _validator(self, lin: Lineage) -> Any:
        if not lin.validation or self.validate is None:
            return self.validate
        from agentrl.release.validation import Validator

        if isinstance(self.validate, Validator):  # its own benchmark
            settings = self.d.settings.model_copy(update=lin.validation)
            return Validator(settings, self.d.registry, self.cache_dir)
        return self.validate

    def _build(self, lin: Lineage) -> Controller:
        settings = self.d.settings.model_copy(update=lin.validation) if lin.validation else None
        c = Controller(
            Deployer(self.d.registry, self.bus, lin.name, self.endpoint),
            settings or self.d.settings,
            stats=self.d.controller.stats,  # every gateway process's counters
            tracker=self.d.tracker,
            cache_dir=self.cache_dir,
            validate=self._validator(lin),
            plan=self.plan,
        )
        c.lease = self.lease
        return c

    async def _bootstrap(self, c: Controller, lin: Lineage) -> None:
        """A lineage whose first version was never made live (its creator died between the
        record and the split) gets it now; nothing when it has a live version."""
        try:
            source = await self.d.registry.get_model(lin.parent_model) if lin.parent_model else None
            await c.deployer.bootstrap(lin.base_model or self.d.settings.base_model, source=source)
        except Exception:
            log.warning("lineage %s: its first version is not live yet", lin.name, exc_info=True)

    async def refresh(self, force: bool = False) -> dict[str, Controller]:
        """Controllers for new lineages, none for retired ones; paused ones hold."""
        table, revision = await self.lineages.table()
        if revision == self._revision and not force:
            return self.controllers
        for lin in table.lineages.values():
            if lin.state == "retired":
                if lin.name != self.default:
                    self.controllers.pop(lin.name, None)
                continue
            c = self.controllers.get(lin.name)
            if c is None:
                c = self.controllers[lin.name] = self._build(lin)
                await self._bootstrap(c, lin)
            c.halted = lin.state == "paused"
        for c in self.controllers.values():
            if self.lease is not None:
                c.lease = self.lease
        self._revision = revision
        self._refreshed = time.monotonic()
        return self.controllers

    async def handle_status(self, event: Any) -> Any:
        name = lineage_of_status(event) or self.default
        c = self.controllers.get(name)
        if c is None:
            await self.refresh(force=True)
            c = self.controllers.get(name)
        if c is None:
            if getattr(event, "status", None) == "completed":
                log.error(
                    "training job %s names lineage %r, which does not exist or is retired: "
                    "its checkpoint is not registered",
                    getattr(event, "training_job_id", "?"),
                    name,
                )
            return None
        return await c.handle_status(event)

    async def tick(self) -> dict[str, str | None]:
        """One look at every lineage's rollout (benchmarks and tests; `run` loops)."""
        await self.refresh()
        out: dict[str, str | None] = {}
        for name, c in list(self.controllers.items()):
            try:
                out[name] = await c.tick()
            except Exception:
                log.exception("monitor tick of lineage %s failed", name)
                out[name] = "error"
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Each lineage's monitor on its own period, started as lineages appear and stopped
        when they are retired."""
        tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        try:
            while not stop.is_set():
                try:
                    await self.refresh()
                except Exception:
                    log.warning("could not read the lineages", exc_info=True)
                for name, c in self.controllers.items():
                    if name not in tasks or tasks[name][0].done():
                        own = asyncio.Event()
                        tasks[name] = (asyncio.create_task(c.run(own)), own)
                for name in [n for n in tasks if n not in self.controllers]:
                    task, own = tasks.pop(name)
                    own.set()
                    with contextlib.suppress(Exception):
                        await task
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REFRESH_S)
        finally:
            for _task, own in tasks.values():
                own.set()
            await asyncio.gather(*(t for t, _ in tasks.values()), return_exceptions=True)
