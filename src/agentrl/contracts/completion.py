"""`agent.rl.completion.v1`: the tokens a served completion was made of (gateway -> training).

The gateway records, per completion id, the prompt and completion token ids and the
completion's log-probs under the version that served it, so training on logged traffic uses
exactly the tokens the model produced instead of re-tokenising text (Agent Lightning's and
rLLM's proxies do the same during training). A trajectory turn links to it through
`action.completion_id`. Not a seed event: agentrl's own, kept in RL_COMPLETIONS.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agentrl.contracts.base import Event, Finite, Id, Timestamp


class CompletionRecord(Event):
    SUBJECT: ClassVar[str] = "agent.rl.completion.v1"
    ID_FIELD: ClassVar[str | None] = "completion_id"
    FOLD_INTO: ClassVar[str | None] = None

    completion_id: Id
    model: Id = Field(description="The model version that served the completion.")
    session_id: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    completion_logprobs: list[Finite] = Field(default_factory=list)
    constrained: bool = Field(
        False,
        description="Sampled under a structured-output grammar: completion_logprobs are those "
        "of the masked (renormalised) distribution the tokens were drawn from.",
    )
    schema_hash: str | None = Field(
        None, description="sha256 of the constraint (schema, regex, grammar or tools)."
    )
    finish_reason: str | None = Field(
        None,
        description="stop, length, tool_calls, or cancelled: the client closed the stream "
        "early and completion_token_ids are exactly the tokens it was sent.",
    )
    timestamp: Timestamp
