"""The closed loop, end to end over the real bus.

Each iteration: the policy being trained acts in a text environment (groups of episodes of
the same task), every episode is published as `agent.rl.trajectory.v1`, the reward service
scores it and publishes `agent.rl.reward.v1`, the trainer turns those rewards into GiGPO (or
GRPO/RLOO/PPO/DPO) advantages and updates the model, and reports `agent.rl.training.status.v1`.
The next iteration acts with the updated model. Validation and canary rollout come later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.bus import Bus, Delivery
from agentrl.contracts.base import utcnow
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.training import (
    Artifacts,
    CurrentMetrics,
    Progress,
    StatusMetrics,
    TrainingRequest,
    TrainingStatus,
)
from agentrl.errors import AgentRLError

if TYPE_CHECKING:
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer


@dataclass
class DemoSettings:
    env_id: str = "frozenlake-4x4"
    model: str = "smollm2"
    algorithm: str = "gigpo"
    iterations: int = 2
    tasks_per_iteration: int = 2
    group_size: int = 4
    max_steps: int = 4
    max_new_tokens: int = 16
    history_window: int = 0  # FrozenLake and Sokoban observations are Markov: no history
    learning_rate: float = 2e-4
    lora_r: int = 16
    seed: int = 0
    data_dir: Path = Path(".agentrl")
    reward_timeout_s: float = 120.0
    # A small penalty for unparsable actions gives GiGPO's step level something to learn
    # from before the first success: the model first learns to answer in the format.
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"invalid_action_penalty": -0.1})


@dataclass
class IterationReport:
    iteration: int
    episodes: int
    success_rate: float
    invalid_action_rate: float
    reward_mean: float
    reward_std: float
    samples: int
    loss: float | None
    rollout_s: float
    reward_wait_s: float
    update_s: float


@dataclass
class DemoResult:
    job_id: str
    iterations: list[IterationReport] = field(default_factory=list)
    final_checkpoint: str | None = None
    trajectories_published: int = 0
    rewards_received: int = 0
    statuses_published: int = 0


def new_job_id() -> str:
    return str(uuid.uuid4())  # the published schemas want a canonical UUID


class RewardInbox:
    """Collects rewards from the bus, keeping the highest version per trajectory."""

    def __init__(self) -> None:
        self.latest: dict[str, RewardEvent] = {}
        self.changed = asyncio.Event()
        self.error: BaseException | None = None  # the reader died: waiting is pointless

    async def handle(self, batch: list[Delivery]) -> None:
        for d in batch:
            ev: RewardEvent = d.event
            old = self.latest.get(ev.trajectory_id)
            if old is None or ev.version >= old.version:
                self.latest[ev.trajectory_id] = ev
        self.changed.set()

    def add(self, events: Sequence[RewardEvent]) -> None:
        for ev in events:
            old = self.latest.get(ev.trajectory_id)
            if old is None or ev.version >= old.version:
                self.latest[ev.trajectory_id] = ev
        self.changed.set()

    async def wait_for(self, ids: Sequence[str], timeout: float) -> dict[str, RewardEvent]:
        deadline = time.monotonic() + timeout
        while True:
            missing = [i for i in ids if i not in self.latest]
            if not missing:
                return {i: self.latest[i] for i in ids}
            if self.error is not None:
                raise AgentRLError(f"the reward reader stopped: {self.error!r}") from self.error
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentRLError(
                    f"no reward for {len(missing)} of {len(ids)} trajectories after {timeout:.0f}s "
                    "(is the reward service running? see RL_DLQ for rejected trajectories)"
                )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))


def training_request(settings: DemoSettings, config: TrainerConfig, job_id: str) -> TrainingRequest:
    """The `agent.rl.training.request.v1` the demo publishes for its job."""
    return TrainingRequest.model_validate(
        {
            "training_job_id": job_id,
            "timestamp": utcnow(),
            "requester": "agentrl-demo",
            "trigger_reason": "manual",
            "training_config": {
                "algorithm": settings.algorithm,
                "base_model": settings.model,
                "hyperparameters": {
                    "learning_rate": settings.learning_rate,
                    "batch_size": config.batch_size,
                    "epochs": config.epochs,
                },
                "checkpointing": {"storage_path": config.storage_path},
            },
        }
    )


def status_event(
    settings: DemoSettings, job_id: str, state: str, it: int, step: int, **extra: Any
) -> TrainingStatus:
    """The `agent.rl.training.status.v1` the demo publishes after iteration `it`."""
    return TrainingStatus(
        training_job_id=job_id,
        timestamp=utcnow(),
        status=state,  # type: ignore[arg-type]
        progress=Progress(
            current_epoch=it,
            total_epochs=settings.iterations,
            current_step=step,
            percent_complete=100.0 * it / settings.iterations,
        ),
        **extra,
    )


def _non_negative(x: float | None) -> float | None:
    return None if x is None else max(0.0, float(x))


def trainer_config(settings: DemoSettings, job_id: str) -> TrainerConfig:
    from agentrl.llm.config import TrainerConfig

    return TrainerConfig(
        algorithm=settings.algorithm,  # type: ignore[arg-type]
        model=settings.model,
        learning_rate=settings.learning_rate,
        lora_r=settings.lora_r,
        seed=settings.seed,
        history_window=settings.history_window,
        storage_path=str(settings.data_dir / "checkpoints" / job_id),
    )


def load_trainer(settings: DemoSettings, job_id: str) -> PolicyTrainer:
    """Load the policy model (slow for real models: do it before services start)."""
    from agentrl.llm.trainer import PolicyTrainer

    return PolicyTrainer.from_config(trainer_config(settings, job_id))


async def run_loop(
    bus: Bus,
    settings: DemoSettings,
    on_iteration: Callable[[IterationReport], None] | None = None,
    log: Callable[[str], None] = print,
    trainer: PolicyTrainer | None = None,
    job_id: str | None = None,
) -> DemoResult:
    """Run `settings.iterations` rounds of act -> publish -> reward -> train on `bus`.

    The reward service must be consuming `agent.rl.trajectory.v1` on the same bus.
    """
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.loop import LoopSettings, build_pairs, build_samples, collect, make_tasks
    from agentrl.rollout.convert import episode_to_trajectory
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    job_id = job_id or new_job_id()
    result = DemoResult(job_id=job_id)
    config = trainer.config if trainer is not None else trainer_config(settings, job_id)
    await bus.publish(training_request(settings, config, job_id))

    inbox = RewardInbox()
    stop_inbox = asyncio.Event()
    ready = asyncio.Event()
    inbox_task = asyncio.create_task(follow_rewards(bus, inbox, stop_inbox, ready))
    await ready.wait()

    async def status(state: str, it: int, **extra: Any) -> None:
        step = trainer.global_step if trainer else 0
        await bus.publish(status_event(settings, job_id, state, it, step, **extra))
        result.statuses_published += 1

    try:
        if trainer is None:
            log(f"loading model {settings.model!r} ...")
            trainer = await asyncio.to_thread(load_trainer, settings, job_id)
        await status("running", 0)
        loop_cfg = LoopSettings(
            env_id=settings.env_id,
            tasks_per_iteration=settings.tasks_per_iteration,
            group_size=settings.group_size,
            max_steps=settings.max_steps,
            max_new_tokens=settings.max_new_tokens,
            base_seed=settings.seed,
            env_kwargs=dict(settings.env_kwargs),
            write_files=False,
        )
        policy = HFAgentPolicy(
            trainer.policy.model,
            trainer.policy.tokenizer,
            max_new_tokens=settings.max_new_tokens,
            temperature=config.temperature,
            max_batch_size=settings.tasks_per_iteration * settings.group_size,
            seed=settings.seed,
        )
        for it in range(1, settings.iterations + 1):
            t0 = time.perf_counter()
            seeds = [
                settings.seed + (it - 1) * settings.tasks_per_iteration + k
                for k in range(settings.tasks_per_iteration)
            ]
            groups = await collect(
                make_tasks(loop_cfg, seeds), settings.group_size, policy, config.history_window
            )
            episodes = [ep for g in groups for ep in g if ep.steps]
            t1 = time.perf_counter()
            await bus.publish_many(
                [episode_to_trajectory(ep, model=settings.model) for ep in episodes]
            )
            result.trajectories_published += len(episodes)
            rewards = await inbox.wait_for(
                [ep.episode_id for ep in episodes], settings.reward_timeout_s
            )
            result.rewards_received += len(rewards)
            scores = {tid: r.total_reward for tid, r in rewards.items()}
            t2 = time.perf_counter()
            if config.algorithm == "dpo":
                pairs = build_pairs(groups, trainer, scores=scores)
                history = await asyncio.to_thread(trainer.train_on_pairs, pairs) if pairs else []
                n_samples = len(pairs)
            else:
                samples = build_samples(groups, trainer, scores=scores)
                history = await asyncio.to_thread(
                    trainer.train_on_samples, samples, allow_empty=True
                )
                n_samples = len(samples)
            t3 = time.perf_counter()
            values = np.array(list(scores.values()))
            losses = [h["loss"] for h in history if h.get("loss") is not None]
            steps = [st for ep in episodes for st in ep.steps]
            invalid = sum(bool(st.step_info.get("invalid_action")) for st in steps)
            report = IterationReport(
                iteration=it,
                episodes=len(episodes),
                success_rate=float(np.mean([ep.success for ep in episodes])) if episodes else 0.0,
                invalid_action_rate=invalid / max(len(steps), 1),
                reward_mean=float(values.mean()) if values.size else 0.0,
                reward_std=float(values.std()) if values.size else 0.0,
                samples=n_samples,
                loss=float(np.mean(losses)) if losses else None,
                rollout_s=t1 - t0,
                reward_wait_s=t2 - t1,
                update_s=t3 - t2,
            )
            result.iterations.append(report)
            last = history[-1] if history else {}
            await status(
                "running",
                it,
                metrics=StatusMetrics(
                    current=CurrentMetrics(
                        loss=report.loss,
                        reward_mean=report.reward_mean,
                        reward_std=report.reward_std,
                        policy_entropy=last.get("policy_entropy"),
                        # KL >= 0 (the schema says so); a negative k1 estimate is noise
                        kl_divergence=_non_negative(last.get("approx_kl")),
                        learning_rate=last.get("learning_rate"),
                    )
                ),
            )
            if on_iteration:
                on_iteration(report)
        ckpt = CheckpointManager(
            config.storage_path,
            config.max_checkpoints,
            config.storage_options,
            run_info={"name": f"agentrl demo {job_id}", "data": f"rollouts of {settings.env_id}"},
        )
        last_metrics = result.iterations[-1].__dict__ if result.iterations else {}
        result.final_checkpoint = await asyncio.to_thread(
            ckpt.save, trainer, last_metrics, name="final"
        )
        await status(
            "completed",
            settings.iterations,
            artifacts=Artifacts(final_checkpoint=result.final_checkpoint),
        )
    except Exception as exc:
        code = getattr(exc, "code", "INFRA")
        await status(
            "failed",
            len(result.iterations),
            error={
                "code": code if code in ("OOM", "CONVERGENCE", "DATA", "INFRA") else "INFRA",
                "message": str(exc),
            },
        )
        raise
    finally:
        stop_inbox.set()
        await inbox_task
    return result


async def follow_rewards(
    bus: Bus,
    inbox: RewardInbox,
    stop: asyncio.Event,
    ready: asyncio.Event | None = None,
    fetch_timeout: float = 0.5,
) -> int:
    """Feed `inbox` with the rewards published from now on, until `stop`.

    A one-off reader: an ephemeral pull consumer that starts after the stream's current last
    sequence (never a replay of the whole RL_REWARDS stream), acks nothing, and is deleted
    when the run ends (the server also drops it after 30 s without a reader). Returns how
    many rewards it read.
    """
    import nats.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from agentrl.contracts.streams import stream_for

    stream = stream_for(RewardEvent.SUBJECT).name
    info = await bus.js.stream_info(stream)
    sub = await bus.js.pull_subscribe(
        RewardEvent.SUBJECT,
        stream=stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=int(info.state.last_seq) + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            filter_subject=RewardEvent.SUBJECT,
        ),
    )
    name = (await sub.consumer_info()).name
    read = 0
    if ready is not None:
        ready.set()
    try:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(256, timeout=fetch_timeout)
            except (TimeoutError, nats.errors.TimeoutError):  # the client raises either
                continue
            events = []
            for m in msgs:
                try:
                    events.append(RewardEvent.model_validate_json(m.data))
                except ValueError:
                    continue  # not ours to judge: the reward stream's own consumers dead-letter
            read += len(events)
            inbox.add(events)
    except Exception as exc:
        inbox.error = exc
        inbox.changed.set()
        raise
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await bus.js.delete_consumer(stream, name)
    return read
