"""The one protocol every text environment follows.

An observation is a dict with at least:
  - "text":   what the agent is shown this turn (a rendered grid, a tool result, ...)
  - "anchor": the raw environment state without history, hashable (a string); GiGPO groups
              steps whose anchors are equal.
`step` never raises on a bad action: it returns an observation explaining the problem and
sets `info["invalid_action"] = True` so trainers can apply a penalty.

Every `info` also carries `"success"` (bool: the task was solved on this step) and, where
the environment has its own step limit, `"truncated"`. Rewards are sparse: the success
reward arrives on the final step; step and invalid-action penalties are opt-in. An
environment may expose `ground_truth` (the rollout worker passes it to reward functions).
Given the same seed and the same action texts, an episode is identical.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

Observation = dict[str, Any]


@runtime_checkable
class TextEnv(Protocol):
    """reset(seed) -> observation; step(action_text) -> (observation, reward, done, info).

    Optional: `valid_actions()` (the moves a valid-action policy scores) and
    `observation_stands_alone: bool` (each observation holds what the first one did, so a
    rollout worker's windowed prompt leaves the first one out and states repeat as prompts).
    """

    env_id: str

    def reset(self, seed: int | None = None) -> Observation: ...

    def step(self, action_text: str) -> tuple[Observation, float, bool, dict[str, Any]]: ...
