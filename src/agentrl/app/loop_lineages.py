"""`agentrl loop --lineages 2`: two agents with different tasks sharing one base model, each
in its own lineage (`agentrl.release.lineage`): its own versions, split, validation benchmark,
training trigger and canary.

Built from `agentrl.app.loop`'s pieces: the same embedded stack, agents, watcher, end rule
and drill. The agents of lineage k name themselves `agent_id` (the training service's
`threshold_scope=lineage` counts and filters by it) and ask the gateway for the lineage by
its name (`model`). FrozenLake 4x4 and 5x5 (egocentric observations): the same recipe the
main loop measured, on maps of two sizes. A drill pushes a broken version (torn weights,
`inject_bad_candidate`) into the first lineage's canary once that lineage is done; the
gateway refuses it and it is rolled back, while the other lineage's split is watched for any
version that is not its own and for any rollback.

On 2 cores the lineages compete for the CPU: a lineage that is done (and that the drill no
longer needs) stops acting and is paused, so its trajectories no longer trigger jobs and
validations nobody counts, and the other lineage's jobs, validations and canaries get the
machine; at the end every lineage's base and live version play their held-out maps at once
(the engine scores their moves in the same passes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.app.loop import (
    HELDOUT_OFFSET,
    Agents,
    LoopConfig,
    LoopResult,
    VersionRow,
    Watch,
    _system_prompt,
    _wait_http,
    cancel_left,
    decision_of,
    end_rule,
    free_port,
    inject_bad_candidate,
    live_benchmark,
    loop_environment,
    model_of,
    passed_validation,
    prepare_data_dir,
    trained_and_decided,
    undecided,
)
from agentrl.app.loop_agents import credited
from agentrl.app.loop_launcher import fork_launcher, stopping
from agentrl.core.stats import wilson

BY = "agentrl-loop"


@dataclass(frozen=True)
class LineageSpec:
    """One lineage of the run: its public name, its agents' id and their task."""

    name: str
    agent_id: str
    env_id: str


SPECS = (
    LineageSpec("lake/4x4", "lake4-agent", "frozenlake-4x4"),
    LineageSpec("lake/5x5", "lake5-agent", "frozenlake-5x5"),
)


def specs(n: int) -> list[LineageSpec]:
    if not 1 <= n <= len(SPECS):
        raise ValueError(f"--lineages {n}: 1 to {len(SPECS)} (FrozenLake 4x4 and 5x5)")
    return list(SPECS[:n])


def lineage_task(cfg: LoopConfig, spec: LineageSpec, seed: int) -> Any:
    """`loop_task` on the lineage's own map size."""
    from agentrl.core.episodes import Message
    from agentrl.envs.registry import task_for

    task = task_for(
        spec.env_id,
        seed,
        max_episode_steps=cfg.max_steps,
        obs_format="egocentric",
        progress_reward=cfg.progress_reward,
        hole_penalty=cfg.hole_penalty,
    )
    task.initial_messages = [Message(role="system", content=_system_prompt())]
    return task


def validation_of(spec: LineageSpec) -> dict[str, Any]:
    """The lineage's DeploySettings overrides: its benchmark plays its own task."""
    return {
        "benchmark_tasks": {"research_synthesis": [spec.env_id]},
        "benchmark_env_kwargs": {spec.env_id: {"obs_format": "egocentric"}},
    }


class LineageAgents(Agents):
    """The loop's agents, named after their lineage and playing its task."""

    def __init__(
        self, cfg: LoopConfig, bus: Any, gateway_url: str, spec: LineageSpec, say: Any
    ) -> None:
        super().__init__(cfg, bus, gateway_url, spec.name, say)
        self.spec = spec
        self.agent_id = spec.agent_id

    def task(self, seed: int, family: str = "mixed", pool: str = "train") -> Any:
        return lineage_task(self.cfg, self.spec, seed)


@dataclass
class Drill:
    """A broken version pushed into `target`'s canary; `other`'s split watched meanwhile."""

    target: str
    other: str | None
    injected: str | None = None
    state: str = ""  # the injected version's last state
    foreign: set[str] = field(default_factory=set)  # not-its-own versions seen in other's split
    other_rollbacks: int = 0  # rollbacks in the other lineage while the drill ran
    other_before: dict[str, float] | None = None
    other_after: dict[str, float] | None = None

    def untouched(self) -> bool:
        return not self.foreign and self.other_rollbacks == 0

    def rolled_back(self) -> bool:
        return self.injected is not None and self.state == "rolled_back" and self.untouched()

    def finished(self) -> bool:
        return self.state in ("rolled_back", "live", "retired", "skipped")


def at_rest(name: str, done: bool, drill: Drill | None) -> bool:
    """Pure: a done lineage stops acting and is paused, unless the drill still needs it: its
    target, and the other lineage (the drill watches its controller and split at work)."""
    if not done:
        return False
    return drill is None or name not in (drill.target, drill.other) or drill.finished()


def paced(done: bool, busy: bool, validating: bool, job_active: bool) -> bool:
    """Pure: a lineage acts at a trickle while its job trains or its version validates (a
    canary gets full speed: its analysis needs sessions); and once it is done: it acts on
    only for the drill, which needs its split and controller at work, not its CPU (at full
    speed the two done lineages played 450 trajectories while the drill ran)."""
    return done or (not busy and (validating or job_active))


def own_split_only(lineage: str, weights: dict[str, float]) -> set[str]:
    """Pure: the versions in a lineage's split that are not its own (`<lineage>-...`)."""
    return {m for m, w in weights.items() if w > 0 and not m.startswith(f"{lineage}-")}


def lineage_gain(summary: dict[str, Any]) -> float | None:
    live, base = summary.get("live_heldout_success"), summary.get("base_heldout_success")
    return None if live is None or base is None else round(live - base, 4)


@dataclass
class LineagesResult:
    per: dict[str, LoopResult] = field(default_factory=dict)
    drill: Drill | None = None
    wall_s: float = 0.0
    trajectories: int = 0
    rewards: int = 0
    lost: int = 0
    stages: dict[str, float] = field(default_factory=dict)
    report: str | None = None

    def summary(self) -> dict[str, Any]:
        per = {name: r.summary() for name, r in self.per.items()}
        gains = [lineage_gain(s) for s in per.values()]
        apart = []
        for r in self.per.values():
            base = next((v for v in r.versions if v.model_id.endswith("-base")), None)
            live = next((v for v in r.versions if v.state == "live"), None)
            apart.append(
                bool(base and live and base is not live and live.ci_low is not None)
                and (live.ci_low or 0.0) > (base.ci_high or 1.0)  # type: ignore[union-attr]
            )
        return {
            "lineages": len(per),
            "min_lineage_gain": min((g for g in gains if g is not None), default=None)
            if all(g is not None for g in gains)
            else None,
            "intervals_apart": all(apart) if apart else False,
            "drill_rolled_back": self.drill.rolled_back() if self.drill else None,
            "drill_version": self.drill.injected if self.drill else None,
            "drill_other_split_untouched": self.drill.untouched() if self.drill else None,
            "trajectories": self.trajectories,
            "rewards": self.rewards,
            "lost": self.lost,
            "wall_s": round(self.wall_s, 1),
            "per_lineage": per,
            "stages": self.stages,
        }


@dataclass
class _Track:
    """The watcher's view of one lineage."""

    spec: LineageSpec
    agents: LineageAgents
    finishing: set[str] | None = None
    done: bool = False
    busy: bool = False
    pending: bool = False
    extended: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # its agents stop acting
    resting: bool = False  # done: not acting, its lineage paused (`at_rest`)


async def _wait_live_served(registry: Any, name: str, timeout_s: float = 120.0) -> None:
    """Until a gateway reports routing the lineage (its first version at 100 %)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        split, _ = await registry.get_split(name)
        if split is not None and split.live:
            for report in await registry.serving_reports(name):
                if report.weights.get(split.live) == 100.0:
                    return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"no gateway routed lineage {name} within {timeout_s:.0f}s")


def _job_lineage(evs: list[Any]) -> str | None:
    from agentrl.release.fleet import lineage_of_status

    for e in evs:
        name = lineage_of_status(e)
        if name:
            return name
    return None


async def run_lineages(
    cfg: LoopConfig,
    n: int = 2,
    say: Callable[[str], None] = print,
    drill: bool = True,
    log_file: str | None = None,
) -> LineagesResult:
    """The loop with `n` lineages (see the module's docstring)."""
    import logging

    from agentrl.app.stack import stack_services
    from agentrl.bus.server import EmbeddedNats
    from agentrl.core.settings import Settings
    from agentrl.release.lineage import Lineages
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    chosen = specs(n)
    # the run's agents are shared among the lineages (2 cores serve them all), at least 2 each
    if cfg.agents // n >= 2:
        cfg = cfg.model_copy(update={"agents": cfg.agents // n})
    t_start = time.monotonic()
    stages: dict[str, float] = {}
    data_dir = prepare_data_dir(Path(cfg.data_dir), fresh=cfg.fresh)
    if log_file:
        from agentrl.core.logs import log_to_file

        say(f"log: {log_to_file(data_dir / log_file)}")
    # the jobs' launcher, forked before any torch computation and any thread (`loop_launcher`)
    launcher = fork_launcher(data_dir)
    env = loop_environment(cfg)
    # each lineage's trigger counts and filters its own agents' trajectories
    env["AGENTRL_TRAINING_THRESHOLD_SCOPE"] = "lineage"
    os.environ.update(env)
    settings = Settings(
        data_dir=data_dir,
        api_port=int(os.environ.get("AGENTRL_API_PORT") or free_port()),
        gateway_port=int(os.environ.get("AGENTRL_GATEWAY_PORT") or free_port()),
        nats_url=None,
    )
    ds = DeploySettings()
    result = LineagesResult()
    with stopping(launcher), EmbeddedNats(settings=settings) as server:
        async with stack_services(server.url, settings) as stack:
            await _wait_http(f"{stack.gateway_url}/models", 180)
            stages["startup"] = time.monotonic() - t_start
            say(f"stack: up in {stages['startup']:.1f}s")
            bus = stack.bus
            registry = await Registry.open(bus.js, ds.bucket)
            lineages = Lineages(registry, ds.public_model)
            for spec in chosen:
                await lineages.create(
                    spec.name,
                    base_model=cfg.model,
                    agents=[spec.agent_id],
                    validation=validation_of(spec),
                    by=BY,
                    reason=f"agentrl loop --lineages: {spec.env_id}",
                    bus=bus,
                )
            for spec in chosen:
                await _wait_live_served(registry, spec.name)
                say(f"lineage {spec.name}: agents {spec.agent_id} on {spec.env_id}, base live")
            stages["lineages_ready"] = time.monotonic() - t_start
            watch = Watch()
            stop_watch = asyncio.Event()
            watchers = [
                asyncio.create_task(
                    bus.consume(
                        "agent.rl.reward.v1", "loop-watch-rewards", watch.on_reward, stop=stop_watch
                    )
                ),
                asyncio.create_task(
                    bus.consume(
                        "agent.rl.training.status.v1",
                        "loop-watch-status",
                        watch.on_status,
                        stop=stop_watch,
                    )
                ),
            ]
            acting: list[asyncio.Task[None]] = []
            tracks: list[_Track] = []
            try:
                tracks += [
                    _Track(s, LineageAgents(cfg, bus, stack.gateway_url, s, say)) for s in chosen
                ]
                t_act = time.monotonic()
                acting += [asyncio.create_task(t.agents.run(t.stop)) for t in tracks]
                the_drill = (
                    Drill(chosen[0].name, chosen[1].name if n > 1 else None) if drill else None
                )
                result.drill = the_drill
                try:
                    await _watch(cfg, registry, watch, tracks, acting, the_drill, data_dir, bus, say,
                                 t_start, lineages)  # fmt: skip
                finally:
                    for tr in tracks:
                        tr.stop.set()
                    for task in acting:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(task, 60)
                stages["acting"] = time.monotonic() - t_act
                t_tail = time.monotonic()
                published = {t for tr in tracks for t in tr.agents.published}
                while time.monotonic() - t_tail < 30 and any(
                    t not in watch.rewards for t in published
                ):
                    await asyncio.sleep(0.3)
                t_eval = time.monotonic()
                # every lineage's versions at once: their moves scored in the same passes, the
                # episodes in flight bounded together below the gateway's admission
                limit = asyncio.Semaphore(HELDOUT_IN_FLIGHT)
                evaluated = await asyncio.gather(
                    *(_evaluate(cfg, registry, watch, tr, say, limit) for tr in tracks)
                )
                for tr, res in zip(tracks, evaluated, strict=True):
                    result.per[tr.spec.name] = res
                stages["heldout_eval"] = time.monotonic() - t_eval
                try:  # the report of `agentrl loop`, every lineage's versions in it
                    from datetime import UTC, datetime, timedelta

                    from agentrl.app.report import load_from_streams, write_report

                    data = await load_from_streams(bus, datetime.now(UTC) - timedelta(hours=1))
                    rows = [v for r in result.per.values() for v in r.versions]
                    page = await asyncio.to_thread(
                        write_report, data, data_dir / "report", heldout=rows
                    )
                    result.report = str(page)
                except Exception as exc:  # a by-product: say why it is missing
                    say(f"report: not written ({type(exc).__name__}: {exc})")
                stop_watch.set()
                await asyncio.gather(*watchers, return_exceptions=True)
                result.trajectories = len(published)
                result.rewards = sum(1 for t in published if t in watch.rewards)
                result.lost = result.trajectories - result.rewards
            finally:  # an error or a signal: nothing left consuming when the bus closes
                await cancel_left([*watchers, *acting])
                for tr in tracks:
                    with contextlib.suppress(Exception):
                        await tr.agents.close()
    result.stages = {k: round(v, 2) for k, v in stages.items()}
    result.wall_s = time.monotonic() - t_start
    return result


async def _watch(
    cfg: LoopConfig,
    registry: Any,
    watch: Watch,
    tracks: list[_Track],
    acting: list[asyncio.Task[None]],
    drill: Drill | None,
    data_dir: Path,
    bus: Any,
    say: Callable[[str], None],
    t_start: float,
    lineages: Any = None,
) -> None:
    """Each lineage runs `end_rule` on its own versions; the drill follows its target's end;
    a lineage at rest (`at_rest`) stops acting and is paused; the run ends when every
    lineage (and the drill) is done or the budget runs out."""
    deadline = t_start + cfg.time_budget_s
    grace_until = deadline + cfg.grace_s
    watcher = _Watcher(cfg, registry, watch, drill, data_dir, bus, say)
    while True:
        await asyncio.sleep(0.5)
        now = time.monotonic()
        for task in acting:
            if task.done():
                task.result()
        with_jobs = watcher.lineages_with_jobs()
        for tr in tracks:
            await watcher.follow(tr, with_jobs)
        await watcher.drill_other()
        watcher.note(now, tracks)
        drill_done = drill is None or drill.finished()
        if all(t.done for t in tracks) and drill_done:
            return
        for tr in tracks:  # done and not needed by the drill: leave the CPU to the others
            if not tr.resting and at_rest(tr.spec.name, tr.done, drill):
                await _rest(tr, lineages, bus, say)
        if now >= deadline and (not any(t.pending for t in tracks) or now >= grace_until):
            say(f"time budget of {cfg.time_budget_s:.0f}s reached")
            return


async def _rest(tr: _Track, lineages: Any, bus: Any, say: Callable[[str], None]) -> None:
    """A done lineage stops acting and is paused (acting stops even if pausing fails)."""
    tr.resting = True
    tr.stop.set()
    if lineages is not None:
        try:
            await lineages.set_state(
                tr.spec.name, "paused", by=BY, reason="done: no more jobs", bus=bus
            )
        except Exception as exc:  # acting stopped all the same
            say(f"{tr.spec.name}: not paused ({type(exc).__name__}: {exc})")
    say(f"lineage {tr.spec.name}: at rest (no acting, paused)")


class _Watcher:
    """What `_watch` remembers between its looks: the decisions and job statuses already
    said, when it last noted the acting, and when the drill's version was injected."""

    def __init__(
        self,
        cfg: LoopConfig,
        registry: Any,
        watch: Watch,
        drill: Drill | None,
        data_dir: Path,
        bus: Any,
        say: Callable[[str], None],
    ) -> None:
        self.cfg, self.registry, self.watch, self.drill = cfg, registry, watch, drill
        self.data_dir, self.bus, self.say = data_dir, bus, say
        self.printed: dict[str, int] = {}
        self.jobs_seen: dict[str, str] = {}
        self.last_note = 0.0
        self.drill_t0: float | None = None

    def lineages_with_jobs(self) -> dict[str, bool]:
        """The lineages with a training job queued or running; each job's new status said."""
        jobs_by_lineage: dict[str, bool] = {}
        for job, evs in self.watch.statuses.items():
            name = _job_lineage(evs)
            if self.jobs_seen.get(job) != evs[-1].status:
                self.jobs_seen[job] = evs[-1].status
                self.say(f"training job {job[:8]} ({name}): {evs[-1].status}")
            if name and evs[-1].status in ("queued", "running"):
                jobs_by_lineage[name] = True
        return jobs_by_lineage

    async def follow(self, tr: _Track, with_jobs: dict[str, bool]) -> None:
        """One look at a lineage's versions: its new decisions said, its flags (busy,
        pending, paced), its end rule, and the drill's step when it is the target."""
        cfg, drill, say = self.cfg, self.drill, self.say
        name = tr.spec.name
        try:
            records = await self.registry.list_models(name)
            rollout = await self.registry.get_rollout(name)
        except Exception as exc:
            say(f"watch: registry not readable now ({type(exc).__name__})")
            return
        self._say_decisions(records)
        injected = drill.injected if drill and drill.target == name else None
        decided = trained_and_decided(records, {injected})
        tr.busy = rollout is not None and rollout.status == "running"
        validating = any(
            r.state == "candidate"
            and r.checkpoint_path
            and not any(d.action in ("validate", "wait") for d in r.decisions)
            for r in records
        )
        tr.pending = tr.busy or validating
        tr.agents.paced = cfg.pace and paced(
            tr.done, tr.busy, validating, with_jobs.get(name, False)
        )
        bench = live_benchmark(records)
        stage = end_rule(cfg, len(decided), bench)
        if stage == "extend" and len(decided) > tr.extended:
            tr.extended = len(decided)
            say(f"{name}: {len(decided)} decided, benchmark {bench or 0.0:.2f}: going on")
        if stage == "end" and tr.finishing is None and cfg.finish_in_flight:
            tr.finishing = passed_validation(records, {injected})
        if tr.finishing and undecided(records, tr.finishing):
            return
        if stage == "end" and not tr.busy and not tr.done:
            tr.done = True
            say(
                f"lineage {name}: done ({len(decided)} version{'' if len(decided) == 1 else 's'} decided)"
            )
        if drill is not None and name == drill.target and tr.done and drill.state not in (
            "rolled_back", "live", "retired", "skipped"
        ):  # fmt: skip
            await self._drill_step(drill, tr, records)

    def _say_decisions(self, records: list[Any]) -> None:
        for r in records:
            for d in r.decisions[self.printed.get(r.model_id, 0) :]:
                to = f" -> {d.to_state}" if d.to_state else ""
                self.say(f"version {r.model_id}: {d.action}{to} ({d.by}: {d.reason})")
            self.printed[r.model_id] = len(r.decisions)

    async def _drill_step(self, drill: Drill, tr: _Track, records: list[Any]) -> None:
        """The drill on its done target: inject the bad candidate once the lineage is idle
        (the other lineage's split noted before), then follow its state to its end (the
        other's split noted after)."""
        registry, name = self.registry, tr.spec.name
        if drill.injected is None and not tr.busy:
            got = await inject_bad_candidate(self.bus, name, self.data_dir, self.say)
            if got is None:
                drill.state = "skipped"
            elif got:
                drill.injected = got
                self.drill_t0 = time.time()
                if drill.other:
                    split, _ = await registry.get_split(drill.other)
                    drill.other_before = dict(split.weights) if split else {}
        elif drill.injected:
            rec = next((r for r in records if r.model_id == drill.injected), None)
            drill.state = rec.state if rec else ""
            if drill.state in ("rolled_back", "live", "retired") and drill.other:
                split, _ = await registry.get_split(drill.other)
                drill.other_after = dict(split.weights) if split else {}
                self.say(f"drill: {drill.injected} {drill.state}; {drill.other}'s split "
                         f"{drill.other_before} -> {drill.other_after}")  # fmt: skip

    async def drill_other(self) -> None:
        """While the drill's version is in flight: versions not its own seen in the other
        lineage's split, and rollbacks there since the injection."""
        drill, drill_t0 = self.drill, self.drill_t0
        if not (drill and drill.other and drill.injected and drill_t0 is not None) or (
            drill.state in ("rolled_back", "live", "retired")
        ):
            return
        split, _ = await self.registry.get_split(drill.other)
        drill.foreign |= own_split_only(drill.other, dict(split.weights) if split else {})
        for r in await self.registry.list_models(drill.other):
            drill.other_rollbacks = max(
                drill.other_rollbacks,
                sum(d.action == "rollback" and d.at.timestamp() >= drill_t0 for d in r.decisions),
            )

    def note(self, now: float, tracks: list[_Track]) -> None:
        """Every 15 s: what each lineage's agents published, by version, and the rewards."""
        if now - self.last_note <= 15:
            return
        self.last_note = now
        self.say(
            "acting: "
            + ", ".join(
                f"{t.spec.name} {len(t.agents.published)} by {credited(t.agents.by_model)}"
                for t in tracks
            )
            + f"; {len(self.watch.rewards)} rewarded"
        )


HELDOUT_IN_FLIGHT = 60  # episodes of all held-out evaluations at once (admission: 64)


async def _evaluate(
    cfg: LoopConfig,
    registry: Any,
    watch: Watch,
    tr: _Track,
    say: Callable[[str], None],
    limit: asyncio.Semaphore | None = None,
) -> LoopResult:
    """Held-out greedy success of the lineage's base and live versions on its own held-out
    maps, by each version's own name; every version's row with its decision."""
    records = await registry.list_models(tr.spec.name)
    res = LoopResult(start_model=f"{tr.spec.name}-base")
    tasks = [("frozenlake", HELDOUT_OFFSET + k) for k in range(cfg.heldout_seeds)]
    total_by = sum(tr.agents.by_model.values()) or 1
    for r in sorted(records, key=lambda r: r.version):
        act, why = decision_of(r)
        row = VersionRow(r.model_id, r.state, decision=act, why=why)
        row.traffic_share = tr.agents.by_model.get(r.model_id, 0) / total_by
        rs = [
            x
            for t, x in ((t, watch.reward_of(t)) for t in tr.agents.published)
            if x is not None and model_of(watch, t) == r.model_id
        ]
        row.rewards, row.mean_reward = len(rs), (sum(rs) / len(rs) if rs else None)
        res.versions.append(row)
    # the base and the live version at once (and, from the caller, every lineage's)
    played = [row for row in res.versions if row.state == "live" or row.model_id.endswith("-base")]
    results = await asyncio.gather(
        *(tr.agents.heldout(row.model_id, tasks, limit=limit) for row in played)
    )
    for row, (wins, n, _) in zip(played, results, strict=True):
        if not n:
            say(f"held-out {tr.spec.env_id}: {row.model_id} not measured (every episode ended "
                "on an error)")  # fmt: skip
            continue
        row.heldout_success, row.heldout_n = wins / n, n
        row.ci_low, row.ci_high = wilson(wins, n)
        say(f"held-out {tr.spec.env_id}: {row.model_id} {wins}/{n} = {wins / n:.2f} "
            f"[{row.ci_low:.2f}, {row.ci_high:.2f}]")  # fmt: skip
    res.heldout_errors = sum(tr.agents.heldout_errors.values())
    res.trajectories = len(tr.agents.published)
    res.rewards = sum(1 for t in tr.agents.published if t in watch.rewards)
    res.lost = res.trajectories - res.rewards
    res.mixed = tr.agents.mixed
    return res


def table(result: LineagesResult) -> str:
    from agentrl.app.loop import table as one_table

    parts = []
    for name, r in result.per.items():
        parts.append(f"== lineage {name}")
        parts.append(one_table(r))
    return "\n".join(parts)
