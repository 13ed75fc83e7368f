"""Ape-X (Horgan et al. 2018) on Ray: many epsilon-greedy actors, sharded prioritized replay,
one learner that broadcasts its parameters through the object store.

  actors (Ray actors)   actor i explores with eps_i = base^(1 + exponent * i / (N - 1)),
                        builds n-step transitions, computes their initial priorities from
                        its own TD errors (its local copy of the network), and sends them
                        to a replay shard (actor i -> shard i mod S).
  shards (Ray actors)   `PrioritizedReplay` each; prioritisation is per shard.
  learner (driver)      samples from the shards in turn (prefetching the next batches),
                        trains, sends |TD| priorities back to the shard the batch came
                        from, and every `param_sync_interval` updates puts its parameters
                        into the object store once and hands the reference to all actors
                        (ParameterSyncEvent with sha256 checksum and model version).

On one machine `ray.init()` starts a local instance; on a cluster started with
`ray start --head` (and `ray start --address=HEAD:6379` on the workers), pass
`distributed.ray_address: auto` (or `--ray-address`) and the same code spreads the
actors and shards over the nodes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections import deque
from typing import Any

import numpy as np
import torch

from agentrl.core.errors import ConfigError
from agentrl.offpolicy.config import AGMConfigEntity
from agentrl.offpolicy.dqn import DQNLearner, parameters_checksum
from agentrl.offpolicy.early_stop import aggregate_metrics
from agentrl.offpolicy.entities import PopulationMetricsEntity
from agentrl.offpolicy.events import EventDispatcher, ParameterSyncEvent, ReplayUpdateEvent
from agentrl.offpolicy.monitor import ProgressFn, RunMonitor, TrainResult
from agentrl.offpolicy.registry import EntityRegistry
from agentrl.offpolicy.replay import Batch, anneal_beta
from agentrl.offpolicy.shard import ReplayShard
from agentrl.offpolicy.trainer import q_probe

log = logging.getLogger(__name__)


def actor_epsilons(n: int, base: float = 0.4, exponent: float = 7.0) -> list[float]:
    """eps_i = base^(1 + exponent * i / (n - 1)) for i = 0..n-1 (one actor: base)."""
    if n < 1:
        raise ValueError(f"need at least one actor, got {n}")
    if n == 1:
        return [base]
    return [base ** (1.0 + exponent * i / (n - 1)) for i in range(n)]


class ApexActor:
    """One exploring actor with its own envs and a local copy of the network (a Ray actor)."""

    def __init__(
        self, actor_id: int, cfg_json: dict[str, Any], epsilon: float, shard: Any, seed: int
    ) -> None:
        torch.set_num_threads(1)
        from agentrl.offpolicy.collect import NStepAccumulator, VecEnv
        from agentrl.offpolicy.dqn import QNetwork

        self.cfg = cfg = AGMConfigEntity.model_validate(cfg_json)
        self.actor_id, self.epsilon, self.shard = actor_id, epsilon, shard
        d = cfg.distributed
        self.env = VecEnv(cfg.env_id, d.actor_num_envs, seed)
        self.n_actions = self.env.spec.n_actions
        self.net = QNetwork(
            self.env.spec.obs_dim, self.n_actions, cfg.kernel_smoothing.latent_dim, cfg.network
        )
        self.net.requires_grad_(False)
        self.nstep = NStepAccumulator(
            cfg.dqn.n_step, cfg.dqn.gamma, d.actor_num_envs, self.env.spec.obs_dim
        )
        self.rng = np.random.default_rng(seed)
        self.obs = self.env.reset()
        self.autoreset = np.zeros(d.actor_num_envs, dtype=bool)
        self.ep_ret = np.zeros(d.actor_num_envs)
        self.model_version = -1
        self.syncs = 0
        self.action_counts = np.zeros(self.n_actions, dtype=np.int64)

    def set_params(self, state: dict[str, torch.Tensor], version: int, checksum: str) -> int:
        """Load broadcast parameters; refuses a payload whose checksum does not match."""
        got = parameters_checksum(state)
        if got != checksum:
            raise ValueError(
                f"actor {self.actor_id}: parameter checksum mismatch for version {version}"
            )
        self.net.load_state_dict(state)
        self.model_version = version
        self.syncs += 1
        return version

    @torch.no_grad()
    def collect(self, steps: int) -> dict[str, Any]:
        """Run `steps` vector steps, send transitions with initial priorities to the shard."""
        from agentrl.offpolicy.collect import Transitions
        from agentrl.offpolicy.dqn import double_dqn_targets

        parts: list[Transitions] = []
        returns: list[float] = []
        env_steps = 0
        n = self.env.num_envs
        for _ in range(steps):
            q = self.net(torch.as_tensor(self.obs))
            actions = q.argmax(dim=1).numpy()
            explore = self.rng.random(n) < self.epsilon
            if explore.any():
                actions = np.where(explore, self.rng.integers(0, self.n_actions, n), actions)
            next_obs, rew, term, trunc = self.env.step(actions)
            valid = ~self.autoreset
            tr = self.nstep.push(self.obs, actions, rew, next_obs, term, trunc, valid)
            if tr is not None:
                parts.append(tr)
            self.ep_ret += rew * valid
            ended = valid & (term | trunc)
            if ended.any():
                returns.extend(self.ep_ret[ended].tolist())
                self.ep_ret[ended] = 0.0
            self.autoreset = term | trunc
            self.obs = next_obs
            env_steps += int(valid.sum())
            np.add.at(self.action_counts, actions[valid], 1)
        summary: dict[str, Any] = {
            "actor_id": self.actor_id,
            "env_steps": env_steps,
            "returns": returns,
            "model_version": self.model_version,
            "epsilon": self.epsilon,
            "action_counts": self.action_counts.tolist(),
            "added": None,
        }
        if not parts:
            return summary
        batch = Transitions.concat(parts) if len(parts) > 1 else parts[0]
        # initial priorities from this actor's own TD errors (its copy serves as both nets)
        q_s = self.net(torch.as_tensor(batch.obs))
        q_next = self.net(torch.as_tensor(batch.next_obs))
        y = double_dqn_targets(
            torch.as_tensor(batch.rewards),
            torch.as_tensor(batch.dones),
            torch.as_tensor(batch.discounts),
            q_next,
            q_next,
            self.cfg.dqn.double,
        )
        td = (y - q_s.gather(1, torch.as_tensor(batch.actions).unsqueeze(1)).squeeze(1)).numpy()
        data = {
            f: getattr(batch, f)
            for f in ("obs", "actions", "rewards", "next_obs", "dones", "discounts")
        }
        import ray

        summary["added"] = ray.get(self.shard.add.remote(data, td))
        return summary


LOCAL_RAY_TRIES = 2

# What a local start on a busy machine needs (each set only where the environment does not):
# Ray's own knob for how long the driver waits for its raylet to register with the GCS (Ray
# gives it ~30 s in all; a busy 2-core machine missed that), and no idle workers started with
# the raylet, whose imports competed with the dashboard agent's in the 15 s the raylet gives
# that agent (the actors start the workers they need once the driver is connected).
LOCAL_RAY_ENV = {"RAY_raylet_start_wait_time_s": "60", "RAY_enable_worker_prestart": "0"}


def ensure_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Connect to `address` or start a local Ray; returns True if this call started it.

    A local start waits for its raylet as long as `LOCAL_RAY_ENV` says. What no setting
    of Ray 2.60 lengthens: the raylet gives its dashboard agent a fixed 15 s to write its
    ports, and ends when the agent misses them ("Timed out waiting for file
    .../metrics_agent_port_..." in the session's raylet.out: each of 10 failed starts at load
    10-13 on 2026-11-30, while each of Ray's processes spent ~3 CPU-s importing jsonschema's
    rfc3987-syntax, no longer in the dev environment); ray.init then says "The current node
    timed out during startup", and the start is tried once more as a last resort."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return True
    for name, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(name, value)
    for attempt in range(1, LOCAL_RAY_TRIES + 1):
        began = time.time()
        try:
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 2,
                include_dashboard=False,
                log_to_driver=False,
            )
            return True
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == LOCAL_RAY_TRIES:
                raise
            log.warning("local Ray did not start in time (try %d): starting again", attempt)
            ray.shutdown()
            _end_ray_processes_since(began)
    return True


def _end_ray_processes_since(began: float) -> None:
    """The processes a failed local start left behind (its GCS server, raylet and reaper:
    `ray.shutdown` does not know a node that never finished starting)."""
    import psutil

    mine = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile is not ours to end
            if p.create_time() >= began - 1 and "ray" in " ".join(p.cmdline()).lower():
                mine.append(p)
    for p in mine:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(mine, timeout=10)


class ApexTrainer:
    """The learner side of Ape-X: owns the shards and actors, trains, syncs parameters."""

    def __init__(
        self,
        cfg: AGMConfigEntity,
        num_actors: int | None = None,
        dispatcher: EventDispatcher | None = None,
        registry: EntityRegistry | None = None,
        run_id: str | None = None,
        ray_address: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.num_actors = num_actors or cfg.distributed.actors_per_gpu
        self.dispatcher = dispatcher or EventDispatcher()
        self.registry = registry or EntityRegistry(max_versions=10_000)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.ray_address = ray_address or cfg.distributed.ray_address
        self.learner_id = f"learner-{self.run_id}"

    def train(self, progress: ProgressFn | None = None) -> TrainResult:
        import ray

        d = self.cfg.distributed
        needed = self.num_actors * d.actor_num_cpus + d.replay_shards * d.shard_num_cpus
        # a local instance gets enough logical CPUs for every actor (they share the cores)
        started = ensure_ray(self.ray_address, max(os.cpu_count() or 2, math.ceil(needed)))
        available = float(ray.cluster_resources().get("CPU", 0.0))
        if needed > available + 1e-9:
            if started:
                ray.shutdown()
            raise ConfigError(
                f"Ape-X needs {needed:g} Ray CPUs ({self.num_actors} actors x "
                f"distributed.actor_num_cpus {d.actor_num_cpus:g} + {d.replay_shards} shards x "
                f"distributed.shard_num_cpus {d.shard_num_cpus:g}) but the cluster has "
                f"{available:g}; lower those, use fewer actors/shards, or add nodes"
            )
        old_threads = torch.get_num_threads()
        if self.cfg.torch_threads is not None:
            torch.set_num_threads(self.cfg.torch_threads)
        handles: list[Any] = []
        try:
            return self._train(progress, handles)
        finally:
            torch.set_num_threads(old_threads)
            for h in handles:
                ray.kill(h)
            if started:
                ray.shutdown()

    def _train(self, progress: ProgressFn | None, handles: list[Any]) -> TrainResult:
        """Actors collect into the replay shards while the learner samples, updates and
        sends priorities back, until `total_steps` env steps or the monitor stops it."""
        run = _ApexRun(self, progress, handles)
        cfg = self.cfg
        while run.env_steps < cfg.total_steps and not run.mon.stop:
            learning = run.learning()
            run.harvest(learning)
            run.take_probe()
            if learning:
                run.learn()
            run.after_env_steps()
        return run.result()

    def _broadcast(
        self,
        learner: DQNLearner,
        actors: list[Any],
        version: int,
        step: int,
        syncs: list[dict[str, Any]],
    ) -> list[Any]:
        """Put the parameters in the object store once; every actor loads that one copy."""
        import ray

        state = learner.state_dict()
        checksum = parameters_checksum(state)
        ref = ray.put(state)
        refs = [a.set_params.remote(ref, version, checksum) for a in actors]
        event = ParameterSyncEvent(
            learner_id=self.learner_id, step=step, checksum=checksum, model_version=version
        )
        syncs.append({"step": step, "model_version": version, "checksum": checksum})
        self.dispatcher.emit(event)
        return refs

    def _population(
        self, step: int, reports: dict[int, dict[str, Any]], recent: dict[int, deque[float]]
    ) -> dict[str, Any]:
        """Diversity of the actor population, recorded as a PopulationMetricsEntity."""
        means = [float(np.mean(r)) if r else 0.0 for r in recent.values()]
        counts = np.sum([rep["action_counts"] for rep in reports.values()], axis=0).astype(
            np.float64
        )
        p = counts / counts.sum() if counts.sum() > 0 else np.full_like(counts, 1.0 / len(counts))
        entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
        hist, edges = np.histogram(means, bins=min(5, len(means)))
        pop = PopulationMetricsEntity(
            step=step,
            n_members=len(means),
            return_mean=float(np.mean(means)),
            return_std=float(np.std(means)),
            return_min=float(np.min(means)),
            return_max=float(np.max(means)),
            strategy_entropy=entropy,
            histogram_counts=tuple(int(c) for c in hist),
            histogram_edges=tuple(float(e) for e in edges),
        )
        self.registry.record(pop, key=self.run_id)
        robust = aggregate_metrics(
            [
                {"return": m, "epsilon": rep["epsilon"]}
                for m, rep in zip(means, reports.values(), strict=False)
            ]
        )
        return {
            "return_median": robust.get("return", 0.0),
            "entropy": entropy,
            "diversity": pop.return_std,
        }


class _ApexRun:
    """One `ApexTrainer` run in Ray: its replay shards, actors and learner, and the loop's
    state (chunks out, prefetched samples, counts, the parameter broadcasts)."""

    def __init__(
        self, trainer: ApexTrainer, progress: ProgressFn | None, handles: list[Any]
    ) -> None:
        import ray

        from agentrl.offpolicy.collect import VecEnv

        self.trainer = trainer
        cfg, d = trainer.cfg, trainer.cfg.distributed
        self.cfg, self.d, self.rp, self.dq = cfg, d, cfg.replay, cfg.dqn
        torch.manual_seed(cfg.seed)
        probe_env = VecEnv(cfg.env_id, 1, cfg.seed)
        obs_dim, n_actions = probe_env.spec.obs_dim, probe_env.spec.n_actions
        probe_env.close()
        cfg_json = cfg.model_dump(mode="json")

        shard_cls = ray.remote(num_cpus=d.shard_num_cpus)(ReplayShard)
        actor_cls = ray.remote(num_cpus=d.actor_num_cpus)(ApexActor)
        self.shards: list[Any] = [
            shard_cls.remote(i, cfg_json, obs_dim) for i in range(d.replay_shards)
        ]  # type: ignore[attr-defined]
        handles.extend(self.shards)
        n = trainer.num_actors
        self.epsilons = actor_epsilons(n, d.epsilon_base, d.epsilon_exponent)
        self.actors: list[Any] = [
            actor_cls.remote(
                i,
                cfg_json,
                self.epsilons[i],
                self.shards[i % len(self.shards)],
                cfg.seed * 1000 + 17 * i + 1,
            )  # type: ignore[attr-defined]
            for i in range(n)
        ]
        handles.extend(self.actors)

        learner = self.learner = DQNLearner(cfg, obs_dim, n_actions)
        self.probe: torch.Tensor | None = None
        self.mon = RunMonitor(
            cfg,
            trainer.run_id,
            learner.act,
            learner.state_dict,
            lambda: q_probe(learner, self.probe),
            trainer.dispatcher,
            trainer.registry,
            progress,
        )
        self.model_version = 0
        self.syncs: list[dict[str, Any]] = []
        self.sync_refs = trainer._broadcast(learner, self.actors, self.model_version, 0, self.syncs)
        self.collect = {a.collect.remote(d.actor_chunk_steps): i for i, a in enumerate(self.actors)}
        self.actor_reports: dict[int, dict[str, Any]] = {}
        self.recent_returns: dict[int, deque[float]] = {i: deque(maxlen=20) for i in range(n)}
        self.pending: deque[tuple[int, Any]] = deque()
        self.next_shard = 0
        self.env_steps = 0
        self.stored = 0
        self.beta_steps = self.rp.beta_anneal_steps or cfg.total_steps

    def learning(self) -> bool:
        """Past `learning_starts`, with a batch's worth stored per shard."""
        return (
            self.env_steps >= self.dq.learning_starts
            and self.stored >= self.rp.batch_size * self.d.replay_shards
        )

    def harvest(self, learning: bool) -> None:
        """Actors: the finished chunks counted and reported, new chunks handed out. While
        learning, whatever is done is taken without waiting; before, up to a second."""
        import ray

        collect = self.collect
        if learning:  # take whatever chunks are done, without waiting
            ready, _ = ray.wait(list(collect), num_returns=len(collect), timeout=0)
        else:
            ready, _ = ray.wait(list(collect), num_returns=1, timeout=1.0)
        dispatcher = self.trainer.dispatcher
        for ref in ready:
            i = collect.pop(ref)
            rep = ray.get(ref)
            self.env_steps += rep["env_steps"]
            self.actor_reports[i] = rep
            self.recent_returns[i].extend(rep["returns"])
            self.mon.add_episode_returns(rep["returns"])
            if rep["added"] is not None:
                self.stored += rep["added"]["count"]
                if dispatcher.wants(ReplayUpdateEvent):
                    dispatcher.emit(
                        ReplayUpdateEvent(
                            shard_id=rep["added"]["shard_id"],
                            count=rep["added"]["count"],
                            priority_stats=rep["added"]["stats"],
                        )
                    )
            if self.env_steps < self.cfg.total_steps:
                collect[self.actors[i].collect.remote(self.d.actor_chunk_steps)] = i

    def take_probe(self) -> None:
        """Once 256 transitions are stored: the fixed observations of the Q probe."""
        import ray

        if self.probe is None and self.stored >= 256:
            first: list[Batch] = ray.get(
                self.shards[0].sample.remote(min(256, self.rp.batch_size), 1.0)
            )
            if first:
                self.probe = torch.as_tensor(first[0].obs.copy())

    def learn(self) -> None:
        """Learner: sample (prefetched, round robin over the shards) -> update ->
        priorities back; the parameters broadcast every `param_sync_interval` updates."""
        import ray

        d, rp, learner, mon = self.d, self.rp, self.learner, self.mon
        beta = anneal_beta(rp.beta0, self.env_steps, self.beta_steps)
        while len(self.pending) < d.max_pending_samples:
            ref = self.shards[self.next_shard].sample.remote(
                rp.batch_size, beta, d.batches_per_request
            )
            self.pending.append((self.next_shard, ref))
            self.next_shard = (self.next_shard + 1) % len(self.shards)
        shard_id, ref = self.pending.popleft()
        updates: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in ray.get(ref):
            stats, td = learner.update(batch)
            updates.append((batch.indices, td))
            extra = {"beta": beta, "model_version": self.model_version}
            mon.on_update(stats, learner.updates, self.env_steps, extra)
            if learner.updates % d.param_sync_interval == 0:
                self.model_version += 1
                ray.get(self.sync_refs)  # previous broadcast delivered before the next
                self.sync_refs = self.trainer._broadcast(
                    learner, self.actors, self.model_version, learner.updates, self.syncs
                )
            if mon.stop:
                break
        if updates:
            self.shards[shard_id].update_priorities.remote(updates)

    def after_env_steps(self) -> None:
        """The monitor's evaluation, with the actor population's figures on its new row."""
        mon = self.mon
        mon.after_env_steps(self.env_steps, self.learner.updates)
        if self.actor_reports and mon.eval_rows and mon.eval_rows[-1].get("population") is None:
            mon.eval_rows[-1]["population"] = self.trainer._population(
                self.env_steps, self.actor_reports, self.recent_returns
            )

    def result(self) -> TrainResult:
        """The last broadcast delivered and the chunks still out collected (one lost at
        shutdown is logged, not raised), then the run's result."""
        import ray

        ray.get(self.sync_refs)
        for ref in list(self.collect):
            try:
                rep = ray.get(ref)
                self.env_steps += rep["env_steps"]
                self.actor_reports[self.collect[ref]] = rep
            except Exception:
                log.warning("an actor's last chunk was lost at shutdown", exc_info=True)
        versions = [rep["model_version"] for rep in self.actor_reports.values()]
        shard_sizes = ray.get([s.size.remote() for s in self.shards])
        return self.mon.result(
            self.env_steps,
            self.learner.updates,
            self.learner.state_dict(),
            parameter_syncs=self.syncs,
            actor_model_versions=versions,
            shard_sizes=shard_sizes,
            actor_epsilons=self.epsilons,
        )
