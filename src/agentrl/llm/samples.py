"""Turn rollout steps into token sequences the trainer can score.

One `PolicySample` is one environment step: the tokens the policy saw (chat template over
the configured history window) followed by the action tokens it produced. Only action
tokens carry loss. If the rollout recorded the exact token ids and their log-probs we use
them (the update is then exactly on-policy at the first epoch); otherwise we re-render the
observation and recompute log-probs with the policy before updating.

Micro-batches group samples of similar length (length bucketing) so padding stays small;
a micro-batch is the unit of one forward/backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from agentrl.core.episodes import Message, StepData

PROMPT_ID_KEYS = ("prompt_ids", "prompt_token_ids", "input_ids")
ACTION_ID_KEYS = (
    "tokens",
    "action_ids",
    "token_ids",
    "completion_ids",
    "output_ids",
    "generated_ids",
)
LOGPROB_KEYS = ("token_logprobs", "logprobs", "action_logprobs")


@dataclass
class PolicySample:
    """One step as tokens. `old_logprobs`/`ref_logprobs` are per action token."""

    prompt_ids: list[int]
    action_ids: list[int]
    advantage: float = 0.0
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_value: float | None = None
    ret: float | None = None
    reward: float = 0.0  # the episode's score, for reward metrics
    group_id: str = ""
    episode_id: str = ""
    step_index: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.action_ids)


def _as_messages(observation: Any) -> list[dict[str, Any]]:
    """Observation of a step -> OpenAI-style message dicts (what chat templates take)."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict):
        if "role" in observation:
            return [observation]
        if "messages" in observation:
            return _as_messages(observation["messages"])
        if "text" in observation:
            return [{"role": "user", "content": str(observation["text"])}]
    if isinstance(observation, Sequence):
        out: list[dict[str, Any]] = []
        for m in observation:
            if isinstance(m, Message):
                out.append(m.to_openai())
            elif isinstance(m, dict):
                out.append({k: v for k, v in m.items() if v is not None})
            else:
                raise ValueError(f"cannot read a chat message from {type(m).__name__}")
        return out
    raise ValueError(
        f"cannot turn observation of type {type(observation).__name__} into chat messages; "
        "pass a list of Message, a dict with 'text', or a string"
    )


def window_messages(messages: list[dict[str, Any]], history_window: int | None) -> list[dict]:
    """Keep system messages and the last `history_window` other messages (None: all)."""
    if history_window is None:
        return messages
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return system + (rest[-history_window:] if history_window > 0 else [])


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Chat template with the generation prompt, as token ids."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:  # plain LMs: "role: content" lines
        text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
        text += "assistant: "
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_action(tokenizer: Any, text: str, add_eos: bool = True) -> list[int]:
    """Action text -> ids, ending in EOS so the model also learns where to stop."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (not ids or ids[-1] != eos):
        ids.append(int(eos))
    return ids


def _first(d: dict[str, Any], keys: Iterable[str]) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def sample_from_step(
    step: StepData,
    tokenizer: Any,
    *,
    advantage: float | None = None,
    history_window: int | None = None,
    reward: float = 0.0,
    group_id: str = "",
    episode_id: str = "",
) -> PolicySample:
    """Tokens of one step: exact ids from the rollout when recorded, else re-rendered."""
    lp = step.policy_logprobs or {}
    prompt_ids = _first(lp, PROMPT_ID_KEYS)
    action_ids = _first(lp, ACTION_ID_KEYS)
    old: torch.Tensor | None = None
    if prompt_ids is not None and action_ids is not None:
        prompt_ids = [int(t) for t in prompt_ids]
        action_ids = [int(t) for t in action_ids]
        logprobs = _first(lp, LOGPROB_KEYS)
        if logprobs is not None and len(logprobs) == len(action_ids):
            old = torch.tensor([float(x) for x in logprobs], dtype=torch.float32)
    else:
        messages = window_messages(_as_messages(step.observation_data), history_window)
        prompt_ids = render_prompt(tokenizer, messages)
        text = step.raw_policy_output
        if text is None:
            text = str(step.action_taken.get("content") or step.action_taken.get("text") or "")
        action_ids = encode_action(tokenizer, text)
    if not action_ids:
        raise ValueError(f"step {step.system_step_index} has no action tokens")
    adv = step.advantage if advantage is None else advantage
    return PolicySample(
        prompt_ids=prompt_ids,
        action_ids=action_ids,
        advantage=float(adv or 0.0),
        old_logprobs=old,
        old_value=step.policy_value_estimate,
        ret=step.return_to_go,
        reward=reward,
        group_id=group_id,
        episode_id=episode_id,
        step_index=step.system_step_index,
    )


def truncate(sample: PolicySample, max_length: int) -> PolicySample:
    """A copy whose prompt keeps only its newest tokens so prompt + action fits `max_length`.

    The input is never changed. A sample that carries behaviour (or reference) log-probs
    cannot be cut: they were computed with the context that would be removed, so the first
    ratio would not be 1. That raises ValueError; the caller drops the sample and counts it
    (rollout and training contexts stay identical). Tell the policy the maximum prompt
    length to avoid drops.
    """
    over = sample.length - max_length
    if over <= 0:
        return sample
    if over >= len(sample.prompt_ids):
        raise ValueError(
            f"action of {len(sample.action_ids)} tokens does not fit max_length={max_length}"
        )
    if sample.old_logprobs is not None or sample.ref_logprobs is not None:
        raise ValueError(
            f"sample of {sample.length} tokens exceeds max_length={max_length} and its "
            "log-probs were recorded on the full prompt; cutting it would misalign them"
        )
    return replace(
        sample,
        prompt_ids=list(sample.prompt_ids[over:]),
        meta={**sample.meta, "truncated_tokens": over},
    )


@dataclass
class MicroBatch:
    """Right-padded tokens plus flat indices of the positions that predict action tokens.

    For an action token at index j of a sequence, the logits at j-1 predict it, so
    `pred_b`/`pred_t` point at j-1 and `targets` hold the token. `seq_index` names the
    sample (0..B-1) of each flat token; `value_t` is the last prompt position (for V(s)).
    """

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    pred_b: torch.Tensor  # [N]
    pred_t: torch.Tensor  # [N]
    targets: torch.Tensor  # [N]
    seq_index: torch.Tensor  # [N]
    value_t: torch.Tensor  # [B]
    samples: list[PolicySample]

    @property
    def num_action_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def per_token(self, values: Sequence[float]) -> torch.Tensor:
        """Broadcast one value per sample to its action tokens."""
        per_seq = torch.tensor(list(values), dtype=torch.float32)
        return per_seq[self.seq_index]

    def cat_token_field(self, name: str) -> torch.Tensor | None:
        """Concatenate a per-token tensor field of the samples (None if any is missing)."""
        parts = [getattr(s, name) for s in self.samples]
        if any(p is None for p in parts):
            return None
        return torch.cat(parts).float()


def collate(samples: Sequence[PolicySample], pad_id: int) -> MicroBatch:
    """Pad `samples` on the right into one micro-batch."""
    lengths = [s.length for s in samples]
    width = max(lengths)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    pred_b: list[int] = []
    pred_t: list[int] = []
    targets: list[int] = []
    seq_index: list[int] = []
    value_t: list[int] = []
    for b, s in enumerate(samples):
        seq = s.prompt_ids + s.action_ids
        ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[b, : len(seq)] = 1
        start = len(s.prompt_ids)
        if start < 1:
            raise ValueError("a sample needs at least one prompt token before its action")
        n = len(s.action_ids)
        pred_b.extend([b] * n)
        pred_t.extend(range(start - 1, start - 1 + n))
        targets.extend(s.action_ids)
        seq_index.extend([b] * n)
        value_t.append(start - 1)
    t = torch.tensor
    return MicroBatch(
        input_ids=ids,
        attention_mask=mask,
        pred_b=t(pred_b, dtype=torch.long),
        pred_t=t(pred_t, dtype=torch.long),
        targets=t(targets, dtype=torch.long),
        seq_index=t(seq_index, dtype=torch.long),
        value_t=t(value_t, dtype=torch.long),
        samples=list(samples),
    )


def make_microbatches(
    samples: Sequence[PolicySample], max_tokens: int, pad_id: int, max_seqs: int | None = None
) -> list[MicroBatch]:
    """Length-bucketed micro-batches: sort by length and cut whenever the padded size
    (rows x longest row) would exceed `max_tokens` (or `max_seqs` rows)."""
    order = sorted(range(len(samples)), key=lambda i: samples[i].length)
    batches: list[MicroBatch] = []
    current: list[PolicySample] = []
    longest = 0
    for i in order:
        s = samples[i]
        new_longest = max(longest, s.length)
        too_many = max_seqs is not None and len(current) >= max_seqs
        if current and (new_longest * (len(current) + 1) > max_tokens or too_many):
            batches.append(collate(current, pad_id))
            current, new_longest = [], s.length
        current.append(s)
        longest = new_longest
    if current:
        batches.append(collate(current, pad_id))
    return batches


def padding_fraction(batches: Sequence[MicroBatch]) -> float:
    """Share of computed positions that are padding (what bucketing keeps small)."""
    total = sum(b.input_ids.numel() for b in batches)
    real = sum(b.num_tokens for b in batches)
    return 0.0 if total == 0 else 1.0 - real / total


def minibatches(n: int, batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Shuffle 0..n-1 and cut into ceil(n / batch_size) index lists."""
    perm = torch.randperm(n, generator=generator).tolist()
    k = max(1, math.ceil(n / max(1, batch_size)))
    size = math.ceil(n / k)
    return [perm[i : i + size] for i in range(0, n, size)]
