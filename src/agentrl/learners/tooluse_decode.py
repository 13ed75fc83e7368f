"""Batched decoding of a local causal LM under a structured-outputs grammar, in-process.

The learner needs what the gateway's local backend does (llguidance masks the logits of
every token the grammar forbids, token by token) on the policy it is training, without a
server in between: `generate` decodes a batch of prompts, each with its own matcher, and
returns the sampled tokens with their log-probs under the masked, temperature-scaled
distribution (the behaviour policy). The prefix all prompts share (the system prompt, and
within a group the task too) is prefilled once and its KV cache copied to every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.deploy.structured import advance, mask_logits
from agentrl.rollout.policies.hf_policy import sample_tokens

MIN_SHARED_PREFIX = 16


@dataclass
class Generated:
    """One row's answer: tokens (ending in EOS when it stopped), their behaviour log-probs,
    and why it ended (stop | length | grammar_error)."""

    ids: list[int]
    logprobs: list[float]
    finish: str


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own."""
    if len(prompts) < 2:
        return 0
    shortest = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < shortest and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


@torch.no_grad()
def generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    matchers: Sequence[Any | None],
    *,
    temperature: float,
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    generator: torch.Generator,
    autocast: Any = None,
) -> list[Generated]:
    """Decode every prompt; rows with a matcher only ever sample tokens it allows."""
    n = len(prompts)
    shared = shared_prefix(prompts)
    rest = [list(p[shared:]) for p in prompts]
    width = max(len(r) for r in rest)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rest):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    ctx = autocast if autocast is not None else nullcontext()
    with ctx:
        cache = None
        if shared:
            prefix = torch.tensor([list(prompts[0][:shared])], dtype=torch.long)
            cache = model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
            cache.batch_repeat_interleave(n)
            mask = torch.cat([mask.new_ones((n, shared)), mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)[:, shared:]
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :].float()
        next_pos = mask.sum(-1, keepdim=True)
        finish = ["length"] * n
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        alive = list(range(n))  # original row of each batch row still decoding
        for _step in range(max_new_tokens):
            guided = [b for b, i in enumerate(alive) if matchers[i] is not None]
            ended: set[int] = set()
            if guided:
                rows = [matchers[alive[b]] for b in guided]
                for b in mask_logits(logits, guided, rows):
                    finish[alive[b]] = "grammar_error"
                    ended.add(b)
                    logits[b] = 0.0
            choice, chosen_lp = sample_tokens(logits, temperature, generator)
            choice_list, lp_list = choice.tolist(), chosen_lp.tolist()
            for b, i in enumerate(alive):
                if b in ended:
                    continue
                tok = int(choice_list[b])
                toks[i].append(tok)
                lps[i].append(float(lp_list[b]))
                m = matchers[i]
                if m is not None and not advance(m, tok):
                    finish[i] = "grammar_error"
                    ended.add(b)
                elif tok in eos_ids or (m is not None and m.is_stopped()):
                    finish[i] = "stop"
                    ended.add(b)
                elif len(toks[i]) >= max_new_tokens:
                    ended.add(b)
            if len(ended) == len(alive):
                break
            if ended:  # drop finished rows from the batch and the cache
                keep = [b for b in range(len(alive)) if b not in ended]
                alive = [alive[b] for b in keep]
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                choice, mask, next_pos = choice[index], mask[index], next_pos[index]
            mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=1)
            out = model(
                input_ids=choice[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            )
            next_pos = next_pos + 1
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
    return [Generated(toks[i], lps[i], finish[i]) for i in range(n)]
