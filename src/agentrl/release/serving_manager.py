"""Keeps the gateway's routing in step with the registry.

Every `poll_s` it reads the split (a restart therefore keeps the split: it is in the
registry). A version with traffic is prepared on its backend first (the checkpoint is
checked against its sha256, then its adapter is loaded); one that cannot be prepared does
not serve: its share goes to the live version, `on_refused(model_id, reason)` is told once
(the service rolls it back and records why), and it is tried again with backoff (1 s
doubling to 60 s; a transient failure heals) or at once when it leaves the split and comes
back. When the live version itself cannot be prepared (a restart during a storage hiccup)
the last good one (`previous_live`) serves its share instead of 503s.

Each gateway publishes what it actually serves (`serving.<name>.<gateway>` in the registry:
its routing weights and prepared versions, rewritten every `report_every_s`); the controller
advances or promotes only a version some gateway serves.

A version held for an evaluation (`agentrl.release.holds`, the registry's `holds` key, read
on each sync) is loaded routable by its id, with no share of any split, and unloaded when
its hold ends; every gateway process does it, so worker processes and the compiled front
(whose table lists every loaded version) serve it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrl.core.supervision import until_stopped
from agentrl.serving.backends import Backend, LocalBackend, UpstreamBackend
from agentrl.serving.config import DeploySettings
from agentrl.serving.gateway import GatewayState
from agentrl.serving.registry import ModelRecord, Registry, ServingReport

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
        self.refused: dict[str, str] = {}  # model_id -> why it cannot serve now
        self._retry: dict[str, tuple[int, float]] = {}  # model_id -> (attempts, retry at)
        self.retry_base_s, self.retry_max_s = 1.0, 60.0
        self.gateway_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.report_every_s = 2.0
        self._reported_at = 0.0
        self.max_loaded = 8
        self._upstreams: dict[tuple[str, bool], UpstreamBackend] = {}
        self._vllm_backend: Any = None  # agentrl.serving.vllm.backend.VllmBackend
        self._revision = -1  # the default lineage's split revision
        self._revisions: dict[str, int] = {}  # lineage -> its split revision read
        self._kept: dict[str, set[str]] = {}  # lineage -> the versions it keeps loaded
        self._owner: dict[str, str] = {}  # model_id -> the lineage whose split names it
        self._routing: Any = None  # agentrl.release.lineage.Routing
        self._lineage_revision = -1
        self._engine_lock = asyncio.Lock()
        # held for an evaluation by id (`agentrl.release.holds`): the holds in force, the
        # versions loaded because of one (unloaded when it ends), the ones refused (why, retry)
        self.held: set[str] = set()
        self._hold_loaded: set[str] = set()
        self._hold_refused: dict[str, tuple[str, float]] = {}
        self.hold_retry_s = 5.0
        # read once a second, not every poll (0.2 s): a KV get is ~0.7 ms of CPU, and a hold
        # is for an evaluation that lasts minutes
        self.hold_poll_s = 1.0
        self._holds_read_at = -1e9

    async def _local(self, record: ModelRecord) -> LocalBackend:
        async with self._engine_lock:
            if self.engine is None:
                from agentrl.serving.local import LocalEngine

                spec = record.serving.get("base_spec") or {"name": record.base_model}
                self.engine = await asyncio.to_thread(
                    LocalEngine,
                    spec.get("name", record.base_model),
                    seed=int(spec.get("seed") or 0),
                    tiny_kwargs=spec.get("tiny_kwargs"),
                    max_batch_size=self.settings.max_batch_size,
                    score_batch_size=self.settings.score_batch_size,
                    max_wait_ms=self.settings.batch_wait_ms,
                    prompt_cache_mb=self.settings.prompt_cache_mb,
                    prefix_cache_mb=self.settings.prefix_cache_mb,
                    threads=self.settings.torch_threads,
                    packed_weights=self.settings.packed_weights,
                )
        return LocalBackend(self.engine, self.cache_dir)

    async def _vllm(self, record: ModelRecord) -> Backend:
        """The supervised vLLM of the record's base model (started on first use)."""
        from agentrl.serving.vllm.backend import VllmBackend
        from agentrl.serving.vllm.start import start_vllm

        spec = record.serving.get("base_spec") or {"name": record.base_model}
        async with self._engine_lock:
            if self._vllm_backend is None:
                self._vllm_backend = await start_vllm(spec, self.cache_dir, self.settings)
                # an adapter reloads in well under a second: versions leave vLLM when they
                # leave the split (a rollback unloads) instead of staying as spares
                self.max_loaded = 0
        backend: VllmBackend = self._vllm_backend
        return backend

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
        if kind == "vllm":
            return await self._vllm(record)
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
        """Read the lineage table (one key) and every served lineage's split; prepare what
        they route, then unload spares beyond `max_loaded` (never a version any lineage
        routes or holds live)."""
        names = await self._sync_lineages()
        keep: set[str] = set()
        changed = False
        for name in names:
            kept, did = await self._sync_one(name, force)
            keep |= kept
            changed = changed or did
        for gone in set(self._revisions) - set(names):  # a retired lineage
            self._revisions.pop(gone, None)
            self._kept.pop(gone, None)
            with contextlib.suppress(Exception):
                await self.registry.drop_serving(gone, self.gateway_id)
        await self._sync_holds()
        keep = set().union(*self._kept.values()) if self._kept else keep
        keep |= self.held
        if changed:
            # a version that is the base model itself holds no weights of its own: unloading
            # it frees nothing and made it unservable (a lineage's base, retired, was a 404
            # for the loop's held-out evaluation); only versions with weights are counted
            loaded = [m for m in self.state.backends if not self._weightless(m)]
            spare = [m for m in loaded if m not in keep]
            for model_id in spare[: max(0, len(loaded) - self.max_loaded)]:
                backend = self.state.backends.pop(model_id)
                try:
                    await backend.release(model_id)
                except Exception:  # unloading is best effort
                    log.warning("could not release %s", model_id, exc_info=True)

    async def _sync_lineages(self) -> list[str]:
        """The lineages this gateway routes: the default one and every lineage that is not
        retired (`agentrl.release.lineage`), read from one key when it changed."""
        from agentrl.release.lineage import KEY, LineageTable, Routing

        table, revision = await self.registry._get(KEY, LineageTable)
        if revision != self._lineage_revision or self._routing is None:
            routing = Routing(table or LineageTable(), self.state.public_name)
            served = [n for n in routing.served if n != self.state.public_name]
            self.state.set_lineages(served, routing.by_agent, routing.by_profile, routing.retired)
            self._routing, self._lineage_revision = routing, revision
        return [
            self.state.public_name,
            *(n for n in self._routing.served if n != self.state.public_name),
        ]

    async def _sync_one(self, public: str, force: bool) -> tuple[set[str], bool]:
        """One lineage's split into the gateway; returns the versions it keeps loaded and
        whether anything was read anew."""
        split, revision = await self.registry.get_split(public)
        now = time.monotonic()
        retry_due = any(now >= at for _, at in self._retry.values())
        last = self._revisions.get(public, -1)
        if split is None or (revision == last and not force and not retry_due):
            return self._kept.get(public, set()), False
        # a version that left the split is forgotten: a new decision that puts it back
        # tries it at once
        for model_id in list(self.refused):
            if model_id in self._owner and self._owner[model_id] != public:
                continue  # another lineage's
            if split.weights.get(model_id, 0.0) <= 0 and model_id != split.live:
                self._forget(model_id)
        # the split's weighted versions, and the live one even at 0 % (a canary's 100 % step):
        # it is what a rollback restores, so a restarted gateway holds it as the old one did
        for model_id in dict.fromkeys([*split.weights, *([split.live] if split.live else [])]):
            self._owner[model_id] = public
            if model_id in self.state.backends:
                continue
            if split.weights.get(model_id, 0.0) <= 0 and model_id != split.live:
                continue
            if model_id in self.refused and now < self._retry[model_id][1]:
                continue  # refused recently: retried with backoff
            await self._prepare(model_id)
        weights = {m: w for m, w in split.weights.items() if m in self.state.backends and w > 0}
        live = split.live
        if live and split.weights.get(live, 0.0) > 0 and live not in weights:
            # the live version cannot be served (e.g. after a restart): the last good one
            # stands in for its share rather than answering 503s
            for older in reversed(split.previous_live):
                if older in self.state.backends or await self._prepare(older, tell=False):
                    weights[older] = weights.get(older, 0.0) + split.weights[live]
                    log.error("live version %s cannot serve: %s stands in", live, older)
                    break
        if weights and sum(weights.values()) < sum(split.weights.values()):
            # a refused version's share goes to the live one until the split is corrected
            keep = live if live in weights else next(iter(weights))
            weights[keep] += sum(split.weights.values()) - sum(weights.values())
        if weights:
            self.state.set_split(weights, split.order, public)
        # Versions that left the split stay loaded (pinned by name, evaluated, restored at
        # once) until more than `max_loaded` are; then the oldest of them are unloaded. The
        # split, the live, the previous live version and a stand-in are never unloaded.
        keep_loaded = set(split.weights) | set(split.previous_live[-1:]) | set(weights)
        if split.live:
            keep_loaded.add(split.live)
        self._kept[public] = keep_loaded
        self._revisions[public] = revision
        if public == self.state.public_name:
            self._revision = revision
        await self.report(public)
        return keep_loaded, True

    async def _sync_holds(self) -> None:
        """Load the versions held for an evaluation (`agentrl.release.holds`: routable by id,
        no share of any split) and unload those whose hold ended, unless they were loaded
        before it or a split keeps them. A refusal is not recorded against the version
        (nothing asked it to take traffic): it is reported, and tried again after
        `hold_retry_s` while the hold lasts."""
        from agentrl.release.holds import read_holds

        now = time.monotonic()
        if now - self._holds_read_at < self.hold_poll_s:
            return
        self._holds_read_at = now
        try:
            holds = set(await read_holds(self.registry))
        except Exception:  # the holds as they were: a bad key must not stop the sync
            log.warning("could not read the holds", exc_info=True)
            return
        changed = False
        for model_id in sorted(holds):
            if model_id in self.state.backends:
                continue
            refused = self._hold_refused.get(model_id)
            if refused is not None and now < refused[1]:
                continue
            changed = True
            if await self._prepare(model_id, tell=False):
                self._hold_loaded.add(model_id)
                self._hold_refused.pop(model_id, None)
                log.info("version %s loaded while held for an evaluation", model_id)
            else:
                why = self.refused.get(model_id, "could not be prepared")
                self._forget(model_id)
                self._hold_refused[model_id] = (why, now + self.hold_retry_s)
        for model_id in self.held - holds:
            changed = True
            self._hold_refused.pop(model_id, None)
            if model_id not in self._hold_loaded:
                continue
            self._hold_loaded.discard(model_id)
            if any(model_id in k for k in self._kept.values()):
                continue  # a split routes it now
            backend = self.state.backends.pop(model_id, None)
            log.info("version %s unloaded: its hold ended", model_id)
            if backend is not None:
                try:
                    await backend.release(model_id)
                except Exception:  # unloading is best effort
                    log.warning("could not release %s", model_id, exc_info=True)
        self.held = holds
        if changed:
            await self.report()  # the replica answering the hold waits for this

    def _weightless(self, model_id: str) -> bool:
        """True for a version served by the base model itself (no adapter loaded for it)."""
        return model_id in getattr(self.state.backends.get(model_id), "bases", ())

    async def _prepare(self, model_id: str, tell: bool = True) -> bool:
        record = await self.registry.get_model(model_id)
        if record is None:
            await self._refuse(model_id, "not in the registry", tell)
            return False
        try:
            backend = await self.backend_for(record)
            await backend.prepare(record)
        except Exception as exc:
            await self._refuse(model_id, f"{type(exc).__name__}: {exc}", tell)
            return False
        self.state.backends[model_id] = backend
        self._forget(model_id)
        return True

    def _forget(self, model_id: str) -> None:
        self.refused.pop(model_id, None)
        self._retry.pop(model_id, None)

    async def _refuse(self, model_id: str, reason: str, tell: bool = True) -> None:
        attempts = self._retry.get(model_id, (0, 0.0))[0] + 1
        delay = min(self.retry_max_s, self.retry_base_s * 2 ** (attempts - 1))
        self._retry[model_id] = (attempts, time.monotonic() + delay)
        first = model_id not in self.refused
        self.refused[model_id] = reason
        if not first:
            log.warning(
                "version %s still cannot serve (attempt %d, next in %.0fs): %s",
                model_id,
                attempts,
                delay,
                reason,
            )
            return
        log.error("version %s will not serve (retried in %.0fs): %s", model_id, delay, reason)
        if tell and self.on_refused is not None:  # told once per refusal, not per retry
            try:
                await self.on_refused(model_id, reason)
            except Exception:
                log.exception("could not record the refusal of %s", model_id)

    async def report(self, public: str | None = None) -> None:
        """Publish what this gateway serves (`serving.<name>.<gateway>` in the registry), for
        one lineage or (None) for each it routes."""
        names = [public] if public else [self.state.public_name, *self.state.routes]
        for name in names:
            report = ServingReport(
                gateway=self.gateway_id,
                public_name=name,
                weights=dict(self.state.split_of(name)),
                loaded=sorted(m for m in self.state.backends if self._owner.get(m, name) == name),
                refused={
                    m: why
                    for m, why in (
                        {m: w for m, (w, _) in self._hold_refused.items()} | self.refused
                    ).items()
                    if self._owner.get(m, name) == name
                },
                split_revision=max(self._revisions.get(name, 0), 0),
            )
            try:
                await self.registry.report_serving(report)
                self._reported_at = time.monotonic()
            except Exception:
                log.warning("could not publish what this gateway serves", exc_info=True)

    async def run(self, stop: asyncio.Event, poll_s: float = 0.2) -> None:
        while not stop.is_set():
            try:
                await until_stopped(self.sync(), stop)  # a cold model load ends with stop
                if time.monotonic() - self._reported_at >= self.report_every_s:
                    await self.report()  # the heartbeat
            except Exception:
                log.warning("gateway could not read the registry", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)

    async def close(self) -> None:
        for name in [self.state.public_name, *self.state.routes]:
            with contextlib.suppress(Exception):
                await self.registry.drop_serving(name, self.gateway_id)
        for up in self._upstreams.values():
            await up.close()
        if self._vllm_backend is not None:
            await self._vllm_backend.close()
