"""A valid-action `AgentPolicy` over a local Hugging Face model (GLAM-style).

Instead of generating text, the policy scores each valid action as the assistant's answer
and samples from the renormalised distribution (`agentrl.llm.choices.score_choices`): no
invalid actions, and exact log-probs of the policy that chose. Identical prompts under the
same policy version are scored once (call `new_version()` after every update). Free-form
generation (`HFAgentPolicy`) stays the path for Agent Zero JSON tool calls.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.rollout.policy import PolicyOutput, as_chat_messages

ChoicesFor = Callable[[Any], Sequence[str] | None]


class ChoicePolicy:
    """`get_action` -> {"type": "text", "content": <one of the choices>}.

    `choices` is a fixed list or a callable mapping the observation to this turn's valid
    actions (e.g. `env.valid_actions`). `temperature` is part of the policy
    (pi = softmax(z / T) over the choices); 0 picks the most likely choice. log_probs holds
    {"choices", "choice_logprobs", "chosen", "logprob", "sum"}.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        choices: Sequence[str] | ChoicesFor,
        *,
        temperature: float = 1.0,
        seed: int | None = None,
        dtype: Any = None,
    ) -> None:
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        self.model = model
        self.tokenizer = tokenizer
        self.choices = choices
        self.temperature = temperature
        self.dtype = dtype
        self.rng = random.Random(seed)
        self.cache: dict[str, list[float]] = {}
        # Episodes run concurrently (one thread each): prompts waiting for a score are scored
        # together in one batched forward pass, one pass at a time, so threads never
        # oversubscribe the cores and a prompt two episodes reach together is scored once.
        self._pending: dict[str, tuple[list[dict[str, Any]], list[str]]] = {}
        self._pending_lock = threading.Lock()
        self._forward_lock = threading.Lock()
        self.calls = 0
        self.scored = 0

    def new_version(self) -> None:
        """The model changed: forget cached scores."""
        self.cache.clear()

    def _choices(self, observation: Any) -> list[str]:
        found = self.choices(observation) if callable(self.choices) else self.choices
        if not found:
            raise ValueError("no valid actions to choose from")
        return [str(c) for c in found]

    def score(self, messages: list[dict[str, Any]], choices: list[str]) -> list[float]:
        """Renormalised log-probs of `choices` (cached per prompt and choice set)."""
        from agentrl.llm.choices import score_choices

        key = json.dumps([messages, choices], sort_keys=True)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        with self._pending_lock:
            self._pending.setdefault(key, (messages, choices))
        with self._forward_lock:
            hit = self.cache.get(key)
            if hit is None:  # score every prompt waiting now, ours among them
                with self._pending_lock:
                    todo, self._pending = self._pending, {}
                todo.setdefault(key, (messages, choices))  # lost if an earlier batch failed
                keys = [k for k in todo if k not in self.cache]
                scores = score_choices(
                    self.model,
                    self.tokenizer,
                    [todo[k][0] for k in keys],
                    [todo[k][1] for k in keys],
                    dtype=self.dtype,
                )
                self.cache.update(zip(keys, scores, strict=True))
                self.scored += len(keys)
                hit = self.cache[key]
        return hit

    def pick(self, logps: Sequence[float]) -> int:
        if self.temperature == 0:
            return max(range(len(logps)), key=lambda i: logps[i])
        z = [lp / self.temperature for lp in logps]
        top = max(z)
        weights = [math.exp(v - top) for v in z]
        return self.rng.choices(range(len(logps)), weights=weights)[0]

    def tempered(self, logps: Sequence[float]) -> list[float]:
        if self.temperature in (0, 1):
            return list(logps)
        z = [lp / self.temperature for lp in logps]
        top = max(z)
        norm = top + math.log(sum(math.exp(v - top) for v in z))
        return [v - norm for v in z]

    async def get_action(
        self, observation: Any, available_tools_specs: list[dict[str, Any]] | None = None
    ) -> PolicyOutput:
        messages = as_chat_messages(observation)
        choices = self._choices(observation)
        logps = await asyncio.to_thread(self.score, messages, choices)
        self.calls += 1
        k = self.pick(logps)
        pol = self.tempered(logps)
        log_probs = {
            "choices": choices,
            "choice_logprobs": pol,
            "chosen": k,
            "logprob": pol[k],
            "sum": pol[k],
            "temperature": self.temperature,
        }
        return {"type": "text", "content": choices[k]}, choices[k], log_probs, None
