"""Environment ids -> factories, and the task a trainer samples for an (env id, seed).

`make_env("frozenlake-8x8", is_slippery=True)` builds an environment; `task_for("sokoban",
seed=3)` returns the `TaskDefinition` whose episode the rollout worker runs: the system
prompt with the rules and action format, tool specs, ground truth and step limit. The
worker adds the environment's first observation (from `reset(seed)`) as the user turn.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from agentrl.core.episodes import Message, TaskDefinition
from agentrl.envs.base import TextEnv
from agentrl.envs.frozenlake import FrozenLakeTextEnv
from agentrl.envs.sokoban import SokobanEnv
from agentrl.envs.tooluse.env import TOOL_HELP, TOOL_SPECS, ToolUseEnv

EnvFactory = Callable[..., TextEnv]

_REGISTRY: dict[str, EnvFactory] = {
    "sokoban": SokobanEnv,
    "frozenlake-4x4": partial(FrozenLakeTextEnv, size=4),
    "frozenlake-5x5": partial(FrozenLakeTextEnv, size=5),  # a second lineage's task
    "frozenlake-8x8": partial(FrozenLakeTextEnv, size=8),
    "frozenlake-4x4-slippery": partial(FrozenLakeTextEnv, size=4, is_slippery=True),
    "frozenlake-8x8-slippery": partial(FrozenLakeTextEnv, size=8, is_slippery=True),
    "tooluse": partial(ToolUseEnv, family="mixed"),
    "tooluse-arithmetic": partial(ToolUseEnv, family="arithmetic"),
    "tooluse-data": partial(ToolUseEnv, family="data"),
    "tooluse-numbers": partial(ToolUseEnv, family="numbers"),
}

# Step limits the trainer uses by default (GiGPO's groups are 8 episodes of up to 15 steps).
DEFAULT_MAX_EPISODE_STEPS = {
    "sokoban": 15,
    "frozenlake-4x4": 15,
    "frozenlake-5x5": 20,
    "frozenlake-8x8": 40,
    "frozenlake-4x4-slippery": 25,
    "frozenlake-8x8-slippery": 60,
    "tooluse": 6,
    "tooluse-arithmetic": 6,
    "tooluse-data": 6,
    "tooluse-numbers": 6,
}

_MOVE_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one cell in a direction.",
        "parameters": {
            "type": "object",
            "properties": {
                "direction": {"type": "string", "enum": ["up", "down", "left", "right"]}
            },
            "required": ["direction"],
        },
    },
}
_MOVE_FORMAT = (
    "Each turn, answer with one move: up, down, left or right. You may think first, then end "
    'with the move, or reply in JSON: {"thoughts": ["..."], "headline": "...", '
    '"tool_name": "move", "tool_args": {"direction": "up"}}.'
)
SYSTEM_PROMPTS = {
    "sokoban": (
        "You are playing Sokoban on a grid. You (P) can walk on floor (_) and push a box (X) "
        "by walking into it, if the cell behind it is free; you cannot pull boxes or walk "
        "through walls (#). Solve the puzzle by pushing every box onto a target (O). "
        + _MOVE_FORMAT
    ),
    "frozenlake": (
        "You are crossing a frozen lake on a grid. Walk from the start S to the goal G over "
        "frozen tiles F; stepping on a hole H ends the game. " + _MOVE_FORMAT
    ),
    "tooluse": (
        "You are an assistant that solves a task with tools. Work step by step: compute with "
        "the calculator or Python, read the result, and give the final answer (only the "
        "answer, e.g. a number or a name) with the response tool.\n" + TOOL_HELP
    ),
}


def env_ids() -> list[str]:
    return sorted(_REGISTRY)


def register_env(env_id: str, factory: EnvFactory) -> None:
    """Add an environment id (e.g. a plugin's own environment)."""
    _REGISTRY[env_id] = factory


def make_env(env_id: str, **kwargs: Any) -> TextEnv:
    """A fresh environment; keyword arguments override the id's defaults."""
    try:
        factory = _REGISTRY[env_id]
    except KeyError:
        raise ValueError(f"unknown env_id {env_id!r}: use one of {', '.join(env_ids())}") from None
    env = factory(**kwargs)
    env.env_id = env_id
    return env


def _family(env_id: str) -> str:
    for family in SYSTEM_PROMPTS:
        if env_id.startswith(family):
            return family
    raise ValueError(f"no task template for env_id {env_id!r}")


def task_for(
    env_id: str, seed: int, max_episode_steps: int | None = None, **env_kwargs: Any
) -> TaskDefinition:
    """The task of one episode group: same env id, same seed (GiGPO's group), same prompt."""

    family = _family(env_id)
    env = make_env(env_id, **env_kwargs)
    env.reset(seed)  # fixes the level / question, hence the ground truth
    tools = TOOL_SPECS if family == "tooluse" else [_MOVE_SPEC]
    steps = max_episode_steps or DEFAULT_MAX_EPISODE_STEPS.get(env_id, 15)
    return TaskDefinition(
        name=f"{env_id}/seed-{seed}",
        env_id=env_id,
        seed=int(seed),
        initial_messages=[Message(role="system", content=SYSTEM_PROMPTS[family])],
        tool_specs=[dict(spec) for spec in tools],
        ground_truth=getattr(env, "ground_truth", None),
        max_episode_steps=steps,
        termination_regex=None,
        env_kwargs=dict(env_kwargs),
    )


def sample_tasks(
    env_id: str, n: int, base_seed: int = 0, **env_kwargs: Any
) -> list[TaskDefinition]:
    """`n` tasks with consecutive seeds from `base_seed` (a trainer's batch of groups)."""
    return [task_for(env_id, base_seed + i, **env_kwargs) for i in range(n)]
