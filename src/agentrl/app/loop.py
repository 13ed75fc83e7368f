"""`agentrl loop`, the main job: the whole feedback loop on the whole stack, as an outside
agent sees it. Read `run_loop` top to bottom; each stage is a function below it.

The embedded stack of `agentrl up` runs in this process (nats-server, reward service,
warehouse ingester, training service, deployment controller + gateway, control API). Agent
workers act in FrozenLake (egocentric observations) on training seeds through the gateway
with the official `openai` SDK and the valid moves as `guided_choice`; every episode is
published as `agent.rl.trajectory.v1`. From there nothing is called directly: the reward
service scores, the training service's threshold trigger starts a job, the deployment
controller validates the finished checkpoint, ramps the canary and promotes or rolls back,
and the agents keep acting, partly on the new version. At the end each served version is
evaluated greedily on held-out seeds (never trained on) through the gateway by its own name.

Knobs of the other services are their own settings (AGENTRL_TRAINING_*, AGENTRL_DEPLOY_*);
`loop_environment` sets the demo-sized values before the services read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.app.loop_agents import Agents, Watch, link_completions, served_versions
from agentrl.app.loop_config import (
    HELDOUT_OFFSET,
    MOVES,
    PACE_S,
    LoopConfig,
    _system_prompt,
    loop_environment,
    loop_task,
)
from agentrl.app.loop_decide import (
    Decider,
    end_rule,
    inject_bad_candidate,
    live_benchmark,
    passed_validation,
    trained_and_decided,
    undecided,
)
from agentrl.app.loop_launcher import ForkedLauncher, fork_launcher
from agentrl.app.loop_results import (
    LoopResult,
    VersionRow,
    decision_of,
    deploy_stages,
    job_stages,
    median,
    model_of,
    table,
)
from agentrl.app.tls import client_tls
from agentrl.core.stats import wilson

__all__ = [  # the loop's names, importable from here as before the split
    "HELDOUT_OFFSET",
    "MOVES",
    "PACE_S",
    "Agents",
    "LoopConfig",
    "LoopResult",
    "VersionRow",
    "Watch",
    "_system_prompt",
    "_until_served",
    "decision_of",
    "end_rule",
    "inject_bad_candidate",
    "link_completions",
    "live_benchmark",
    "loop_environment",
    "loop_task",
    "passed_validation",
    "prepare_data_dir",
    "run_loop",
    "served_versions",
    "table",
    "trained_and_decided",
    "undecided",
]


@dataclass
class Run:
    """What the stages share: the settings, the stack's handles and the figures so far."""

    cfg: LoopConfig
    say: Callable[[str], None]
    t_start: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=dict)
    result: LoopResult = field(default_factory=LoopResult)
    data_dir: Path = Path()
    public: str = ""
    stack: Any = None
    bus: Any = None
    registry: Any = None
    start_model: str | None = None  # a warm start: not one of the generations
    watch: Watch = field(default_factory=Watch)
    stop_watch: asyncio.Event = field(default_factory=asyncio.Event)
    watchers: list[asyncio.Task[Any]] = field(default_factory=list)
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    end_acting: asyncio.Event = field(default_factory=asyncio.Event)
    t_act: float = 0.0
    launcher: ForkedLauncher | None = None  # the jobs' launcher, forked from this process


async def run_loop(
    cfg: LoopConfig, say: Callable[[str], None] = print, log_file: str | None = None
) -> LoopResult:
    """The main job; with `log_file` (the command's `loop.log`) every log record, warning and
    progress bar goes to that file in the data dir, the console keeps `say`'s lines."""
    from agentrl.app.stack import stack_services
    from agentrl.bus.server import EmbeddedNats

    run = Run(cfg, say)
    try:
        settings = prepare(run, log_file)  # the data dir, the log file, services' settings
        with EmbeddedNats(settings=settings) as server:
            async with stack_services(server.url, settings) as stack:
                try:
                    await start_stack(run, stack)  # up and answering; the warm start; watchers
                    agents = Agents(cfg, run.bus, stack.gateway_url, run.public, say)
                    acting = start_acting(run, agents)  # the agents act until the run ends
                    catch_signals(run)  # Ctrl-C: stop acting, still evaluate and report
                    await decide(run, agents, acting)  # print the chain; end by the end rule
                    await stop_acting(run, agents, acting)
                    records = await settle(run, agents)  # the rewards' tail; the stages' times
                    await evaluate_heldout(run, agents, records)  # every version, greedy
                    await stop_watching(run)
                    await write_report(run)
                    count(run, agents)
                    await agents.close()
                finally:
                    await drop_watchers(run)  # a second signal's: before the bus closes
    finally:
        if run.launcher is not None:
            run.launcher.stop()
    run.stages["acting_per_min"] = run.result.trajectories / max(
        run.stages.get("acting", 1.0) / 60, 1e-9
    )
    run.result.stages = {k: round(v, 2) for k, v in run.stages.items()}
    run.result.wall_s = time.monotonic() - run.t_start
    return run.result


# ---- start the stack -----------------------------------------------------------------------


def prepare(run: Run, log_file: str | None) -> Any:
    """The run's folder (afresh), its log file, and the services' loop-sized settings set in
    the environment before they read them; the stack's `Settings`."""
    import logging

    from agentrl.core.settings import Settings

    for noisy in ("httpx", "httpx2"):  # one INFO line per agent request drowns the progress
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run.data_dir = prepare_data_dir(Path(run.cfg.data_dir), fresh=run.cfg.fresh)
    if log_file:  # after the wipe of the data dir, before anything logs
        from agentrl.core.logs import log_to_file

        run.say(f"log: {log_to_file(run.data_dir / log_file)}")
    # before any torch computation (`loop_environment`'s bf16 probe) and any thread
    run.launcher = fork_launcher(run.data_dir)
    if run.cfg.env == "tooluse":
        from agentrl.app import loop_tooluse

        loop_tooluse.write_reward_config(run.data_dir, run.cfg.partial_credit)
        run.say(loop_tooluse.data_program_line(run.cfg))
    os.environ.update(loop_environment(run.cfg))
    return Settings(
        data_dir=run.data_dir,
        api_port=int(os.environ.get("AGENTRL_API_PORT") or free_port()),
        gateway_port=int(os.environ.get("AGENTRL_GATEWAY_PORT") or free_port()),
        nats_url=None,
    )


async def start_stack(run: Run, stack: Any) -> None:
    """Wait until the gateway answers, open the registry, make a warm start live, and watch
    rewards and training statuses on the bus."""
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    ds = DeploySettings()
    run.stack, run.bus, run.public = stack, stack.bus, ds.public_model
    for what, where in stack.urls().items():
        run.say(f"stack: {what:<22} {where}")
    await _wait_http(f"{stack.gateway_url}/models", 180)
    if run.cfg.backend == "vllm":  # the gateway is up before vLLM (minutes on 2 cores)
        await _wait_answer(stack.gateway_url, run.public, 1800)
    run.stages["startup"] = time.monotonic() - run.t_start
    run.say(f"stack: up in {run.stages['startup']:.1f}s ({', '.join(stack.health)})")
    run.registry = await Registry.open(run.bus.js, ds.bucket)
    run.result.start_model = f"{run.public}-base"
    if run.cfg.init_checkpoint:
        run.start_model = await start_from(
            run.registry, run.bus, run.public, run.cfg, run.data_dir, run.say
        )
        run.result.start_model = run.start_model
    for subject, durable, handler in (
        ("agent.rl.reward.v1", "loop-watch-rewards", run.watch.on_reward),
        ("agent.rl.training.status.v1", "loop-watch-status", run.watch.on_status),
    ):
        run.watchers.append(
            asyncio.create_task(run.bus.consume(subject, durable, handler, stop=run.stop_watch))
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare_data_dir(data_dir: Path, *, fresh: bool = True) -> Path:
    """The run's folder, emptied when `fresh` (only a folder the loop made: its marker file)
    except `models/`, the converted base model: a cache that costs ~30 s to rebuild."""
    data_dir = data_dir.resolve()
    marker = data_dir / ".agentrl-loop"
    if fresh and data_dir.exists() and any(data_dir.iterdir()):
        if not marker.exists():  # never wipe a folder the loop did not make
            raise ValueError(
                f"{data_dir} holds other data; give `agentrl loop` a folder of its own "
                "(each run starts it afresh)"
            )
        for child in data_dir.iterdir():
            if child.name == "models":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    data_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by agentrl loop; wiped at the start of the next run\n")
    return data_dir


async def _wait_answer(gateway_url: str, model: str, timeout: float) -> None:
    """Until the gateway answers a chat completion (a supervised vLLM is starting)."""
    import httpx

    deadline = time.monotonic() + timeout
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with httpx.AsyncClient(timeout=60.0, verify=client_tls()) as client:
        while True:
            try:
                r = await client.post(f"{gateway_url}/chat/completions", json=body)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gateway_url} did not answer within {timeout:.0f}s")
            await asyncio.sleep(2.0)


async def _wait_http(url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0, verify=client_tls()) as client:
        while True:
            try:
                r = await client.get(url)
                if r.status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")
            await asyncio.sleep(0.2)


async def start_from(
    registry: Any, bus: Any, public: str, cfg: LoopConfig, data_dir: Path, say: Any
) -> str:
    """Make `cfg.init_checkpoint` (a warm start) the live version before the agents act:
    registered and promoted by hand, as an operator would (`agentrl deploy promote`)."""
    from agentrl.release.actions import Deployer, checkpoint_sha

    ckpt = str(cfg.init_checkpoint)
    sha = await asyncio.to_thread(checkpoint_sha, ckpt, data_dir / "checkpoint-cache")
    deployer = Deployer(registry, bus, public)
    record = await deployer.register(
        checkpoint_path=ckpt,
        base_model=cfg.model,
        sha256=sha,
        training_job_id="warm-start",
        by="agentrl-loop",
    )
    model_id = str(record.model_id)
    await deployer.promote(model_id, by="agentrl-loop", reason="the loop's warm start")
    await _until_served(registry, public, model_id)
    say(f"start: {model_id} (warm start {ckpt}) is live")
    return model_id


async def _until_served(
    registry: Any, public: str, model_id: str, timeout_s: float = 600.0
) -> None:
    """Wait until a gateway routes all of `public` to `model_id`: agents that start while
    its adapter loads are served by the base (the start would be measured on the base's
    trajectories). A gateway that refuses it ends the loop with the reason."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for report in await registry.serving_reports(public):
            if model_id in report.refused:
                raise RuntimeError(
                    f"the gateway refused the warm start {model_id}: {report.refused[model_id]}"
                )
            if report.weights == {model_id: 100.0}:
                return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"no gateway served the warm start {model_id} within {timeout_s:.0f}s")


# ---- act ------------------------------------------------------------------------------------


def start_acting(run: Run, agents: Agents) -> asyncio.Task[None]:
    """The agents act in the background until `stop_acting`."""
    cfg = run.cfg
    run.t_act = time.monotonic()
    task = asyncio.create_task(agents.run(run.end_acting))
    what = (
        "tool-use tasks (Agent Zero JSON under structured outputs)"
        if cfg.env == "tooluse"
        else "FrozenLake 4x4 (egocentric)"
    )
    run.say(
        f"acting: {cfg.agents} agents x groups of {cfg.group_size} on {what} "
        f"through {run.stack.gateway_url}, trigger every {cfg.threshold} rewards"
    )
    return task


def catch_signals(run: Run) -> None:
    """Ctrl-C / SIGTERM: stop acting, still evaluate and report; a second one stops at once
    (the stack and nats-server still shut down through the context managers)."""
    main_task = asyncio.current_task()

    def on_signal() -> None:
        if run.interrupted.is_set() and main_task is not None:
            run.say("interrupted again: stopping now")
            main_task.cancel()
        run.interrupted.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)


async def stop_acting(run: Run, agents: Agents, acting: asyncio.Task[None]) -> None:
    run.end_acting.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(acting, 60)
    run.stages["acting"] = time.monotonic() - run.t_act


# ---- train and decide ---------------------------------------------------------------------


async def decide(run: Run, agents: Agents, acting: asyncio.Task[None]) -> None:
    """Training and deciding happen in the services: this watches the registry and the
    training statuses, prints every step of the chain, paces the agents, and ends the run
    by the end rule (`loop_decide.end_rule`), the time budget or an interrupt."""
    decider = Decider(run.cfg, run.registry, run.bus, run.public, run.data_dir, run.say)
    await decider.watch(agents, run.watch, acting, run.interrupted, run.start_model, run.t_start)


# ---- evaluate held-out --------------------------------------------------------------------


async def settle(run: Run, agents: Agents) -> list[Any]:
    """Wait a little for the rewards of the last trajectories; the reward latency, the jobs'
    and the versions' stage times; the registry's records."""
    t_tail = time.monotonic()
    while time.monotonic() - t_tail < 30 and any(
        t not in run.watch.rewards for t in agents.published
    ):
        await asyncio.sleep(0.3)
    latencies = [
        run.watch.arrived[t] - at for t, at in agents.published.items() if t in run.watch.arrived
    ]
    run.stages["reward_latency_p50"] = median(latencies)
    job_stages(run.watch, run.stages)
    records: list[Any] = await run.registry.list_models(run.public)
    deploy_stages(records, run.stages)
    promoted_at = [
        d.at.timestamp()
        for r in records
        if r.model_id != run.start_model  # the warm start's promotion precedes acting
        for d in r.decisions
        if d.action == "promote"
    ]
    if agents.first_published is not None and promoted_at:
        run.result.loop_wall_s = max(promoted_at) - agents.first_published
    return records


async def evaluate_heldout(run: Run, agents: Agents, records: list[Any]) -> None:
    """Held-out greedy success of every version, by its own name; one row each. A trained
    version no longer served (rejected, rolled back) is loaded for the evaluation only.
    Every version's episodes (both pools) are in flight together under one bound
    (`Agents.heldout_limit`): one version after another, each pool's last episodes decoded
    in batches of a few rows while the next had not started (four such tails for two
    versions); the gateway batches the versions' rows together (one LoRA adapter per row).
    The console's lines come in version order once all are measured."""
    cfg, say = run.cfg, run.say
    t_eval = time.monotonic()
    if cfg.env == "tooluse":
        from agentrl.app import loop_tooluse

        tasks = loop_tooluse.heldout_tasks(cfg.heldout_seeds, HELDOUT_OFFSET)
        unseen = loop_tooluse.heldout_tasks(cfg.unseen_seeds, HELDOUT_OFFSET, "unseen")
    else:
        tasks = [("frozenlake", HELDOUT_OFFSET + k) for k in range(cfg.heldout_seeds)]
        unseen = []
    served = set(await _served_models(run.stack.gateway_url))
    total_by = sum(agents.by_model.values()) or 1
    limit = agents.heldout_limit()
    plays: list[Any] = []
    lines: list[list[str]] = []  # each version's console lines, said in version order
    for r in sorted(records, key=lambda r: r.version):
        act, why = decision_of(r)
        row = VersionRow(r.model_id, r.state, decision=act, why=why)
        row.traffic_share = agents.by_model.get(r.model_id, 0) / total_by
        rs = [
            x
            for t, x in ((t, run.watch.reward_of(t)) for t in agents.published)
            if x is not None and model_of(run.watch, t) == r.model_id
        ]
        row.rewards = len(rs)
        row.mean_reward = sum(rs) / len(rs) if rs else None
        out: list[str] = []
        lines.append(out)
        if run.start_model is not None and r.checkpoint_path is None:
            # with a warm start the comparison is start vs trained; the base's
            # figure is the warm start's own run's (`agentrl learn`), not re-measured
            out.append(f"held-out: {r.model_id} not evaluated (the run started warm)")
        elif not cfg.finish_in_flight and r.state in ("canary", "candidate"):
            # a quick run ends at its first decided version: the jobs that went on
            # meanwhile left versions no one decided
            out.append(f"held-out: {r.model_id} not evaluated (undecided at the end)")
        elif r.model_id in served:
            plays.append(_heldout_row(run, agents, row, tasks, unseen, limit, out.append))
        elif r.checkpoint_path is not None:  # rejected, or rolled back and unloaded
            plays.append(_heldout_unserved(run, agents, row, tasks, unseen, limit, out.append))
        run.result.versions.append(row)
    if len(plays) > 1:
        say(
            f"held-out: {len(plays)} versions on {len(tasks)} + {len(unseen)} tasks, in flight together"
        )
    done = await asyncio.gather(*plays, return_exceptions=True)
    for out in lines:
        for line in out:
            say(line)
    for got in done:
        if isinstance(got, BaseException):
            raise got
    run.stages["heldout_eval"] = time.monotonic() - t_eval
    run.result.heldout_errors = sum(agents.heldout_errors.values())
    if cfg.env == "tooluse":
        run.result.extra = _tooluse_extra(run, agents, records)
        _keep_task_rows(run, agents)


async def _heldout_row(
    run: Run,
    agents: Agents,
    row: VersionRow,
    tasks: list[tuple[str, int]],
    unseen: list[tuple[str, int]],
    limit: asyncio.Semaphore,
    say: Callable[[str], None],
) -> None:
    """One version on the held-out tasks and the unseen pool, both in flight together."""

    async def nothing() -> tuple[int, int, dict[str, tuple[int, int]]]:
        return 0, 0, {}

    (wins, n, per), (uw, un, uper) = await asyncio.gather(
        agents.heldout(row.model_id, tasks, limit=limit),
        agents.heldout(row.model_id, unseen, "unseen", limit=limit) if unseen else nothing(),
    )
    if not n:
        say(f"held-out: {row.model_id} not measured (every episode ended on an error)")
        return
    row.heldout_success, row.heldout_n = wins / n, n
    row.ci_low, row.ci_high = wilson(wins, n)
    row.per_family = per if run.cfg.env == "tooluse" else {}
    fams = ", ".join(f"{f} {w}/{k}" for f, (w, k) in row.per_family.items())
    say(
        f"held-out: {row.model_id} {wins}/{n} = {wins / n:.2f} "
        f"[{row.ci_low:.2f}, {row.ci_high:.2f}]" + (f" ({fams})" if fams else "")
    )
    if un:  # the unseen-phrasing pool, reported apart
        row.unseen_success, row.unseen_n = uw / un, un
        ufams = ", ".join(f"{f} {w}/{k}" for f, (w, k) in uper.items())
        say(f"held-out, unseen pool: {row.model_id} {uw}/{un} ({ufams})")


async def _heldout_unserved(
    run: Run,
    agents: Agents,
    row: VersionRow,
    tasks: list[tuple[str, int]],
    unseen: list[tuple[str, int]],
    limit: asyncio.Semaphore,
    say: Callable[[str], None],
) -> None:
    """A trained version no split routes any more (rejected by validation, rolled back):
    held in the deployment's gateways for the held-out evaluation only (a bus request to the
    deploy service, `agentrl.app.held`: routable by its id, no traffic share, no decision),
    measured on the same tasks by its own name, then released. Without it a rejected
    candidate's held-out was never known, nor whether its job learned anything."""
    from agentrl.app.held import held_for_evaluation

    row.held_for_eval = True
    gateway = run.stack.gateway_url
    async with held_for_evaluation(run.bus, run.public, row.model_id, gateway_url=gateway) as why:
        if why is not None:
            say(f"held-out: {row.model_id} ({row.state}) not evaluated: cannot load ({why})")
            return
        say(f"held-out: {row.model_id} ({row.state}) loaded for the evaluation only")
        await _heldout_row(run, agents, row, tasks, unseen, limit, say)


def _tooluse_extra(run: Run, agents: Agents, records: list[Any]) -> dict[str, Any]:
    from agentrl.app import loop_tooluse

    walls = loop_tooluse.generation_walls(records, run.watch.statuses)
    return {
        "unseen_seeds": max((v.unseen_n for v in run.result.versions), default=0),
        "cut_by_token_cap": dict(agents.cut),
        **loop_tooluse.job_counts(run.watch.statuses, records),  # up to the last decided
        "generation_walls_s": [round(w, 1) for w in walls],
        "generation_wall_s_p50": round(median(walls), 1) if walls else None,
    }


def _keep_task_rows(run: Run, agents: Agents) -> None:
    """Each evaluated version's held-out outcome per task: in the result (the paired figures
    and first tools of its JSON line) and in `<data-dir>/heldout/<version>.jsonl`."""
    from agentrl.app.loop_tooluse_heldout import write_rows

    evaluated = [v.model_id for v in run.result.versions if v.model_id in agents.heldout_rows]
    run.result.task_rows = {m: agents.heldout_rows[m] for m in evaluated}
    try:
        paths = write_rows(run.data_dir / "heldout", run.result.task_rows)
    except OSError as exc:  # the figures are in the JSON line all the same
        run.say(f"held-out rows: not written ({type(exc).__name__}: {exc})")
        return
    if paths:
        run.say(f"held-out per task: {len(paths)} files in {paths[0].parent}")


async def _served_models(gateway_url: str) -> list[str]:
    import httpx

    async with httpx.AsyncClient(timeout=10, verify=client_tls()) as client:
        r = await client.get(f"{gateway_url}/models")
        return [m["id"] for m in r.json().get("data", [])]


# ---- report ---------------------------------------------------------------------------------


async def stop_watching(run: Run) -> None:
    run.stop_watch.set()
    await asyncio.gather(*run.watchers, return_exceptions=True)


async def drop_watchers(run: Run) -> None:
    """Cancel the watchers still consuming (a run cut short: a second signal, an error). The
    stack's bus drains on closing, and a watcher's subscription left open held that drain for
    nats-py's whole 30 s (`agentrl loop` stopped 31 s after a second signal)."""
    await cancel_left(run.watchers)


async def cancel_left(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the tasks not done yet and wait until they are (`drop_watchers`)."""
    left = [t for t in tasks if not t.done()]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


async def write_report(run: Run) -> None:
    """The HTML report, from the streams of this stack (a by-product: a failure says why)."""
    t_rep = time.monotonic()
    try:
        from datetime import UTC, datetime, timedelta

        from agentrl.app.report import load_from_streams, write_report

        data = await load_from_streams(run.bus, datetime.now(UTC) - timedelta(hours=1))
        page = await asyncio.to_thread(
            write_report, data, run.data_dir / "report", heldout=run.result.versions
        )
        run.result.report = str(page)
    except Exception as exc:
        run.say(f"report: not written ({type(exc).__name__}: {exc})")
    run.stages["report"] = time.monotonic() - t_rep


def count(run: Run, agents: Agents) -> None:
    """Trajectories published, rewarded, lost, and played by more than one version."""
    res = run.result
    res.trajectories = len(agents.published)
    res.mixed = agents.mixed
    res.rewards = sum(1 for t in agents.published if t in run.watch.rewards)
    res.lost = res.trajectories - res.rewards
