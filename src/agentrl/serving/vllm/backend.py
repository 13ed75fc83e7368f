"""The gateway's backend over a supervised vLLM: each version is a LoRA adapter loaded into
the running server (after its checkpoint's manifest sha256 and files are checked), the base
version is vLLM's base model, and every answer carries the token ids and log-probs vLLM
sampled (`return_token_ids`, `logprobs`), so the completion log holds exactly those tokens.

vLLM forgets its adapters when it restarts: the supervisor's on-ready hook loads every one
again (and warms each up) before the server counts as ready, so traffic never reaches a
restarted vLLM that lacks an adapter of the split. While it is down, requests fail at once
with 503 (counted by the gateway as errors of the version they were routed to).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agentrl.serving.backends import UpstreamBackend, verify_checkpoint
from agentrl.serving.errors import BackendError, DeployError, VersionNotServed
from agentrl.serving.openai_types import ChatRequest, Generation
from agentrl.serving.registry import ModelRecord
from agentrl.serving.vllm.base import same_base
from agentrl.serving.vllm.lora import LoraLimits, adapter_rank, lora_limits
from agentrl.serving.vllm.server import VllmServer
from agentrl.serving.vllm.settings import VllmSettings

log = logging.getLogger(__name__)

# vLLM 0.32 dropped the guided_* fields (silently ignored): they become structured_outputs
GUIDED = {
    "guided_choice": "choice",
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_grammar": "grammar",
}
STRUCTURED = ("structured_outputs", "response_format", *GUIDED)


class VllmBackend(UpstreamBackend):
    """Versions as runtime-loaded LoRA adapters of one supervised `vllm serve`."""

    def __init__(
        self,
        server: VllmServer,
        base: dict[str, Any],
        cache_dir: Path,
        *,
        timeout_s: float = 60.0,
        settings: VllmSettings | None = None,
    ) -> None:
        super().__init__(
            server.base_url,
            api_key=server.api_key,  # vLLM refuses /v1 without it (adapter loading too)
            timeout_s=timeout_s,
            default_model=server.served_name,
        )
        self.server, self.base, self.cache_dir = server, base, cache_dir
        self.adapters: dict[str, Path] = {}  # model_id -> verified folder, loaded in vLLM
        self.load_seconds: dict[str, float] = {}
        self.lost: dict[str, str] = {}  # model_id -> why a restarted vLLM lacks it
        self.adapter_wait_s = 300.0  # how long `prepare` waits for a (re)starting vLLM
        self.settings = settings or VllmSettings()
        self.ranks: dict[str, int] = {}  # model_id -> its adapter's rank
        self.resizes = 0  # restarts that raised vLLM's LoRA limits
        server.on_ready.append(self._on_ready)

    # ---- adapters ----------------------------------------------------------------------
    async def _on_ready(self) -> None:
        """Reload every adapter into a (re)started vLLM, then warm each name up once (the
        first request of a fresh vLLM was measured at 39 s on 2 busy cores, the next 0.9 s)."""
        for model_id, folder in list(self.adapters.items()):
            try:
                await self._load(model_id, folder)
            except DeployError as exc:  # one bad adapter must not keep vLLM down for all
                log.error("adapter %s could not be reloaded: %s", model_id, exc)
                self.adapters.pop(model_id)
                self.lost[model_id] = str(exc)
        for name in [self.server.served_name, *self.adapters]:
            resp = await self.client.post(
                "/chat/completions",
                json={"model": name, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 1, "logprobs": True, "return_token_ids": True},
                timeout=max(self.timeout_s, 300.0),
            )  # fmt: skip
            if resp.status_code >= 400:
                raise DeployError(f"warm-up of {name} failed: {resp.text[:300]}")

    async def _load(self, model_id: str, folder: Path) -> None:
        resp = await self.client.post(
            "/load_lora_adapter", json={"lora_name": model_id, "lora_path": str(folder)}
        )
        if resp.status_code >= 400 and "already" not in resp.text:
            raise DeployError(f"vLLM refused adapter {model_id}: {resp.text[:300]}")

    async def prepare(self, record: ModelRecord) -> None:
        if record.checkpoint_path is None:  # the base model itself: nothing to load, and
            # the gateway need not wait for vLLM (requests get 503 until it is ready)
            self.names[record.model_id] = self.server.served_name
            return
        folder = await asyncio.to_thread(verify_checkpoint, record, self.cache_dir)
        if not (folder / "adapter_config.json").exists():
            raise DeployError(
                f"{record.checkpoint_path} holds no LoRA adapter (adapter_config.json): the "
                "vllm backend serves versions as adapters of its base model"
            )
        from agentrl.llm.names import BASE_FILE

        spec_file = folder / BASE_FILE
        if spec_file.exists():
            spec = json.loads(spec_file.read_text())
            if not same_base(spec, self.base):
                raise DeployError(
                    f"adapter {record.model_id} was trained on base {spec}, but vLLM serves "
                    f"{self.base}; start it with that base model"
                )
        await self._fit(record.model_id, folder)
        # a (re)starting vLLM is waited for: the version is not to blame for it
        await self.server.wait_ready(self.adapter_wait_s, through_restarts=True)
        started = time.monotonic()
        await self._load(record.model_id, folder)
        self.load_seconds[record.model_id] = time.monotonic() - started
        self.adapters[record.model_id] = folder
        self.names[record.model_id] = record.model_id
        self.lost.pop(record.model_id, None)

    def limits_for(self, extra: dict[str, int] | None = None) -> LoraLimits:
        """vLLM's LoRA limits for the adapters served now plus `extra` (model_id -> rank)."""
        ranks = {**self.ranks, **(extra or {})}
        s = self.settings
        return lora_limits(
            len(ranks), max(ranks.values(), default=0), floor_loras=s.max_loras,
            floor_rank=s.max_lora_rank, cap=s.max_loras_cap,
        )  # fmt: skip

    async def _fit(self, model_id: str, folder: Path) -> None:
        """Raise vLLM's LoRA limits (a restart) when one more adapter would not fit them:
        more live adapters than batch slots, or a rank above --max-lora-rank. Never lowered
        while serving (that restart would cost every lineage its traffic)."""
        rank = await asyncio.to_thread(adapter_rank, folder)
        if not self.settings.resize_loras:  # vLLM's own limits decide (it may refuse)
            self.ranks[model_id] = rank
            return
        want = self.limits_for({model_id: rank})
        have = self.server.lora
        if have.fits(len(self.ranks | {model_id: rank}), rank):
            self.ranks[model_id] = rank
            return
        bigger = LoraLimits(
            max(have.max_loras, want.max_loras),
            max(have.max_lora_rank, want.max_lora_rank),
            max(have.max_cpu_loras, want.max_cpu_loras),
        )
        self.ranks[model_id] = rank
        if await self.server.resize(bigger):
            self.resizes += 1

    async def release(self, model_id: str) -> None:
        self.ranks.pop(model_id, None)
        self.lost.pop(model_id, None)
        if self.adapters.pop(model_id, None) is not None and self.server.state == "ready":
            resp = await self.client.post("/unload_lora_adapter", json={"lora_name": model_id})
            if resp.status_code >= 400:
                log.warning("vLLM could not unload %s: %s", model_id, resp.text[:200])
        self.names.pop(model_id, None)

    async def loaded(self) -> list[str]:
        """The adapter names vLLM itself lists (GET /v1/models), base excluded."""
        resp = await self.client.get("/models")
        resp.raise_for_status()
        return sorted(m["id"] for m in resp.json()["data"] if m["id"] != self.server.served_name)

    # ---- requests ----------------------------------------------------------------------
    def _body(self, model_id: str, request: ChatRequest) -> dict[str, Any]:
        body = super()._body(model_id, request)
        extra = request.model_extra or {}
        if "return_tokens_as_token_ids" not in extra:
            body.pop("return_tokens_as_token_ids", None)  # ids come as token_ids instead
        so = dict(body.get("structured_outputs") or {})
        for old, new in GUIDED.items():
            if old in body:
                so.setdefault(new, body.pop(old))
        if so:
            body["structured_outputs"] = so
        body["logprobs"] = True  # the completion log needs them whatever the client asked
        body["return_token_ids"] = True
        return body

    def _ready(self, model_id: str) -> None:
        if model_id not in self.names:  # never prepared, or released: not the base's answer
            raise VersionNotServed(
                f"model version {model_id!r} is not loaded in vLLM (released, or never prepared)"
            )
        if model_id in self.lost:
            raise BackendError(f"adapter {model_id} was lost: {self.lost[model_id]}", 502)
        if self.server.state != "ready":
            why = f": {self.server.last_error}" if self.server.last_error else ""
            raise BackendError(f"vLLM is not serving now ({self.server.state}){why}", 503)

    def _shape(self, request: ChatRequest, obj: dict[str, Any]) -> dict[str, Any]:
        """Drop what the client did not ask for (log-probs, token ids) from vLLM's answer."""
        extra = request.model_extra or {}
        if not extra.get("return_token_ids"):
            obj.pop("prompt_token_ids", None)
            for choice in obj.get("choices") or []:
                choice.pop("token_ids", None)
        if not request.logprobs:
            for choice in obj.get("choices") or []:
                if "logprobs" in choice:
                    choice["logprobs"] = None
        return obj

    async def generate(self, model_id: str, request: ChatRequest) -> Generation:
        self._ready(model_id)
        gen = await super().generate(model_id, request)
        gen.constrained = any(getattr(request, k, None) for k in STRUCTURED) or bool(
            request.tools and request.tool_choice not in (None, "none", "auto")
        )
        if gen.raw is not None:
            gen.raw = self._shape(request, gen.raw)
        return gen

    async def stream(self, model_id: str, request: ChatRequest) -> AsyncIterator[tuple[str, Any]]:
        self._ready(model_id)
        async for kind, value in super().stream(model_id, request):
            if kind == "chunks":
                value = [self._shape(request, v) for v in value]
            elif kind == "done":
                value.constrained = any(getattr(request, k, None) for k in STRUCTURED)
            yield kind, value

    async def close(self) -> None:
        await super().close()
        await self.server.close()
