"""`agentrl loop --env tooluse`: what differs from the FrozenLake loop, in one place.

The agents are Agent Zero agents: the system prompt lists the tools (calculator, code_exe,
response) and the JSON reply format; each task is the user's question; each tool result
comes back as Agent Zero's JSON user message (`envs.tooluse.agent_prompt`). Every reply is
decoded through the gateway under the reply schema (structured outputs: one branch per
tool, `thoughts` one short item), so an invalid call cannot happen. The reward service
scores task completion plus partial credit per turn (`write_reward_config`); jobs train on
the logged tokens by GiGPO with PPO-clip against the masked distribution, hint the tasks
whose every attempt failed (`job_hints`), replay the verified successes after each RL epoch
(`job_replay`), and continue the newest version; validation plays benchmark tasks of each
family under the same schema; held-out tasks are balanced across the three families and
never trained on. The ablations at the same budget: `--hints off`, `--no-partial-credit`,
`--replay-steps 0`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.envs.tooluse.tasks import FAMILIES

ENV_ID = "tooluse"
# The gateway's decode batch (`AGENTRL_DEPLOY_MAX_BATCH_SIZE`) and the held-out episodes in
# flight. SmolLM2 with the light warm start on one torch thread, the same 32 first-turn
# tool-use replies (greedy, the reply schema, 24 tokens) at each batch, fresh prompts each
# (2026-11-29, load 11-15): 5.9 and 7.5 tokens/s at 8, 9.0 at 16, 11.6 at 32. Held-out runs
# alone at the end: 32 episodes in flight; the agents (16) and a canary fit in one batch.
SERVE_MAX_BATCH = 32
HELDOUT_IN_FLIGHT = 32
# validation's benchmark seeds: neither training (0, 1, ...) nor held-out (>= 1_000_000)
BENCHMARK_SEED = 500_000


def response_format() -> dict[str, Any]:
    """The OpenAI `response_format` the agents send: Agent Zero's reply, strict."""
    from agentrl.envs.tooluse.agent_prompt import response_schema

    return {
        "type": "json_schema",
        "json_schema": {"name": "agent_zero_reply", "schema": response_schema(), "strict": True},
    }


def task(seed: int, max_steps: int, family: str = "mixed", pool: str = "train") -> Any:
    """One tool-use task as an Agent Zero agent sees it: Agent Zero's system prompt lists the
    tools and the agent answers in its JSON under the reply schema; it sends no OpenAI
    `tools`. With them the gateway appended their JSON specs and a second reply format
    ({"name", "arguments"}) to the system prompt and allowed either format: 443 prompt tokens
    instead of 234 on the first turn, and not the prompt the warm start was trained on
    (`agent_prompt.messages_for`, what validation and `agentrl learn` send). `pool="unseen"`:
    the held-out pool of phrasings and kinds the training generator never produces."""
    from agentrl.core.episodes import Message
    from agentrl.envs.registry import task_for
    from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT

    env_id = ENV_ID if family == "mixed" else f"{ENV_ID}-{family}"
    kwargs: dict[str, Any] = {"view": "agent_zero"}
    if pool != "train":
        kwargs["pool"] = pool
    t = task_for(env_id, seed, max_episode_steps=max_steps, **kwargs)
    t.initial_messages = [Message(role="system", content=SYSTEM_PROMPT)]
    t.tool_specs = []
    return t


def heldout_tasks(n: int, offset: int, pool: str = "train") -> list[tuple[str, int]]:
    """`n` held-out (family, seed) pairs, the families in turn (balanced), each family's
    questions distinct (`tasks.distinct_seeds`)."""
    from agentrl.envs.tooluse.tasks import distinct_seeds

    per = -(-n // len(FAMILIES))
    seeds = {f: distinct_seeds(f, per, offset, pool) for f in FAMILIES}
    return [(FAMILIES[k % len(FAMILIES)], seeds[FAMILIES[k % len(FAMILIES)]][k // len(FAMILIES)])
            for k in range(n)]  # fmt: skip


def cut_by_token_cap(episode: Any) -> tuple[int, int]:
    """(replies cut by the token cap, replies) of one episode: the gateway's finish reason
    of each turn ("length": the reply hit max_tokens)."""
    reasons = [(s.policy_logprobs or {}).get("finish_reason") for s in episode.steps]
    return sum(r == "length" for r in reasons), len(reasons)


JOB_COUNTS = ("hinted_tasks", "hinted_successes", "corrections_used", "replayed")


def job_counts(statuses: dict[str, list[Any]], records: list[Any] | None = None) -> dict[str, int]:
    """What the jobs report of hints, users' corrections and replay (`replayed`: replies the
    replay's supervised steps trained) (their last status's metrics:
    `metrics.current.<key>`), summed over jobs; 0 where no job reports one. With `records`:
    only the jobs up to the last decided generation (started no later than the job of the
    newest version that is not a canary or candidate; none when no version was decided), so
    the figures describe the generations the run's result is about, not jobs that went on
    after it."""
    out = dict.fromkeys(JOB_COUNTS, 0)
    cutoff = _last_decided_start(statuses, records) if records is not None else None
    for evs in statuses.values():
        if not evs:
            continue
        if records is not None and (cutoff is None or evs[0].timestamp > cutoff):
            continue
        current = evs[-1].metrics.current
        extra = {**(getattr(current, "model_extra", None) or {})}
        for key in JOB_COUNTS:
            value = extra.get(key, getattr(current, key, None))
            if isinstance(value, (int, float)):
                out[key] += int(value)
    return out


def _last_decided_start(statuses: dict[str, list[Any]], records: list[Any]) -> Any:
    """The first status's time of the newest decided generation's job, or None."""
    decided = [
        r
        for r in records
        if r.training_job_id
        and r.state not in ("canary", "candidate")
        and statuses.get(r.training_job_id)
    ]
    if not decided:
        return None
    last = max(decided, key=lambda r: r.version)
    return statuses[last.training_job_id][0].timestamp


def generation_walls(records: list[Any], statuses: dict[str, list[Any]]) -> list[float]:
    """Seconds from each promoted generation's trigger (its job's first status) to its
    promotion, in version order."""
    out = []
    for r in sorted(records, key=lambda r: r.version):
        evs = statuses.get(r.training_job_id or "")
        promoted = [d.at for d in r.decisions if d.action == "promote"]
        if evs and promoted:
            out.append((promoted[-1] - evs[0].timestamp).total_seconds())
    return out


def environment(cfg: Any) -> dict[str, str]:
    """The services' settings for the tool-use loop (on top of the loop's shared ones)."""
    from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT

    families = {
        "tool_usage": [f"{ENV_ID}-arithmetic"],
        "data_analysis": [f"{ENV_ID}-data"],
        "code_generation": [f"{ENV_ID}-numbers"],
    }
    hyper: dict[str, Any] = {
        "objective": cfg.objective,
        "min_reward": cfg.min_reward,
        "awr_beta": 0.5,
        # advantages as large as the reward differences behind them (Dr. GRPO), not divided
        # by each group's std: a group of failures that differ by a little partial credit
        # got advantages as large as a success's (`training.samples.ADVANTAGE_SCALES`)
        "advantage_scale": "none",
        # constrained completions train against the masked distribution they came from
        "constraints": [{"response_format": response_format()}] if cfg.structured else [],
        # hints for the task groups whose every attempt failed (`learners.tooluse_job`)
        "tooluse_hints": job_hints(cfg),
        # supervised passes on the verified successes after each RL epoch (`tooluse_replay`)
        "tooluse_replay": job_replay(cfg),
    }
    env = {
        "AGENTRL_TRAINING_HYPERPARAMETERS": json.dumps(hyper),
        "AGENTRL_TRAINING_MAX_LENGTH": "1024",
        # a job reads the whole run, not the FrozenLake loop's last 5 minutes: at 4-7
        # episodes a minute a threshold's trajectories span more than that, and the window
        # left the ablation's first job 11 of its 32 (none rewarded: the job failed,
        # 2026-11-28); the tool-use streams hold hundreds of trajectories, not thousands
        "AGENTRL_TRAINING_DATASET_WINDOW_S": str(int(cfg.time_budget_s + cfg.grace_s + 600)),
        "AGENTRL_TRAINING_BATCH_SIZE": "8",
        # whole GiGPO groups: a sample of `threshold` of the run's trajectories split most
        # groups of `task_repeats` attempts into single attempts (no group, no step groups)
        "AGENTRL_TRAINING_SAMPLE_SIZE": str(max(cfg.threshold, 1) * 4),
        "AGENTRL_TRAINING_ADVANTAGE_ESTIMATOR": "gigpo",
        "AGENTRL_DEPLOY_BENCHMARK_TASKS": json.dumps(families),
        "AGENTRL_DEPLOY_BENCHMARK_ENV_KWARGS": json.dumps(
            {env: {"view": "agent_zero"} for envs in families.values() for env in envs}
        ),
        "AGENTRL_DEPLOY_BENCHMARK_SYSTEM_PROMPT": SYSTEM_PROMPT,
        "AGENTRL_DEPLOY_BENCHMARK_VALID_ACTIONS": "false",
        "AGENTRL_DEPLOY_BENCHMARK_RESPONSE_FORMAT": json.dumps(response_format()),
        "AGENTRL_DEPLOY_BENCHMARK_MAX_TOKENS": str(cfg.max_tokens),
        "AGENTRL_DEPLOY_BENCHMARK_SEED": str(BENCHMARK_SEED),
        # the start version (a warm start: live, never validated) is benchmarked while the
        # agents act, not beside the first candidate after its trigger (24 episodes and two
        # safety suites instead of 12 and one: 64 s against 31 s alone, load 3, 2026-12-01)
        "AGENTRL_DEPLOY_BENCHMARK_LIVE_EARLY": "true",
        # the canary's reward check on the scale these rewards have (task completion: 0 or
        # 1), not the deploy default's [-1, 1], which doubled its worst-case spread. In 200
        # simulated canaries (sessions of 4 episodes), two equal versions at the loop's 0.35
        # passed 3 times at 8 sessions a side and 110 at 16 (on [0, 1]: 36 and 148); a
        # broken version (0 against 0.85) failed 0 and 159 times (on [0, 1]: 65 and 196)
        "AGENTRL_DEPLOY_REWARD_RANGE": "[0.0, 1.0]",
        "AGENTRL_DEPLOY_MAX_BATCH_SIZE": str(SERVE_MAX_BATCH),
        # a batch of 256-token replies of SmolLM2 takes about a minute on 2 busy cores: the
        # default 60 s made every queued request time out and be retried (measured)
        "AGENTRL_DEPLOY_BACKEND_TIMEOUT_S": "600",
        "AGENTRL_DEPLOY_VALIDATION_MAX_NEW_TOKENS": "12" if cfg.model == "tiny" else "32",
    }
    if not cfg.structured:  # the ablation: free text everywhere, validation included
        del env["AGENTRL_DEPLOY_BENCHMARK_RESPONSE_FORMAT"]
        env["AGENTRL_DEPLOY_VALIDATION_MAX_NEW_TOKENS"] = str(cfg.max_tokens)
    return env


PARTIAL_CREDIT_CAP = 0.5  # the most a failure earns: half of what success adds


def write_reward_config(data_dir: Path, partial_credit: bool = True) -> Path:
    """Task completion (1 for a right final answer) plus, for a failure, partial credit per
    turn (`partial_credit: {cap: 0.5}`: a failure earns at most 0.5, on the turns that
    earned it); `partial_credit=False` is the ablation (0 or 1)."""
    path = Path(data_dir) / "rewards.yaml"
    text = (
        "weights: {task_completion: 1.0, efficiency: 0.0, code_quality: 0.0, user_feedback: 0.0}\n"
    )
    if partial_credit:
        text += f"partial_credit: {{cap: {PARTIAL_CREDIT_CAP}}}\n"
    path.write_text(text)
    return path


def job_hints(cfg: Any) -> dict[str, Any] | None:
    """The jobs' hint settings (`learners.tooluse_job.JobHints`), None when off.

    The loop's default is `importance` (`LoopConfig.hints` says why): it samples again
    inside the job with the hint, at `hint_temperature` (0.3: 4 of 21 hinted successes where
    the acting temperature 1.0 found 1), and trains only on hinted successes; `distill` trains
    on every failed attempt's own logged tokens (forward passes only)."""
    mode = getattr(cfg, "hints", "importance")
    if mode == "off":
        return None
    return {
        "mode": mode,
        "reveal_answer": bool(getattr(cfg, "hint_reveals_answer", False)),
        "plan": bool(getattr(cfg, "hint_plan", True)),
        "max_steps": cfg.max_steps,
        "max_new_tokens": cfg.max_tokens,
        "temperature": getattr(cfg, "hint_temperature", None) or cfg.temperature,
        "structured": cfg.structured,
        "max_tasks": int(getattr(cfg, "hint_tasks", 8)),
        "samples": int(getattr(cfg, "hint_samples", 4)),
        "balance_openings": bool(getattr(cfg, "balance_openings", False)),
        "data_program": getattr(cfg, "data_program", None),
    }


REPLAY_ROUNDS = 1
REPLAY_SUCCESS_BAR = 0.5


def job_replay(cfg: Any) -> dict[str, Any] | None:
    """The jobs' replay settings (`learners.tooluse_job_replay.JobReplaySettings`), None when off
    (`--replay-steps 0`, or `replay_episodes_per_family=0`: the ablation)."""
    steps = int(getattr(cfg, "replay_steps", 0))
    per_family = int(getattr(cfg, "replay_episodes_per_family", 0))
    if steps <= 0 or per_family <= 0:
        return None
    # one round a job (after its first RL epoch), on the families below half solved: a round
    # is forward and backward passes over whole multi-turn prompts (144 s at load 4-7, after
    # each of 2 epochs), and a family the policy solves gets its successes from the RL steps
    out: dict[str, Any] = {
        "steps": steps,
        "episodes_per_family": per_family,
        "rounds": REPLAY_ROUNDS,
        "success_bar": REPLAY_SUCCESS_BAR,
    }
    warm = int(getattr(cfg, "replay_warm_tasks_per_family", 0))
    if warm > 0:  # the warm start's verified scripted episodes join it
        out.update(warm_tasks_per_family=warm, max_steps=max(2, cfg.max_steps))
    if getattr(cfg, "balance_openings", False):  # as many calculator openings as code_exe
        out["balance_openings"] = True
    if getattr(cfg, "data_program", None):  # the scripted data programs' form
        out["data_program"] = cfg.data_program
    return out


def start_data_program(checkpoint: str | Path | None) -> str | None:
    """The form of the data programs a warm start learned (`solver.DATA_PROGRAMS`), as
    `agentrl learn` records it in the checkpoint's metrics.json (`ToolUseLearner.save`);
    None where it is not recorded (a checkpoint from before s34 learned the canonical form,
    a loop job's) or the checkpoint is not a local folder."""
    from agentrl.envs.tooluse.solver import DATA_PROGRAMS

    if not checkpoint:
        return None
    path = Path(checkpoint) / "metrics.json"
    try:
        form = json.loads(path.read_text()).get("data_program")
    except (OSError, ValueError, AttributeError):
        return None
    return form if form in DATA_PROGRAMS else None


def data_program_line(cfg: Any) -> str:
    """The config print's line on the data programs' form: the jobs' hints and replay write
    them so, and whether the warm start learned that form."""
    from agentrl.envs.tooluse.solver import DATA_PROGRAM

    form = getattr(cfg, "data_program", None) or DATA_PROGRAM
    start = start_data_program(getattr(cfg, "init_checkpoint", None))
    line = f"data programs: the jobs' hints and replay write the {form} form"
    if not getattr(cfg, "init_checkpoint", None):
        return line
    if start is None:
        return line + " (the warm start does not record its form: canonical before s34)"
    if start == form:
        return line + f" (the warm start's, {Path(str(cfg.init_checkpoint)) / 'metrics.json'})"
    return line + f" (set here; the warm start learned the {start} form)"


def policy_kwargs(cfg: Any, session: str | None) -> dict[str, Any]:
    """What the agents' OpenAI policy sends besides the messages."""
    body: dict[str, Any] = {"response_format": response_format()} if cfg.structured else {}
    if session:
        body["episode_id"] = session
    return {"max_tokens": cfg.max_tokens, "guided_choice": None, "extra_body": body or None}
