"""Grammar masks at training time: the importance ratio of a constrained completion taken
against the distribution its tokens were drawn from.

The gateway samples a structured-output completion from the masked (renormalised)
distribution and logs those log-probs with the constraint's hash (`schema_hash`). A
PPO-clip / GRPO ratio exp(log pi_new(a) - log mu(a)) is only right when both sides are the
same distribution: so the job rebuilds the grammar named by the hash, replays the logged
tokens through a matcher to get, per action token, the tokens the grammar allowed at that
position, and scores the policy under that same mask (`llm.forward`: forbidden logits get
MASKED before the softmax). On the behaviour policy's own tokens the ratio is then exactly
1 (tested); without the mask the policy's unmasked log-prob is below the logged one, the
ratio below 1 on every constrained token, and the clip saw a policy change that was not.

Which grammars a job can rebuild: those of the requests it is told about (`constraints`:
request-like dicts, e.g. the loop's `{"response_format": ...}`), hashed exactly as the
gateway hashes them (`serving.structured.constraint_for`). A row whose hash is unknown, or
whose tokens the rebuilt grammar rejects, falls back to the old rule (its logged log-probs
are not used as old log-probs; the policy's own become them), counted in `unmatched`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.llm.forward import BITMASK_KEY, MASKED

__all__ = ["BITMASK_KEY", "MASKED", "GrammarBook"]


@dataclass
class GrammarBook:
    """schema hash -> constraint, over one tokenizer; compiled matchers cached per hash."""

    tokenizer: Any
    vocab_size: int
    constraints: dict[str, Any] = field(default_factory=dict)
    unmatched: int = 0  # constrained rows whose grammar could not be rebuilt or replayed
    _compiler: Any = None

    @classmethod
    def from_requests(
        cls, tokenizer: Any, vocab_size: int, requests: Iterable[Mapping[str, Any]]
    ) -> GrammarBook:
        book = cls(tokenizer, vocab_size)
        for req in requests:
            book.add_request(req)
        return book

    def add_request(self, request: Mapping[str, Any]) -> str | None:
        """Register the constraint of a request-like dict (`response_format`, `guided_json`,
        `structured_outputs`, `tools` + `tool_choice`, ...); returns its hash (None: none)."""
        from agentrl.serving.openai_types import ChatRequest
        from agentrl.serving.structured import constraint_for

        body = {"model": "m", "messages": [{"role": "user", "content": ""}], **dict(request)}
        constraint = constraint_for(ChatRequest.model_validate(body))
        if constraint is None:
            return None
        self.constraints[constraint.key] = constraint
        return str(constraint.key)

    def _matcher(self, schema_hash: str) -> Any:
        from agentrl.serving.structured import GrammarCompiler

        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size)
        cache = self._compiler._cache
        template = cache.get(schema_hash)
        if template is None:
            template = cache[schema_hash] = self._compiler.compile(self.constraints[schema_hash])
        return template.deep_copy()

    def bitmask(self, schema_hash: str | None, action_ids: Sequence[int]) -> torch.Tensor | None:
        """Per action token, the tokens the grammar allowed at its position (llguidance's
        packed int32 bitmask, [len(action_ids), ceil(vocab / 32)]), replaying the tokens
        through a fresh matcher; None when the hash is unknown or a token breaks the grammar
        (the completion was not decoded under this grammar)."""
        if not schema_hash or schema_hash not in self.constraints or not action_ids:
            self.unmatched += 1
            return None
        # llguidance's numpy helpers, as the gateway's (`structured.mask_logits`):
        # `llguidance.torch` applies `@torch.compile` at import, which imports inductor:
        # ~1.9 CPU-s of each job process that replays a grammar, for two array helpers
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        from agentrl.serving.structured import advance

        matcher = self._matcher(schema_hash)
        out = allocate_token_bitmask(len(action_ids), self.vocab_size)
        for i, tok in enumerate(action_ids):
            fill_next_token_bitmask(matcher, out, i)
            if not advance(matcher, int(tok)):  # a token the grammar forbids there
                self.unmatched += 1
                return None
        return torch.from_numpy(out)
