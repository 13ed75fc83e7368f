"""The loop's time budget caps acting; what is in flight when it runs out — a training job,
a validation, a canary — is waited for up to `grace_s`. The tool-use loop's first job ran
past its 1,200 s budget (hints decode inside the job) and the run ended with nothing trained:
a job in flight did not count as pending."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from agentrl.app.loop_agents import Agents, Watch
from agentrl.app.loop_config import LoopConfig
from agentrl.app.loop_decide import Decider
from agentrl.contracts.training import TrainingStatus


def _status(job: str, status: str) -> TrainingStatus:
    return TrainingStatus(training_job_id=job, timestamp=datetime.now(UTC), status=status)


def _decider(said: list[str], tmp_path: Path) -> Decider:
    cfg = LoopConfig.quick()
    return Decider(cfg, None, None, "p", tmp_path, said.append)


async def test_a_job_in_flight_at_the_budget_is_waited_for_then_the_run_ends(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    decider = _decider(said, tmp_path)
    agents = Agents(decider.cfg, None, "http://127.0.0.1:9/v1", "p", said.append)
    watch = Watch()
    past = time.monotonic() - 1.0  # the budget ran out a second ago
    await watch.on_status(_status("j1", "running"))
    assert not await decider._step([], None, agents, watch, None, past)  # waits for the job
    assert decider.pending and agents.paced
    assert any("waiting up to" in s and "job" in s for s in said), said
    await watch.on_status(_status("j1", "completed"))
    assert await decider._step([], None, agents, watch, None, past)  # nothing in flight: ends
    assert not decider.pending
    assert said[-1].startswith("time budget of")


async def test_before_the_budget_a_job_in_flight_only_paces_the_agents(tmp_path: Path) -> None:
    said: list[str] = []
    decider = _decider(said, tmp_path)
    agents = Agents(decider.cfg, None, "http://127.0.0.1:9/v1", "p", said.append)
    watch = Watch()
    await watch.on_status(_status("j1", "queued"))
    assert not await decider._step([], None, agents, watch, None, time.monotonic() + 60)
    assert agents.paced and not any("time budget" in s for s in said)


def test_the_tool_use_loop_waits_a_generation_after_its_budget() -> None:
    # job ~10 min, validation ~8, canary ~6 on 2 cores (2026-11-30): the grace covers them
    assert LoopConfig.tooluse().grace_s >= 1500
    assert LoopConfig.tooluse(quick=True).grace_s == 120  # the quick one ends by generations


async def test_the_drill_paces_the_agents_even_while_its_canary_runs(tmp_path: Path) -> None:
    """Once the generations are decided only the --bad-candidate drill is left: the gateway
    refuses its torn weights with or without traffic, so the agents act at a trickle (at full
    speed the quick loop's two agents played on through the drill, counted by no one)."""
    from agentrl.serving.config import RolloutPlan
    from agentrl.serving.registry import ModelRecord, Rollout

    said: list[str] = []
    cfg = LoopConfig.quick(bad_candidate=True)
    decider = Decider(cfg, None, None, "p", tmp_path, said.append)
    agents = Agents(cfg, None, "http://127.0.0.1:9/v1", "p", said.append)
    live = ModelRecord(model_id="p-v1", version=1, public_name="p", base_model="tiny",
                       checkpoint_path="/ckpt", state="live")  # fmt: skip
    decider.injected = "p-v2"  # the drill's version, in its canary (a rollout running)
    canary = Rollout(model_id="p-v2", plan=RolloutPlan.default(), deployment_id="d")
    later = time.monotonic() + 60
    assert not await decider._step([live], canary, agents, Watch(), None, later)
    assert agents.paced
    # before the generations are decided a running canary gets every agent
    fresh = Decider(cfg, None, None, "p", tmp_path, said.append)
    assert not await fresh._step([], canary, agents, Watch(), None, later)
    assert not agents.paced
    # without the drill's flag nothing changes: the run ends at its decided generations
    plain = Decider(LoopConfig.quick(), None, None, "p", tmp_path, said.append)
    assert await plain._step([live], None, agents, Watch(), None, later)
