"""`agentrl learn --config configs/tooluse-*.yaml`: SmolLM2 answers the tool-use tasks in
Agent Zero's JSON under structured outputs, warm-started on the environment's scripted
solutions, then improved by RL, and measured greedy on held-out tasks never trained on.

Stages, each timed: (1) the base on the held-out tasks; (2) the warm start: LoRA fine-tuned
on the solver's replies (`envs.tooluse.solver`) for training seeds, balanced across the
families, saved as a checkpoint the gateway's local backend loads; (3) the warm start on
the same held-out tasks; (4) RL: groups of episodes sampled at temperature ~1 under the
schema on fresh training seeds, reward = success, updated by rejection sampling (NLL on the
successful episodes' sampled tokens) or GRPO (group-relative advantages, log-probs
recomputed under the current policy: the behaviour log-probs are of the masked
distribution, so the ratio starts on-policy at 1); (5) the trained policy on the held-out
tasks. Training seeds stay below `HELDOUT_OFFSET`; held-out seeds start there.

Issue 52: RL iterations also hint the tasks whose samples all failed
(`tooluse_hints`: importance-corrected training on hinted successes, or distillation from
the hinted model, of the hint-free prompt), take supervised steps on a family-balanced
replay of verified successes (`tooluse_replay`), and weigh the families equally; the
held-out evaluation adds the unseen-phrasing pool (`unseen_per_family`), reported apart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.envs.tooluse.tasks import FAMILIES
from agentrl.learners.tooluse_episodes import (
    EpisodeRecord,
    PlaySettings,
    PlayTiming,
    SchemaMatchers,
    episode_json,
    play,
    summarise,
)

log = logging.getLogger(__name__)

HELDOUT_OFFSET = 1_000_000  # as agentrl.learners.valid_action: training seeds stay below
WARM_SEED_BASE = 0  # warm-start seeds: WARM_SEED_BASE + k
RL_SEED_BASE = 100_000  # RL seeds: fresh training tasks, disjoint from the warm start's


class ToolUseConfig(BaseModel):
    """Every knob of a tool-use learning run (configs/tooluse-*.yaml)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "smollm2",
        description="smollm2, tiny, or a saved version's checkpoint folder (a loop job's or "
        "a warm start's): its adapters are measured as the start and trained further",
    )
    families: list[str] = Field(default_factory=lambda: list(FAMILIES))
    max_steps: int = Field(4, ge=2)
    max_new_tokens: int = Field(256, ge=8)
    structured: bool = True
    threads: int = Field(1, ge=0, description="torch threads; 0 leaves torch's default")
    device: str = Field(
        "cpu", description="cpu, cuda, cuda:N, or auto (cuda when there is one): the policy's"
    )
    lora_r: int = Field(16, gt=0)
    lora_alpha: int = Field(32, gt=0)
    lora_layers: int | None = Field(None, ge=1, description="adapters on the top N layers")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    )
    micro_batch_tokens: int = Field(4096, gt=0)
    # warm start
    warm_start: bool = True
    warm_tasks_per_family: int = Field(16, ge=0)
    warm_epochs: int = Field(2, ge=0)
    warm_batch_size: int = Field(8, gt=0)
    warm_learning_rate: float = Field(5e-4, gt=0)
    warm_stop_loss: float | None = Field(
        None, gt=0, description="stop the warm start after an epoch whose mean loss is below"
    )
    warm_time_budget_s: float | None = Field(None, gt=0, description="no new epoch after this")
    warm_fast: bool = Field(
        True, description="one sequence per episode, frozen layers once (tooluse_warm)"
    )
    data_program: Literal["canonical", "shown"] | None = Field(
        None,
        description="how every scripted data program of the run holds the table (the warm "
        "start's demonstrations, the hints' plan, the replayed warm-start episodes): "
        "`solver.DATA_PROGRAMS`; None: canonical. Saved with the checkpoints (metrics.json), "
        "so a loop started from one writes its hints and replay in the form it learned",
    )
    # RL
    rl_method: Literal["rejection", "grpo", "none"] = "rejection"
    iterations: int = Field(4, ge=0)
    tasks_per_iteration: int = Field(12, gt=0, description="balanced across the families")
    group_size: int = Field(4, gt=0)
    temperature: float = Field(1.0, gt=0)
    rl_learning_rate: float = Field(2e-4, gt=0)
    rl_epochs: int = Field(1, gt=0)
    rl_batch_size: int = Field(8, gt=0)
    result_bonus: float = Field(
        0.0, ge=0, description="GRPO: reward for a tool result showing the answer"
    )
    rl_time_budget_s: float | None = Field(1200.0, gt=0)
    # hints where every sample of a task failed (`learners.tooluse_hints`)
    hints: Literal["off", "importance", "distill"] = Field(
        "importance",
        description="importance: resample with the hint, train the hint-free prompt on the "
        "hinted successes with the truncated importance ratio; distill: the model with the "
        "hint is the teacher on the failed samples' own tokens; off: no hints",
    )
    hint_reveals_answer: bool = Field(False, description="the hint also gives the answer")
    hint_plan: bool = Field(
        True,
        description="the hint also shows the first reply to write (the scripted solver's "
        "call, never the answer); false: the checker's words only",
    )
    hint_samples: int | None = Field(None, gt=0, description="hinted resamples (group_size)")
    hint_clip: float = Field(1.0, gt=0, description="importance-ratio cap / advantage clip")
    # keeping what was learned (`learners.tooluse_replay`)
    replay_steps: int = Field(1, ge=0, description="supervised replay passes per iteration")
    replay_episodes_per_family: int = Field(4, gt=0)
    replay_capacity_per_family: int = Field(64, gt=0)
    replay_warm: bool = Field(
        True, description="the warm start's scripted episodes (warm_tasks) join the replay"
    )
    balance_families: bool = Field(True, description="every family weighs the same per step")
    # evaluation (issue 52: >= 60 held-out tasks per family, >= 200 in all)
    heldout_per_family: int = Field(67, gt=0)
    unseen_per_family: int = Field(
        30, ge=0, description="the unseen-phrasing pool (never generated for training)"
    )
    eval_base: bool = True
    eval_start: bool = Field(
        True, description="measure the start (false: a run from a start measured before)"
    )
    batch_size: int = Field(34, gt=0, description="episodes decoded together")
    seed: int = 0
    out_dir: str = "runs/tooluse"

    @field_validator("hints", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        """YAML reads a bare `off` as false: that is "off" here too."""
        return "off" if value is False else value

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> ToolUseConfig:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        data.pop("kind", None)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

    def heldout(self) -> list[tuple[str, int]]:
        """Held-out tasks: `heldout_per_family` distinct questions of each family."""
        from agentrl.envs.tooluse.tasks import distinct_seeds

        n = self.heldout_per_family
        return [(f, s) for f in self.families for s in distinct_seeds(f, n, HELDOUT_OFFSET)]

    def unseen(self) -> list[tuple[str, int]]:
        """The unseen pool's tasks (played with `pool="unseen"`): phrasings and kinds the
        training generator never produces, distinct questions."""
        from agentrl.envs.tooluse.tasks import distinct_seeds

        n = self.unseen_per_family
        return [
            (f, s) for f in self.families for s in distinct_seeds(f, n, HELDOUT_OFFSET, "unseen")
        ]

    def warm_tasks(self) -> list[tuple[str, int]]:
        """The warm start's training tasks: `warm_tasks_per_family` of each family, its
        question kinds in turn (`tasks.seeds_by_kind`)."""
        from agentrl.envs.tooluse.tasks import seeds_by_kind

        n = self.warm_tasks_per_family
        per = {f: seeds_by_kind(f, n, WARM_SEED_BASE) for f in self.families}
        return [(f, per[f][k]) for k in range(n) for f in self.families]

    def rl_tasks(self, iteration: int) -> list[tuple[str, int]]:
        n = self.tasks_per_iteration
        seeds = [RL_SEED_BASE + iteration * n + j for j in range(n)]
        if max(seeds) >= HELDOUT_OFFSET:
            raise ValueError("RL seeds would reach the held-out range")
        return [(self.families[j % len(self.families)], s) for j, s in enumerate(seeds)]


@dataclass
class ToolUseResult:
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)


class ToolUseLearner:
    """The policy (LoRA over the base), its trainer, and the structured-outputs matchers."""

    def __init__(self, config: ToolUseConfig) -> None:
        from agentrl.llm.config import TrainerConfig
        from agentrl.llm.loading import apply_lora, load_policy
        from agentrl.llm.trainer import PolicyTrainer

        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        device = resolve_device(config.device)
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True
        policy = load_policy(config.model, seed=0, device=device)
        if not policy.is_lora:  # a saved version (a checkpoint folder) keeps its adapters
            policy.lora = lora_settings(config, int(policy.model.config.num_hidden_layers))
            policy.model = apply_lora(policy.model, policy.lora)
        out = Path(config.out_dir)
        tc = TrainerConfig(
            algorithm="grpo",
            model=config.model,
            lora_r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_target_modules=list(config.lora_targets),
            lora_layers=lora_layers_of(policy),
            learning_rate=config.warm_learning_rate,
            batch_size=config.rl_batch_size,
            epochs=config.rl_epochs,
            micro_batch_tokens=config.micro_batch_tokens,
            max_length=4096,
            seed=config.seed,
            recompute_old_logprobs=True,
            storage_path=str(out / "checkpoints"),
            device=device,
        )
        self.trainer = PolicyTrainer(policy, tc)
        self.tokenizer = policy.tokenizer
        vocab = int(policy.model.config.vocab_size)
        self.matchers = SchemaMatchers(self.tokenizer, vocab) if config.structured else None
        self.generator = torch.Generator().manual_seed(config.seed)
        self.timing = PlayTiming()
        from agentrl.learners.tooluse_replay import Replay

        self.replay = Replay(config.replay_capacity_per_family)
        self.corrections: dict[tuple[str, int], str] = {}
        """Users' corrections by task (family, seed): where one is given it is the hint
        (`set_corrections`)."""

    @classmethod
    def from_trainer(cls, trainer: Any, config: ToolUseConfig) -> ToolUseLearner:
        """A learner around a trainer that already holds the policy (a loop job's): nothing
        is loaded; `config` sets how it plays (tokens, steps, schema, hints)."""
        from agentrl.learners.tooluse_replay import Replay

        self = cls.__new__(cls)
        self.config = config
        self.trainer = trainer
        self.tokenizer = trainer.policy.tokenizer
        vocab = int(trainer.policy.model.config.vocab_size)
        self.matchers = SchemaMatchers(self.tokenizer, vocab) if config.structured else None
        self.generator = torch.Generator().manual_seed(config.seed)
        self.timing = PlayTiming()
        self.replay = Replay(config.replay_capacity_per_family)
        self.corrections = {}
        return self

    def set_corrections(self, corrections: dict[tuple[str, int], str | None]) -> None:
        """The hook for users' corrections: a hint string (or None) per task. A task with
        one gets it as its hint, in place of what the environment says it needs."""
        self.corrections = {k: v for k, v in corrections.items() if v and v.strip()}

    @property
    def model(self) -> Any:
        return self.trainer.policy.model

    def set_lr(self, lr: float) -> None:
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = lr
        self.trainer.scheduler.base_lrs = [lr for _ in self.trainer.scheduler.base_lrs]

    def play(
        self,
        tasks: Sequence[tuple[str, int]],
        temperature: float,
        groups: Sequence[int] | None = None,
        adapters: bool = True,
        hints: Sequence[str | None] | None = None,
        pool: str = "train",
    ) -> list[EpisodeRecord]:
        cfg = self.config
        settings = PlaySettings(
            temperature=temperature,
            max_steps=cfg.max_steps,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size,
            structured=cfg.structured,
        )
        kwargs: dict[str, Any] = {
            "matchers": self.matchers,
            "generator": self.generator,
            "groups": groups,
            "timing": self.timing,
            "hints": hints,
            "pool": pool,
        }
        if adapters:
            return play(self.model, self.tokenizer, tasks, settings, **kwargs)
        with self.model.disable_adapter():  # the base: LoRA off
            return play(self.model, self.tokenizer, tasks, settings, **kwargs)

    def save(self, name: str, metrics: dict[str, Any]) -> str:
        """A checkpoint `name`; its metrics.json also says the form its scripted data
        programs were written in (`data_program`: what `loop_tooluse.start_data_program`
        reads when a loop starts from it)."""
        from agentrl.llm.checkpoint import CheckpointManager

        form = data_form(self.config)
        ckpt = CheckpointManager(
            self.trainer.config.storage_path,
            run_info={
                "name": f"agentrl tool-use policy ({name})",
                "data": "scripted solutions and RL episodes of training seeds "
                f"(< {HELDOUT_OFFSET}) of the tool-use tasks, Agent Zero JSON; data "
                f"programs in the {form} form",
            },
        )
        return ckpt.save(self.trainer, {**metrics, "data_program": form}, name=name)


def data_form(config: ToolUseConfig) -> str:
    """The form of the run's scripted data programs, by name (None is the solver's default)."""
    from agentrl.envs.tooluse.solver import DATA_PROGRAM

    return config.data_program or DATA_PROGRAM


def lora_settings(config: ToolUseConfig, layers: int) -> Any:
    """Fresh adapters as the config asks: on the top `lora_layers` of `layers` (or all)."""
    from agentrl.llm.loading import LoraSettings

    top = None if config.lora_layers is None else range(max(0, layers - config.lora_layers), layers)
    return LoraSettings(
        r=config.lora_r,
        alpha=config.lora_alpha,
        target_modules=tuple(config.lora_targets),
        layers=None if top is None else tuple(top),
    )


def lora_layers_of(policy: Any) -> list[int] | None:
    """The decoder layers the policy's adapters sit on (None: all, or not known)."""
    lora = getattr(policy, "lora", None)
    layers = getattr(lora, "layers", None)
    return None if layers is None else [int(x) for x in layers]


def resolve_device(name: str) -> str:
    """`auto` is cuda when torch sees a GPU, else cpu; a cuda device that is not there is a
    clear error, not a crash deep in the first forward pass."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no GPU here (use cpu or auto)")
    return name


def solved_episodes(
    max_steps: int, tasks: Sequence[tuple[str, int]], data_form: str | None = None
) -> list[Any]:
    """The solver's episodes on `tasks` (data programs in `data_form`,
    `solver.data_program`), only those the environment scored as solved."""
    from agentrl.envs.tooluse import ToolUseEnv
    from agentrl.envs.tooluse.solver import solve_episode

    envs = {f: ToolUseEnv(family=f, max_steps=max_steps) for f in FAMILIES}
    episodes = [solve_episode(envs[family], seed, data_form) for family, seed in tasks]
    return [ep for ep in episodes if ep.success]


def warm_episodes(config: ToolUseConfig) -> list[Any]:
    """The warm start's scripted episodes (`warm_tasks`), data programs in the config's
    form: what it trains on, and what joins the replay (`replay_warm`)."""
    return solved_episodes(config.max_steps, config.warm_tasks(), config.data_program)


def demonstrations(learner: ToolUseLearner, tasks: Sequence[tuple[str, int]]) -> list[Any]:
    """The solver's replies on `tasks` as training samples (exact chat-template prompts),
    only from episodes the environment scored as solved; data programs in the config's
    form."""
    from agentrl.envs.tooluse.agent_prompt import messages_for
    from agentrl.llm.samples import PolicySample, encode_action, render_prompt

    tok = learner.tokenizer
    samples = []
    cfg = learner.config
    for ep in solved_episodes(cfg.max_steps, tasks, cfg.data_program):
        for i, turn in enumerate(ep.turns):
            prompt = render_prompt(tok, messages_for(ep.task.question, ep.turns[:i]))
            samples.append(
                PolicySample(prompt, encode_action(tok, turn.reply), advantage=1.0, reward=1.0)
            )
    return samples


def solved_items(tokenizer: Any, episode: Any) -> list[Any]:
    """A solved scripted episode's replies as NLL items (exact chat-template prompts)."""
    from agentrl.envs.tooluse.agent_prompt import messages_for
    from agentrl.learners.tooluse_hints import TokenItem
    from agentrl.llm.samples import encode_action, render_prompt

    return [
        TokenItem(
            render_prompt(tokenizer, messages_for(episode.task.question, episode.turns[:i])),
            encode_action(tokenizer, turn.reply),
            episode.task.family,
        )
        for i, turn in enumerate(episode.turns)
    ]


def nll_epochs(
    learner: ToolUseLearner, samples: Sequence[Any], epochs: int, batch: int
) -> list[float]:
    from agentrl.learners.sft import sft_epoch

    return [sft_epoch(learner.trainer, samples, batch) for _ in range(epochs)] if samples else []


def warm_start(
    learner: ToolUseLearner, demos: Sequence[Any], say: Callable[[str], None] = print
) -> list[float]:
    """NLL epochs on the demonstrations, each reported with its loss and time; stops after
    `warm_epochs`, or earlier once an epoch's mean loss is below `warm_stop_loss` or the
    warm start has run `warm_time_budget_s`."""
    from agentrl.learners.sft import sft_epoch
    from agentrl.learners.tooluse_warm import warm_epochs

    cfg = learner.config
    return warm_epochs(
        cfg, len(demos), lambda: sft_epoch(learner.trainer, demos, cfg.warm_batch_size), say, _load
    )


def episode_samples(episodes: Sequence[EpisodeRecord], advantages: Sequence[float]) -> list[Any]:
    """Every valid turn of each episode as a sample with its episode's advantage, on the
    tokens that were sampled."""
    from agentrl.llm.samples import PolicySample

    out = []
    for ep, adv in zip(episodes, advantages, strict=True):
        for i, t in enumerate(ep.turns):
            if t.finish != "stop":
                continue
            out.append(
                PolicySample(
                    list(t.train_prompt_ids),
                    list(t.action_ids),
                    advantage=float(adv),
                    reward=ep.reward,
                    group_id=str(ep.group),
                    episode_id=f"{ep.family}-{ep.seed}-{id(ep)}",
                    step_index=i,
                )
            )
    return out


def group_advantages(episodes: Sequence[EpisodeRecord], bonus: float) -> list[float]:
    """GRPO: each episode's reward minus its group's mean, over the group's std."""
    rewards = [ep.reward + bonus * float(ep.answer_in_result and not ep.success) for ep in episodes]
    groups: dict[int, list[int]] = {}
    for k, ep in enumerate(episodes):
        groups.setdefault(ep.group, []).append(k)
    adv = [0.0] * len(episodes)
    for members in groups.values():
        r = torch.tensor([rewards[k] for k in members])
        std = float(r.std(unbiased=False))
        for k in members:
            adv[k] = (rewards[k] - float(r.mean())) / (std + 1e-6) if std > 0 else 0.0
    return adv


def rl_iteration(learner: ToolUseLearner, iteration: int) -> dict[str, Any]:
    """One iteration: groups sampled hint-free; rejection sampling (or GRPO) on them; hints
    for the tasks whose samples all failed; supervised steps on the replay."""
    from agentrl.learners.tooluse_hints import balance, success_items, train_items

    cfg = learner.config
    t0 = time.perf_counter()
    tasks = cfg.rl_tasks(iteration)
    batch = [t for t in tasks for _ in range(cfg.group_size)]
    groups = [j for j in range(len(tasks)) for _ in range(cfg.group_size)]
    episodes = learner.play(batch, cfg.temperature, groups=groups)
    t1 = time.perf_counter()
    learner.set_lr(cfg.rl_learning_rate)
    items = []
    trained_on = 0
    if cfg.rl_method == "rejection":
        items = success_items(episodes)
    elif cfg.rl_method == "grpo":
        samples = episode_samples(episodes, group_advantages(episodes, cfg.result_bonus))
        learner.trainer.train_on_samples(samples, allow_empty=True)
        trained_on = sum(abs(s.advantage) > 1e-8 for s in samples)
    hinted = hint_round(learner, tasks, episodes)
    items += hinted.pop("items")
    t2 = time.perf_counter()
    if cfg.balance_families:
        balance(items)
    trained_on += len(items)
    for _ in range(cfg.rl_epochs if items else 0):
        train_items(learner.trainer, items, cfg.rl_batch_size, cfg.hint_clip, learner.generator)
    learner.replay.add_episodes(episodes)
    replayed = 0
    for _ in range(cfg.replay_steps if len(learner.replay) else 0):
        rep = learner.replay.sample(cfg.replay_episodes_per_family, learner.generator)
        replayed += len(rep)
        train_items(learner.trainer, rep, cfg.rl_batch_size, generator=learner.generator)
    t3 = time.perf_counter()
    rec = {
        "iteration": iteration,
        "train_success": sum(ep.success for ep in episodes) / len(episodes),
        "answered": sum(ep.answered for ep in episodes) / len(episodes),
        "samples": trained_on,
        "replayed": replayed,
        "cut_by_token_cap": sum(t.finish == "length" for ep in episodes for t in ep.turns),
        **hinted,
        "rollout_s": round(t1 - t0, 1),
        "hint_s": round(t2 - t1, 1),
        "update_s": round(t3 - t2, 1),
    }
    for f in cfg.families:
        fam = [ep for ep in episodes if ep.family == f]
        if fam:
            rec[f"success_{f}"] = round(sum(ep.success for ep in fam) / len(fam), 3)
    return rec


def hint_round(
    learner: ToolUseLearner, tasks: Sequence[tuple[str, int]], episodes: Sequence[EpisodeRecord]
) -> dict[str, Any]:
    """Hints for the tasks none of whose samples succeeded, and what to train from them:
    {"items", "hinted_tasks", "hinted_successes", "hinted_samples", "corrections_used"}."""
    from agentrl.learners.tooluse_hints import distill_items, importance_items

    cfg = learner.config
    out: dict[str, Any] = {"items": [], "hinted_tasks": 0, "hinted_successes": 0,
                           "hinted_samples": 0, "corrections_used": 0}  # fmt: skip
    if cfg.hints == "off":
        return out
    by_task: dict[tuple[str, int], list[EpisodeRecord]] = {}
    for ep in episodes:
        by_task.setdefault((ep.family, ep.seed), []).append(ep)
    hints: dict[tuple[str, int], str] = {}
    for key in tasks:
        eps = by_task.get(key, [])
        if not eps or any(ep.success for ep in eps):
            continue
        correction = learner.corrections.get(key)
        out["corrections_used"] += int(correction is not None)
        hints[key] = task_hint(cfg, key, eps, correction)
    out["hinted_tasks"] = len(hints)
    if not hints:
        return out
    failed = [ep for key in hints for ep in by_task[key]]
    if cfg.hints == "distill":
        out["items"] = distill_items(learner.tokenizer, failed, hints)
        return out
    k = cfg.hint_samples or cfg.group_size
    batch = [key for key in hints for _ in range(k)]
    again = learner.play(batch, cfg.temperature, hints=[hints[key] for key in batch])
    out["hinted_samples"] = len(again)
    out["hinted_successes"] = sum(ep.success for ep in again)
    out["items"] = importance_items(again)
    return out


def task_hint(
    cfg: ToolUseConfig,
    key: tuple[str, int],
    episodes: Sequence[EpisodeRecord],
    correction: str | None = None,
) -> str:
    """The hint of task `key` (family, seed) whose `episodes` all failed, as the config asks:
    the plan's call with a data program in the config's form (`data_program`)."""
    from agentrl.envs.tooluse.hints import hint_for
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.learners.tooluse_hints import attempts_of

    return hint_for(generate_task(key[1], key[0]), attempts_of(episodes),
                    reveal_answer=cfg.hint_reveals_answer, correction=correction,
                    plan=cfg.hint_plan, data_form=cfg.data_program)  # fmt: skip


def run_tooluse(
    config: ToolUseConfig, say: Callable[[str], None] = print
) -> tuple[ToolUseResult, dict[str, Any]]:
    """All stages; returns the result and the final JSON record."""
    t_start = time.perf_counter()
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    learner = ToolUseLearner(config)
    res = ToolUseResult()
    held = config.heldout()
    assert all(s >= HELDOUT_OFFSET for _, s in held)
    load_s = time.perf_counter() - t_start
    say(f"loaded {config.model} in {load_s:.0f}s; {len(held)} held-out tasks; load {_load()}")

    def evaluate(name: str, adapters: bool = True) -> None:
        if config.unseen_per_family:  # the unseen pool first: reported apart
            t = time.perf_counter()
            eps = learner.play(config.unseen(), 0.0, adapters=adapters, pool="unseen")
            res.timings[f"eval_unseen_{name}_s"] = time.perf_counter() - t
            res.summaries[f"unseen_{name}"] = summarise(eps)
            with (out / f"unseen_{name}.jsonl").open("w") as fh:
                fh.writelines(episode_json(e) + "\n" for e in eps)
            u = res.summaries[f"unseen_{name}"]
            say(
                f"{name}: unseen-pool success {u['all']['success']:.2f} {u['all']['ci']} "
                + " ".join(f"{f} {u[f]['success']:.2f}" for f in config.families if f in u)
            )
        t = time.perf_counter()
        before = dataclasses.replace(learner.timing)
        eps = learner.play(held, 0.0, adapters=adapters)
        res.timings[f"eval_{name}_s"] = time.perf_counter() - t
        tm = learner.timing
        turns, tokens = tm.turns - before.turns, tm.tokens - before.tokens
        say(
            f"{name}: {len(eps)} episodes, {turns} turns, {tokens} generated tokens "
            f"({tokens / max(1, turns):.0f}/turn); decode {tm.decode_s - before.decode_s:.0f}s, "
            f"tools {tm.env_s - before.env_s:.0f}s"
        )
        res.summaries[name] = summarise(eps)
        with (out / f"heldout_{name}.jsonl").open("w") as fh:
            fh.writelines(episode_json(e) + "\n" for e in eps)
        # what is measured so far, kept if the run is stopped before its last line
        (out / "summaries.json").write_text(json.dumps(res.summaries, indent=1))
        s = res.summaries[name]["all"]
        say(
            f"{name}: held-out success {s['success']:.2f} {s['ci']} "
            + " ".join(f"{f} {res.summaries[name][f]['success']:.2f}" for f in config.families)
            + f" ({res.timings[f'eval_{name}_s']:.0f}s, load {_load()})"
        )

    if config.eval_base:
        evaluate("base", adapters=False)
    # warm start
    t = time.perf_counter()
    if config.warm_start and config.warm_tasks_per_family and config.warm_epochs:
        learner.set_lr(config.warm_learning_rate)
        if config.warm_fast:
            from agentrl.learners.tooluse_warm import fast_warm_start

            episodes = warm_episodes(config)
            losses, extra = fast_warm_start(learner, episodes, say, _load)
            res.timings.update(extra)
            n_demos = sum(len(ep.turns) for ep in episodes)
        else:
            demos = demonstrations(learner, config.warm_tasks())
            losses = warm_start(learner, demos, say)
            n_demos = len(demos)
        res.timings["warm_start_s"] = time.perf_counter() - t
        res.timings["warm_epochs"] = len(losses)
        res.checkpoints["warmstart"] = learner.save("warmstart", {"sft_losses": losses})
        say(
            f"warm start: {n_demos} scripted replies, losses {[round(x, 3) for x in losses]} "
            f"({res.timings['warm_start_s']:.0f}s, load {_load()})"
        )
    else:
        res.timings["warm_start_s"] = 0.0
    if not config.eval_start:
        say("start: not measured here (eval_start: false)")
    elif config.warm_start or not config.eval_base:
        evaluate("start")
    else:  # no warm start: the loop starts from the base
        res.summaries["start"] = res.summaries["base"]
        if "unseen_base" in res.summaries:
            res.summaries["unseen_start"] = res.summaries["unseen_base"]
    if config.replay_warm and config.replay_steps and config.warm_tasks_per_family:
        # the warm start's verified episodes (the same seeds it trained on) join the replay
        n = 0
        for ep in warm_episodes(config):
            learner.replay.add(ep.task.family, solved_items(learner.tokenizer, ep), "warm start")
            n += 1
        say(f"replay: {n} verified warm-start episodes")
    # RL
    t = time.perf_counter()
    if config.rl_method != "none":
        for it in range(config.iterations):
            if config.rl_time_budget_s and time.perf_counter() - t > config.rl_time_budget_s:
                say(f"RL time budget {config.rl_time_budget_s:.0f}s spent after {it} iterations")
                break
            rec = rl_iteration(learner, it)
            res.curve.append(rec)
            say(json.dumps(rec))
    res.timings["rl_s"] = time.perf_counter() - t
    if res.curve:
        res.checkpoints["final"] = learner.save("final", {"curve": res.curve})
        evaluate("trained")
    else:  # no RL ran: the trained policy is the start (measured, if it was)
        for key in ("start", "unseen_start"):
            if key in res.summaries:
                res.summaries[key.replace("start", "trained")] = res.summaries[key]
        res.checkpoints["final"] = res.checkpoints.get("warmstart") or learner.save("final", {})
    res.timings["wall_s"] = time.perf_counter() - t_start
    return res, final_record(config, res)


def final_record(config: ToolUseConfig, res: ToolUseResult) -> dict[str, Any]:
    """The run's JSON line; a stage that was not measured is null, never a stand-in."""
    s = res.summaries

    def fig(name: str, key: str = "all", field: str = "success") -> Any:
        return s[name][key][field] if name in s else None

    rec: dict[str, Any] = {
        "base_heldout_success": fig("base"),
        "start_heldout_success": fig("start"),
        "trained_heldout_success": fig("trained"),
        "base_ci": fig("base", field="ci"),
        "start_ci": fig("start", field="ci"),
        "trained_ci": fig("trained", field="ci"),
        "start_ci_high": fig("start", field="ci")[1] if "start" in s else None,
        "trained_ci_low": fig("trained", field="ci")[0] if "trained" in s else None,
        "heldout_tasks": fig("trained", field="episodes"),
        "invalid_calls": sum(
            x["all"]["invalid_calls"] for k, x in s.items() if not k.startswith("unseen_")
        ),
        "cut_by_token_cap": {k: x["all"]["cut_by_token_cap"] for k, x in s.items()},
        "structured": config.structured,
        "rl_method": config.rl_method,
        "rl_iterations": len(res.curve),
        "hints": config.hints,
        "hint_reveals_answer": config.hint_reveals_answer,
        "hint_plan": config.hint_plan,
        "data_program": data_form(config),
        "replay_steps": config.replay_steps,
        "unseen_tasks": fig("unseen_trained", field="episodes"),
        "rl_cut_by_token_cap": sum(r.get("cut_by_token_cap", 0) for r in res.curve),
        "hinted_tasks": sum(r.get("hinted_tasks", 0) for r in res.curve),
        "hinted_samples": sum(r.get("hinted_samples", 0) for r in res.curve),
        "hinted_successes": sum(r.get("hinted_successes", 0) for r in res.curve),
        "corrections_used": sum(r.get("corrections_used", 0) for r in res.curve),
        "rl_train_success": [r["train_success"] for r in res.curve],
    }
    for name in ("base", "start", "trained"):
        for f in config.families:
            rec[f"{name}_{f}"] = fig(name, f)
        rec[f"unseen_{name}_success"] = fig(f"unseen_{name}")
        rec[f"unseen_{name}_ci"] = fig(f"unseen_{name}", field="ci")
        for f in config.families:
            u = s.get(f"unseen_{name}", {})
            rec[f"unseen_{name}_{f}"] = u[f]["success"] if f in u else None
    eval_s = sum(v for k, v in res.timings.items() if k.startswith("eval_"))
    rec.update(
        warm_start_s=round(res.timings.get("warm_start_s", 0.0), 1),
        warm_epochs=int(res.timings.get("warm_epochs", 0)),
        rl_s=round(res.timings.get("rl_s", 0.0), 1),
        eval_s=round(eval_s, 1),
        wall_s=round(res.timings.get("wall_s", 0.0), 1),
        load=_load(),
    )
    return rec


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def run_main(config_path: Path, overrides: dict[str, Any], console: Any) -> dict[str, Any]:
    """`agentrl learn` for a tool-use config: stages, the held-out table, a last JSON line."""
    from rich.table import Table

    config = ToolUseConfig.from_file(config_path, **overrides)
    warm = (
        f"warm start {config.warm_tasks_per_family} tasks/family x {config.warm_epochs} epochs"
        if config.warm_start
        else "no warm start"
    )
    rl = (
        f"RL {config.rl_method} {config.iterations} x {config.tasks_per_iteration} tasks x "
        f"{config.group_size}"
        if config.rl_method != "none"
        else "no RL"
    )
    console.print(
        f"[bold]tool-use learning[/]: {config.model}, Agent Zero JSON, structured outputs "
        f"{'on' if config.structured else 'off'}, {warm}, {rl}, data programs in the "
        f"{data_form(config)} form; load {_load()}"
    )
    res, record = run_tooluse(config, say=lambda m: console.print(m))
    table = Table(
        title=f"held-out greedy success, {record['heldout_tasks']} tasks never trained on"
    )
    table.add_column("model")
    table.add_column("all [95% CI]")
    for f in config.families:
        table.add_column(f)
    table.add_column("answered")
    table.add_column("invalid calls")
    for name in ("base", "start", "trained"):
        s = res.summaries.get(name)
        if s is None:
            continue
        table.add_row(
            name,
            f"{s['all']['success']:.2f} [{s['all']['ci'][0]:.2f}, {s['all']['ci'][1]:.2f}]",
            *[f"{s[f]['success']:.2f}" for f in config.families],
            f"{s['all']['answered']:.2f}",
            str(s["all"]["invalid_calls"]),
        )
    console.print(table)
    (Path(config.out_dir) / "result.json").write_text(
        json.dumps({"record": record, "curve": res.curve, "summaries": res.summaries}, indent=1)
    )
    print(json.dumps(record), flush=True)
    return record
