"""Keeps the gateway's routing in step with the registry.

Every `poll_s` it reads the split (a restart therefore keeps the split: it is in the
registry). A version with traffic is prepared on its backend first (the checkpoint is
checked against its sha256, then its adapter is loaded); one that cannot be prepared never
serves: its share goes to the live version and `on_refused(model_id, reason)` is told once
(the service rolls it back and records why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl.deploy.backends import Backend, LocalBackend, UpstreamBackend
from agentrl.deploy.config import DeploySettings
from agentrl.deploy.gateway import GatewayState
from agentrl.deploy.registry import ModelRecord, Registry

log = logging.getLogger(__name__)

Refused = Callable[[str, str], Awaitable[None]]


class ServingManager:
    def __init__(
        self,
        registry: Registry,
        state: GatewayState,
        settings: DeploySettings,
        cache_dir: Path,
        *,
        engine: Any = None,
        on_refused: Refused | None = None,
    ) -> None:
        self.registry = registry
        self.state = state
        self.settings = settings
        self.cache_dir = cache_dir
        self.engine = engine
        self.on_refused = on_refused
        self.refused: dict[str, str] = {}
        self.max_loaded = 8
        self._upstreams: dict[tuple[str, bool], UpstreamBackend] = {}
        self._revision = -1
        self._engine_lock = asyncio.Lock()

    async def _local(self, record: ModelRecord) -> LocalBackend:
        async with self._engine_lock:
            if self.engine is None:
                from agentrl.deploy.local import LocalEngine

                spec = record.serving.get("base_spec") or {"name": record.base_model}
                self.engine = await asyncio.to_thread(
                    LocalEngine,
                    spec.get("name", record.base_model),
                    seed=int(spec.get("seed") or 0),
                    tiny_kwargs=spec.get("tiny_kwargs"),
                    max_batch_size=self.settings.max_batch_size,
                    max_wait_ms=self.settings.batch_wait_ms,
                )
        return LocalBackend(self.engine, self.cache_dir)

    def _upstream(self, url: str, load_lora: bool, model: str | None) -> UpstreamBackend:
        key = (url, load_lora)
        if key not in self._upstreams:
            self._upstreams[key] = UpstreamBackend(
                url,
                api_key=self.settings.upstream_api_key,
                timeout_s=self.settings.backend_timeout_s,
                load_lora=load_lora,
                default_model=model,
            )
        return self._upstreams[key]

    async def backend_for(self, record: ModelRecord) -> Backend:
        kind = record.serving.get("kind", self.settings.backend)
        if kind == "upstream":
            url = record.serving.get("base_url") or self.settings.upstream_url
            if not url:
                raise ValueError("upstream backend without a URL: set AGENTRL_DEPLOY_UPSTREAM_URL")
            return self._upstream(
                url,
                bool(record.serving.get("load_lora", self.settings.upstream_load_lora)),
                record.serving.get("upstream_model"),
            )
        return await self._local(record)

    async def sync(self, force: bool = False) -> None:
        split, revision = await self.registry.get_split(self.state.public_name)
        if split is None or (revision == self._revision and not force):
            return
        for model_id, weight in split.weights.items():
            if weight <= 0 or model_id in self.state.backends or model_id in self.refused:
                continue
            record = await self.registry.get_model(model_id)
            if record is None:
                await self._refuse(model_id, "not in the registry")
                continue
            try:
                backend = await self.backend_for(record)
                await backend.prepare(record)
            except Exception as exc:
                await self._refuse(model_id, f"{type(exc).__name__}: {exc}")
                continue
            self.state.backends[model_id] = backend
        weights = {m: w for m, w in split.weights.items() if m in self.state.backends}
        if weights and sum(weights.values()) < sum(split.weights.values()):
            # a refused version's share goes to the live one until the split is corrected
            live = split.live if split.live in weights else next(iter(weights))
            weights[live] += sum(split.weights.values()) - sum(weights.values())
        if weights:
            self.state.set_split(weights, split.order)
        # Versions that left the split stay loaded (pinned by name, evaluated, restored at
        # once) until more than `max_loaded` are; then the oldest of them are unloaded. The
        # split, the live and the previous live version are never unloaded.
        keep = set(split.weights) | {split.live} | set(split.previous_live[-1:])
        spare = [m for m in self.state.backends if m not in keep]
        for model_id in spare[: max(0, len(self.state.backends) - self.max_loaded)]:
            backend = self.state.backends.pop(model_id)
            try:
                await backend.release(model_id)
            except Exception:  # unloading is best effort
                log.warning("could not release %s", model_id, exc_info=True)
        self._revision = revision

    async def _refuse(self, model_id: str, reason: str) -> None:
        self.refused[model_id] = reason
        log.error("version %s will not serve: %s", model_id, reason)
        if self.on_refused is not None:
            try:
                await self.on_refused(model_id, reason)
            except Exception:
                log.exception("could not record the refusal of %s", model_id)

    async def run(self, stop: asyncio.Event, poll_s: float = 0.2) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:
                log.warning("gateway could not read the registry", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)

    async def close(self) -> None:
        for up in self._upstreams.values():
            await up.close()
