"""Issue 49.7: validating a base-model version loads the model off the event loop (the
gateway shares that loop: it stood still 1.2 s at load 16). A heartbeat task measures the
loop's longest gap while a real Validator loads a real (random, from config) base model and
runs its benchmark and safety episodes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agentrl.release.validation import Validator, _hf_policy, load_prompts
from agentrl.serving.config import DeploySettings
from agentrl.serving.registry import ModelRecord
from deploy_helpers import TINY


def _spec(layers: int) -> dict[str, object]:
    """A random model from config whose load takes a noticeable time (~40M parameters at 4
    layers, ~2.6M more a layer)."""
    return {
        "name": "tiny",
        "seed": 0,
        "tiny_kwargs": {"hidden_size": 512, "intermediate_size": 1024, "num_layers": layers},
    }


def _spec_that_loads_in_half_a_second() -> tuple[dict[str, object], float]:
    """The smallest spec of 4, 8, 16 or 32 layers whose one load takes over 0.5 s on this
    host, now (a fast host loaded 4 layers in 0.38 s: too short to tell a stalled loop from
    a beating one), and that load's seconds."""
    for layers in (4, 8, 16, 32):
        spec = _spec(layers)
        started = time.perf_counter()
        _hf_policy("tiny", spec)
        load_s = time.perf_counter() - started
        if load_s > 0.5:
            break
    return spec, load_s


async def test_the_loop_keeps_beating_while_validation_loads_the_base_model(
    tmp_path: Path,
) -> None:
    _hf_policy("tiny", {"name": "tiny", "tiny_kwargs": TINY})  # imports, once
    spec, load_s = _spec_that_loads_in_half_a_second()

    settings = DeploySettings(benchmark_episodes=1, validation_max_new_tokens=2)
    prompts = {k: v[:1] for k, v in load_prompts().items()}
    validator = Validator(
        settings,
        None,
        tmp_path,
        task_types={"research_synthesis": ["frozenlake-4x4"]},
        prompts=prompts,
    )
    record = ModelRecord(
        model_id="v-base",
        version=0,
        public_name="p",
        base_model="tiny",
        checkpoint_path=None,
        serving={"base_spec": spec},
    )
    gaps: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.05)
    try:
        result = await validator.evaluate(record)
    finally:
        done.set()
        await beat
    assert "benchmark" in result and "safety" in result
    worst = max(gaps)
    # the load alone took load_s; the loop never stood still for anything like it (a
    # thread still shares the GIL: the loading holds it for a few tenths at a time)
    assert load_s > 0.5, load_s
    assert worst < max(0.3, load_s / 3), (worst, load_s)
