"""Re-export of the episode data models, which live in `agentrl.core.episodes` (pure data at the
bottom of the import graph, so `envs` and `advantages` need not import `rollout`)."""

from __future__ import annotations

from agentrl.core.episodes import Message, Role, StepData, TaskDefinition

__all__ = ["Message", "Role", "StepData", "TaskDefinition"]
