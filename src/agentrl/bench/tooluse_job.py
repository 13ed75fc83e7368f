"""A fixed harness for the tool-use loop's training job (issue 52): one start checkpoint, one
set of logged episodes (sampled once, saved, reused), one job update per named variant, and
the same greedy held-out before and after, per family with Wilson intervals, plus cheap
diagnostics of the update (KL(new || old) on held-out prompts, mean |ratio - 1| and the clip
fraction at the first step, answer rate, tool calls, replies cut by the token cap, and per
family why the failed held-out episodes failed: `evaluation.tooluse_failures`).

    python -m agentrl.bench.tooluse_job --start runs/tooluse-light/checkpoints/warmstart \\
        --out runs/tooluse-job --variant job --variant lr1e-4

The update is the loop job's own path: the episodes become trajectories shaped as
`rollout.convert` writes the tool-use environment's, scored by the reward service's
calculator with the loop's reward config (task completion + partial credit per turn,
`loop_tooluse.write_reward_config`), with a completion log of their exact tokens, masked
behaviour log-probs and schema hash; `training.samples.build_samples` (GiGPO, the grammar
rebuilt from the loop's response_format) and `training.objectives.shape_samples` make the
samples; a `PolicyTrainer` with the job's settings (`training.jobs.trainer_config`: batch 8,
clip 0.2, the loop's learning rate and epochs) trains them in the job's order. The policy
is loaded as a job loads it (`jobs.continue_from`: the start's adapters into a fresh LoRA).
Variants change the RL update, or add the job's hint step (`learners.tooluse_job`, as
`hyperparameters.tooluse_hints` runs it): hints for the logged tasks whose every attempt
failed, hinted resamples by the start (sampled once, saved to `hinted.jsonl`, reused by
every hint variant), and the hint items trained after the RL steps (`hint-importance`,
`hint-sft`: the hinted successes' tokens on the hint-free prompt with the importance weight
or as plain NLL; `hint-distill`: the hinted model as teacher on the failed attempts' own
tokens). `replay-*` variants shuffle the job's replay (`learners.tooluse_job_replay`: the
logged episodes' verified successes and the warm start's scripted episodes, family-balanced)
into the hint step's passes, and a checked variant trains only hinted successes no longer
than its family's longest verified reply, no family over half a pass (`JobHints`'
`family_bound`, `max_family_share`). Variants with the same RL settings share the RL update (saved once per settings
in `rl-*.pt`): it is deterministic on CPU from the same seed, and it was most of a
variant's time.

    python -m agentrl.bench.tooluse_job ... --stage rl --variant job   # the RL update only
    python -m agentrl.bench.tooluse_job ... --stage hints              # hinted resamples only
    python -m agentrl.bench.tooluse_job ... --stage after --variant X  # beside the one that
                                                                       # plays the held-out before

A variant with `data_program` (`solver.DATA_PROGRAMS`) writes the data programs of its hints'
calls and its replay's scripted episodes in that form (its hinted resamples saved apart, in
`hinted-<form>.jsonl`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    # the loop job now (`loop_job_settings`: pg, 2 epochs, lr 2e-4, GiGPO, partial credit,
    # advantages not divided by the group's std, adapters on the start's layers)
    "job": {},
    # the loop job before issue 52's fixes of session 20: adapters on every layer, std scale
    "old": {"all_layers": True, "advantage_scale": "std", "learning_rate": 5e-4},
    "lr5e-4": {"learning_rate": 5e-4},
    "std": {"advantage_scale": "std"},
    "all-layers": {"all_layers": True},
    "lr1e-4": {"learning_rate": 1e-4},
    "epochs1": {"epochs": 1},
    "no-partial-credit": {"partial_credit": False},
    "grpo": {"estimator": "grpo"},
    "success-only": {"success_only_groups": True},
    # the job's hint step after its RL steps (`learners.tooluse_job.JobHints.mode`)
    "hint-importance": {"hints": "importance"},
    "hint-sft": {"hints": "sft"},
    "hint-distill": {"hints": "distill"},
    "hint-sft-x3": {"hints": "sft", "hint_epochs": 3},  # three passes over the hint items
    # the hint step alone (no RL step: what the hint items do by themselves)
    "sft-only": {"hints": "sft", "rl": False},
    "importance-only": {"hints": "importance", "rl": False},
    # expert iteration: after the hint items are trained, the updated model is hinted again
    # on the same failed tasks and its hinted successes trained (one more round)
    "sft-only-r2": {"hints": "sft", "rl": False, "hint_rounds": 2},
    "hint-sft-r2": {"hints": "sft", "hint_rounds": 2},
    # the hint step with the job's replay (`tooluse_job_replay`: the logged episodes' verified
    # successes and the warm start's scripted episodes, family-balanced) shuffled into its
    # passes, and the hint items' length check (a reply no longer than the longest verified
    # reply of its family) and family cap (no family over half a pass); no RL step
    "replay-sft": {"hints": "sft", "rl": False, "replay": True, "checked": True},
    "replay-importance": {"hints": "importance", "rl": False, "replay": True, "checked": True},
    "replay-sft-unchecked": {"hints": "sft", "rl": False, "replay": True},  # no check, no cap
    "checked-sft": {"hints": "sft", "rl": False, "checked": True},  # no replay
    "replay-only": {"rl": False, "replay": True},  # the replay's passes alone, no hint items
    # the replay's passes balanced per tool of the opening turn (`JobReplaySettings.
    # balance_openings`): as many episodes opening with the calculator as with code_exe a pass
    "replay-tool-balanced": {"rl": False, "replay": True, "balance_openings": True},
    # the best variant with a retry after each failed logged attempt's first tool error in its
    # replay (`JobReplaySettings.retries`: the attempt's turns up to the error, then the
    # solver's call and answer, verified): the start answers at once after an error
    "replay-retry-importance": {
        "hints": "importance",
        "rl": False,
        "replay": True,
        "checked": True,
        "retries": True,
    },
    # sft with each trained reply's thought the scripted solver's for its tool (`JobHints.
    # relabel_thoughts`): hinted, the start wrote "Answer with the tool's result." before its
    # first call, and sft-only then sent arithmetic to code_exe after that thought
    "sft-relabel": {"hints": "sft", "rl": False, "relabel": True},
    "replay-sft-relabel": {
        "hints": "sft",
        "rl": False,
        "replay": True,
        "checked": True,
        "relabel": True,
    },
    "replay-sft-relabel-tool-balanced": {
        "hints": "sft",
        "rl": False,
        "replay": True,
        "checked": True,
        "relabel": True,
        "balance_openings": True,
    },
    # the hint items (sft) and the replay balanced per opening tool, the data programs of the
    # hints' calls and the replay's scripted episodes in the solver's "shown" form (the header
    # and cells in the question's order, read by column name: `solver.data_program`), and
    # its control in the canonical form the warm start learned (issue 52, s33)
    "replay-sft-balanced": {
        "hints": "sft",
        "rl": False,
        "replay": True,
        "checked": True,
        "balance_openings": True,
    },
    "replay-sft-balanced-shown": {
        "hints": "sft",
        "rl": False,
        "replay": True,
        "checked": True,
        "balance_openings": True,
        "data_program": "shown",
    },
}

# the harness's replay (`JobReplaySettings`): per hint pass 2 draws of 4 verified successes a
# family, the warm start's first 4 scripted tasks a family among them
REPLAY = {"steps": 2, "episodes_per_family": 4, "warm_tasks_per_family": 4, "max_steps": 4}
FAMILY_SHARE = 0.5  # a checked variant's cap: no family over half of what a pass trains


def loop_job_settings() -> dict[str, Any]:
    """What `agentrl loop --env tooluse` gives its jobs (`loop_config`, `loop_tooluse`)."""
    from agentrl.app.loop_config import LoopConfig, loop_environment

    cfg = LoopConfig.tooluse()
    env = loop_environment(cfg)
    hyper = json.loads(env["AGENTRL_TRAINING_HYPERPARAMETERS"])
    return {
        "learning_rate": float(env["AGENTRL_TRAINING_LEARNING_RATE"]),
        "epochs": int(env["AGENTRL_TRAINING_EPOCHS"]),
        "estimator": env["AGENTRL_TRAINING_ADVANTAGE_ESTIMATOR"],
        "advantage_scale": str(hyper.get("advantage_scale", "std")),
    }


@dataclasses.dataclass
class Settings:
    start: str
    out: str
    train_per_family: int = 9
    group: int = 4
    heldout_per_family: int = 30
    max_steps: int = 4
    max_new_tokens: int = 256
    batch: int = 32
    threads: int = 1
    seed: int = 0
    hint_tasks: int = 18  # failed logged tasks hinted (JobHints.max_tasks), families in turn
    hint_samples: int = 3  # hinted resamples per task (JobHints.samples)
    hint_temperature: float | None = None  # JobHints.temperature (None: the loop's, 1.0)
    # more failed tasks for the hint step only (not the RL update): per family of
    # `hint_extra_families`, played hint-free `hint_extra_group` times at T=1 and logged
    hint_extra_per_family: int = 0
    hint_extra_families: tuple[str, ...] = ("data",)
    hint_extra_group: int = 2


# -- episodes on disk -------------------------------------------------------------------------


def save_episodes(path: Path, episodes: Sequence[Any]) -> None:
    with path.open("w") as fh:
        for ep in episodes:
            fh.write(json.dumps(dataclasses.asdict(ep)) + "\n")


def save_atomically(path: Path, episodes: Sequence[Any]) -> None:
    """Whole or not at all: another run of the harness may be waiting to copy the file."""
    tmp = path.with_suffix(".tmp")
    save_episodes(tmp, episodes)
    tmp.rename(path)


def load_episodes(path: Path) -> list[Any]:
    from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        turns = [TurnRecord(**t) for t in d.pop("turns")]
        out.append(EpisodeRecord(**d, turns=turns))
    return out


# -- episodes -> the job's records ------------------------------------------------------------


def trajectory_of(ep: Any, tid: str, answer: Any) -> dict[str, Any]:
    """The episode as `rollout.convert` writes a tool-use trajectory (the env's info in
    `step_info`, the answer in `task_context.ground_truth`), with its completion ids. A
    tool's result is the observation as the agent saw it: Agent Zero's user message
    (`agent_prompt.tool_result_message`, the env's `agent_zero` view), so a turn's prompt
    rebuilt from the trajectory (`tooluse_job.turn_messages`: the replay, distillation) is
    the prompt it was sampled from; with the bare result every prompt after a tool call
    differed (37 of 73 turns of the saved logged episodes)."""
    from agentrl.envs.tooluse.agent_prompt import tool_result_message

    turns = []
    for k, t in enumerate(ep.turns):
        prev = ep.turns[k - 1] if k else None
        obs = (
            ep.question
            if prev is None
            else tool_result_message(prev.tool_name, str(prev.result))["content"]
        )
        if t.tool_name == "response" and not t.invalid:
            action = {
                "type": "response",
                "tool_name": "response",
                "tool_args": {"text": t.answer or ""},
            }
        elif t.tool_name and not t.invalid:
            action = {"type": "tool_call", "tool_name": t.tool_name, "tool_args": {}}
        else:
            action = {"type": "response", "tool_args": {"text": t.text}}
        action["raw_response"] = t.text
        action["completion_id"] = f"{tid}-{k}"
        turns.append(
            {
                "turn_id": k + 1,
                "timestamp": f"2026-01-01T00:00:{k:02d}Z",
                "observation": {
                    "type": "user_message" if k == 0 else "tool_result",
                    "content": obs,
                },
                "action": action,
                "result": {
                    "success": not t.invalid,
                    "output": t.result or "",
                    "error": "invalid action" if t.invalid else None,
                },
                "step_info": {
                    "invalid_action": t.invalid,
                    "tool_name": t.tool_name,
                    "tool_error": t.tool_error,
                    "answer": t.answer,
                },
                "logprobs": {"finish_reason": t.finish},
            }
        )
    env_id = f"tooluse-{ep.family}"
    return {
        "trajectory_id": tid,
        "session_id": tid,
        "agent_id": "a",
        "start_timestamp": "2026-01-01T00:00:00Z",
        "end_timestamp": "2026-01-01T00:01:00Z",
        "turns": turns,
        "task_context": {
            "task_id": f"{env_id}-{ep.seed}",
            "instructions": ep.question,
            "env_id": env_id,
            "seed": ep.seed,
            "ground_truth": answer,
            "domain": "general",
        },
        "metadata": {
            "model": "m",
            "outcome": {
                "task_status": "completed_successfully" if ep.success else "failed",
                "completion_percentage": 1.0 if ep.success else 0.0,
            },
        },
    }


def records_of(
    episodes: Sequence[Any], schema_hash: str, partial_credit: bool = True
) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """The job's records (trajectory + the reward service's reward) and completion log."""
    from agentrl.contracts.trajectory import TrajectoryEvent
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.rewards import RewardConfig, ScoringInput, score_batch
    from agentrl.rewards.window import WindowState
    from agentrl.training.dataset import Record

    text = "weights: {task_completion: 1.0, efficiency: 0.0, code_quality: 0.0, user_feedback: 0.0}"
    import yaml

    cfg_d = yaml.safe_load(text)
    if partial_credit:
        from agentrl.app.loop_tooluse import PARTIAL_CREDIT_CAP

        cfg_d["partial_credit"] = {"cap": PARTIAL_CREDIT_CAP}
    config = RewardConfig(**cfg_d)
    trajs, completions = [], {}
    for i, ep in enumerate(episodes):
        tid = f"t{i:05d}"
        trajs.append(trajectory_of(ep, tid, generate_task(ep.seed, ep.family).answer))
        for k, t in enumerate(ep.turns):
            completions[f"{tid}-{k}"] = {
                "prompt_token_ids": list(t.prompt_ids),
                "completion_token_ids": list(t.action_ids),
                "completion_logprobs": list(t.logprobs),
                "constrained": True,
                "schema_hash": schema_hash,
                "finish_reason": t.finish,
            }
    items = [ScoringInput(TrajectoryEvent.model_validate(t)) for t in trajs]
    scored, _ = score_batch(items, WindowState(config.window, config.efficiency_window), config)
    records = [Record(t, json.loads(s.to_json())) for t, s in zip(trajs, scored, strict=True)]
    return records, completions


# -- the job's trainer and update -------------------------------------------------------------


def job_trainer(
    start: str, lr: float, seed: int, max_length: int = 1024, all_layers: bool = False
) -> Any:
    """A PolicyTrainer as a loop job builds one (`jobs.trainer_config` + `continue_from`)."""
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer
    from agentrl.training.jobs import continue_from, init_lora_shape

    kw: dict[str, Any] = {
        "algorithm": "grpo",
        "model": "smollm2",
        "learning_rate": lr,
        "batch_size": 8,
        "epochs": 1,
        "clip_epsilon": 0.2,
        "max_length": max_length,
        "skip_zero_advantage": False,
        "seed": seed,
        "lora_r": 16,
        "kl_coef": 0.0,
        "policy_loss": "ppo_clip",
        "storage_path": "/tmp/agentrl-toolusejob",
    }
    shape = init_lora_shape(start)
    if all_layers:  # what a job did before it read the start's layers
        shape.pop("lora_layers", None)
    config = TrainerConfig(**{**kw, **shape})
    trainer = PolicyTrainer.from_config(config, None)
    continue_from(trainer, start)
    return trainer


def response_format_hash(tokenizer: Any) -> tuple[Any, str]:
    from agentrl.app.loop_tooluse import response_format
    from agentrl.training.masks import GrammarBook

    book = GrammarBook.from_requests(tokenizer, len(tokenizer), [])
    key = book.add_request({"response_format": response_format()})
    assert key is not None
    return book, key


def job_samples(
    trainer: Any,
    records: list[Any],
    completions: dict[str, Any],
    book: Any,
    estimator: str,
    advantage_scale: str = "std",
) -> tuple[list[Any], Any]:
    from agentrl.training.objectives import shape_samples
    from agentrl.training.samples import build_samples

    samples, stats = build_samples(
        records,
        trainer.policy.tokenizer,
        estimator=estimator,
        completions=completions,
        grammars=book,
        advantage_scale=advantage_scale,
    )
    from agentrl.llm.samples import truncate

    kept = []
    for s in shape_samples(samples, "pg"):
        try:
            kept.append(truncate(s, trainer.config.max_length))
        except ValueError:
            continue
    return kept, stats


def first_ratios(trainer: Any, samples: list[Any]) -> dict[str, float]:
    """|ratio - 1| of the policy before any step against the logged (masked) log-probs: 0
    when the job scores the behaviour's own tokens as they were sampled."""
    import torch

    from agentrl.llm.forward import run_head
    from agentrl.llm.samples import make_microbatches

    devs, n = [], 0
    was = trainer.module.training
    trainer.module.eval()
    with torch.no_grad():
        for mb in make_microbatches(samples, trainer.config.micro_batch_tokens, trainer.pad_id):
            out = run_head(trainer.module, mb, trainer.device)
            old = mb.cat_token_field("old_logprobs")
            if old is None:
                continue
            d = (out["logp"].float() - old.float()).exp() - 1
            devs.append(d.abs())
            n += int(d.numel())
    trainer.module.train(was)
    if not devs:
        return {"ratio_dev_mean": math.nan, "ratio_dev_max": math.nan, "ratio_tokens": 0}
    allv = torch.cat(devs)
    return {
        "ratio_dev_mean": float(allv.mean()),
        "ratio_dev_max": float(allv.max()),
        "ratio_tokens": n,
    }


def job_update(trainer: Any, units: list[Any], epochs: int, seed: int) -> list[dict[str, float]]:
    """`TokenJob.train`'s loop: a permutation per epoch, batches of the trainer's size."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batch = trainer.config.batch_size
    per_epoch = math.ceil(len(units) / batch)
    history = []
    for _ in range(epochs):
        order = rng.permutation(len(units))
        for b in range(per_epoch):
            chunk = [units[i] for i in order[b * batch : (b + 1) * batch]]
            metrics = trainer.train_on_samples(chunk, allow_empty=True)
            if metrics:
                history.append(metrics[-1])
    return history


def hint_settings(settings: Settings, mode: str, data_program: str | None = None) -> Any:
    """The job's hint settings as the loop sends them (`loop_tooluse.job_hints`), with the
    harness's number of hinted tasks and resamples."""
    from agentrl.app.loop_config import LoopConfig
    from agentrl.app.loop_tooluse import job_hints
    from agentrl.learners.tooluse_job import JobHints

    d = job_hints(LoopConfig.tooluse()) or {}
    d.update(
        mode=mode,
        max_tasks=settings.hint_tasks,
        samples=settings.hint_samples,
        max_steps=settings.max_steps,
        max_new_tokens=settings.max_new_tokens,
        data_program=data_program,
    )
    if settings.hint_temperature is not None:
        d["temperature"] = settings.hint_temperature
    return JobHints.model_validate(d)


def extra_hint_episodes(trainer: Any, settings: Settings, episodes: list[Any]) -> list[Any]:
    """The logged episodes plus, when asked, hint-free attempts of more training tasks of the
    hinted families (seeds after the logged ones'), sampled once and saved: what the hint
    step sees. The RL update keeps the logged episodes alone. Saved plays of fewer families
    (the same count and group) are kept and only the new families played: each family's
    plays are their own RNG stream from then on, so a family added later is not the plays a
    run asking for all of them at once would make."""
    if settings.hint_extra_per_family <= 0:
        return list(episodes)
    path = Path(settings.out) / "extra_episodes.jsonl"
    meta = {
        "per_family": settings.hint_extra_per_family,
        "families": list(settings.hint_extra_families),
        "group": settings.hint_extra_group,
    }
    meta_path = path.with_suffix(".json")
    saved: list[Any] = []
    played: list[str] = []
    if path.exists():
        old = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if old is None:  # saved before the volume was: reused as it is
            return list(episodes) + load_episodes(path)
        played = list(old["families"])
        same_volume = all(old[k] == meta[k] for k in ("per_family", "group"))
        if not same_volume or not set(played) <= set(settings.hint_extra_families):
            raise SystemExit(f"{path} holds the plays of {old}, not {meta}: use another --out")
        saved = load_episodes(path)
    missing = [f for f in settings.hint_extra_families if f not in played]
    if not missing:
        return list(episodes) + saved
    extra = _extra_plays(trainer, settings, missing)
    tmp = path.with_suffix(".tmp")
    save_episodes(tmp, saved + extra)
    meta_path.write_text(json.dumps({**meta, "families": played + missing}))
    tmp.rename(path)
    return list(episodes) + saved + extra


def _extra_plays(trainer: Any, settings: Settings, families: Sequence[str]) -> list[Any]:
    """`hint_extra_per_family` training tasks of each of `families`, played hint-free
    `hint_extra_group` times at temperature 1."""
    import torch

    from agentrl.learners.tooluse import RL_SEED_BASE

    tasks = [
        (f, RL_SEED_BASE + 8_000 + j)
        for j in range(settings.hint_extra_per_family)
        for f in families
    ]
    g = settings.hint_extra_group
    batch = [x for x in tasks for _ in range(g)]
    groups = [1000 + j for j in range(len(tasks)) for _ in range(g)]
    torch.manual_seed(settings.seed + 1)
    return play(trainer, settings, batch, 1.0, groups)


def hinted_resamples(
    trainer: Any,
    settings: Settings,
    records: list[Any],
    completions: dict[str, Any],
    data_program: str | None = None,
) -> list[Any]:
    """The start's hinted resamples of the failed logged tasks, sampled once (the job's
    `hint_step`, importance mode) and saved; every hint variant of the same `data_program`
    reuses them. A failed task the saved resamples lack (its family's extra plays added
    since) is hinted and saved beside them; the saved ones are not played again."""
    from agentrl.learners.tooluse_job import failed_groups, hint_step, pick_tasks, task_key

    name = "hinted.jsonl" if data_program in (None, "canonical") else f"hinted-{data_program}.jsonl"
    path = Path(settings.out) / name
    hs = hint_settings(settings, "importance", data_program)
    saved = load_episodes(path) if path.exists() else []
    have = {(ep.family, ep.seed) for ep in saved}
    wanted = pick_tasks(failed_groups(records), hs.max_tasks)
    missing = {k for k in wanted if k not in have}
    if path.exists() and not missing:
        return saved
    todo = [r for r in records if task_key(r.trajectory) in missing] if saved else records
    step = hint_step(trainer, todo, hs, completions, settings.seed)
    tmp = path.with_suffix(".tmp")
    save_episodes(tmp, saved + step.episodes)
    tmp.rename(path)
    return saved + step.episodes


def rl_key(v: dict[str, Any]) -> str:
    keys = ("learning_rate", "epochs", "estimator", "advantage_scale", "partial_credit")
    parts = [str(v[k]) for k in keys] + [str(v["all_layers"]), str(v.get("success_only_groups"))]
    return "rl-" + "-".join(parts).replace("/", "_") + ".pt"


def lora_state(trainer: Any) -> dict[str, Any]:
    return {
        k: x.detach().clone() for k, x in trainer.policy.model.state_dict().items() if "lora_" in k
    }


# -- measuring --------------------------------------------------------------------------------


def heldout_kl(
    trainer: Any, old_state: dict[str, Any], episodes: Sequence[Any], tokens: int = 32
) -> float:
    """Mean exact KL(new || old) over the vocabulary at the first `tokens` positions of each
    held-out episode's first reply (the start's greedy reply), unmasked."""
    import torch

    from agentrl.llm.samples import PolicySample, make_microbatches

    model = trainer.policy.model
    lora = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    new_state = {k: v.detach().clone() for k, v in lora.items()}
    samples = [
        PolicySample(
            list(ep.turns[0].prompt_ids), list(ep.turns[0].action_ids[:tokens]), advantage=0.0
        )
        for ep in episodes
        if ep.turns
    ]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for mb in make_microbatches(samples, 4096, trainer.pad_id):
            lps = []
            for state in (new_state, old_state):
                model.load_state_dict(state, strict=False)
                ids = mb.input_ids.to(trainer.device)
                mask = mb.attention_mask.to(trainer.device)
                base = model.get_base_model()  # LoRA layers are in it; the head only on rows
                hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
                picked = hidden[mb.pred_b.to(trainer.device), mb.pred_t.to(trainer.device)]
                rows = base.lm_head(picked)
                lps.append(torch.log_softmax(rows.float(), -1))
            new, old = lps
            total += float((new.exp() * (new - old)).sum())
            count += int(new.shape[0])
    model.load_state_dict(new_state, strict=False)
    model.train()
    return total / max(1, count)


def summary(episodes: Sequence[Any]) -> dict[str, Any]:
    from agentrl.learners.tooluse_episodes import summarise

    s = summarise(episodes)
    calls = sum(t.tool_name in ("calculator", "code_exe") for e in episodes for t in e.turns)
    s["all"]["tool_calls_per_episode"] = calls / max(1, len(episodes))
    return s


def play(
    trainer: Any,
    settings: Settings,
    tasks: list[tuple[str, int]],
    temperature: float,
    groups: list[int] | None = None,
) -> list[Any]:
    from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner

    cfg = ToolUseConfig(
        model="tiny",
        max_steps=settings.max_steps,
        threads=0,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch,
        seed=settings.seed,
    )
    return ToolUseLearner.from_trainer(trainer, cfg).play(tasks, temperature, groups=groups)


def heldout_tasks(n: int) -> list[tuple[str, int]]:
    from agentrl.envs.tooluse.tasks import FAMILIES, distinct_seeds
    from agentrl.learners.tooluse import HELDOUT_OFFSET

    return [(f, s) for f in FAMILIES for s in distinct_seeds(f, n, HELDOUT_OFFSET)]


def train_tasks(n: int) -> list[tuple[str, int]]:
    from agentrl.envs.tooluse.tasks import FAMILIES
    from agentrl.learners.tooluse import RL_SEED_BASE

    return [(f, RL_SEED_BASE + 7_000 + j) for j in range(n) for f in FAMILIES]


def _line(name: str, s: dict[str, Any]) -> str:
    fams = " ".join(f"{f} {s[f]['success']:.2f}" for f in s if f != "all")
    a = s["all"]
    return (
        f"{name}: {a['success']:.3f} {a['ci']} {fams}; answered {a['answered']:.2f}, "
        f"tool calls/ep {a['tool_calls_per_episode']:.2f}, cut {a['cut_by_token_cap']}"
    )


def run(
    settings: Settings, variants: list[str], say: Any = print, stage: str = "all"
) -> list[dict[str, Any]]:
    """The harness: the start, its logged episodes and held-out before (each sampled once and
    saved), then per variant the start loaded afresh, its update, held-out after and one
    record (said as JSON and appended to `results.jsonl`)."""
    import torch

    from agentrl.evaluation.tooluse_failures import failure_table, first_tool_table
    from agentrl.evaluation.tooluse_paired import paired

    torch.set_num_threads(settings.threads)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trainer = job_trainer(settings.start, 5e-4, settings.seed)
    say(f"loaded {settings.start} ({time.perf_counter() - t0:.0f}s, load {os.getloadavg()})")
    if stage == "after":  # the other process samples them first
        episodes = wait_for_episodes(out / "episodes.jsonl", say)
    else:
        episodes = _logged_episodes(trainer, settings, out / "episodes.jsonl", say)
    say(_line("logged (temperature 1)", summary(episodes)))
    book, key = response_format_hash(trainer.policy.tokenizer)
    if stage == "hints":  # (no held-out: another process may play it meanwhile)
        t = time.perf_counter()
        played = extra_hint_episodes(trainer, settings, episodes)
        if len(played) > len(episodes):
            extra = summary(played[len(episodes) :])
            say(_line(f"extra hint-free plays ({time.perf_counter() - t:.0f}s)", extra))
        recs, comps = records_of(played, key)
        resampled = hinted_resamples(trainer, settings, recs, comps)
        say(_line(f"hinted resamples ({time.perf_counter() - t:.0f}s)", summary(resampled)))
        say(f"process CPU {time.process_time():.0f}s, load {os.getloadavg()}")
        return []
    before_path = out / "heldout_before.jsonl"
    before: list[Any] = []
    if stage != "after":  # "after": another process plays it; waited for at the record
        before = _heldout_before(trainer, settings, before_path, say)
        say(_line("before", summary(before)))
    results = []
    for name in variants:
        v = _variant_settings(name)
        del trainer  # the last one's memory back before the next start is loaded
        gc.collect()
        trainer = job_trainer(
            settings.start, v["learning_rate"], settings.seed, all_layers=v["all_layers"]
        )
        old_state = lora_state(trainer)
        update = _update(trainer, name, v, settings, out, episodes, book, key)
        if stage == "rl":
            say(f"{name}: RL update saved to {out / rl_key(v)} ({update.rl_s:.0f}s)")
            continue
        t = time.perf_counter()
        after = play(trainer, settings, heldout_tasks(settings.heldout_per_family), 0.0)
        save_episodes(out / f"heldout_{name}.jsonl", after)
        eval_s = time.perf_counter() - t
        s_after = summary(after)
        say(_line(f"after {name}", s_after))
        if not before:
            before = wait_for_episodes(before_path, say)
        s_before = summary(before)
        kl = heldout_kl(trainer, old_state, before)
        rec = _variant_record(name, v, update, kl, s_before, s_after)
        rec |= {
            "eval_s": round(eval_s, 1),
            "process_cpu_s": round(time.process_time(), 1),
            "heldout_tasks": len(after),
            "failures_before": failure_table(before),
            "failures_after": failure_table(after),
            "first_tool_before": first_tool_table(before),
            "first_tool_after": first_tool_table(after),
            "paired_vs_before": paired(before, after),
            "logged_episodes": len(episodes),
            "load": [round(x, 2) for x in os.getloadavg()],
        }
        say(json.dumps(rec))
        with (out / "results.jsonl").open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        results.append(rec)
    return results


def wait_for_episodes(path: Path, say: Any, poll_s: float = 10.0) -> list[Any]:
    """The episodes another process saves at `path` (whole: `save_atomically`), once there."""
    if not path.exists():
        say(f"waiting for {path}")
    while not path.exists():
        time.sleep(poll_s)
    return load_episodes(path)


def _logged_episodes(trainer: Any, settings: Settings, path: Path, say: Any) -> list[Any]:
    """The logged episodes: `group` attempts per training task at temperature 1, sampled
    once and saved (every variant and every later run trains on the same ones)."""
    if path.exists():
        return load_episodes(path)
    import torch

    t = time.perf_counter()
    tasks = train_tasks(settings.train_per_family)
    batch = [x for x in tasks for _ in range(settings.group)]
    groups = [j for j in range(len(tasks)) for _ in range(settings.group)]
    torch.manual_seed(settings.seed)
    episodes = play(trainer, settings, batch, 1.0, groups)
    save_atomically(path, episodes)
    say(f"sampled {len(episodes)} episodes in {time.perf_counter() - t:.0f}s")
    return episodes


def _heldout_before(trainer: Any, settings: Settings, path: Path, say: Any) -> list[Any]:
    """The start's greedy held-out episodes, played once and saved."""
    if path.exists():
        return load_episodes(path)
    t = time.perf_counter()
    before = play(trainer, settings, heldout_tasks(settings.heldout_per_family), 0.0)
    save_atomically(path, before)
    say(f"held-out before in {time.perf_counter() - t:.0f}s")
    return before


def _variant_settings(name: str) -> dict[str, Any]:
    """A variant's settings: the loop job's, with partial credit and LoRA on the attention
    layers only unless the variant (`name` before any `@`) says otherwise."""
    return {
        **loop_job_settings(),
        "partial_credit": True,
        "all_layers": False,
        **VARIANTS[name.split("@")[0]],
    }


@dataclasses.dataclass
class _Update:
    """One variant's update: what it trained on and how it went."""

    units: list[Any]
    stats: Any  # job_samples' statistics
    ratios: dict[str, float]
    hist: list[dict[str, float]]
    reused: bool  # the RL update was loaded from an earlier variant's `rl-*.pt`
    rl_s: float
    update_s: float
    step: Any  # the hint step, None without hints
    hint_train: dict[str, float]  # the last round's training
    rounds: list[dict[str, Any]]  # each hint round's counts (`_round_record`)
    replay: dict[str, Any] = dataclasses.field(default_factory=dict)  # `_replay_record`


def _update(
    trainer: Any,
    name: str,
    v: dict[str, Any],
    settings: Settings,
    out: Path,
    episodes: list[Any],
    book: Any,
    key: str,
) -> _Update:
    """The job's update of variant `v` on the logged episodes: its hint step built first
    (from the start, as a job does), the samples, the RL steps (or the same RL settings'
    saved update), then the hint items trained."""
    t = time.perf_counter()
    records, completions = records_of(episodes, key, v["partial_credit"])
    step, hs, h_data = None, None, (records, completions)
    replay = (
        job_replay(
            trainer,
            records,
            completions,
            settings.seed,
            bool(v.get("retries")),
            bool(v.get("balance_openings")),
            v.get("data_program"),
        )
        if v.get("replay")
        else None
    )
    if v.get("hints"):  # built before any update, from the start (as a job does)
        step, hs, h_data = _hint_step(
            trainer, v, settings, episodes, records, completions, key, replay
        )
    units, stats = job_samples(
        trainer, records, completions, book, v["estimator"], v["advantage_scale"]
    )
    if v.get("success_only_groups"):
        ok = {
            r.task_id
            for r in records
            if r.trajectory["metadata"]["outcome"]["task_status"] == "completed_successfully"
        }
        units = [u for u in units if u.group_id in ok]
    # the ratios of the RL step's first batch (a forward pass over every unit: none without RL)
    ratios = first_ratios(trainer, units) if v.get("rl", True) else {}
    units, hist, reused = _rl_update(trainer, units, v, out / rl_key(v), settings.seed)
    rl_s = time.perf_counter() - t
    hint_train: dict[str, float] = {}
    rounds: list[dict[str, Any]] = []
    if step is not None:
        hint_train = step.train(trainer, hs, settings.seed, replay=replay)
        rounds.append(_round_record(step, hint_train))
        for r in range(2, int(v.get("hint_rounds", 1)) + 1):
            again = _hint_round(trainer, hs, settings, out, name, r, *h_data)
            hint_train = again.train(trainer, hs, settings.seed + r, replay=replay)
            rounds.append(_round_record(again, hint_train))
    elif replay is not None:  # the replay's passes alone (as many as a hint step's epochs)
        hint_train = replay.train(trainer)
    update_s = time.perf_counter() - t
    return _Update(
        units,
        stats,
        ratios,
        hist,
        reused,
        rl_s,
        update_s,
        step,
        hint_train,
        rounds,
        _replay_record(replay) if replay is not None else {},
    )


def job_replay(
    trainer: Any,
    records: list[Any],
    completions: dict[str, Any],
    seed: int,
    retries: bool = False,
    balance_openings: bool = False,
    data_program: str | None = None,
) -> Any:
    """The job's replay of the logged episodes' verified hint-free successes and the warm
    start's scripted episodes (`REPLAY`), with `retries` the retries after their failed
    attempts' tool errors too, with `balance_openings` each pass balanced per tool of the
    opening turn, the scripted data programs in `data_program`'s form, as a job builds it
    (`replay_of_records`)."""
    from agentrl.learners.tooluse_job_replay import JobReplaySettings, replay_of_records

    return replay_of_records(
        trainer.policy.tokenizer,
        records,
        JobReplaySettings(
            **REPLAY,
            retries=retries,
            balance_openings=balance_openings,
            data_program=data_program,
        ),
        completions,
        seed,
        max_length=trainer.config.max_length,
    )


def replay_bounds(replay: Any) -> dict[str, int]:
    """Per family, the longest reply (tokens) among the replay's verified successes: the
    length check's bound (a solution of the family has been seen to need that much)."""
    out: dict[str, int] = {}
    for family in replay.replay.families():
        for items in replay.replay.held(family):
            for it in items:
                out[family] = max(out.get(family, 0), len(it.action_ids))
    return out


def replay_items_per_pass(replay: Any) -> dict[str, int]:
    """Per family, the replay items one hint pass trains beside the hint items (its draws'
    episodes times the family's mean replies an episode): the family cap counts them."""
    out: dict[str, int] = {}
    draws = replay.settings.steps * replay.settings.episodes_per_family
    for family in replay.replay.families():
        held = replay.replay.held(family)
        per_episode = sum(len(items) for items in held) / max(1, len(held))
        out[family] = round(draws * per_episode)
    return out


def _replay_record(replay: Any) -> dict[str, Any]:
    return {
        **replay.counts,
        "replay_by_family": {f: len(replay.replay.held(f)) for f in replay.replay.families()},
        "replay_bounds": replay_bounds(replay),
        "replay_openings_held": replay.replay.openings(),
        "replay_openings_trained": replay.openings,
        "replay_skipped": replay.skipped,
    }


def _round_record(step: Any, train: dict[str, float]) -> dict[str, Any]:
    """One hint round's counts: hinted tasks, successes and samples (per family too), the
    items and tokens it trained."""
    fams: dict[str, list[int]] = {}
    for ep in step.episodes:
        ok_n = fams.setdefault(ep.family, [0, 0])
        ok_n[0] += int(ep.success)
        ok_n[1] += 1
    return {
        **step.counts,
        "hinted_by_family": {f: f"{ok}/{n}" for f, (ok, n) in sorted(fams.items())},
        "hint_items_by_family": step.by_family,
        "tokens": int(train.get("tokens", 0)),
        "loss": round(float(train.get("loss", math.nan)), 4),
    }


def _hint_round(
    trainer: Any,
    hs: Any,
    settings: Settings,
    out: Path,
    name: str,
    r: int,
    records: list[Any],
    completions: dict[str, Any],
) -> Any:
    """Round `r` of expert iteration: the model as the last round left it hinted again on
    the same failed tasks (its resamples saved per variant and round, and reused)."""
    from agentrl.learners.tooluse_job import hint_step

    path = out / f"hinted-{name}-r{r}.jsonl"
    hinted = load_episodes(path) if path.exists() else None
    step = hint_step(trainer, records, hs, completions, settings.seed + r, hinted=hinted)
    if hinted is None:
        tmp = path.with_suffix(".tmp")
        save_episodes(tmp, step.episodes)
        tmp.rename(path)
    return step


def _hint_step(
    trainer: Any,
    v: dict[str, Any],
    settings: Settings,
    episodes: list[Any],
    records: list[Any],
    completions: Any,
    key: str,
    replay: Any = None,
) -> tuple[Any, Any, tuple[list[Any], Any]]:
    """The job's hint step for variant `v` and its settings: hints for the failed tasks
    (of more episodes when `hint_extra_per_family`), with the start's hinted resamples
    unless the hints are distilled; a checked variant's length check bounds a reply by its
    family's longest verified one (the logged successes' and, with a replay, its scripted
    episodes') and caps a family at `FAMILY_SHARE` of a pass (the replay's draw counted);
    -> (the step, its settings, the records it hinted)."""
    from agentrl.learners.tooluse_job import hint_step

    hs = hint_settings(settings, v["hints"], v.get("data_program"))
    hs.epochs = int(v.get("hint_epochs", hs.epochs))
    hs.relabel_thoughts = bool(v.get("relabel", False))
    hs.balance_openings = bool(v.get("balance_openings", False))
    bounds: dict[str, int] | None = None
    others: dict[str, int] | None = None
    if v.get("checked"):
        hs.family_bound, hs.max_family_share = True, FAMILY_SHARE
        if replay is not None:
            bounds, others = replay_bounds(replay), replay_items_per_pass(replay)
    h_recs, h_comps = records, completions
    if settings.hint_extra_per_family > 0:
        more = extra_hint_episodes(trainer, settings, episodes)
        h_recs, h_comps = records_of(more, key, v["partial_credit"])
    hinted: list[Any] | None = None
    if v["hints"] != "distill":
        hinted = hinted_resamples(trainer, settings, h_recs, h_comps, v.get("data_program"))
    step = hint_step(
        trainer,
        h_recs,
        hs,
        h_comps,
        settings.seed,
        hinted=hinted,
        reply_bounds=bounds,
        other_items=others,
    )
    return step, hs, (h_recs, h_comps)


def _rl_update(
    trainer: Any, units: list[Any], v: dict[str, Any], cached: Path, seed: int
) -> tuple[list[Any], list[dict[str, float]], bool]:
    """The RL steps: none for a variant without RL (its units dropped), the update saved at
    `cached` by an earlier variant with the same RL settings, else trained and saved there;
    -> (the units trained, the steps' metrics, reused)."""
    import torch

    if not v.get("rl", True):
        return [], [], False
    if cached.exists():  # the same RL settings' update, saved by an earlier variant
        trainer.policy.model.load_state_dict(torch.load(cached), strict=False)
        return units, json.loads(cached.with_suffix(".json").read_text()), True
    hist = job_update(trainer, units, v["epochs"], seed)
    torch.save(lora_state(trainer), cached.with_suffix(".tmp"))
    cached.with_suffix(".json").write_text(json.dumps(hist))
    cached.with_suffix(".tmp").rename(cached)
    return units, hist, False


def _variant_record(
    name: str,
    v: dict[str, Any],
    update: _Update,
    kl: float,
    s_before: dict[str, Any],
    s_after: dict[str, Any],
) -> dict[str, Any]:
    """A variant's result row (before its evaluation's time and sizes): its settings, the
    update's diagnostics, held-out before and after per family."""
    hist, stats, step = update.hist, update.stats, update.step
    settings_used = ("learning_rate", "epochs", "estimator", "partial_credit", "advantage_scale")
    return {
        "variant": name,
        **{k: v[k] for k in settings_used},
        "units": len(update.units),
        "masked_samples": stats.extra.get("masked_samples", 0),
        "unmasked_constrained_samples": stats.extra.get("unmasked_constrained_samples", 0),
        "steps": len(hist),
        **{k: round(x, 4) for k, x in update.ratios.items()},
        "clip_fraction_mean": round(sum(m["clip_fraction"] for m in hist) / max(1, len(hist)), 4),
        "approx_kl_last": round(hist[-1]["approx_kl"], 4) if hist else None,
        "heldout_kl_new_old": round(kl, 4),
        "before": s_before["all"]["success"],
        "before_ci": s_before["all"]["ci"],
        "after": s_after["all"]["success"],
        "after_ci": s_after["all"]["ci"],
        **{f"before_{f}": s_before[f]["success"] for f in s_before if f != "all"},
        **{f"after_{f}": s_after[f]["success"] for f in s_after if f != "all"},
        "answered_before": round(s_before["all"]["answered"], 3),
        "answered_after": round(s_after["all"]["answered"], 3),
        "tool_calls_before": round(s_before["all"]["tool_calls_per_episode"], 3),
        "tool_calls_after": round(s_after["all"]["tool_calls_per_episode"], 3),
        "cut_before": s_before["all"]["cut_by_token_cap"],
        "cut_after": s_after["all"]["cut_by_token_cap"],
        "update_s": round(update.update_s, 1),
        "rl_s": round(update.rl_s, 1),
        "rl_reused": update.reused,
        "hint_mode": v.get("hints"),
        **(step.counts if step is not None else {}),
        **{f"hint_{k}": round(float(x), 4) for k, x in update.hint_train.items()},
        **({"hint_rounds": update.rounds} if update.rounds else {}),
        **update.replay,
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    run(settings_of(p, a), a.variant, stage=a.stage)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--train-per-family", type=int, default=9)
    p.add_argument("--heldout-per-family", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hint-tasks", type=int, default=18)
    p.add_argument("--hint-samples", type=int, default=3)
    p.add_argument("--hint-temperature", type=float, default=None)
    p.add_argument("--hint-extra-per-family", type=int, default=0)
    p.add_argument(
        "--hint-extra-families",
        default="data",
        help="comma-separated families of the extra hint-free plays (e.g. data,numbers)",
    )
    p.add_argument("--hint-extra-group", type=int, default=2, help="hint-free plays per extra task")
    p.add_argument(
        "--stage",
        choices=("all", "rl", "hints", "after"),
        default="all",
        help="rl: the variants' RL updates only (saved); hints: the hinted resamples only "
        "(no held-out); after: the variants' updates and held-out after, the held-out before "
        "waited for (another process plays it)",
    )
    return p


def settings_of(p: argparse.ArgumentParser, a: argparse.Namespace) -> Settings:
    """The harness's settings from its command line (a bad variant or family: the parser's
    error)."""
    from agentrl.envs.tooluse.tasks import FAMILIES

    extra_families = tuple(f.strip() for f in a.hint_extra_families.split(",") if f.strip())
    for f in extra_families:
        if f not in FAMILIES:
            p.error(f"unknown family {f!r} in --hint-extra-families: use {', '.join(FAMILIES)}")
    for v in a.variant:
        if v.split("@")[0] not in VARIANTS:
            p.error(f"unknown variant {v!r}: use {', '.join(VARIANTS)}")
    return Settings(
        a.start,
        a.out,
        a.train_per_family,
        heldout_per_family=a.heldout_per_family,
        threads=a.threads,
        hint_tasks=a.hint_tasks,
        hint_samples=a.hint_samples,
        hint_temperature=a.hint_temperature,
        hint_extra_per_family=a.hint_extra_per_family,
        hint_extra_families=extra_families,
        hint_extra_group=a.hint_extra_group,
    )


if __name__ == "__main__":
    main()
