"""Logged trajectories -> training samples (policy-gradient samples and DPO pairs).

Each turn is one sample: the context is the task's instructions, the earlier observations
and the agent's earlier responses, then this turn's observation (rendered with the model's
chat template); the action is the agent's JSON response of the turn (`raw_response`, or the
tool call as JSON when no raw response was logged). Where the gateway logged the completion
(`action.completion_id` found in the completion log), the exact prompt and completion token
ids are used and the behaviour log-probs become the old log-probs of the importance ratio.
A completion decoded under a grammar (`constrained` in the log) keeps its exact tokens; its
logged log-probs are those of the masked distribution. Where the job can rebuild the
grammar from the row's `schema_hash` (`training.masks.GrammarBook`, from the request specs
the job is given), the sample carries that mask per action token and the trainer scores the
policy under it, so the logged log-probs are the right old log-probs and the ratio is
on-policy-correct (1 on the behaviour policy's own tokens). Otherwise they are not used as
old log-probs (the trainer scores the tokens under the unmasked policy instead), so the
ratio never mixes the two distributions.
A cancelled completion (`finish_reason: cancelled`: the client closed the stream early, as
Agent Zero does at the first complete JSON tool request) is used like any other: the gateway
logs exactly the tokens the client was sent, never the ones decoded after it left, so the row
is the action the agent took; no end-of-sequence token is added (the model did not stop
there), and its log-probs are still the behaviour log-probs of those tokens. A cancelled row
without tokens (the client left before any text) falls back to the turn's text.

Advantages: attempts of the same task_id form a group (GRPO: (r - mean) / std, RLOO:
leave-one-out, GiGPO: episode advantage + step advantage over anchor groups of identical
observations). A task with a single attempt has no group to compare with, so its advantage
is r minus a per-domain running baseline: an exponential moving average (alpha 0.1) of the
domain's rewards in end-time order, taken before the attempt is added and started at the
mean reward of the domain's single attempts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

import numpy as np
import torch

from agentrl.llm.forward import BITMASK_KEY
from agentrl.llm.samples import PolicySample
from agentrl.llm.trainer import PreferencePair
from agentrl.training.dataset import Record, gc_paused
from agentrl.training.prompt_ids import encode_dialogues, render

BASELINE_ALPHA = 0.1
# How a group's centred rewards are scaled. "std" (GRPO): divided by the group's std, so
# any difference becomes about +-1 however small. "none" (Dr. GRPO, Liu et al. 2025): not
# divided, so an advantage is as large as the reward difference behind it. With shaped
# rewards (the tool-use loop's partial credit, < 0.5 for a failure) "std" gave a group of
# four failures that differ by 0.17 of partial credit first-turn advantages of +3.0 and
# -1.0 (GiGPO), as large as a success's in its group (+3.0): the job learned the checklist
# as hard as the task (`tests/training/test_tooluse_advantage_scale.py`).
ADVANTAGE_SCALES = ("std", "none")


@dataclass
class Turn:
    prompt: list[dict[str, str]]
    action: str
    completion_id: str | None
    anchor: str


@dataclass
class BuildStats:
    trajectories: int = 0
    samples: int = 0
    exact_token_samples: int = 0
    grouped_trajectories: int = 0
    baseline_trajectories: int = 0
    pairs: int = 0
    correction_pairs: int = 0
    skipped_turns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _content(obs: dict[str, Any]) -> str:
    content = obs.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    kind = obs.get("type")
    if kind == "tool_result":
        return f"Tool result: {text}"
    if kind == "subordinate_response":
        return f"Subordinate response: {text}"
    return text


def action_text(action: dict[str, Any], thoughts: Sequence[str] = ()) -> str:
    """The agent's response as it produced it: raw_response, else the Agent Zero JSON."""
    raw = action.get("raw_response")
    if raw:
        return str(raw)
    return json.dumps(
        {
            "thoughts": list(thoughts),
            "tool_name": action.get("tool_name") or action.get("type", "response"),
            "tool_args": action.get("tool_args") or {},
        }
    )


class Step(NamedTuple):
    """One turn without its context: the user message, the agent's response text."""

    user: str
    action: str
    completion_id: str | None
    anchor: str


def trajectory_steps(traj: dict[str, Any]) -> list[Step]:
    """User message and action of each turn of one trajectory (`_content` and `action_text`
    written out: this runs for every turn of a job's dataset)."""
    task = traj.get("task_context") or {}
    instructions = str(task.get("instructions") or "")
    steps: list[Step] = []
    first = True
    for turn in traj.get("turns") or ():
        o = turn.get("observation") or {}
        content = o.get("content")
        obs = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        kind = o.get("type")
        if kind == "tool_result":
            obs = f"Tool result: {obs}"
        elif kind == "subordinate_response":
            obs = f"Subordinate response: {obs}"
        if first and instructions and obs != instructions:
            user = f"{instructions}\n\n{obs}" if obs else instructions
        else:
            user = obs
        first = False
        action = turn.get("action") or {}
        raw = action.get("raw_response")
        text = str(raw) if raw else action_text(action, turn.get("thought_process") or ())
        cid = action.get("completion_id")
        steps.append(Step(user, text, str(cid) if cid else None, obs))
    return steps


def trajectory_turns(traj: dict[str, Any]) -> list[Turn]:
    """Context and action of each turn of one trajectory."""
    history: list[dict[str, str]] = []
    turns: list[Turn] = []
    for step in trajectory_steps(traj):
        history.append({"role": "user", "content": step.user})
        turns.append(Turn(list(history), step.action, step.completion_id, step.anchor))
        history.append({"role": "assistant", "content": step.action})
    return turns


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return render(tokenizer, messages)


def episode_advantages(
    records: Sequence[Record],
    estimator: str,
    scores: Sequence[float] | None = None,
    tasks: Sequence[str] | None = None,
    scale: str = "std",
) -> tuple[np.ndarray, np.ndarray]:
    """Per record: its advantage and whether it came from a group (True) or the baseline.
    `scores` and `tasks`: the records' scores and task ids where the caller has them.
    `scale`: "std" divides a group's centred rewards by its std (GRPO), "none" does not
    (Dr. GRPO: see `ADVANTAGE_SCALES`)."""
    from agentrl.advantages import grpo_advantages, rloo_advantages

    values = np.array([r.score for r in records] if scores is None else scores, dtype=np.float64)
    ids = [r.task_id for r in records] if tasks is None else tasks
    sizes: dict[str, int] = defaultdict(int)
    for t in ids:
        sizes[t] += 1
    grouped = np.array([sizes[t] > 1 for t in ids], dtype=bool)
    adv = np.zeros(len(records))
    if not len(records):
        return adv, grouped
    if grouped.any():
        idx = np.flatnonzero(grouped)
        gids = [ids[int(i)] for i in idx]
        if estimator == "rloo":
            adv[idx] = rloo_advantages(values[idx], gids)
        else:
            adv[idx] = grpo_advantages(
                values[idx], gids, scale="none" if scale == "none" else "group"
            )
    adv[~grouped] = running_baseline(
        [records[int(i)] for i in np.flatnonzero(~grouped)], values[~grouped]
    )
    return adv, grouped


def running_baseline(records: Sequence[Record], scores: np.ndarray) -> np.ndarray:
    """r - b_domain, with b an EMA of the domain's earlier rewards (see the module doc)."""
    out = np.zeros(len(records))
    if not len(records):
        return out
    order = sorted(
        range(len(records)), key=lambda i: str(records[i].trajectory.get("end_timestamp"))
    )
    by_domain: dict[str, list[float]] = defaultdict(list)
    for i, r in enumerate(records):
        by_domain[r.domain].append(float(scores[i]))
    base = {d: float(np.mean(v)) for d, v in by_domain.items()}
    for i in order:
        d = records[i].domain
        out[i] = scores[i] - base[d]
        base[d] += BASELINE_ALPHA * (scores[i] - base[d])
    return out


def gigpo_step_advantages(
    records: Sequence[Record], turns: Sequence[Sequence[Turn | Step]], scale: str = "std"
) -> list[list[float]]:
    """GiGPO per turn for grouped records (anchor = identical observation text). A turn's
    reward is its share of the reward (`Record.turn_rewards`: the partial credit it earned,
    the outcome on the last turn) where the reward service gave one, else the total on the
    last turn: so the step groups compare what each turn earned, and a group where no
    attempt succeeded still has different returns to learn from (MT-GRPO's turn credit)."""
    from agentrl.advantages import gigpo_advantages

    gids: list[str] = []
    eids: list[str] = []
    anchors: list[str] = []
    rewards: list[float] = []
    ep_scores: list[float] = []
    for r, ts in zip(records, turns, strict=True):
        per_turn = r.turn_rewards
        if per_turn is not None and len(per_turn) != len(ts):
            per_turn = None
        for k, t in enumerate(ts):
            gids.append(r.task_id)
            eids.append(r.trajectory_id)
            anchors.append(t.anchor)
            if per_turn is not None:
                rewards.append(per_turn[k])
            else:
                rewards.append(r.score if k == len(ts) - 1 else 0.0)
            ep_scores.append(r.score)
    res = gigpo_advantages(
        gids, eids, anchors, rewards, ep_scores, gamma=0.95, omega=1.0, combine="additive",
        mode="mean_norm" if scale == "none" else "mean_std_norm",
    )  # fmt: skip
    out: list[list[float]] = []
    pos = 0
    for ts in turns:
        out.append([float(a) for a in res.advantages[pos : pos + len(ts)]])
        pos += len(ts)
    return out


def build_samples(
    records: Sequence[Record],
    tokenizer: Any,
    *,
    estimator: str = "grpo",
    completions: dict[str, dict[str, Any]] | None = None,
    stats: BuildStats | None = None,
    grammars: Any = None,
    constraints: Sequence[dict[str, Any]] = (),
    advantage_scale: str = "std",
) -> tuple[list[PolicySample], BuildStats]:
    """Policy-gradient samples of every turn of every record (see the module doc). Built
    for a job that keeps them to its end: the collector is paused, and what is alive at the
    end is frozen out of later collections (`gc_paused(freeze=True)`).

    `grammars` (a `training.masks.GrammarBook`), or `constraints` (request-like dicts such
    as `{"response_format": ...}`, hashed as the gateway does): the grammars whose
    constrained completions are trained with masked ratios. `advantage_scale`: one of
    `ADVANTAGE_SCALES`."""
    if advantage_scale not in ADVANTAGE_SCALES:
        raise ValueError(f"advantage_scale {advantage_scale!r}: use one of {ADVANTAGE_SCALES}")
    if grammars is None and constraints:
        from agentrl.training.masks import GrammarBook

        grammars = GrammarBook.from_requests(tokenizer, len(tokenizer), constraints)
    with gc_paused(freeze=True):
        return _build_samples(
            records, tokenizer, estimator, completions or {}, stats or BuildStats(), grammars,
            advantage_scale,
        )  # fmt: skip


def _build_samples(
    records: Sequence[Record],
    tokenizer: Any,
    estimator: str,
    completions: dict[str, dict[str, Any]],
    stats: BuildStats,
    grammars: Any = None,
    scale: str = "std",
) -> tuple[list[PolicySample], BuildStats]:
    stats.trajectories = len(records)
    turns = [trajectory_steps(r.trajectory) for r in records]
    # per record, read once: (domain, score, task_id, trajectory_id)
    facts = [(r.domain, r.score, r.task_id, r.trajectory_id) for r in records]
    adv, grouped = episode_advantages(
        records,
        "rloo" if estimator == "rloo" else "grpo",
        [f[1] for f in facts],
        [f[2] for f in facts],
        scale,
    )
    stats.grouped_trajectories = int(grouped.sum())
    stats.baseline_trajectories = int((~grouped).sum())
    step_adv: list[list[float]] | None = None
    if estimator == "gigpo" and grouped.any():
        gi = [i for i in range(len(records)) if grouped[i]]
        per = gigpo_step_advantages([records[i] for i in gi], [turns[i] for i in gi], scale)
        step_adv = [[float(adv[i])] * len(turns[i]) for i in range(len(records))]
        for j, i in enumerate(gi):
            step_adv[i] = per[j]
    exact: list[tuple[int, int, dict[str, Any]]] = []
    wanted: list[list[bool]] = []
    for i, ts in enumerate(turns):
        want = []
        for k, t in enumerate(ts):
            comp = completions.get(t.completion_id) if t.completion_id else None
            if comp and comp.get("completion_token_ids") and comp.get("prompt_token_ids"):
                exact.append((i, k, comp))
                want.append(False)
            else:
                want.append(True)
        wanted.append(want)
    samples: list[PolicySample] = []
    encoded = encode_dialogues(
        tokenizer, [[(t.user, t.action) for t in ts] for ts in turns], wanted
    )
    eos = None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)

    def make(
        i: int,
        k: int,
        prompt: list[int],
        action: list[int],
        old: Any,
        schema: Any = None,
        bitmask: Any = None,
    ) -> None:
        a = step_adv[i][k] if step_adv is not None else float(adv[i])
        domain, score, task_id, trajectory_id = facts[i]
        meta: dict[str, Any] = {
            "exact_tokens": old is not None or schema is not None,
            "domain": domain,
        }
        if schema is not None:
            meta["schema_hash"] = schema
        if bitmask is not None:  # scored under the grammar it was sampled under
            meta[BITMASK_KEY] = bitmask
        samples.append(
            PolicySample(
                prompt_ids=prompt,
                action_ids=action,
                advantage=a,
                old_logprobs=old,
                reward=score,
                group_id=task_id,
                episode_id=trajectory_id,
                step_index=k,
                meta=meta,
            )
        )

    for i, row in enumerate(encoded):
        for k, ids in enumerate(row):
            if ids is None:
                continue
            p, a = ids  # p is this turn's own list; a may be shared with other turns
            if not p:
                stats.skipped_turns += 1
                continue
            action = [*a, eos] if eos is not None and (not a or a[-1] != eos) else list(a)
            make(i, k, p, action, None)
    for i, k, comp in exact:
        action = [int(x) for x in comp["completion_token_ids"]]
        lps = comp.get("completion_logprobs")
        constrained = bool(comp.get("constrained"))
        logged = lps is not None and len(lps) == len(action)
        bitmask = None
        if constrained and logged and grammars is not None:
            bitmask = grammars.bitmask(comp.get("schema_hash"), action)
            key = "masked_samples" if bitmask is not None else "unmasked_constrained_samples"
            stats.extra[key] = stats.extra.get(key, 0) + 1
        old = (
            torch.tensor([float(x) for x in lps or ()], dtype=torch.float32)
            if logged and (not constrained or bitmask is not None)
            else None
        )
        schema = str(comp.get("schema_hash") or "constrained") if constrained else None
        make(i, k, [int(x) for x in comp["prompt_token_ids"]], action, old, schema, bitmask)
        stats.exact_token_samples += 1
    # Built in record order, turn by turn: already sorted when the records' ids increase
    # (a seeded sample is) and no exact-token sample was appended after the others.
    tids = [f[3] for f in facts]
    if exact or not all(a < b for a, b in zip(tids, islice(tids, 1, None), strict=False)):
        samples.sort(key=lambda s: (s.episode_id, s.step_index))
    stats.samples = len(samples)
    return samples, stats


def build_pairs(
    records: Sequence[Record],
    tokenizer: Any,
    *,
    corrections: Sequence[dict[str, Any]] = (),
    stats: BuildStats | None = None,
) -> tuple[list[PreferencePair], BuildStats]:
    """DPO pairs: per task the best vs the worst attempt (ties skipped), and for each
    feedback correction the corrected response vs the agent's last response."""
    stats = stats or BuildStats()
    by_task: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_task[r.task_id].append(r)
    pairs: list[PreferencePair] = []
    for group in by_task.values():
        if len(group) < 2:
            continue
        ranked = sorted(group, key=lambda r: r.score)
        worst, best = ranked[0], ranked[-1]
        margin = best.score - worst.score
        if margin <= 0:
            continue
        chosen = _turn_samples(best, tokenizer)
        rejected = _turn_samples(worst, tokenizer)
        if chosen and rejected:
            pairs.append(PreferencePair(chosen, rejected, margin))
    by_id = {r.trajectory_id: r for r in records}
    for c in corrections:
        rec = by_id.get(str(c.get("trajectory_id")))
        text = c.get("correction") or c.get("comment")
        if rec is None or not text:
            continue
        last = trajectory_turns(rec.trajectory)[-1]
        prompt = _tok(tokenizer, _render(tokenizer, last.prompt))
        chosen_ids = _tok(tokenizer, str(text), eos=True)
        rejected_ids = _tok(tokenizer, last.action, eos=True)
        if prompt and chosen_ids != rejected_ids:
            pairs.append(
                PreferencePair(
                    [PolicySample(prompt, chosen_ids, episode_id=rec.trajectory_id)],
                    [PolicySample(list(prompt), rejected_ids, episode_id=rec.trajectory_id)],
                    1.0,
                )
            )
            stats.correction_pairs += 1
    stats.pairs = len(pairs)
    return pairs, stats


def _tok(tokenizer: Any, text: str, eos: bool = False) -> list[int]:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if (
        eos
        and tokenizer.eos_token_id is not None
        and (not ids or ids[-1] != tokenizer.eos_token_id)
    ):
        ids.append(int(tokenizer.eos_token_id))
    return ids


def _turn_samples(record: Record, tokenizer: Any) -> list[PolicySample]:
    out = []
    for k, t in enumerate(trajectory_turns(record.trajectory)):
        prompt = _tok(tokenizer, _render(tokenizer, t.prompt))
        action = _tok(tokenizer, t.action, eos=True)
        if prompt and action:
            out.append(PolicySample(prompt, action, episode_id=record.trajectory_id, step_index=k))
    return out
