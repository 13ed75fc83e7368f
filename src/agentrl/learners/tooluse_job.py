"""A loop job's tool-use step (issue 52): hints for the tasks whose every logged attempt
failed, trained onto the hint-free prompts, inside the dataset job that trains on the
loop's logged tokens (`training.jobs.run_dataset_job`, `hyperparameters.tooluse_hints`).

The job's records are grouped by task (the trajectory's `task_context`: env id and seed
rebuild the task, `envs.tooluse.tasks.generate_task`). For a group where no attempt
succeeded the hint is a user's correction of one of its trajectories (`Record.hint`, via
`ToolUseLearner.set_corrections`), else what the environment's checker says
(`envs.tooluse.hints.hint_for`: what was wrong, what the task needs; the answer only with
`reveal_answer`). Then, as in `agentrl learn` (`learners.tooluse_hints`):

  - importance: the job's policy (the version the agents acted with, before this job's
    update) samples the task again with the hint in context; the hinted successes' tokens
    train the hint-free prompt with the truncated importance ratio;
  - distill: the same model with the hint in context is the teacher on the failed
    attempts' own logged tokens (per-token advantage log pi(a | x + hint) - log pi(a | x));
  - sft: as importance, the hinted successes' tokens on the hint-free prompt, but as plain
    NLL (ReLIFT's supervised steps on the hardest items, interleaved with the RL update).

Every trained prompt is hint-free (tested); the hint is only ever the other policy's
context. The counts (`hinted_tasks`, `hinted_successes`, `corrections_used`) go into the
job's final status, where the loop sums them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.envs.tooluse.hints import Attempt, hint_for, with_hint
from agentrl.learners.tooluse_hints import TokenItem

Key = tuple[str, int]  # (env family or "mixed", seed): what `generate_task` rebuilds


class JobHints(BaseModel):
    """`hyperparameters.tooluse_hints` of a job request (the loop's `loop_tooluse.job_hints`)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["importance", "distill", "sft"] = "importance"
    reveal_answer: bool = False
    plan: bool = Field(
        True, description="the hint also shows the first call's shape (hints.call_shape)"
    )
    fallback_distill: bool = Field(
        False,
        description="importance: a task none of whose hinted resamples succeeded is "
        "distilled on its failed attempts instead of training nothing (off: distillation "
        "moved the light warm start away from the solutions, bench tooluse_hints compare)",
    )
    samples: int = Field(4, gt=0, description="hinted resamples per task (importance)")
    max_tasks: int = Field(8, gt=0, description="hinted tasks per job (its time is bounded)")
    max_steps: int = Field(4, ge=1)
    max_new_tokens: int = Field(256, ge=8)
    temperature: float = Field(1.0, gt=0)
    structured: bool = True
    clip: float = Field(1.0, gt=0)
    batch_size: int = Field(8, gt=0)
    epochs: int = Field(1, ge=1)
    play_batch: int = Field(
        32,
        gt=0,
        description="hinted episodes decoded together (at 60 hinted tasks x 3 resamples one "
        "batch of 180 held every prompt's cache at once)",
    )
    max_reply_tokens: int | None = Field(
        None,
        gt=0,
        description="a hinted success with a reply longer than this many tokens is not "
        "trained (hinted data programs taught long replies: cut by the cap 13 -> 56); None: "
        "no token bound",
    )
    family_bound: bool = Field(
        False,
        description="a hinted success with a reply longer than the longest reply of a "
        "verified hint-free success of its family (among the job's records, and the "
        "`reply_bounds` a caller adds, e.g. the warm start's scripted episodes) is not trained",
    )
    max_family_share: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="a family's hint items at most this share of what a pass trains (the "
        "hint items and any replay draw trained with them): its longest hinted successes "
        "are dropped first; None: no cap (27 hinted tasks gave 31 data successes of 33)",
    )
    relabel_thoughts: bool = Field(
        False,
        description="sft: each trained reply's thought is the one the scripted solver writes "
        "before its tool ('Use the calculator.', 'Write a Python program.', the answer's); "
        "the light warm start picks its tool from its thought, and hinted it wrote 'Answer "
        "with the tool's result.' before 33 of 33 first calls: after sft-only 68 of 72 parsed "
        "held-out first replies opened with it (none before) and arithmetic called code_exe "
        "(27 of 30). Applied before the length check, which then bounds the reply as trained",
    )

    balance_openings: bool = Field(
        False,
        description="a pass's opening turns (the hint items' and any replay draw's first "
        "replies) weigh the same per tool, after the family balance "
        "(`tooluse_hints.balance_openings`): a pass's data items, 19 code_exe openings against "
        "arithmetic's 11 calculator ones, sent arithmetic to code_exe (2026-12-01)",
    )

    data_program: Literal["canonical", "shown"] | None = Field(
        None,
        description="how a hint's call writes a data program (`solver.DATA_PROGRAMS`): "
        "'shown' copies the table's header and cells in the order the question shows them; "
        "None: the solver's default (the canonical column order the warm start learned)",
    )

    @model_validator(mode="after")
    def _relabel_needs_sft(self) -> JobHints:
        if self.relabel_thoughts and self.mode != "sft":
            raise ValueError(
                "relabel_thoughts needs mode 'sft': a relabelled reply was not sampled, so "
                "its importance ratio or teacher advantage would mean nothing"
            )
        return self


@dataclass
class HintStep:
    """What the hint step found and will train: items and the counts the job reports."""

    items: list[TokenItem] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "hinted_tasks": 0,
            "hinted_successes": 0,
            "hinted_samples": 0,
            "corrections_used": 0,
            "hint_items": 0,
            "distilled_tasks": 0,
            "hint_too_long": 0,
            "hint_capped": 0,
            "hint_relabelled": 0,
        }
    )
    hints: dict[Key, str] = field(default_factory=dict)
    episodes: list[Any] = field(default_factory=list)  # the hinted resamples (importance, sft)
    # per family: what the checks kept of its hinted successes and the tools its items call
    # (`family_counts`); apart from `counts`, which a loop sums across jobs
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def pass_items(
        self, replay: Any = None, generator: Any = None, openings: bool = False
    ) -> list[TokenItem]:
        """One pass's items, family-balanced (`tooluse_hints.balance`): copies of the hint
        items and, with `replay` (a `tooluse_job_replay.JobReplay`), `replay.settings.steps`
        fresh family-balanced draws of its verified hint-free successes (ReLIFT's
        supervised steps interleaved: shuffled into the same batches); with `openings`,
        then the opening turns' weights balanced per tool (`balance_openings`)."""
        from agentrl.learners.tooluse_hints import balance, balance_openings

        items = [copy.copy(it) for it in self.items]
        if replay is not None and len(replay.replay) and replay.settings.on:
            for _ in range(replay.settings.steps):
                items += replay.draw(generator)
        items = balance(items)
        return balance_openings(items) if openings else items

    def train(
        self, trainer: Any, settings: JobHints, seed: int = 0, replay: Any = None
    ) -> dict[str, float]:
        """Train the items (after the job's own steps), `settings.epochs` passes of
        `pass_items` (with `replay`: its draws among them)."""
        import torch

        from agentrl.learners.tooluse_hints import train_items

        if not self.items:
            return {}
        gen = torch.Generator().manual_seed(seed)
        out: dict[str, float] = {}
        for _ in range(settings.epochs):
            items = self.pass_items(replay, gen, settings.balance_openings)
            out = train_items(trainer, items, settings.batch_size, settings.clip, gen)
        return out


def task_key(trajectory: dict[str, Any]) -> Key | None:
    """(family, seed) of a tool-use trajectory from its task context, None for another env."""
    ctx = trajectory.get("task_context") or {}
    env_id = str(ctx.get("env_id") or "")
    seed = ctx.get("seed")
    if not (env_id == "tooluse" or env_id.startswith("tooluse-")) or seed is None:
        return None
    if str((ctx.get("env_kwargs") or {}).get("pool") or "train") != "train":
        return None  # held-out pools are never trained on
    return (env_id.partition("-")[2] or "mixed", int(seed))


def succeeded(record: Any) -> bool:
    """The environment's verdict on the trajectory (its outcome), not the shaped reward."""
    meta = record.trajectory.get("metadata") or {}
    status = (meta.get("outcome") or {}).get("task_status")
    return status == "completed_successfully"


def pick_tasks(groups: dict[Key, list[Any]], limit: int) -> list[Key]:
    """At most `limit` of the failed tasks, the families in turn (first-seen order within
    a family): a job's first failed groups were mostly one family's, and the hinted
    families are the ones the policy fails most (data, numbers). A "mixed" task's family
    is the one its seed draws."""
    from agentrl.envs.tooluse.tasks import FAMILIES, generate_task

    by_family: dict[str, list[Key]] = {}
    for key in groups:
        fam = key[0] if key[0] in FAMILIES else generate_task(key[1], key[0]).family
        by_family.setdefault(fam, []).append(key)
    out: list[Key] = []
    queues = list(by_family.values())
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out


def failed_groups(records: Sequence[Any]) -> dict[Key, list[Any]]:
    """Tool-use tasks none of whose attempts succeeded, in first-seen order."""
    groups: dict[Key, list[Any]] = {}
    for r in records:
        key = task_key(r.trajectory)
        if key is not None:
            groups.setdefault(key, []).append(r)
    return {k: g for k, g in groups.items() if not any(succeeded(r) for r in g)}


def attempt_of(trajectory: dict[str, Any]) -> Attempt:
    """What the checker saw of one logged attempt."""
    answer, tools, error, cut = None, [], False, False
    for turn in trajectory.get("turns") or ():
        info = turn.get("step_info") or {}
        tool = info.get("tool_name")
        if tool == "response" and info.get("answer") is not None:
            answer = str(info["answer"])
        elif tool in ("calculator", "code_exe"):
            tools.append(str(tool))
        error = error or bool(info.get("tool_error"))
        lp = turn.get("logprobs") or {}
        cut = cut or (isinstance(lp, dict) and lp.get("finish_reason") == "length")
    return Attempt(answer=answer, tools=tuple(tools), tool_error=error, cut_by_token_cap=cut)


def turn_messages(
    trajectory: dict[str, Any], question: str, upto: int, hint: str | None = None
) -> list[dict[str, str]]:
    """The chat before turn `upto` as the agent saw it (Agent Zero's system prompt, the
    question, then each reply and the tool result that followed), the hint after the
    question when given."""
    from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT

    turns = trajectory.get("turns") or []
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": with_hint(question, hint)},
    ]
    for k in range(upto):
        messages.append({"role": "assistant", "content": reply_text(turns[k])})
        messages.append({"role": "user", "content": str(turns[k + 1]["observation"]["content"])})
    return messages


def reply_text(turn: dict[str, Any]) -> str:
    action = turn.get("action") or {}
    raw = action.get("raw_response")
    if raw:
        return str(raw)
    return json.dumps(
        {
            "thoughts": turn.get("thought_process") or [],
            "tool_name": action.get("tool_name"),
            "tool_args": action.get("tool_args") or {},
        }
    )


def action_ids(
    tokenizer: Any, turn: dict[str, Any], completions: dict[str, dict[str, Any]]
) -> list[int]:
    """The turn's logged tokens (the completion log's), else its text re-tokenised + EOS."""
    from agentrl.llm.samples import encode_action

    cid = (turn.get("action") or {}).get("completion_id")
    comp = completions.get(str(cid)) if cid else None
    if comp and comp.get("completion_token_ids"):
        return [int(x) for x in comp["completion_token_ids"]]
    return encode_action(tokenizer, reply_text(turn))


def distill_items_from_records(
    tokenizer: Any,
    groups: dict[Key, list[Any]],
    hints: dict[Key, str],
    questions: dict[Key, str],
    families: dict[Key, str],
    completions: dict[str, dict[str, Any]],
) -> list[TokenItem]:
    """The failed attempts' own turns: student prompt hint-free, teacher prompt with the
    hint (the same history), on the logged tokens."""
    from agentrl.llm.samples import render_prompt

    out = []
    for key, hint in hints.items():
        for r in groups[key]:
            turns = r.trajectory.get("turns") or []
            for k in range(len(turns)):
                ids = action_ids(tokenizer, turns[k], completions)
                if not ids:
                    continue
                q = questions[key]
                out.append(
                    TokenItem(
                        render_prompt(tokenizer, turn_messages(r.trajectory, q, k)),
                        ids,
                        families[key],
                        "distill",
                        hinted_prompt_ids=render_prompt(
                            tokenizer, turn_messages(r.trajectory, q, k, hint)
                        ),
                    )
                )
    return out


def play_config(s: JobHints, tasks: int, seed: int) -> Any:
    """How the hint step plays `tasks` hinted tasks: the job's turns, tokens and schema,
    `s.samples` resamples a task, at most `s.play_batch` episodes decoded together."""
    from agentrl.learners.tooluse import ToolUseConfig

    return ToolUseConfig(
        model="tiny",  # not loaded: the learner wraps the job's trainer
        max_steps=max(2, s.max_steps),
        max_new_tokens=s.max_new_tokens,
        structured=s.structured,
        threads=0,
        hints="distill" if s.mode == "distill" else "importance",
        hint_reveals_answer=s.reveal_answer,
        hint_plan=s.plan,
        hint_samples=s.samples,
        group_size=s.samples,
        temperature=s.temperature,
        batch_size=max(1, min(s.play_batch, s.samples * tasks)),
        seed=seed,
    )


def hint_step(
    trainer: Any,
    records: Sequence[Any],
    settings: JobHints | dict[str, Any],
    completions: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    hinted: Sequence[Any] | None = None,
    reply_bounds: dict[str, int] | None = None,
    other_items: dict[str, int] | None = None,
    timing: Any = None,
) -> HintStep:
    """Hints for the failed groups among `records` and the items they train (not trained
    yet: `HintStep.train`). Importance and sft modes sample with the trainer's current
    policy, unless `hinted` gives the resamples already played (a bench reusing them).
    The hinted successes trained pass the length check (`max_reply_tokens`, and with
    `family_bound` the family's longest verified reply: the records' and `reply_bounds`')
    and the family cap (`max_family_share`, counting `other_items`: the items per family
    a pass trains beside the hint items, e.g. a replay draw). `timing` (a `PlayTiming`):
    where the sampling's decode work is counted (a job's liveness)."""
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.learners.tooluse import ToolUseLearner
    from agentrl.learners.tooluse_hints import importance_items, sft_items

    t0 = time.perf_counter()
    s = settings if isinstance(settings, JobHints) else JobHints.model_validate(settings)
    step = HintStep()
    groups = failed_groups(records)
    keys = pick_tasks(groups, s.max_tasks)
    if not keys:
        return step
    learner = ToolUseLearner.from_trainer(trainer, play_config(s, len(keys), seed))
    if timing is not None:
        learner.timing = timing
    # users' corrections: the latest non-empty one of a task's trajectories is its hint
    learner.set_corrections({k: next((r.hint for r in groups[k] if r.hint), None) for k in keys})
    tasks = {k: generate_task(k[1], k[0]) for k in keys}
    for k in keys:
        correction = learner.corrections.get(k)
        step.counts["corrections_used"] += int(correction is not None)
        step.hints[k] = hint_for(
            tasks[k],
            [attempt_of(r.trajectory) for r in groups[k]],
            reveal_answer=s.reveal_answer,
            correction=correction,
            plan=s.plan,
            data_form=s.data_program,
        )
    step.counts["hinted_tasks"] = len(step.hints)
    families = {k: tasks[k].family for k in keys}
    if s.mode == "distill":
        questions = {k: tasks[k].question for k in keys}
        step.items = distill_items_from_records(
            learner.tokenizer, groups, step.hints, questions, families, completions or {}
        )
    else:
        if hinted is None:
            batch = [k for k in keys for _ in range(s.samples)]
            again = learner.play(batch, s.temperature, hints=[step.hints[k] for k in batch])
        else:
            again = [ep for ep in hinted if (ep.family, ep.seed) in step.hints]
        step.episodes = list(again)
        step.counts["hinted_samples"] = len(again)
        step.counts["hinted_successes"] = sum(ep.success for ep in again)
        bounds = dict(reply_bounds or {})
        if s.family_bound:
            own = verified_reply_bounds(records, completions or {}, learner.tokenizer)
            bounds = {f: max(bounds.get(f, 0), own.get(f, 0)) for f in {*bounds, *own}}
        else:
            bounds = {}
        trained = [ep for ep in again if ep.success and ep.hint]
        if s.relabel_thoughts:  # before the length check: the trained reply is what it bounds
            trained, step.counts["hint_relabelled"] = relabel_thoughts(trained, learner.tokenizer)
        short = [ep for ep in trained if fits(ep, s.max_reply_tokens, bounds)]
        step.counts["hint_too_long"] = len(trained) - len(short)
        kept = cap_share(short, s.max_family_share, other_items or {})
        step.counts["hint_capped"] = len(short) - len(kept)
        step.items = importance_items(kept) if s.mode == "importance" else sft_items(kept)
        for it, fam in zip(step.items, _families_of(kept, families), strict=True):
            it.family = fam
        step.by_family = family_counts(trained, short, kept, families)
        solved = {(ep.family, ep.seed) for ep in again if ep.success}
        unsolved = {k: step.hints[k] for k in keys if k not in solved}
        if s.fallback_distill and unsolved:  # no hinted success: the teacher's view instead
            questions = {k: tasks[k].question for k in unsolved}
            extra = distill_items_from_records(
                learner.tokenizer, groups, unsolved, questions, families, completions or {}
            )
            step.counts["distilled_tasks"] = len(unsolved)
            step.items += extra
    step.counts["hint_items"] = len(step.items)
    step.seconds = time.perf_counter() - t0
    return step


def _families_of(episodes: Sequence[Any], families: dict[Key, str]) -> list[str]:
    """Each importance item's concrete family (a "mixed" task's drawn family), in order."""
    out = []
    for ep in episodes:
        if not ep.success or not ep.hint:
            continue
        for t in ep.turns:
            if t.finish == "stop" and t.free_prompt_ids is not None:
                out.append(families.get((ep.family, ep.seed), ep.family))
    return out


def family_counts(
    trained: Sequence[Any], short: Sequence[Any], kept: Sequence[Any], families: dict[Key, str]
) -> dict[str, dict[str, int]]:
    """Per family, the hinted successes (`successes`), those the length check dropped
    (`too_long`) and the family cap dropped (`capped`), the items trained (`items`), and
    the trained items by tool (`calculator`, `code_exe`, `response`) and with the scripted
    solver's thought for that tool (`solver_thought`: the light warm start picks its tool
    from its thought). A pass balances each family's total weight, not what its items
    teach: a run that drifts says here which family's items, tools and thoughts it trained."""
    out: dict[str, dict[str, int]] = {}

    def row(ep: Any) -> dict[str, int]:
        fam = families.get((ep.family, ep.seed), ep.family)
        zero = {"successes": 0, "too_long": 0, "capped": 0, "items": 0, "solver_thought": 0}
        return out.setdefault(fam, zero)

    short_ids, kept_ids = {id(ep) for ep in short}, {id(ep) for ep in kept}
    for ep in trained:
        r = row(ep)
        r["successes"] += 1
        r["too_long"] += id(ep) not in short_ids
        r["capped"] += id(ep) in short_ids and id(ep) not in kept_ids
    for ep in kept:
        r = row(ep)
        for t in ep.turns:
            if t.finish == "stop" and t.free_prompt_ids is not None:  # an item (importance_items)
                r["items"] += 1
                tool = str(t.tool_name or "none")
                r[tool] = r.get(tool, 0) + 1
                r["solver_thought"] += _thoughts(t.text) == [solver_thought(tool)]
    return {f: out[f] for f in sorted(out)}


def solver_thought(tool: str | None) -> str | None:
    """The scripted solver's thought before a call of `tool` (`solver.THOUGHT_*`; None for
    another tool or none)."""
    from agentrl.envs.tooluse.solver import THOUGHT_ANSWER, THOUGHT_CALC, THOUGHT_CODE

    want = {"calculator": THOUGHT_CALC, "code_exe": THOUGHT_CODE, "response": THOUGHT_ANSWER}
    return want.get(tool or "")


def _thoughts(text: str) -> Any:
    """A reply's `thoughts` (None: not a JSON object)."""
    try:
        reply = json.loads(text)
    except ValueError:
        return None
    return reply.get("thoughts") if isinstance(reply, dict) else None


def longest_reply(episode: Any) -> int:
    """The most tokens of one finished reply of a (hinted) episode."""
    return max((len(t.action_ids) for t in episode.turns if t.finish == "stop"), default=0)


def fits(episode: Any, max_tokens: int | None, bounds: dict[str, int]) -> bool:
    """The length check of a hinted success: no reply over `max_tokens`, nor over its
    family's bound when it has one."""
    n = longest_reply(episode)
    if max_tokens is not None and n > max_tokens:
        return False
    bound = bounds.get(episode.family)
    return not bound or n <= bound


def verified_reply_bounds(
    records: Sequence[Any], completions: dict[str, dict[str, Any]], tokenizer: Any
) -> dict[str, int]:
    """Per family, the longest reply (tokens) of a verified, hint-free, uncorrected success
    among the records: what a solution of that family has been seen to need."""
    from agentrl.envs.tooluse.tasks import generate_task

    out: dict[str, int] = {}
    for r in records:
        key = task_key(r.trajectory)
        if key is None or not succeeded(r) or r.hint:
            continue
        task = generate_task(key[1], key[0])
        turns = r.trajectory.get("turns") or []
        first = (turns[0].get("observation") or {}).get("content") if turns else None
        if first != task.question:  # played with a hint in its prompt
            continue
        for turn in turns:
            lp = turn.get("logprobs") or {}
            if isinstance(lp, dict) and lp.get("finish_reason") == "length":
                continue
            n = len(action_ids(tokenizer, turn, completions))
            out[task.family] = max(out.get(task.family, 0), n)
    return out


def cap_share(episodes: Sequence[Any], share: float | None, others: dict[str, int]) -> list[Any]:
    """The hinted successes with each family's finished replies at most `share` of a pass's
    items (these and `others`, the items per family trained beside them); an over-share
    family loses its longest episodes first. Order kept. A lone family is left whole: there
    is nothing to balance it against."""
    if share is None:
        return list(episodes)

    def items(ep: Any) -> int:
        return sum(t.finish == "stop" for t in ep.turns)

    kept = list(episodes)
    while True:
        per: dict[str, int] = dict(others)
        for ep in kept:
            per[ep.family] = per.get(ep.family, 0) + items(ep)
        total = sum(per.values())
        over = [f for f, n in per.items() if n > share * total and n > others.get(f, 0)]
        if not over or len([n for n in per.values() if n]) < 2:  # nothing to balance against
            return kept
        family = max(over, key=lambda f: per[f])
        mine = [ep for ep in kept if ep.family == family]
        drop = max(mine, key=longest_reply)  # ties: the first seen
        kept = [ep for ep in kept if ep is not drop]


def relabel_thoughts(episodes: Sequence[Any], tokenizer: Any) -> tuple[list[Any], int]:
    """The episodes with every finished reply's thought the scripted solver's for its tool
    (`solver.THOUGHT_*`), the rest of the reply's tokens as sampled; -> (episodes, replies
    changed). A later turn's prompt still shows the earlier reply as it was sampled."""
    out, changed = [], 0
    for ep in episodes:
        turns = []
        for t in ep.turns:
            new = relabelled(t, tokenizer)
            changed += new is not None
            turns.append(new or t)
        out.append(dataclasses.replace(ep, turns=turns))
    return out, changed


def relabelled(turn: Any, tokenizer: Any) -> Any | None:
    """The turn with its reply's thought replaced by its tool's (None: already that thought,
    or not a finished reply in the schema's shape). The tokens after the thought are kept
    as sampled where a token boundary falls where the thought ends, else the whole reply is
    re-tokenised; the log-probs are dropped (these tokens were not sampled)."""
    thought = solver_thought(turn.tool_name)
    cut = turn.text.find(', "tool_name"')
    if thought is None or turn.finish != "stop" or turn.invalid or cut < 0:
        return None
    try:
        old = json.loads(turn.text)
    except ValueError:
        return None
    if not isinstance(old, dict) or old.get("thoughts") == [thought]:
        return None
    head = '{"thoughts": ' + json.dumps([thought], ensure_ascii=False)
    text = head + turn.text[cut:]
    if json.loads(text) != {**old, "thoughts": [thought]}:
        return None
    ids = list(turn.action_ids)
    k = 0  # the sampled tokens' boundary where the thought ends, if one falls there
    for j in range(1, len(ids)):
        shown = tokenizer.decode(ids[:j])
        if len(shown) >= cut:
            k = j if shown == turn.text[:cut] else 0
            break
    new_ids = tokenizer.encode(head, add_special_tokens=False) + ids[k:] if k else []
    if not k or tokenizer.decode(new_ids) != text:
        new_ids = tokenizer.encode(text, add_special_tokens=False)
    return dataclasses.replace(turn, text=text, action_ids=new_ids, logprobs=[])
