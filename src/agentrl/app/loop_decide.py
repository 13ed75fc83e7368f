"""The decide stage's rules: which versions count as decided, when the run ends or goes on,
and the deliberately broken version `--bad-candidate` deploys by hand."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentrl.app.loop_agents import credited
from agentrl.app.loop_config import LoopConfig


def trained_and_decided(records: list[Any], not_trained: set[str | None]) -> list[Any]:
    """The versions this run trained whose fate is decided (live, retired, rolled back or
    rejected): what `generations` counts. Not the warm start nor a hand-injected version
    (the warm start is live from the first second: counted, a one-generation loop with a
    warm start ended before its first job)."""
    return [
        r
        for r in records
        if r.state in ("live", "retired", "rolled_back", "rejected")
        and r.checkpoint_path
        and r.model_id not in not_trained
    ]


def live_benchmark(records: list[Any]) -> float | None:
    """The live version's own validation benchmark mean (None: no live version, or one
    never validated, such as the base)."""
    from agentrl.release.validation import benchmark_mean

    live = next((r for r in records if r.state == "live"), None)
    return None if live is None else benchmark_mean(live.validation_details)


def end_rule(
    cfg: LoopConfig, decided: int, benchmark: float | None
) -> Literal["train", "extend", "end"]:
    """Pure: "train" until `generations` versions are decided; then "end" if the live
    version reaches `until_benchmark` on its validation maps (or `max_generations` are
    decided, or the bar is off), else "extend" (more generations)."""
    if decided < cfg.generations:
        return "train"
    if (
        cfg.until_benchmark <= 0
        or decided >= max(cfg.generations, cfg.max_generations)
        or (benchmark is not None and benchmark >= cfg.until_benchmark)
    ):
        return "end"
    return "extend"


def passed_validation(records: list[Any], not_trained: set[str | None]) -> set[str]:
    """Trained versions past validation and not yet decided: in canary, or candidates whose
    validation passed and that wait for the rollout before them."""
    return {
        r.model_id
        for r in records
        if r.model_id not in not_trained
        and (
            r.state == "canary"
            or (r.state == "candidate" and any(d.action == "validate" for d in r.decisions))
        )
    }


def undecided(records: list[Any], ids: set[str]) -> set[str]:
    """Those of `ids` still in canary or waiting as candidates."""
    return {r.model_id for r in records if r.model_id in ids and r.state in ("canary", "candidate")}


async def inject_bad_candidate(bus: Any, public: str, data_dir: Path, say: Any) -> str | None:
    """A deliberately broken version deployed by hand past validation (an operator's
    mistake): a copy of the live checkpoint whose weights no longer match their manifest.
    The gateway refuses to serve it and rolls it back on its own. None: nothing to break;
    "": not now (another version's rollout is on)."""
    from agentrl.release.actions import Deployer
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    ds = DeploySettings()
    registry = await Registry.open(bus.js, ds.bucket)
    split, _ = await registry.get_split(public)
    live = await registry.get_model(split.live) if split and split.live else None
    if live is None or not live.checkpoint_path:
        say("bad candidate: no trained live version to break; skipped")
        return None
    from agentrl.serving.errors import DeployError
    from agentrl.serving.registry import ACTIVE

    async def rollout_on() -> bool:
        current = await registry.get_rollout(public)
        return current is not None and current.status in ACTIVE

    if await rollout_on():
        return ""  # the controller started another version's canary meanwhile: after it
    deployer = Deployer(registry, bus, public, "")
    by = "agentrl-loop (--bad-candidate)"
    # registered once: a start refused below is tried again later with the same version
    # (unless the controller's validation took it meanwhile: then a new one)
    earlier = [
        r
        for r in await registry.list_models(public)
        if r.state == "candidate"
        and r.checkpoint_path
        and Path(r.checkpoint_path).parent == data_dir / "bad-candidate"
    ]
    if earlier:
        record = earlier[0]
    else:
        src = Path(live.checkpoint_path)
        bad = data_dir / "bad-candidate" / src.name
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(src, bad)
        for f in bad.glob("*.safetensors"):
            raw = bytearray(f.read_bytes())
            raw[-64:] = bytes(64)  # torn weights: the manifest's sha256 no longer matches
            f.write_bytes(bytes(raw))
        record = await deployer.register(
            checkpoint_path=str(bad),
            base_model=live.base_model,
            sha256=live.sha256 or "",
            serving=dict(live.serving),
            by=by,
        )
    try:
        await deployer.start(
            record.model_id,
            ds.plan(),
            by=by,
            approval="manual_approved",
            reason="deliberately broken version injected by --bad-candidate",
        )
    except DeployError:
        if await rollout_on():
            return ""  # a canary began between the look above and this start: after it
        raise
    say(f"bad candidate: {record.model_id} (torn weights) deployed by hand past validation")
    return record.model_id


@dataclass
class Decider:
    """The decide stage: watch the registry and the training statuses, print every new step
    of the chain, pace the agents, and say when the run ends (`watch`)."""

    cfg: LoopConfig
    registry: Any
    bus: Any
    public: str
    data_dir: Path
    say: Callable[[str], None]
    seen: dict[str, str] = field(default_factory=dict)  # model id or job:<id> -> state
    printed: dict[str, int] = field(default_factory=dict)  # audit entries said per version
    injected: str | None = None  # the --bad-candidate version
    pending: bool = False  # a job, validation or canary in flight when the budget ran out
    finishing: set[str] | None = None  # validated when `generations` were reached
    extended: int = 0  # decided versions when the run last said it goes on
    last_note: float = 0.0

    async def watch(
        self,
        agents: Any,
        watch: Any,
        acting: asyncio.Task[None],
        interrupted: asyncio.Event,
        start_model: str | None,
        t_start: float,
    ) -> None:
        """Until the end rule ends the run, the time budget (and its grace) runs out, or an
        interrupt; the agents' failure ends it with their error."""
        cfg = self.cfg
        deadline = t_start + cfg.time_budget_s
        grace_until = deadline + cfg.grace_s
        while time.monotonic() < deadline or (self.pending and time.monotonic() < grace_until):
            await asyncio.sleep(0.5)
            if interrupted.is_set():
                self.say("interrupted: acting stops; evaluating what there is")
                return
            if acting.done():
                acting.result()
            try:
                records = await self.registry.list_models(self.public)
                rollout = await self.registry.get_rollout(self.public)
            except Exception as exc:  # a slow or restarting nats-server: look again
                self.say(f"watch: registry not readable now ({type(exc).__name__})")
                continue
            self._tell(records, agents, watch)
            if await self._step(records, rollout, agents, watch, start_model, deadline):
                return
        self.say(
            f"time budget of {cfg.time_budget_s:.0f}s reached"
            + (f"; the {cfg.grace_s:.0f}s grace ran out" if self.pending else "")
        )

    def _tell(self, records: list[Any], agents: Any, watch: Any) -> None:
        """Every new entry of each version's audit trail, in order (states can change twice
        between two looks), each job's new status, and every 15 s the acting figures."""
        for r in records:
            for d in r.decisions[self.printed.get(r.model_id, 0) :]:
                to = f" -> {d.to_state}" if d.to_state else ""
                self.say(f"version {r.model_id}: {d.action}{to} ({d.by}: {d.reason})")
            self.printed[r.model_id] = len(r.decisions)
            self.seen[r.model_id] = r.state
        for job, evs in watch.statuses.items():
            last = evs[-1].status
            key = f"job:{job}"
            if self.seen.get(key) != last:
                self.say(f"training job {job[:8]}: {last}")
                self.seen[key] = last
        if time.monotonic() - self.last_note > 15:
            self.last_note = time.monotonic()
            self.say(
                acting_line(
                    len(agents.published), len(watch.rewards), agents.by_model, agents.mixed
                )
            )

    async def _step(
        self,
        records: list[Any],
        rollout: Any,
        agents: Any,
        watch: Any,
        start_model: str | None,
        deadline: float,
    ) -> bool:
        """One look: pace the agents and apply the end rule; True ends the run."""
        cfg = self.cfg
        not_trained = {self.injected, start_model}
        decided = trained_and_decided(records, not_trained)
        busy = rollout is not None and rollout.status == "running"
        validating = [
            r
            for r in records
            if r.state == "candidate"
            and r.checkpoint_path
            and not any(d.action in ("validate", "wait") for d in r.decisions)
        ]
        training = any(evs[-1].status in ("queued", "running") for evs in watch.statuses.values())
        was_pending = self.pending
        # a job in flight is pending too: the tool-use loop's first job ran past its acting
        # budget and the run ended with nothing trained (2026-11-30)
        self.pending = busy or bool(validating) or training
        # 2 cores: full-speed acting starves a training job and a validation alike; but a
        # running canary decides only on enough sessions per version (a paced trickle gave
        # it 0-3 in four minutes, and every canary was rolled back)
        agents.paced = cfg.pace and not busy and (bool(validating) or training)
        if time.monotonic() >= deadline:
            if not self.pending:
                self.say(f"time budget of {cfg.time_budget_s:.0f}s reached")
                return True
            if not was_pending:
                self.say(
                    f"time budget of {cfg.time_budget_s:.0f}s reached: waiting up to "
                    f"{cfg.grace_s:.0f}s for the job, validation or canary in flight"
                )
        bench = live_benchmark(records)
        stage = end_rule(cfg, len(decided), bench)
        if stage == "extend" and len(decided) > self.extended:
            self.extended = len(decided)
            self.say(
                f"{len(decided)} versions decided; the live version's benchmark "
                f"{bench or 0.0:.2f} < {cfg.until_benchmark:g}: going on, up to "
                f"{max(cfg.generations, cfg.max_generations)}"
            )
        if stage == "end" and self.finishing is None and cfg.finish_in_flight:
            # the versions already through validation (in canary or waiting their turn) are
            # decided before the run ends: cutting one mid-canary left the previous version
            # live (0.16 reported with 0.54 in its canary)
            self.finishing = passed_validation(records, not_trained)
            if self.finishing:
                self.say(f"{len(decided)} versions decided: finishing {sorted(self.finishing)}")
        if self.finishing and undecided(records, self.finishing):
            return False
        if stage == "end" and cfg.bad_candidate:
            # what is left is the drill, whose canary needs no sessions (the gateway refuses
            # the torn weights on its own): a trickle of acting, as a done lineage's
            agents.paced = cfg.pace
        if stage != "end" or busy:
            return False
        if not cfg.bad_candidate:
            return True
        if self.injected is None:
            injected = await inject_bad_candidate(self.bus, self.public, self.data_dir, self.say)
            if injected is None:
                return True  # nothing to break
            self.injected = injected or None  # "": not now, a rollout is on
            return False
        return self.seen.get(self.injected) in ("rolled_back", "live", "retired")


def acting_line(published: int, rewarded: int, by_model: dict[str, int], mixed: int) -> str:
    """The loop's acting progress: trajectories per version that played every turn; those
    played by two versions are counted apart, never as a version of their own."""
    line = f"acting: {published} trajectories, {rewarded} rewarded, by version {credited(by_model)}"
    return line + (f", {mixed} played by two versions (credited to none)" if mixed else "")
