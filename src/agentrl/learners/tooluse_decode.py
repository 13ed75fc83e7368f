"""Batched decoding of a local causal LM under a structured-outputs grammar, in-process.

The learner needs what the gateway's local backend does (llguidance masks the logits of
every token the grammar forbids, token by token) on the policy it is training, without a
server in between: `generate` decodes a batch of prompts, each with its own matcher, and
returns the sampled tokens with their log-probs under the masked, temperature-scaled
distribution (the behaviour policy). The prefix all prompts share (the system prompt, and
within a group the task too) is prefilled once and its KV cache copied to every row.

Given a `PrefixCache` (one per play: K/V depend on the weights, and a play runs under one
set), each finished row's K/V (prompt and reply) stays cached, as the gateway's engine keeps
conversations: an episode's next turn starts from the longest cached run of its prompt and
prefills only what is new (the reply's re-rendering where it differs, the tool result).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.serving.decoding import (
    MIN_PREFIX,
    BatchDecoder,
    DecodeRow,
    DecodeStats,
    PrefixCache,
    decode_all,
)

MIN_SHARED_PREFIX = MIN_PREFIX


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
    """Decode every prompt; rows with a matcher only ever sample tokens it allows. The
    decode core is the gateway's (`agentrl.serving.decoding`): finished rows leave the batch
    and the cache; the shared prefix is prefilled once (a prefix cache for this call)."""
    shared = shared_prefix(prompts)
    rows = [
        DecodeRow(
            list(p),
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            matcher=m,
            prefix_len=shared,
        )
        for p, m in zip(prompts, matchers, strict=True)
    ]
    with decoder_for(
        model,
        eos_ids=eos_ids,
        pad_id=pad_id,
        generator=generator,
        autocast=autocast,
        cache=PrefixCache(2**40) if shared else None,
        conversations=False,
    ) as decoder:
        decode_all(decoder, rows)
    return [Generated(r.toks, r.lps, r.finish) for r in rows]


@contextmanager
def decoder_for(
    model: Any,
    *,
    eos_ids: set[int],
    pad_id: int,
    generator: torch.Generator,
    autocast: Any = None,
    cache: PrefixCache | None = None,
    conversations: bool = True,
    stats: DecodeStats | None = None,
) -> Iterator[BatchDecoder]:
    """The gateway's decode core over `model` (in the autocast, if any), its steps
    projecting only the rows that need logits; with `conversations`, each finished row's
    K/V stays in `cache` for the prompts that continue it."""
    head = _HeadRows(model)

    def forward(_adapters: list[str], logit_rows: torch.Tensor | None = None, **kw: Any) -> Any:
        head.rows = logit_rows
        try:
            return model(**kw)
        finally:
            head.rows = None

    decoder = BatchDecoder(
        forward,
        eos_ids=eos_ids,
        pad_id=pad_id,
        generator=generator,
        prefix_cache=cache,
        conversations=conversations,
        stats=stats,
        device=next(model.parameters()).device,
        select_logits=head.installed,
    )
    try:
        with autocast if autocast is not None else nullcontext():
            yield decoder
    finally:
        head.remove()


class _HeadRows:
    """A pre-hook on the vocabulary projection for one `generate` call: a decode step
    projects only the rows whose next token is not forced by their grammar (as the
    gateway's engine does: the projection is a fifth of SmolLM2's work per token, and ~40 %
    of a reply's tokens are forced JSON keys and punctuation)."""

    def __init__(self, model: Any) -> None:
        self.rows: torch.Tensor | None = None
        get_head = getattr(model, "get_output_embeddings", None)
        module = get_head() if get_head is not None else None
        self._handle = None if module is None else module.register_forward_pre_hook(self._select)
        self.installed = self._handle is not None

    def _select(self, _module: Any, args: tuple[Any, ...]) -> Any:
        if self.rows is None:
            return None
        return (args[0].index_select(0, self.rows), *args[1:])

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
