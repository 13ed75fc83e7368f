"""The loop's agents (workers acting through the gateway; every episode a trajectory) and
what the loop watches on the bus (rewards, training statuses)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentrl.app.loop_config import HELDOUT_OFFSET, MOVES, PACE_S, LoopConfig, loop_task

# what a trajectory played by more than one version is published as: credited to none
MIXED_MODEL = "unknown"


def credited(by_model: dict[str, int]) -> dict[str, int]:
    """Trajectories per version, without those played by two versions (credited to none)."""
    return {m: n for m, n in by_model.items() if m != MIXED_MODEL}


class Agents:
    """Agent workers acting through the gateway; every episode becomes a trajectory."""

    agent_id = "agentrl-loop"  # a lineage's agents name themselves (app.loop_lineages)

    def __init__(
        self, cfg: LoopConfig, bus: Any, gateway_url: str, public: str, say: Callable[[str], None]
    ) -> None:
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        from agentrl.app.tls import client_tls

        self.cfg, self.bus, self.public, self.say = cfg, bus, public, say
        # the agents publish their own trajectories: the gateway must not capture a copy
        self.client = AsyncOpenAI(
            base_url=gateway_url,
            api_key="agentrl-loop",
            max_retries=0,
            default_headers={"x-agentrl-capture": "off"},
            http_client=DefaultAsyncHttpxClient(verify=client_tls()),  # openai's defaults
        )
        self.published: dict[str, float] = {}  # trajectory_id -> publish time
        self.by_model: dict[str, int] = {}
        self.mixed = 0  # trajectories several versions played (credited to none)
        self.failed = 0
        self.next_seed = 0
        self.acting_s = 0.0
        self.paced = False  # a job trains or a version validates: act at a trickle (watcher)
        self.first_published: float | None = None  # unix time of the first trajectory
        self.heldout_errors: dict[str, int] = {}  # version: held-out episodes ended on an error
        # replies cut by the token cap (tool use), and all replies, while acting / held-out
        self.cut: dict[str, int] = {"acting": 0, "acting_replies": 0, "heldout": 0,
                                    "heldout_replies": 0}  # fmt: skip
        # tool use: each version's held-out outcome per task (`loop_tooluse_heldout.task_row`)
        self.heldout_rows: dict[str, list[dict[str, Any]]] = {}

    def task(self, seed: int, family: str = "mixed", pool: str = "train") -> Any:
        return loop_task(self.cfg, seed, family, pool)

    def policy(self, model: str, temperature: float, session: str | None = None) -> Any:
        """The gateway's policy; `session` (sent as `episode_id` on every turn) keeps all
        turns of a group on one version of the sticky split."""
        from agentrl.rollout.policies.openai_policy import OpenAIAgentPolicy

        kwargs: dict[str, Any] = {
            "max_tokens": 4,
            "guided_choice": MOVES,
            "extra_body": {"episode_id": session} if session else None,
        }
        if self.cfg.env == "tooluse":
            from agentrl.app import loop_tooluse

            kwargs = loop_tooluse.policy_kwargs(self.cfg, session)
        return OpenAIAgentPolicy(
            model,
            client=self.client,
            temperature=temperature,
            max_retries=3,
            backoff_base=0.2,
            **kwargs,
        )

    async def group(self, seed: int) -> None:
        """One GiGPO group: `group_size` episodes of the same map (same task_id)."""
        from agentrl.rollout.convert import episode_to_trajectory
        from agentrl.rollout.worker import RLRolloutWorker

        task = self.task(seed)
        group_id = str(uuid.uuid4())  # the trajectories' session_id and the gateway's key
        policy = self.policy(self.public, self.cfg.temperature, session=group_id)
        tools = self.cfg.env == "tooluse"
        workers = [
            RLRolloutWorker(
                task,
                policy,
                # a FrozenLake state says all (the last answer only); an agent sees its chat
                history_window=None if tools else 0,
                group_id=group_id,
                episode_index=i,
                env_in_thread=tools,  # a FrozenLake step takes microseconds; code_exe runs
            )
            for i in range(self.cfg.group_size)
        ]
        episodes = await asyncio.gather(*(w.run() for w in workers))
        for ep in episodes:
            self._count_cut(ep, "acting")
            if not ep.steps:
                self.failed += 1
                continue
            served = served_versions(ep)
            # credited to a version only when that one version played every turn
            model = served[0] if len(served) == 1 else MIXED_MODEL
            event = episode_to_trajectory(
                ep,
                agent_id=self.agent_id,
                model=model,
                temperature=self.cfg.temperature,
                domain="general",
            )
            if len(served) > 1:
                self.mixed += 1
                event.metadata.served_by = served  # type: ignore[attr-defined]
            link_completions(event, ep, MOVES if not tools else None)
            await self.bus.publish(event)
            if self.first_published is None:
                self.first_published = time.time()
            self.published[event.trajectory_id] = time.monotonic()
            self.by_model[model] = self.by_model.get(model, 0) + 1

    async def run(self, stop: asyncio.Event) -> None:
        async def worker(k: int) -> None:
            while not stop.is_set():
                if self.paced and k > 0:  # a trickle of acting while a job or validation runs
                    await asyncio.sleep(0.5)
                    continue
                seed = self.next_seed // max(1, self.cfg.task_repeats)
                self.next_seed += 1
                if seed >= HELDOUT_OFFSET:
                    raise RuntimeError("training seeds would reach the held-out range")
                t0 = time.monotonic()
                try:
                    await self.group(seed)
                except Exception as exc:  # the gateway may be swapping versions: keep acting
                    self.failed += 1
                    self.say(f"acting: a group failed ({type(exc).__name__}: {exc})")
                    await asyncio.sleep(0.5)
                self.acting_s += time.monotonic() - t0
                if self.paced:  # one group every few seconds keeps a canary fed
                    await asyncio.sleep(PACE_S)

        await asyncio.gather(*(worker(k) for k in range(self.cfg.agents)))

    def _count_cut(self, episode: Any, where: str) -> None:
        if self.cfg.env == "tooluse":
            from agentrl.app.loop_tooluse import cut_by_token_cap

            cut, replies = cut_by_token_cap(episode)
            self.cut[where] += cut
            self.cut[f"{where}_replies"] += replies

    def heldout_limit(self) -> asyncio.Semaphore:
        """The held-out episodes in flight, shared by every evaluation run at once: as many
        as a gateway batch holds for tool use (`loop_tooluse.HELDOUT_IN_FLIGHT`), 64 maps
        for FrozenLake (the gateway scores their moves in passes of up to
        `LocalEngine.score_batch_size`)."""
        from agentrl.app import loop_tooluse

        tools = self.cfg.env == "tooluse"
        return asyncio.Semaphore(loop_tooluse.HELDOUT_IN_FLIGHT if tools else 64)

    async def heldout(
        self,
        model_id: str,
        tasks: list[tuple[str, int]],
        pool: str = "train",
        limit: asyncio.Semaphore | None = None,
    ) -> tuple[int, int, dict[str, tuple[int, int]]]:
        """Greedy episodes of `model_id` (named explicitly) on held-out (family, seed) tasks:
        wins, episodes measured, and (wins, episodes) per family; episodes that ended on an
        error are left out (`heldout_errors`). `limit`: episodes in flight, shared
        by evaluations run at once (below the gateway's admission bound)."""
        from agentrl.rollout.worker import RLRolloutWorker

        policy = self.policy(model_id, 0.0)
        tools = self.cfg.env == "tooluse"
        sem = limit or self.heldout_limit()

        async def one(family: str, seed: int) -> Any:
            task = self.task(seed, family, pool)
            async with sem:
                return await RLRolloutWorker(
                    task, policy, history_window=None if tools else 0, env_in_thread=tools
                ).run()

        eps = await asyncio.gather(*(one(f, s) for f, s in tasks))
        for e in eps:
            self._count_cut(e, "heldout")
        if tools:  # the pool's rows replace the version's earlier ones of that pool
            from agentrl.app.loop_tooluse_heldout import task_row

            kept = [r for r in self.heldout_rows.get(model_id, []) if r["pool"] != pool]
            rows = [task_row(e, f, s, pool) for (f, s), e in zip(tasks, eps, strict=True)]
            self.heldout_rows[model_id] = kept + rows
        # an episode that ended on an error (a refused request, a gateway away) measured
        # nothing: it is counted apart, never as a failure of the version
        errors = sum(1 for e in eps if e.critical_error)
        self.heldout_errors[model_id] = self.heldout_errors.get(model_id, 0) + errors
        if errors:
            self.say(f"held-out {model_id}: {errors} episodes ended on an error (left out)")
        per: dict[str, tuple[int, int]] = {}
        for (family, _), e in zip(tasks, eps, strict=True):
            if e.critical_error:
                continue
            w, n = per.get(family, (0, 0))
            per[family] = (w + int(e.success), n + 1)
        measured = [e for e in eps if not e.critical_error]
        return sum(int(e.success) for e in measured), len(measured), per

    async def close(self) -> None:
        await self.client.close()


def link_completions(event: Any, episode: Any, choices: list[str] | None = MOVES) -> None:
    """The gateway's contract: each turn's `action.completion_id` (its completion-log record:
    exact tokens and the behaviour log-probs) and the `guided_choice` it was answered from
    (none for free-form replies)."""
    for turn, step in zip(event.turns, episode.steps, strict=False):
        lp = step.policy_logprobs or {}
        if lp.get("completion_id"):
            turn.action.completion_id = str(lp["completion_id"])
        if choices is not None:
            turn.action.guided_choice = list(choices)


def served_versions(episode: Any) -> list[str]:
    """The versions that answered the episode's turns, in order of first use."""
    out: list[str] = []
    for step in episode.steps:
        lp = step.policy_logprobs or {}
        model = lp.get("model")
        if model and str(model) not in out:
            out.append(str(model))
    return out


# ---- watching the stack ---------------------------------------------------------------------


class Watch:
    """Rewards (per trajectory and version) and training statuses, from the bus."""

    def __init__(self) -> None:
        self.rewards: dict[str, dict[int, Any]] = {}
        self.arrived: dict[str, float] = {}
        self.statuses: dict[str, list[Any]] = {}

    async def on_reward(self, ev: Any) -> None:
        self.rewards.setdefault(ev.trajectory_id, {})[ev.version] = ev
        self.arrived.setdefault(ev.trajectory_id, time.monotonic())

    async def on_status(self, ev: Any) -> None:
        self.statuses.setdefault(ev.training_job_id, []).append(ev)

    def reward_of(self, tid: str) -> float | None:
        got = self.rewards.get(tid)
        if not got:
            return None
        ev = got[max(got)]
        return float(ev.total_reward)
