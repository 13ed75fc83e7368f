"""The loop's tool-use jobs replay verified successes (issue 52, item 4; ReLIFT,
arXiv 2506.07527): `training.jobs.TokenJob` builds a `JobReplay` from the trajectories it
read (`hyperparameters.tooluse_replay`) and after each RL epoch takes `steps` supervised
passes on a family-balanced draw of it (`tooluse_replay.Replay`).

What is replayed: the training-pool tool-use trajectories the environment verified as solved
(the outcome, not the shaped reward), whose prompt was the task's question alone (hint-free)
and that no user corrected; each finished reply on its hint-free prompt, with its logged
tokens. A job's hinted successes (importance mode) are not replayed: they train through the
importance ratio, toward the hint-free policy, never as plain NLL.

Why the job's own data and not a store of its own: a tool-use loop job reads the whole run
(its dataset window spans the run) and samples whole task groups from it, so every
generation's successes are there in proportion to the run; and a replay that lives and dies
with the job keeps nothing to be made consistent with the version a job continues (a
retried or failed job replays the same).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from agentrl.envs.tooluse.hints import HINT_PREFIX
from agentrl.learners.tooluse_hints import TokenItem
from agentrl.learners.tooluse_job import (
    action_ids,
    reply_text,
    succeeded,
    task_key,
    turn_messages,
)
from agentrl.learners.tooluse_replay import Replay, opening_counts


class JobReplaySettings(BaseModel):
    """`hyperparameters.tooluse_replay` of a job request (the loop's `loop_tooluse.job_replay`):
    after each RL epoch of the job, `steps` supervised passes, each on `episodes_per_family`
    verified successes of every family the replay holds."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(1, ge=0, description="supervised passes after each RL epoch; 0: off")
    episodes_per_family: int = Field(4, ge=0, description="episodes a family per pass; 0: off")
    capacity_per_family: int = Field(64, gt=0, description="the newest successes kept a family")
    batch_size: int = Field(8, gt=0)
    warm_tasks_per_family: int = Field(
        0,
        ge=0,
        description="the warm start's scripted tasks a family (`agentrl learn`'s warm seeds, "
        "verified by the environment) join the replay first; 0: the loop's own successes only",
    )
    max_steps: int = Field(4, ge=2, description="turns of a scripted warm-start episode")
    rounds: int = Field(
        0,
        ge=0,
        description="replay rounds a job takes (after its first `rounds` RL epochs); 0: after "
        "every epoch. Each round is forward and backward passes over whole multi-turn prompts: "
        "144 s a round on 2 cores at load 4-7 (2026-11-29)",
    )
    retries: bool = Field(
        False,
        description="also replay a retry after the first tool error of a failed, hint-free "
        "attempt: its turns up to the error's message as logged, then the scripted solver's "
        "call and its answer, played on in the environment and kept only when it verifies "
        "(`retry_items`). The warm start never saw a second call: after an error it answers "
        "at once. Off: successes only",
    )
    success_bar: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="replay only the families whose verified success among the job's "
        "tool-use trajectories is below this (a family the policy already solves gets its "
        "successes from the RL steps themselves); None: every family",
    )

    balance_openings: bool = Field(
        False,
        description="each pass opens as many episodes with the calculator as with code_exe "
        "(`Replay.sample`: episodes opening with the under-drawn tool added to the family "
        "draw). The start calls the tool its opening thought names, and a family-balanced "
        "pass opening more than twice as many episodes with code_exe (data's and numbers') "
        "as with the calculator sent arithmetic to code_exe (2026-12-01); off: the family "
        "draw alone",
    )

    data_program: Literal["canonical", "shown"] | None = Field(
        None,
        description="how the scripted episodes (the warm start's, a retry's call) write a data "
        "program (`solver.DATA_PROGRAMS`); None: the solver's default, the canonical column "
        "order the warm start learned",
    )

    @property
    def on(self) -> bool:
        return self.steps > 0 and self.episodes_per_family > 0


@dataclass
class JobReplay:
    """A job's replay of the verified, hint-free successes among the trajectories it read,
    and what it trained: `counts` go into the job's final status (`replayed`: replies
    trained by the replay's supervised steps, the unit `agentrl learn` reports)."""

    replay: Replay
    settings: JobReplaySettings
    generator: torch.Generator
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "replay_successes": 0,
            "replay_warm": 0,
            "replay_families": 0,
            "replay_families_solved": 0,
            "replay_updates": 0,
            "replayed": 0,
            "replay_retries": 0,
        }
    )
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    rounds_done: int = 0
    openings: dict[str, int] = field(default_factory=dict)  # opening turns trained, per tool

    def draw(self, generator: torch.Generator) -> list[TokenItem]:
        """One pass's draw (`settings.balance_openings`: balanced per opening tool), counted."""
        items = self.replay.sample(
            self.settings.episodes_per_family, generator, self.settings.balance_openings
        )
        self.counts["replayed"] += len(items)
        for tool, n in opening_counts(items).items():
            self.openings[tool] = self.openings.get(tool, 0) + n
        return items

    def train(self, trainer: Any) -> dict[str, float]:
        """One round (after an RL epoch): `steps` passes of plain NLL on fresh family-balanced
        draws. The replay's optimiser steps are not the job's steps: `global_step` (what the
        job's loop counts, resumes and names checkpoints by) is left as it was."""
        from agentrl.learners.tooluse_hints import train_items  # torch-heavy: on use

        if not len(self.replay) or not self.settings.on:
            return {}
        if self.settings.rounds and self.rounds_done >= self.settings.rounds:
            return {}
        self.rounds_done += 1
        t0 = time.perf_counter()
        step0 = trainer.global_step
        out: dict[str, float] = {}
        try:
            for _ in range(self.settings.steps):
                items = self.draw(self.generator)
                out = train_items(
                    trainer, items, self.settings.batch_size, generator=self.generator
                )
                self.counts["replay_updates"] += int(out.get("steps", 0))
        finally:
            trainer.global_step = step0
        self.seconds += time.perf_counter() - t0
        return out


def replay_of_records(
    tokenizer: Any,
    records: Sequence[Any],
    settings: JobReplaySettings | dict[str, Any],
    completions: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    max_length: int | None = None,
) -> JobReplay:
    """The job's replay: each training-pool tool-use trajectory the environment verified as
    solved (its outcome, not the shaped reward), newest last, whose first user message is
    the task's question alone (a trajectory played with a hint in its prompt is never
    replayed) and that no user corrected. Each finished turn is an NLL item: the turn's
    hint-free prompt re-rendered as the agent saw it (`tooluse_job.turn_messages`) and the
    logged tokens of the reply (the completion log's, else the text re-tokenised). With
    `warm_tasks_per_family`, the warm start's verified scripted episodes go in first. Past
    `max_length` the prompt keeps its newest tokens, as the job's RL samples do
    (`llm.samples.truncate`); a reply longer than that alone is left out. With
    `success_bar`, a family whose verified success among the records is at or above it is
    left out (`replay_families_solved`)."""
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.llm.samples import render_prompt

    t0 = time.perf_counter()
    s = settings if isinstance(settings, JobReplaySettings) else JobReplaySettings(**settings)
    job = JobReplay(Replay(s.capacity_per_family), s, torch.Generator().manual_seed(seed))

    def skip(why: str) -> None:
        job.skipped[why] = job.skipped.get(why, 0) + 1

    solved = solved_families(records, s.success_bar)
    job.counts["replay_families_solved"] = len(solved)
    if s.warm_tasks_per_family:  # first: the loop's own successes are the newest
        job.counts["replay_warm"] = add_warm_start(job.replay, tokenizer, s, max_length, solved)
    newest = sorted(records, key=lambda r: str(r.trajectory.get("end_timestamp") or ""))
    for r in newest:
        key = task_key(r.trajectory)
        if key is None:
            continue
        if not succeeded(r):
            if s.retries and generate_task(key[1], key[0]).family not in solved:
                _add_retry(job, r, tokenizer, s, max_length, skip)
            continue
        if generate_task(key[1], key[0]).family in solved:
            skip("family_solved")
            continue
        if r.hint:  # verified, yet a user said what it should have done: not a model answer
            skip("corrected")
            continue
        task = generate_task(key[1], key[0])
        turns = r.trajectory.get("turns") or []
        first = (turns[0].get("observation") or {}).get("content") if turns else None
        if first != task.question:  # a hint in the prompt it acted on, or another prompt
            # (redaction leaves the training questions alone: 0 of 1,200 changed, 2026-11-29)
            skip("not_hint_free" if HINT_PREFIX.strip() in str(first) else "other_prompt")
            continue
        items = []
        opening = None  # the first reply's tool, when that reply is kept
        for k, turn in enumerate(turns):
            lp = turn.get("logprobs") or {}
            if isinstance(lp, dict) and lp.get("finish_reason") == "length":
                continue  # a reply cut by the token cap is no one's example
            ids = action_ids(tokenizer, turn, completions or {})
            if not ids or (max_length is not None and len(ids) >= max_length):
                continue
            prompt = render_prompt(tokenizer, turn_messages(r.trajectory, task.question, k))
            item = TokenItem(prompt, ids, task.family)
            items.append(item if max_length is None else _fit(item, max_length))
            if k == 0:
                info = turn.get("step_info") or {}
                opening = info.get("tool_name") or (turn.get("action") or {}).get("tool_name")
        if not items:
            skip("no_reply")
            continue
        job.replay.add(task.family, items, "loop", opening)
        job.counts["replay_successes"] += 1
    job.counts["replay_families"] = len(job.replay.families())
    job.seconds = time.perf_counter() - t0
    return job


def _add_retry(
    job: JobReplay,
    record: Any,
    tokenizer: Any,
    s: JobReplaySettings,
    max_length: int | None,
    skip: Any,
) -> None:
    """A failed attempt's retry items into the replay (source "retry"), or why not."""
    if record.hint:
        skip("retry_corrected")
        return
    items, why = retry_items(tokenizer, record.trajectory, s.max_steps, s.data_program)
    if not items:
        if why:
            skip(why)
        return
    if max_length is not None:
        items = [_fit(it, max_length) for it in items if len(it.action_ids) < max_length]
    job.replay.add(items[0].family, items, "retry")
    job.counts["replay_retries"] += 1


def retry_items(
    tokenizer: Any, trajectory: dict[str, Any], max_steps: int, data_form: str | None = None
) -> tuple[list[TokenItem], str | None]:
    """A retry after the first tool error of a failed, hint-free tool-use attempt, as NLL
    items: the prompt is the attempt's own turns up to the error's message as logged
    (`turn_messages`: the state the policy reaches, its own error), the reply the scripted
    solver's call; then that call's result, as the environment shows it after the same
    steps, and the solver's answer. The attempt's turns are played again in the
    environment first, and the items kept only when the answer verifies; the erroneous
    turn is never an item. -> (items, None), or ([], why not: None for an attempt with no
    tool error)."""
    from agentrl.envs.tooluse import ToolUseEnv
    from agentrl.envs.tooluse.agent_prompt import tool_result_message
    from agentrl.envs.tooluse.solver import answer_reply, first_reply
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.llm.samples import encode_action, render_prompt

    key = task_key(trajectory)
    turns = trajectory.get("turns") or []
    err = next(
        (k for k, t in enumerate(turns) if (t.get("step_info") or {}).get("tool_error")), None
    )
    if key is None or err is None:
        return [], None
    task = generate_task(key[1], key[0])
    if (turns[0].get("observation") or {}).get("content") != task.question:
        return [], "retry_not_hint_free"
    if err + 1 >= len(turns):  # no logged message of the error: the episode ended there
        return [], "retry_no_steps_left"
    env = ToolUseEnv(family=key[0], max_steps=max_steps)  # "mixed" draws as it drew
    env.reset(key[1])
    for turn in turns[: err + 1]:
        _, _, done, _ = env.step(reply_text(turn))
        if done:
            return [], "retry_no_steps_left"
    call = first_reply(task, data_form)
    result, _, done, called = env.step(call)
    if done:  # out of steps after the call: no turn left to answer in
        return [], "retry_no_steps_left"
    answer = answer_reply(str(result["text"]))  # as `solver.solve_episode` reads it
    _, _, _, info = env.step(answer)
    if not info.get("success"):
        return [], "retry_unverified"
    before = turn_messages(trajectory, task.question, err + 1)
    after = [
        *before,
        {"role": "assistant", "content": call},
        tool_result_message(called.get("tool_name"), str(result["text"])),
    ]
    return [
        TokenItem(render_prompt(tokenizer, before), encode_action(tokenizer, call), task.family),
        TokenItem(render_prompt(tokenizer, after), encode_action(tokenizer, answer), task.family),
    ], None


def solved_families(records: Sequence[Any], bar: float | None) -> set[str]:
    """The families whose verified success among the records' training-pool tool-use
    trajectories is at or above `bar` (none when `bar` is None)."""
    from agentrl.envs.tooluse.tasks import generate_task

    if bar is None:
        return set()
    tally: dict[str, list[int]] = {}
    for r in records:
        key = task_key(r.trajectory)
        if key is None:
            continue
        won_n = tally.setdefault(generate_task(key[1], key[0]).family, [0, 0])
        won_n[0] += int(succeeded(r))
        won_n[1] += 1
    return {f for f, (won, n) in tally.items() if n and won / n >= bar}


def add_warm_start(
    replay: Replay,
    tokenizer: Any,
    settings: JobReplaySettings,
    max_length: int | None = None,
    leave_out: set[str] | frozenset[str] = frozenset(),
) -> int:
    """The warm start's scripted episodes (`agentrl learn`'s warm seeds: the first
    `warm_tasks_per_family` of each family, its question kinds in turn), only those the
    environment scored as solved, into `replay` as source "warm start"; how many."""
    from agentrl.envs.tooluse.tasks import FAMILIES, seeds_by_kind
    from agentrl.learners.tooluse import WARM_SEED_BASE, solved_episodes, solved_items

    n = settings.warm_tasks_per_family
    tasks = [(f, s) for f in FAMILIES for s in seeds_by_kind(f, n, WARM_SEED_BASE)]
    added = 0
    todo = [t for t in tasks if t[0] not in leave_out]
    for ep in solved_episodes(settings.max_steps, todo, settings.data_program):
        items = solved_items(tokenizer, ep)
        if max_length is not None:
            items = [_fit(it, max_length) for it in items if len(it.action_ids) < max_length]
        first = ep.turns[0].tool_name if items and len(items) == len(ep.turns) else None
        replay.add(ep.task.family, items, "warm start", first)
        added += int(bool(items))
    return added


def _fit(item: TokenItem, max_length: int) -> TokenItem:
    """The item with its prompt's newest tokens only, so prompt + reply fit `max_length`."""
    cut = max(0, len(item.prompt_ids) + len(item.action_ids) - max_length)
    return TokenItem(item.prompt_ids[cut:], item.action_ids, item.family)
