"""The agent's side of a deployment (seed: "Agent Zero Model Reload") and the TensorZero
export.

`handle_model_deployment` reacts to `agent.rl.model.deployed.v1`: a canary needs nothing
(the gateway routes and names the serving version in each answer, which the agent copies
into its trajectory's `metadata.model`); an immediate or blue-green switch (or a rollback)
changes the model the agent asks for. `tensorzero_experimentation` writes the current split
as TensorZero's static-weights experiment for users who route through TensorZero.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentrl.contracts.deployment import ModelDeployed

log = logging.getLogger(__name__)


async def handle_model_deployment(
    msg: Any,
    update_agent_model: Callable[[str], Awaitable[None] | None],
    on_version: Callable[[str], None] | None = None,
) -> str | None:
    """Handle one deployed event (a NATS message, bytes, a dict or a ModelDeployed).

    Returns the model the agent should now use, or None when nothing changes (canary)."""
    data = getattr(msg, "data", msg)
    if isinstance(data, bytes | str):
        data = json.loads(data)
    event = data if isinstance(data, ModelDeployed) else ModelDeployed.model_validate(data)
    model_id = event.model_info.model_id
    strategy = event.deployment_config.rollout_strategy
    if on_version is not None:
        on_version(model_id)
    if strategy == "canary" and event.deployment_config.traffic_percentage < 100:
        log.info(
            "new model %s deployed with canary rollout (%g %%): the gateway routes",
            model_id,
            event.deployment_config.traffic_percentage,
        )
        return None
    log.info("switching the agent's model to %s (%s)", model_id, strategy)
    result = update_agent_model(model_id)
    if result is not None:
        await result
    return model_id


def tensorzero_experimentation(
    function_name: str, weights: Mapping[str, float], variant_prefix: str = ""
) -> str:
    """TOML for TensorZero: `[functions.<name>.experimentation]` with static weights
    (fractions of 1) over variants named after the versions."""
    live = {f"{variant_prefix}{k}": w for k, w in weights.items() if w > 0}
    total = sum(live.values()) or 1.0
    lines = [
        f"[functions.{function_name}.experimentation]",
        'type = "static_weights"',
        "",
        f"[functions.{function_name}.experimentation.candidate_variants]",
    ]
    lines += [f'"{name}" = {w / total:.6g}' for name, w in sorted(live.items())]
    return "\n".join(lines) + "\n"
