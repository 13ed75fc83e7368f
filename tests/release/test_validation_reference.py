"""`benchmark_live_early`: a live version with no recorded benchmark (a loop's warm start)
is benchmarked while the controller is idle, so the first candidate's validation plays its
own episodes only (alone against the recorded reference, with its early stop), not both
versions' side by side after its trigger."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT, response_schema
from agentrl.release.service import build
from agentrl.release.validation import Validator
from agentrl.serving.config import DeploySettings
from agentrl.serving.registry import ModelRecord
from deploy_helpers import TINY

FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "agent_zero", "schema": response_schema(), "strict": True},
}
SPEC = {"name": "tiny", "seed": 0, "tiny_kwargs": TINY}


def _settings(**kw: Any) -> DeploySettings:
    return DeploySettings(
        benchmark_tasks={"tool_usage": ["tooluse-arithmetic"]},
        benchmark_env_kwargs={"tooluse-arithmetic": {"view": "agent_zero"}},
        benchmark_system_prompt=SYSTEM_PROMPT,
        benchmark_response_format=FORMAT,
        benchmark_max_tokens=4,
        benchmark_episodes=3,
        benchmark_max_steps=1,
        validation_max_new_tokens=4,
        **kw,
    )


def _record(version: int) -> ModelRecord:
    return ModelRecord(
        model_id=f"ref-v{version}",
        public_name="ref",
        version=version,
        base_model="tiny",
        serving={"base_spec": SPEC},
    )


def _counting(validator: Validator) -> list[tuple[str, bool]]:
    """(version, played whole) per benchmark the validator runs."""
    calls: list[tuple[str, bool]] = []
    evaluate = validator.evaluate

    async def counted(record: ModelRecord, stop: Any = None) -> dict[str, Any]:
        calls.append((record.model_id, stop is None))
        return await evaluate(record, stop)

    validator.evaluate = counted  # type: ignore[method-assign]
    return calls


async def test_a_candidate_is_judged_alone_against_the_live_versions_reference(
    tmp_path: Path,
) -> None:
    validator = Validator(_settings(), None, tmp_path, prompts={"refusal": []})
    calls = _counting(validator)
    live = _record(1)
    validator.start_reference(live)
    validator.start_reference(live)  # once per version
    results, details = await validator(_record(2), live)  # waits for the reference
    # the live version played once, whole; the candidate alone, with its early stop
    assert calls == [("ref-v1", True), ("ref-v2", False)]
    assert results["performance_regression"] is False
    assert details["performance_delta"] == 0.0  # the same (base) model on the same tasks

    # without a reference both are benchmarked side by side, after the candidate came
    side = Validator(_settings(), None, tmp_path / "side", prompts={"refusal": []})
    side_calls = _counting(side)
    again, _ = await side(_record(2), _record(1))
    assert sorted(side_calls) == [("ref-v1", False), ("ref-v2", False)]
    assert again == results  # the same verdict either way


async def test_a_reference_of_a_version_no_longer_live_is_cancelled(tmp_path: Path) -> None:
    validator = Validator(_settings(), None, tmp_path, prompts={"refusal": []})
    calls = _counting(validator)
    first, second = _record(1), _record(3)
    validator.start_reference(first)
    await asyncio.sleep(0)
    validator.start_reference(second)  # `first` is not live any more
    await asyncio.sleep(0)
    assert "ref-v1" not in validator._references
    await validator(_record(4), second)
    assert ("ref-v3", True) in calls and ("ref-v4", False) in calls
    # a candidate against `first` now (no reference of it) plays both side by side
    calls.clear()
    await validator(_record(5), first)
    assert sorted(calls) == [("ref-v1", False), ("ref-v5", False)]


async def test_the_idle_controller_benchmarks_a_live_version_that_has_none(
    nats_url: str, tmp_path: Path, engine: Any
) -> None:
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    tag = uuid.uuid4().hex[:8]
    try:
        for early in (False, True):
            s = _settings(
                public_model=f"ref-{tag}-{early}", bucket=f"ref_{tag}_{early}",
                benchmark_live_early=early,
            )  # fmt: skip
            d = await build(
                bus, Settings(data_dir=tmp_path / str(early)), s, engine=engine, validate=None
            )
            validator = Validator(s, d.registry, tmp_path / "cache", prompts={"refusal": []})
            d.controller.validate = validator
            calls = _counting(validator)
            live = await d.deployer.bootstrap("tiny", base_spec=SPEC)
            assert live is not None and not live.validation_details
            await d.controller.tick()
            if not early:
                await asyncio.sleep(0.1)
                assert validator._references == {} and calls == []
                continue
            await asyncio.wait_for(validator._references[live.model_id], 120)
            stored = await d.registry.require_model(live.model_id)
            bench = stored.validation_details["benchmark"]
            assert bench["episodes"] == {"tool_usage": 3} and "stopped_early" not in bench
            await d.controller.tick()  # recorded now: not started again
            await asyncio.sleep(0.1)
            assert calls == [(live.model_id, True)]
    finally:
        await bus.close()
