"""The model registry: one NATS KV bucket (`agentrl_models`) with history.

Keys (all JSON):
    model.<model_id>      ModelRecord: checkpoint + sha256, validation results, state,
                          traffic weight, and every decision (who, when, why, evidence)
    split.<public_name>   Split: the weights the gateway routes by (it survives restarts)
    rollout.<public_name> Rollout: the last rollout's plan, step and timers, and the intent of
                          a promote / rollback in progress (`status` promoting | rolling_back
                          + `target`), so a restarted controller, or anyone, finishes it
    serving.<public_name>.<gateway>  ServingReport: what one gateway actually serves (a
                          heartbeat; the controller advances only versions that are served)
    job.<training_job_id> the model_id registered for a training job (idempotency)
    seq.<public_name>     the last version number handed out
The bucket keeps 64 revisions per key, so `history(key)` shows how a record or the split
changed. Writes are compare-and-set, so the controller, the API and the CLI can act on the
same model without losing each other's updates. Retention (seed: models 90 days, the best
ones indefinitely) is `prune()`: retired / rolled-back / rejected records older than the
retention that are not marked best are purged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from agentrl.bus.kv import kv_keys, open_bucket
from agentrl.contracts.base import utcnow
from agentrl.core.logs import audit
from agentrl.observability import instrument as obs
from agentrl.serving.config import RolloutPlan
from agentrl.serving.errors import DeployError, UnknownModel

State = Literal["candidate", "canary", "live", "retired", "rolled_back", "rejected"]
HISTORY = 64

# Allowed state changes. "rejected" (failed validation) is added to the five states
# so a blocked candidate is visibly different from one waiting for its rollout.
TRANSITIONS: dict[str, set[str]] = {
    "candidate": {"canary", "live", "rejected", "retired", "rolled_back"},
    "canary": {"live", "rolled_back", "canary"},
    "live": {"retired", "rolled_back"},
    "retired": {"live", "canary"},
    "rolled_back": {"canary", "live", "retired"},
    "rejected": {"canary", "live", "retired"},  # a human may override a failed validation
}

# a model id's lineage suffix (`<lineage>-v3`, `<lineage>-base`)
MODEL_LIKE = re.compile(r"-(?:v\d+|base)$")


def lineage_of_version(model_id: str) -> str | None:
    """The lineage a version id names (`<lineage>-vN`, `<lineage>-base`), else None."""
    head = MODEL_LIKE.sub("", model_id)
    return head if head and head != model_id else None


class Decision(BaseModel):
    """One entry of the audit trail."""

    model_config = ConfigDict(extra="allow")

    at: datetime = Field(default_factory=utcnow)
    by: str
    action: str
    reason: str
    from_state: str | None = None
    to_state: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class ModelRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    model_id: str
    version: int
    public_name: str
    base_model: str
    checkpoint_path: str | None = None  # None: the base model itself, no adapters
    sha256: str | None = None  # sha256 of the checkpoint's manifest.json
    training_job_id: str | None = None
    training_samples: int | None = None
    final_reward: float | None = None
    validation_results: dict[str, Any] = Field(default_factory=dict)
    validation_details: dict[str, Any] = Field(default_factory=dict)
    state: State = "candidate"
    traffic_weight: float = 0.0
    best: bool = False
    serving: dict[str, Any] = Field(default_factory=dict)  # backend overrides (upstream, ...)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    decisions: list[Decision] = Field(default_factory=list)

    def decide(self, decision: Decision) -> None:
        self.decisions.append(decision)
        self.updated_at = decision.at


class Split(BaseModel):
    """What the gateway routes by: weights in percent per model_id, newest first."""

    public_name: str
    weights: dict[str, float] = Field(default_factory=dict)
    order: list[str] = Field(default_factory=list)
    live: str | None = None
    canary: str | None = None
    previous_live: list[str] = Field(default_factory=list)
    paused: bool = False
    updated_at: datetime = Field(default_factory=utcnow)
    reason: str = ""
    # The rollout whose steps may route the canary now, and the last ones that ended (a late
    # step write of an ended rollout is refused, so it cannot undo a rollback or a promote).
    rollout_id: str | None = None
    ended_rollouts: list[str] = Field(default_factory=list)


RolloutStatus = Literal["running", "promoting", "rolling_back", "promoted", "rolled_back"]
ACTIVE = ("running", "promoting", "rolling_back")  # another rollout must wait for these


class Rollout(BaseModel):
    model_id: str
    plan: RolloutPlan
    step: int = 0
    started_at: datetime = Field(default_factory=utcnow)
    step_started_at: datetime = Field(default_factory=utcnow)
    paused: bool = False
    failures: int = 0
    deployment_id: str
    training_job_id: str | None = None
    previous_model: str | None = None
    approval_status: Literal["automated", "manual_approved"] = "automated"
    deployed_by: str = "agentrl-deploy-controller"
    status: RolloutStatus = "running"
    last_check: dict[str, Any] = Field(default_factory=dict)
    weight: float | None = None  # the new version's weight now (a human may set it off-plan)
    # The intent of a promote / rollback (written first, with compare-and-set): `target` is
    # the version that will be live, `bad` the one rolled back, `replaces` the live one a
    # promote retires; whoever finds it half-done finishes it with these.
    target: str | None = None
    bad: str | None = None
    replaces: str | None = None
    action_by: str | None = None
    action_reason: str | None = None
    action_evidence: dict[str, Any] = Field(default_factory=dict)
    action_at: datetime | None = None
    escalated: bool = False  # an inconclusive analysis asked a human (on_inconclusive=hold)


class ServingReport(BaseModel):
    """What one gateway serves now (its heartbeat in the registry)."""

    gateway: str
    public_name: str
    weights: dict[str, float] = Field(default_factory=dict)  # what it actually routes by
    loaded: list[str] = Field(default_factory=list)  # prepared versions
    refused: dict[str, str] = Field(default_factory=dict)
    split_revision: int = 0
    at: datetime = Field(default_factory=utcnow)


def check_transition(record: ModelRecord, to_state: str) -> None:
    if to_state not in TRANSITIONS.get(record.state, set()):
        raise DeployError(
            f"model {record.model_id} is {record.state}; it cannot become {to_state} "
            f"(allowed: {sorted(TRANSITIONS.get(record.state, set()))})"
        )


M = TypeVar("M", bound=BaseModel)


class Registry:
    """Typed access to the registry bucket; open with `await Registry.open(js)`."""

    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self.kv = kv
        self.bucket = bucket
        self._keys: tuple[float, list[str]] | None = None  # (when, the last listing)
        self._listing = asyncio.Lock()
        # every lineage's split this process read or wrote: the traffic metric's versions
        # are all of theirs (one lineage's write used to zero every other lineage's)
        self._traffic: dict[str, dict[str, float]] = {}

    def _all_traffic(self, public_name: str, weights: dict[str, float]) -> dict[str, float]:
        self._traffic[public_name] = dict(weights)
        return {v: w for split in self._traffic.values() for v, w in split.items()}

    async def keys(self, max_age_s: float = 0.0) -> list[str]:
        """The bucket's live keys. A listing younger than `max_age_s` is reused, and
        concurrent callers share one: the controllers of many lineages (one process, one
        registry) list the bucket once per look, not once each (a listing reads every key)."""
        async with self._listing:
            now = time.monotonic()
            if max_age_s > 0 and self._keys is not None and now - self._keys[0] < max_age_s:
                return self._keys[1]
            try:
                keys = await kv_keys(self.kv)
            except nats.js.errors.NoKeysError:
                keys = []
            self._keys = (time.monotonic(), keys)
            return keys

    @classmethod
    async def open(cls, js: Any, bucket: str = "agentrl_models", replicas: int = 1) -> Registry:
        config = KeyValueConfig(bucket=bucket, history=HISTORY, replicas=replicas)
        return cls(await open_bucket(js, config), bucket)

    # ---- raw --------------------------------------------------------------------------
    async def _get(self, key: str, model: type[M]) -> tuple[M | None, int]:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        if entry.value is None or not entry.value:
            return None, 0
        return model.model_validate_json(entry.value), int(entry.revision or 0)

    async def _put(self, key: str, value: BaseModel, revision: int) -> int:
        data = value.model_dump_json().encode()
        if revision:
            return int(await self.kv.update(key, data, last=revision))
        try:
            return int(await self.kv.create(key, data))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise
        except nats.js.errors.APIError as exc:  # create of a key deleted earlier
            entry = None
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                entry = await self.kv.get(key)
            if entry is not None and entry.value:
                raise nats.js.errors.KeyWrongLastSequenceError() from exc
            return int(await self.kv.put(key, data))

    async def _mutate(
        self, key: str, model: type[M], fn: Callable[[M | None], M | Awaitable[M]]
    ) -> M:
        """Read-modify-write with compare-and-set, retried on a concurrent write."""
        for _ in range(20):
            current, rev = await self._get(key, model)
            if current is not None:
                current = current.model_copy(deep=True)
            result = fn(current)
            value = await result if isinstance(result, Awaitable) else result
            try:
                await self._put(key, value, rev)
                return value
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
                await asyncio.sleep(0.01)
        raise DeployError(f"registry key {key} kept changing under us; try again")

    # ---- models -----------------------------------------------------------------------
    async def get_model(self, model_id: str) -> ModelRecord | None:
        return (await self._get(f"model.{model_id}", ModelRecord))[0]

    async def require_model(self, model_id: str) -> ModelRecord:
        record = await self.get_model(model_id)
        if record is None:
            known = [m.model_id for m in await self.list_models()]
            raise UnknownModel(f"no model {model_id!r} in the registry; known: {known}")
        return record

    async def list_models(self, public_name: str | None = None) -> list[ModelRecord]:
        try:
            keys = await kv_keys(self.kv)  # (server-side filters are unreliable across versions)
        except nats.js.errors.NoKeysError:
            return []
        out = []
        for key in (k for k in keys if k.startswith("model.")):
            record, _ = await self._get(key, ModelRecord)
            if record is not None and (public_name is None or record.public_name == public_name):
                out.append(record)
        return sorted(out, key=lambda r: (r.public_name, r.version))

    async def put_model(self, record: ModelRecord) -> ModelRecord:
        def replace(_: ModelRecord | None) -> ModelRecord:
            return record

        return await self._mutate(f"model.{record.model_id}", ModelRecord, replace)

    async def update_model(self, model_id: str, fn: Callable[[ModelRecord], None]) -> ModelRecord:
        def apply(current: ModelRecord | None) -> ModelRecord:
            if current is None:
                raise DeployError(f"no model {model_id!r} in the registry")
            fn(current)
            current.updated_at = utcnow()
            return current

        return await self._mutate(f"model.{model_id}", ModelRecord, apply)

    async def transition(
        self,
        model_id: str,
        to_state: str,
        *,
        by: str,
        action: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
        weight: float | None = None,
    ) -> ModelRecord:
        def apply(record: ModelRecord) -> None:
            if record.state != to_state:
                check_transition(record, to_state)
            record.decide(
                Decision(
                    by=by,
                    action=action,
                    reason=reason,
                    from_state=record.state,
                    to_state=to_state,
                    evidence=evidence or {},
                )
            )
            record.state = to_state  # type: ignore[assignment]
            if weight is not None:
                record.traffic_weight = weight

        updated = await self.update_model(model_id, apply)
        audit(f"deployment.{action}", actor=by, model_id=model_id, reason=reason, state=to_state)
        return updated

    async def record(
        self, model_id: str, *, by: str, action: str, reason: str, evidence: dict[str, Any]
    ) -> ModelRecord:
        """Append a decision that changes no state (a hold, a passed check, ...)."""

        def apply(record: ModelRecord) -> None:
            record.decide(
                Decision(
                    by=by,
                    action=action,
                    reason=reason,
                    from_state=record.state,
                    to_state=record.state,
                    evidence=evidence,
                )
            )

        updated = await self.update_model(model_id, apply)
        audit(f"deployment.{action}", actor=by, model_id=model_id, reason=reason)
        return updated

    async def next_version(self, public_name: str) -> int:
        class Seq(BaseModel):
            n: int = 0

        def bump(cur: Seq | None) -> Seq:
            return Seq(n=(cur.n if cur else 0) + 1)

        return (await self._mutate(f"seq.{public_name}", Seq, bump)).n

    async def model_for_job(self, training_job_id: str) -> str | None:
        class Job(BaseModel):
            model_id: str

        found, _ = await self._get(f"job.{_key(training_job_id)}", Job)
        return found.model_id if found else None

    async def bind_job(self, training_job_id: str, model_id: str) -> None:
        await self.kv.put(
            f"job.{_key(training_job_id)}", json.dumps({"model_id": model_id}).encode()
        )

    # ---- split and rollout ------------------------------------------------------------
    async def get_split(self, public_name: str) -> tuple[Split | None, int]:
        split, revision = await self._get(f"split.{public_name}", Split)
        if split is not None:  # a process that only reads the split labels its versions too
            obs.split_seen(self._all_traffic(public_name, split.weights))
        return split, revision

    async def update_split(self, public_name: str, fn: Callable[[Split], None]) -> Split:
        def apply(current: Split | None) -> Split:
            split = current or Split(public_name=public_name)
            fn(split)
            _check_weights(split.weights)
            split.updated_at = utcnow()
            return split

        split = await self._mutate(f"split.{public_name}", Split, apply)
        merged = self._all_traffic(public_name, split.weights)
        obs.deployment(traffic={v: w / 100.0 for v, w in merged.items()})  # 0-1 ratios
        return split

    async def get_rollout(self, public_name: str) -> Rollout | None:
        return (await self._get(f"rollout.{public_name}", Rollout))[0]

    async def create_rollout(self, public_name: str, rollout: Rollout) -> Rollout:
        """Write a new rollout (compare-and-set): refused while another one is active."""

        def apply(current: Rollout | None) -> Rollout:
            if current is not None and current.status in ACTIVE:
                raise DeployError(
                    f"a rollout of {current.model_id} is {current.status}; promote or roll it "
                    "back first"
                )
            return rollout

        return await self._mutate(f"rollout.{public_name}", Rollout, apply)

    async def update_rollout(self, public_name: str, fn: Callable[[Rollout], None]) -> Rollout:
        """Compare-and-set change of the stored rollout: `fn` sees the current value (it may
        raise DeployError when its precondition no longer holds) and a concurrent write
        makes it run again on the new value. A deleted rollout is never recreated."""

        def apply(current: Rollout | None) -> Rollout:
            if current is None:
                raise DeployError(f"no rollout of {public_name} (it was removed): not recreated")
            fn(current)
            return current

        return await self._mutate(f"rollout.{public_name}", Rollout, apply)

    # ---- what the gateways serve ------------------------------------------------------
    async def report_serving(self, report: ServingReport) -> None:
        key = f"serving.{_key(report.public_name)}.{_key(report.gateway)}"
        await self.kv.put(key, report.model_dump_json().encode())

    async def drop_serving(self, public_name: str, gateway: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.kv.delete(f"serving.{_key(public_name)}.{_key(gateway)}")

    async def serving_reports(
        self, public_name: str, max_age_s: float = 15.0, listing_age_s: float = 0.0
    ) -> list[ServingReport]:
        """The gateways that reported in the last `max_age_s` seconds (their keys from a
        listing at most `listing_age_s` old: a gateway's report is rewritten every few
        seconds, so a listing shared by every lineage's look misses none for long)."""
        prefix = f"serving.{_key(public_name)}."
        keys = [k for k in await self.keys(listing_age_s) if k.startswith(prefix)]
        out = []
        now = utcnow()
        cutoff, gone = now - timedelta(seconds=max_age_s), now - timedelta(hours=1)
        for key in keys:
            report, _ = await self._get(key, ServingReport)
            if report is not None and report.at >= cutoff:
                out.append(report)
            elif report is not None and report.at < gone:  # a gateway killed long ago
                with contextlib.suppress(nats.js.errors.Error):
                    await self.kv.purge(key)
        return out

    async def history(self, key: str) -> list[dict[str, Any]]:
        """Every stored revision of `key` (oldest first) as decoded JSON.

        Right after a server restart nats-py's history watcher can come back empty for a
        key that exists (seen once in a fresh-clone test run); a key with a value has at
        least one revision, so an empty answer for it is retried a few times."""
        entries: list[Any] = []
        for attempt in range(4):
            try:
                entries = await self.kv.history(key)
                break
            except nats.js.errors.NoKeysError:
                try:
                    await self.kv.get(key)
                except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                    return []
                await asyncio.sleep(0.25 * (attempt + 1))
        out = []
        for e in entries:
            if e.value:
                out.append({"revision": e.revision, "value": json.loads(e.value)})
        return out

    # ---- retention --------------------------------------------------------------------
    async def prune(self, retention_days: float, now: datetime | None = None) -> list[str]:
        """Purge finished records older than the retention unless they are best models."""
        now = now or utcnow()
        cutoff = now - timedelta(days=retention_days)
        gone = []
        for record in await self.list_models():
            finished = record.state in {"retired", "rolled_back", "rejected"}
            if finished and not record.best and record.updated_at < cutoff:
                await self.kv.purge(f"model.{record.model_id}")
                gone.append(record.model_id)
        return gone


def _check_weights(weights: dict[str, float]) -> None:
    for version, w in weights.items():
        if not 0.0 <= w <= 100.0:
            raise DeployError(f"weight {w} for {version} is outside 0..100 percent")
    total = sum(weights.values())
    if weights and abs(total - 100.0) > 1e-6:
        raise DeployError(f"traffic weights add up to {total}, not 100 percent")


def _key(text: str) -> str:
    """A KV-safe key token for an arbitrary id."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in text)
    if safe == text:
        return safe
    return f"{safe[:40]}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
