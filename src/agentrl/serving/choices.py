"""`guided_choice` answered by scoring: each allowed answer's log-probability under the
model (sum over its tokens, given the prompt), renormalised over the allowed answers.

This is the valid-action policy of the learning issue: the model can only say one of the
choices, and the probability it gives each is its own, restricted to the set. Pure
functions; the backend computes the scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def renormalise(scores: Sequence[float]) -> list[float]:
    """log p(choice | prompt) -> probabilities over the choices (a softmax, stable)."""
    if not scores:
        raise ValueError("no choices to renormalise")
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def pick(
    scores: Sequence[float], temperature: float, rng: random.Random | None = None
) -> tuple[int, list[float]]:
    """The chosen index and the renormalised distribution it was drawn from (at
    `temperature`; 0 picks the most likely choice)."""
    probs = renormalise(scores)
    if temperature <= 0:
        return max(range(len(probs)), key=probs.__getitem__), probs
    tempered = renormalise([s / temperature for s in scores])
    draw = (rng or random).random()
    edge = 0.0
    for i, p in enumerate(tempered):
        edge += p
        if draw < edge:
            return i, tempered
    return len(tempered) - 1, tempered
