"""Training the hint-free prompt from hints, and the token-level losses the tool-use
learner shares (issue 52, "hints where every sample failed").

When every sample of a task failed, the learner builds a hint (the environment checker's
verdict and what the task needs, `envs.tooluse.hints`, or a user's correction) and trains
the prompt WITHOUT the hint in one of two ways:

  - "importance": sample again with the hint in context; train the hint-free prompt on the
    hinted successes' tokens, each token weighted by the truncated importance ratio
    min(c, pi(a_t | x) / pi(a_t | x + hint)), both from the current policy: a gradient
    that targets the hint-free policy, not the hinted one (tokens the hint-free policy
    would never write, a copied answer among them, get little weight);
  - "distill": the same model with the hint in context is the teacher, on the student's
    own logged tokens of the failed samples; the per-token advantage is
    log pi(a_t | x + hint) - log pi(a_t | x), clipped to [-c, c] (OpenClaw-RL's
    hindsight-guided on-policy distillation, arXiv 2603.10165).

Log-probs here are of the unmasked distribution for both prompts (the grammar's mask is
the same for both, since the tokens and the schema are; only its normaliser differs).
Every item's trained prompt is `TurnRecord.train_prompt_ids`: never one with a hint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.envs.tooluse.agent_prompt import Turn, messages_for
from agentrl.envs.tooluse.hints import Attempt, with_hint
from agentrl.learners.tooluse_episodes import EpisodeRecord

MODES = ("nll", "importance", "distill")


@dataclass
class TokenItem:
    """One reply to train on: the (hint-free) prompt, the reply's tokens, how its tokens are
    weighted (`mode`), and, for hint modes, the hinted prompt the other policy sees."""

    prompt_ids: list[int]
    action_ids: list[int]
    family: str
    mode: str = "nll"
    hinted_prompt_ids: list[int] | None = None
    weight: float = 1.0
    # the tool this reply calls when it is an episode's first reply, else None: a replay
    # pass can count its opening turns per tool (`tooluse_replay.Replay.sample`)
    opening: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: use one of {MODES}")
        if self.mode != "nll" and self.hinted_prompt_ids is None:
            raise ValueError(f"a {self.mode} item needs the hinted prompt")


def attempts_of(episodes: Sequence[EpisodeRecord]) -> list[Attempt]:
    """What the checker saw of each failed episode."""
    out = []
    for ep in episodes:
        answer = next((t.answer for t in ep.turns if t.answer is not None), None)
        tools = tuple(t.tool_name for t in ep.turns if t.tool_name in ("calculator", "code_exe"))
        out.append(
            Attempt(
                answer=None if answer is None else str(answer),
                tools=tuple(str(t) for t in tools),
                tool_error=any(t.tool_error for t in ep.turns),
                cut_by_token_cap=any(t.finish == "length" for t in ep.turns),
            )
        )
    return out


def success_items(episodes: Sequence[EpisodeRecord]) -> list[TokenItem]:
    """Every finished reply of the successful episodes, plain NLL on the hint-free prompt."""
    return [
        TokenItem(list(t.train_prompt_ids), list(t.action_ids), ep.family)
        for ep in episodes
        if ep.success
        for t in ep.turns
        if t.finish == "stop"
    ]


def importance_items(hinted: Sequence[EpisodeRecord]) -> list[TokenItem]:
    """The hinted successes' replies, trained on the hint-free prompt with the importance
    correction (the hinted prompt is the behaviour policy's)."""
    out = []
    for ep in hinted:
        if not ep.success or not ep.hint:
            continue
        for k, t in enumerate(ep.turns):
            if t.finish != "stop" or t.free_prompt_ids is None:
                continue
            out.append(
                TokenItem(
                    list(t.free_prompt_ids),
                    list(t.action_ids),
                    ep.family,
                    "importance",
                    hinted_prompt_ids=list(t.prompt_ids),
                    opening=t.tool_name if k == 0 and t.tool_name != "response" else None,
                )
            )
    return out


def balance_openings(items: list[TokenItem]) -> list[TokenItem]:
    """Weights so the opening turns (`TokenItem.opening`) of every tool present carry the
    same total weight, their sum unchanged; the other items as they were. After `balance`
    (families equal) in a hint pass: the family weights would undo a balance of counts."""
    totals: dict[str, float] = {}
    for it in items:
        if it.opening is not None:
            totals[it.opening] = totals.get(it.opening, 0.0) + it.weight
    if len(totals) < 2:
        return items
    per_tool = sum(totals.values()) / len(totals)
    for it in items:
        if it.opening is not None:
            it.weight *= per_tool / totals[it.opening]
    return items


def sft_items(hinted: Sequence[EpisodeRecord]) -> list[TokenItem]:
    """The hinted successes' replies as plain NLL on the hint-free prompt (ReLIFT-style
    supervised steps; no importance weight, so a token the hint-free policy would rarely
    write is learned as much as any other)."""
    return [
        TokenItem(it.prompt_ids, it.action_ids, it.family, opening=it.opening)
        for it in importance_items(hinted)
    ]


def distill_items(
    tokenizer: Any, failed: Sequence[EpisodeRecord], hints: dict[tuple[str, int], str]
) -> list[TokenItem]:
    """The failed hint-free episodes' own replies, with the hinted prompt of the same turn
    (the teacher's context: the same history, the hint after the question)."""
    from agentrl.llm.samples import render_prompt

    out = []
    for ep in failed:
        hint = hints.get((ep.family, ep.seed))
        if not hint or ep.hint:
            continue
        history: list[Turn] = []
        for t in ep.turns:
            # a reply cut by the token cap is the student's too: the teacher's advantages
            # say which of its tokens the hint would not have written (the rambling)
            if t.finish in ("stop", "length") and t.action_ids:
                teacher = render_prompt(
                    tokenizer, messages_for(with_hint(ep.question, hint), history)
                )
                out.append(
                    TokenItem(
                        list(t.prompt_ids),
                        list(t.action_ids),
                        ep.family,
                        "distill",
                        hinted_prompt_ids=teacher,
                    )
                )
            if t.result is not None:
                history.append(Turn(t.text, t.result, t.tool_name))
    return out


def balance(items: list[TokenItem]) -> list[TokenItem]:
    """Weights so every family present carries the same total weight (the ablation's job
    drifted to the one family its kept trajectories came from); the mean weight stays 1."""
    counts: dict[str, int] = {}
    for it in items:
        counts[it.family] = counts.get(it.family, 0) + 1
    if not counts:
        return items
    per_family = len(items) / len(counts)
    for it in items:
        it.weight *= per_family / counts[it.family]
    return items


def _samples(items: Sequence[TokenItem], hinted: bool) -> list[Any]:
    from agentrl.llm.samples import PolicySample

    out = []
    for k, it in enumerate(items):
        prompt = it.hinted_prompt_ids if hinted else it.prompt_ids
        assert prompt is not None
        out.append(PolicySample(list(prompt), list(it.action_ids), meta={"item": k}))
    return out


def _logprobs(trainer: Any, items: Sequence[TokenItem], hinted: bool, grad: bool) -> list[Any]:
    """Per-token log-probs of each item's reply after its (hinted or hint-free) prompt."""
    from agentrl.llm.forward import run_head
    from agentrl.llm.samples import make_microbatches

    out: list[Any] = [None] * len(items)
    if not items:
        return out
    module = trainer.module if grad else trainer.head
    was = module.training
    if not grad:
        module.eval()
    try:
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            mbs = make_microbatches(
                _samples(items, hinted), trainer.config.micro_batch_tokens, trainer.pad_id
            )
            for mb in mbs:
                with trainer._autocast():
                    logp = run_head(module, mb, trainer.device)["logp"].float()
                splits = [len(s.action_ids) for s in mb.samples]
                for s, lp in zip(mb.samples, logp.split(splits), strict=True):
                    out[s.meta["item"]] = lp
    finally:
        module.train(was)
    return out


def token_coefficients(
    item: TokenItem, logp: torch.Tensor, other: torch.Tensor | None, clip: float
) -> torch.Tensor:
    """The (detached) weight of each token's log-prob in the loss."""
    lp = logp.detach()
    if item.mode == "nll":
        coef = torch.ones_like(lp)
    elif item.mode == "importance":
        assert other is not None
        coef = torch.exp(lp - other.to(lp.device)).clamp(max=clip)
    else:  # distill: teacher minus student
        assert other is not None
        coef = (other.to(lp.device) - lp).clamp(-clip, clip)
    return coef * item.weight


def train_items(
    trainer: Any,
    items: Sequence[TokenItem],
    batch_size: int,
    clip: float = 1.0,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """One shuffled pass: per step, the hinted log-probs without grad, then
    -sum(coef_t * log pi(a_t | x)) / tokens on the hint-free prompts."""
    if not items:
        return {"loss": math.nan, "steps": 0, "tokens": 0, "mean_coef": math.nan}
    order = torch.randperm(len(items), generator=generator).tolist()
    losses, coefs, tokens = [], [], 0
    for start in range(0, len(order), batch_size):
        batch = [items[i] for i in order[start : start + batch_size]]
        hinted = [it for it in batch if it.mode != "nll"]
        others = dict(
            zip(
                (id(it) for it in hinted),
                _logprobs(trainer, hinted, hinted=True, grad=False),
                strict=True,
            )
        )
        trainer.optimizer.zero_grad(set_to_none=True)
        lps = _logprobs(trainer, batch, hinted=False, grad=True)
        n = sum(len(it.action_ids) for it in batch)
        total = None
        for it, lp in zip(batch, lps, strict=True):
            coef = token_coefficients(it, lp, others.get(id(it)), clip)
            coefs.append(float(coef.mean()))
            term = -(coef * lp).sum() / n
            total = term if total is None else total + term
        assert total is not None
        total.backward()
        trainer._optimizer_step()
        losses.append(float(total.detach()))
        tokens += n
    return {
        "loss": sum(losses) / len(losses),
        "steps": len(losses),
        "tokens": tokens,
        "mean_coef": sum(coefs) / len(coefs),
    }
