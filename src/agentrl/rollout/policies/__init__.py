"""AgentPolicy implementations: scripted/random (tests), OpenAI-compatible endpoints,
local Hugging Face models with batched generation. Heavy ones import lazily."""

from __future__ import annotations

from agentrl.rollout.policies.scripted import RandomPolicy, ScriptedPolicy

__all__ = ["ChoicePolicy", "HFAgentPolicy", "OpenAIAgentPolicy", "RandomPolicy", "ScriptedPolicy"]


def __getattr__(name: str) -> object:
    if name == "OpenAIAgentPolicy":
        from agentrl.rollout.policies.openai_policy import OpenAIAgentPolicy

        return OpenAIAgentPolicy
    if name == "HFAgentPolicy":
        from agentrl.rollout.policies.hf_policy import HFAgentPolicy

        return HFAgentPolicy
    if name == "ChoicePolicy":
        from agentrl.rollout.policies.choice_policy import ChoicePolicy

        return ChoicePolicy
    raise AttributeError(name)
