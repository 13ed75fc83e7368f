"""Validation of tool-use versions under structured outputs: the benchmark episodes are
played through the local engine with the agents' response format (Agent Zero's JSON, one
branch per tool), so every reply is a valid call of a listed tool — on the tiny random
model, whose free text never is."""

from __future__ import annotations

from pathlib import Path

from agentrl.core.episodes import Message
from agentrl.envs.registry import task_for
from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT, response_schema
from agentrl.release.engine_policy import EnginePolicy
from agentrl.release.validation import Validator
from agentrl.rollout.worker import RLRolloutWorker
from agentrl.serving.config import DeploySettings
from agentrl.serving.local import LocalEngine
from agentrl.serving.registry import ModelRecord
from deploy_helpers import TINY

FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "agent_zero", "schema": response_schema(), "strict": True},
}


async def test_engine_policy_plays_only_valid_tool_calls() -> None:
    engine = LocalEngine("tiny", tiny_kwargs=TINY)
    policy = EnginePolicy(engine, None, response_format=FORMAT, max_tokens=96, temperature=1.0)
    for seed in range(3):
        task = task_for("tooluse", seed, max_episode_steps=3, view="agent_zero")
        task.initial_messages = [Message(role="system", content=SYSTEM_PROMPT)]
        episode = await RLRolloutWorker(task, policy).run()
        assert episode.steps
        for step in episode.steps:
            if (step.policy_logprobs or {}).get("finish_reason") == "length":
                continue  # cut by max_tokens: no grammar can finish a reply it is not given
            assert not step.step_info.get("invalid_action"), step.step_info
            assert step.step_info.get("tool_name") in ("calculator", "code_exe", "response")


async def test_validator_benchmarks_through_the_engine(tmp_path: Path) -> None:
    settings = DeploySettings(
        benchmark_tasks={"tool_usage": ["tooluse-arithmetic"]},
        benchmark_env_kwargs={"tooluse-arithmetic": {"view": "agent_zero"}},
        benchmark_system_prompt=SYSTEM_PROMPT,
        benchmark_response_format=FORMAT,
        benchmark_max_tokens=64,
        benchmark_episodes=2,
        benchmark_max_steps=2,
        validation_max_new_tokens=8,
    )
    validator = Validator(settings, None, tmp_path, prompts={"refusal": []})
    record = ModelRecord(
        model_id="agentrl-policy-base",
        public_name="agentrl-policy",
        version=0,
        base_model="tiny",
        serving={"base_spec": {"name": "tiny", "seed": 0, "tiny_kwargs": TINY}},
    )
    found = await validator.evaluate(record)
    assert found["benchmark"]["scores"] == {"tool_usage": 0.0}  # random weights: no answer
    assert found["benchmark"]["episodes_per_env"] == 2


async def test_base_still_answers_after_its_only_adapter_is_unloaded(tmp_path: Path) -> None:
    """Validation loads a version's adapter and drops it after; with no other adapter
    loaded, peft kept the deleted one active and every later request failed (KeyError)."""
    from agentrl.serving.openai_types import ChatRequest
    from deploy_helpers import write_checkpoint

    engine = LocalEngine("tiny", tiny_kwargs=TINY)
    folder = Path(write_checkpoint(tmp_path / "v1", seed=1))
    request = ChatRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0
    )
    before = await engine.generate(None, request)
    engine.load_adapter("v1", folder)
    await engine.generate("v1", request)
    engine.unload_adapter("v1")
    after = await engine.generate(None, request)
    assert after.completion_token_ids == before.completion_token_ids  # the base, unchanged
    engine.load_adapter("v1", folder)  # and it can come back
    await engine.generate("v1", request)


async def test_a_busy_engine_still_loads_a_new_version(tmp_path: Path) -> None:
    """Agents keep the engine decoding batch after batch; a new version's adapter must get
    in between two batches (the engine's lock alone starved it: the gateway kept serving
    the old version while the registry said the new one was live)."""
    import asyncio
    import time

    from agentrl.serving.openai_types import ChatRequest
    from deploy_helpers import write_checkpoint

    engine = LocalEngine("tiny", tiny_kwargs=TINY, max_batch_size=4)
    folder = Path(write_checkpoint(tmp_path / "v1", seed=1))
    request = ChatRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=200, temperature=1.0
    )
    stop = asyncio.Event()

    async def agent() -> None:
        while not stop.is_set():
            await engine.generate(None, request)

    agents = [asyncio.create_task(agent()) for _ in range(8)]
    await asyncio.sleep(0.5)  # the engine is busy now
    t0 = time.monotonic()
    await asyncio.wait_for(asyncio.to_thread(engine.load_adapter, "v1", folder), 30)
    waited = time.monotonic() - t0
    stop.set()
    # their requests in flight end here, not after 200 more tokens each: a request gone
    # stops its row mid-decode; an agent's request that failed still fails the test
    for a in agents:
        a.cancel()
    ended = await asyncio.gather(*agents, return_exceptions=True)
    assert all(e is None or isinstance(e, asyncio.CancelledError) for e in ended), ended
    assert "v1" in engine.adapters and waited < 30
