"""The settings of one `agentrl loop` run, its profiles, and what they set for the services.

Every field's docstring is its `agentrl loop --OPTION` help (the command is drawn from this
model: `agentrl.core.configcli`). Why the values are what they are (the measurements behind
them) is in docs/guide/loop.md, "Why the loop's settings are what they are".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MOVES = ["up", "down", "left", "right"]
HELDOUT_OFFSET = 1_000_000  # same as agentrl.learners.valid_action: training seeds stay below
PACE_S = 3.0  # paced acting: agent 0's pause between groups (a job trains or a version validates)


class LoopConfig(BaseModel):
    """One run of the loop. The defaults are the valid-action learning set-up on the whole
    stack (FrozenLake, SmolLM2); `quick()`, `tooluse()` and `on_vllm()` are the other profiles."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    data_dir: Path = Path(".agentrl/loop")
    """A folder of its own, wiped at start. Refused if it holds other data (the loop's
    marker file is missing)."""
    model: str = "smollm2"
    """Base model: smollm2 or tiny. The tiny one is a random model of a few layers."""
    env: Literal["frozenlake", "tooluse"] = "frozenlake"
    """Environment: frozenlake or tooluse. FrozenLake's agents choose a move out of four
    (`guided_choice`); tool-use agents answer in Agent Zero's JSON."""
    backend: Literal["local", "vllm"] = "local"
    """Serving backend: local or vllm. With vllm a supervised `vllm serve` serves every
    version as a LoRA loaded at run time (`agentrl vllm setup`)."""
    generations: int = 4
    """Trained versions to decide. Decided: promoted, rejected or rolled back."""
    until_benchmark: float = 0.6
    """Go on while the benchmark is below. The live version's greedy success on
    validation's own maps (never the held-out ones), up to `max_generations`; 0: off."""
    max_generations: int = 9
    """The most versions `until_benchmark` goes on to."""
    agents: int = 4
    """Agent workers acting through the gateway."""
    group_size: int = 16
    """Episodes of one task per group (GiGPO's group, the canary's session)."""
    threshold: int = 256
    """Rewarded trajectories per job. The trigger's threshold and the job's sample."""
    max_steps: int = 12
    """Turns per episode."""
    heldout_seeds: int = 50
    """Held-out tasks per version at the end. Never trained on."""
    unseen_seeds: int = 0
    """Unseen-phrasing tasks per version. Tool use; reported apart."""
    job_kind: Literal["dataset"] = "dataset"
    """Training job kind the trigger starts (the logged trajectories)."""
    bad_candidate: bool = False
    """Deploy a broken version at the end. It shows the automatic rollback."""
    time_budget_s: float = 1800.0
    """A cap on the run's acting, in seconds. The run ends once `generations` are
    decided."""
    temperature: float = 6.0
    """The agents' sampling temperature. Held-out evaluation is greedy."""
    ramp: tuple[float, ...] = (50.0, 100.0)
    """The canary's traffic steps (percent)."""
    step_delay_s: float = 5.0
    """The canary's least time per step."""
    min_samples: int = 4
    """Sessions a side before the canary decides."""
    max_reward_drop: float = 1.0
    """The canary's non-inferiority margin on the reward scale."""
    inconclusive_deadline_s: float = 240.0
    """An undecided canary step is rolled back after this long."""
    learning_rate: float = 2e-3
    """Each job's learning rate."""
    gamma: float = 0.5
    """The jobs' discount of step returns. GiGPO compares them within a state's group."""
    epochs: int = 20
    """Epochs per job (x 4 minibatches)."""
    objective: str = "state_awr"
    """What a job optimises (`training.objectives`; state_awr: per-state targets)."""
    progress_reward: float = 0.3
    """FrozenLake's shaped reward for a step closer to the goal."""
    hole_penalty: float = 0.3
    """FrozenLake's penalty for falling into a hole."""
    benchmark_episodes: int = 60
    """Validation's benchmark episodes per version (greedy)."""
    grace_s: float = 120.0
    """After the budget: how long to wait for a job or a version being decided."""
    finish_in_flight: bool = True
    """At the end, decide the versions already past validation before evaluating."""
    pace: bool = True
    """Pace acting while a job trains. One agent acts, a group every few seconds: on 2
    cores acting would starve a job or a validation; a canary gets all agents (its
    analysis needs sessions)."""
    fresh: bool = True
    """Start the data dir afresh."""
    max_tokens: int = 4
    """Tokens per reply (a move's name; tool-use replies are JSON)."""
    min_reward: float = 1.0
    """Rejection sampling (objective rs): the least reward of a trajectory kept."""
    init_checkpoint: str | None = None
    """Act first with this checkpoint. A warm start, e.g. from `agentrl learn`: registered
    and promoted by hand before the agents act."""
    structured: bool = True
    """Decode replies under the schema. Tool use: Agent Zero's reply schema; off is the
    ablation (free text, parsed as it comes)."""
    lora_r: int = 16
    """The jobs' LoRA rank (alpha = 2 r)."""
    backend_timeout_s: float = 60.0
    """The gateway's wait for one answer of its backend."""
    lineages: int = Field(0, ge=0, le=2)
    """Lineages, one per agent (FrozenLake).

    On one base model, 4x4 and 5x5 maps; each is trained on its own agents' trajectories, validated and canaried on its own;
    with bad_candidate the drill breaks the first lineage's canary (`app.loop_lineages`)."""
    task_repeats: int = 1
    """Each task acted this many times, one single-episode session each: a job's GiGPO
    group (tool use)."""
    hints: Literal["importance", "distill", "sft", "off"] = "importance"
    """Tool use: hints for failed tasks.

    Where all attempts of a task failed. With importance the job resamples with the hint and
    trains the hint-free prompt on the hinted successes, weighted by the importance ratio to
    the hint-free policy; with distill the model with the hint is the teacher, on the logged
    tokens; sft resamples as importance does and trains the hinted successes as plain NLL
    (ReLIFT); off is the ablation. Importance is the default: on the job harness (90 held-out,
    the light warm start at 0.21) importance ended at 0.16 and distill at 0.10, and by the
    log-prob of the solutions importance moved toward them, distill away (2026-11-29)."""
    hint_reveals_answer: bool = False
    """Tool use: the hint also gives the answer."""
    hint_temperature: float | None = Field(0.3, gt=0)
    """Tool use: the temperature of the jobs' hinted resamples (importance, sft).

    None: the acting temperature. The light warm start's hinted resamples of 7 failed tasks
    succeeded 1 of 21 times at 1.0 (it miscopies the plan's table rows) and 4 of 21 at 0.3,
    and 9 of 24 on 8 more data tasks at 0.3 (bench tooluse_job, 2026-11-29). The importance
    ratio is between the hint-free and the hinted policy, so it does not depend on the
    sampling temperature."""
    hint_tasks: int = Field(8, gt=0)
    """Tool use: failed tasks a job hints at most (the families in turn).

    The hint step's volume: each is resampled `hint_samples` times inside the job, so its
    time grows with both (bench tooluse_job --hint-tasks measures a volume on the harness)."""
    hint_samples: int = Field(4, gt=0)
    """Tool use: hinted resamples per hinted task (importance, sft)."""
    hint_plan: bool = True
    """Tool use: the environment's hint also shows the first reply to write.

    It is the scripted solver's first call (never the answer): words alone taught SmolLM2
    nothing (0 of 24 hinted episodes). false for a run with no scripted solution anywhere:
    the checker's words and users' corrections only."""
    partial_credit: bool = True
    """Partial credit (tool use).

    Per turn, on a failure; off is the ablation: a reward of 0 or 1."""
    replay_steps: int = Field(1, ge=0)
    """Tool use: replay passes per epoch.

    Supervised passes on the verified, hint-free successes among a job's trajectories after
    each of its RL epochs (ReLIFT), `replay_episodes_per_family` of each family; 0 is the
    ablation."""
    replay_episodes_per_family: int = Field(4, ge=0)
    """Tool use: successes of each family in one replay pass.

    The same count from every family (drawn again when it holds fewer); 0 turns the replay
    off."""
    replay_warm_tasks_per_family: int = Field(0, ge=0)
    """Tool use: the warm start's scripted tasks of each family in the replay.

    Its seeds as `agentrl learn` trains the warm start (`warm_tasks_per_family`), the
    environment's verified solutions; for a run with `init_checkpoint` from that warm start;
    0: the loop's own successes only (no scripted solution anywhere)."""
    balance_openings: bool = False
    """Tool use: the jobs' replay passes and hint items open as many replies with the
    calculator as with code_exe.

    The start calls the tool its opening thought names, and an update drifts that thought
    toward the tool it trains most, across families (`JobReplaySettings.balance_openings`,
    `JobHints.balance_openings`; on the job harness the balanced replay kept every family's
    first tool, and in the loop one generation gained 17 and lost 2 of 210 held-out tasks,
    2026-12-01). On in the tool-use profile."""
    data_program: Literal["canonical", "shown"] | None = None
    """Tool use: how the jobs' hints and replayed scripted episodes write a data program.

    "shown": the table's header and cells in the order the question shows them, read by
    column name (`solver.DATA_PROGRAMS`); None: the solver's default, the canonical column
    order. Unset with `init_checkpoint`, the tool-use profile takes the form the warm start
    recorded (`agentrl learn --set data_program=shown`); given, it wins. Not measured yet
    (issue 52, s33)."""

    @classmethod
    def tooluse(cls, quick: bool = False, **kw: Any) -> LoopConfig:
        """The tool-use loop (`--env tooluse`, `agentrl.app.loop_tooluse`): Agent Zero JSON
        replies under structured outputs; jobs by GiGPO (PPO-clip, masked ratios) on the
        logged tokens with partial credit per turn and hints, each task acted 4 times; 210
        held-out tasks (70 per family) and 90 of the unseen pool."""
        base: dict[str, Any] = dict(
            env="tooluse",
            model="smollm2",
            generations=3,
            until_benchmark=0.0,
            # sessions of one episode (docs/guide/loop.md); 16 in flight decode 1.2-1.5x the
            # tokens a second of 8 (`loop_tooluse.SERVE_MAX_BATCH`): the canary's episodes
            agents=16,
            group_size=1,
            task_repeats=4,  # each task in 4 sessions: a job's GiGPO group (issue 52)
            # replay passes and hint items balanced per tool of the opening turn: without it a
            # generation moved arithmetic to code_exe (-15 of 70); with it 17 gained / 2 lost
            # of 210 paired, p 0.0007 (2026-12-01, docs/bench/2026-12.md)
            balance_openings=True,
            threshold=64,
            max_steps=4,
            heldout_seeds=210,
            unseen_seeds=90,
            time_budget_s=1200.0,
            # one generation after the budget: job 582 s (hints 364), validation 503 s, canary
            # 350 s (2026-11-30, load 5); 120 s cut the first job off and nothing was trained
            grace_s=1800.0,
            temperature=1.0,
            objective="pg",
            epochs=2,
            # the standalone learner's RL rate on the warm start's top-8-layer adapters: at
            # 5e-4 (adapters on all 30 layers) a job's PPO approx_kl reached 0.45 in 4 steps
            # (`python -m agentrl.bench.tooluse_job`, 2026-11-29)
            learning_rate=2e-4,
            max_tokens=256,
            benchmark_episodes=4,
            min_samples=8,
            max_reward_drop=0.5,
            inconclusive_deadline_s=1200.0,
        )
        if quick:
            base.update(
                model="tiny",
                generations=1,
                agents=2,
                group_size=2,
                threshold=8,
                max_steps=2,
                heldout_seeds=3,  # one task per family
                unseen_seeds=3,
                time_budget_s=600.0,
                grace_s=120.0,
                step_delay_s=1.0,
                min_samples=4,
                max_reward_drop=2.0,
                inconclusive_deadline_s=300.0,  # a cap: the canary ends when it decides
                epochs=1,
                # a random model fills any cap: the chain, not its replies (every reply is
                # cut at 12 as at 24; the quick run 34.1/34.8 -> 29.1/27.7 CPU-s with hint_tasks 1)
                max_tokens=12,
                # a random model's hinted resamples never succeed: importance would decode
                # minutes inside the job for nothing; distill's forward passes walk the chain
                # (one hinted task walks it: each more is its turns' forward passes again)
                hints="distill",
                hint_tasks=1,
                benchmark_episodes=1,
                finish_in_flight=False,
                task_repeats=1,
            )
        if kw.get("init_checkpoint") and "data_program" not in kw:
            # the form the warm start learned, where it recorded one (`agentrl learn`)
            from agentrl.app.loop_tooluse import start_data_program

            base["data_program"] = start_data_program(kw["init_checkpoint"])
        base.update(kw)
        return cls(**base)

    @classmethod
    def on_vllm(cls, **kw: Any) -> LoopConfig:
        """The FrozenLake loop served by vLLM's CPU build (`--backend vllm`), sized to what one
        core answers: 2 agents x groups of 4, rank-8 adapters, one generation on 128
        trajectories, temperature 2 (vLLM's maximum); about 35 minutes on 2 cores."""
        base: dict[str, Any] = dict(
            backend="vllm",
            generations=1,
            until_benchmark=0.0,
            agents=2,
            group_size=4,
            threshold=128,
            temperature=2.0,
            lora_r=8,
            backend_timeout_s=300.0,
            benchmark_episodes=10,
            min_samples=4,
            max_reward_drop=1.0,
            inconclusive_deadline_s=1500.0,
            time_budget_s=3600.0,
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def quick(cls, **kw: Any) -> LoopConfig:
        """The seconds-long FrozenLake loop with the tiny random model: the chain, not learning."""
        base: dict[str, Any] = dict(
            model="tiny",
            generations=1,
            until_benchmark=0.0,  # a random model's benchmark is 0: no extension
            agents=2,
            group_size=2,  # a canary's 2 sessions a version in 4 episodes (docs/guide/loop.md)
            threshold=8,
            max_steps=4,
            heldout_seeds=8,
            time_budget_s=600.0,
            ramp=(50.0, 100.0),
            step_delay_s=1.0,
            min_samples=4,
            max_reward_drop=2.0,  # the random model's rewards are noise: the whole range
            inconclusive_deadline_s=60.0,
            epochs=1,
            temperature=1.0,
            benchmark_episodes=4,
            finish_in_flight=False,
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def profile(
        cls, *, env: str = "frozenlake", backend: str = "local", quick: bool = False, **kw: Any
    ) -> LoopConfig:
        """The profile `env`, `backend` and `quick` name, with `kw` over it."""
        if env == "tooluse":
            return cls.tooluse(quick=quick, backend=backend, **kw)
        if backend == "vllm" and not quick:
            return cls.on_vllm(env=env, **kw)
        if quick:
            return cls.quick(env=env, backend=backend, **kw)
        return cls(env=env, backend=backend, **kw)  # type: ignore[arg-type]


def loop_environment(cfg: LoopConfig) -> dict[str, str]:
    """The other services' settings for a loop-sized run (only those not set by the user)."""
    hyper = {
        # the moves are guided_choice turns (`training.jobspec.TRAINERS`)
        "trainer": "choices" if cfg.env == "frozenlake" else "tokens",
        "objective": cfg.objective,
        "gamma": cfg.gamma,
        "awr_beta": 0.5,
        "minibatches": 4,
        "policy_temperature": 2.0,
        "lora_layers": 2,
        "lora_r": cfg.lora_r,
        "lora_alpha": 2 * cfg.lora_r,
        "entropy_coef": 0.02,
    }
    env = {
        "AGENTRL_TRAINING_THRESHOLD": str(cfg.threshold),
        "AGENTRL_TRAINING_SCHEDULE": "",
        "AGENTRL_TRAINING_BASE_MODEL": cfg.model,
        "AGENTRL_TRAINING_ALGORITHM": "grpo",
        "AGENTRL_TRAINING_ADVANTAGE_ESTIMATOR": "gigpo",
        "AGENTRL_TRAINING_SAMPLE_SIZE": str(cfg.threshold),
        # a job reads the last minutes only (its sample is the newest `threshold` anyway):
        # the streams grow by thousands of trajectories and completions per generation
        "AGENTRL_TRAINING_DATASET_WINDOW_S": "300",
        "AGENTRL_TRAINING_BATCH_SIZE": "16",
        "AGENTRL_TRAINING_EPOCHS": str(cfg.epochs),
        "AGENTRL_TRAINING_LEARNING_RATE": str(cfg.learning_rate),
        "AGENTRL_TRAINING_MAX_LENGTH": "512",
        "AGENTRL_TRAINING_HOLDOUT_SIZE": "0.0",
        "AGENTRL_TRAINING_STATUS_EVERY_STEPS": "5",
        "AGENTRL_TRAINING_HYPERPARAMETERS": json.dumps(hyper),
        "AGENTRL_TRAINING_INIT_FROM": "latest",
        # the next job's process waits with torch imported: 5-8 s off each job of the chain
        "AGENTRL_TRAINING_WARM_WORKER": "true",
        "AGENTRL_TRAINING_MIXED_PRECISION": _mixed_precision(cfg.model),
        "AGENTRL_DEPLOY_BASE_MODEL": cfg.model,
        "AGENTRL_DEPLOY_BACKEND": cfg.backend,
        "AGENTRL_DEPLOY_BACKEND_TIMEOUT_S": str(cfg.backend_timeout_s),
        "AGENTRL_DEPLOY_RAMP": json.dumps(list(cfg.ramp)),
        "AGENTRL_DEPLOY_STEP_DELAY_S": str(cfg.step_delay_s),
        "AGENTRL_DEPLOY_MONITOR_PERIOD_S": "0.5",
        "AGENTRL_DEPLOY_MIN_SAMPLES": str(cfg.min_samples),
        "AGENTRL_DEPLOY_MAX_REWARD_DROP": str(cfg.max_reward_drop),
        "AGENTRL_DEPLOY_INCONCLUSIVE_DEADLINE_S": str(cfg.inconclusive_deadline_s),
        # validation plays FrozenLake as the agents do (valid actions, greedy) on benchmark
        # maps of its own (neither training nor held-out seeds); a candidate worse than the
        # live version by more than 0.05 is rejected (the seed's regression rule)
        "AGENTRL_DEPLOY_BENCHMARK_TASKS": json.dumps({"research_synthesis": ["frozenlake-4x4"]}),
        "AGENTRL_DEPLOY_BENCHMARK_ENV_KWARGS": json.dumps(
            {"frozenlake-4x4": {"obs_format": "egocentric"}}
        ),
        "AGENTRL_DEPLOY_BENCHMARK_SYSTEM_PROMPT": _system_prompt(),
        "AGENTRL_DEPLOY_BENCHMARK_VALID_ACTIONS": "true",
        "AGENTRL_DEPLOY_BENCHMARK_MAX_STEPS": str(cfg.max_steps),
        "AGENTRL_DEPLOY_BENCHMARK_EPISODES": str(cfg.benchmark_episodes),
        "AGENTRL_DEPLOY_BENCHMARK_SEED": str(HELDOUT_OFFSET + 500_000),
        # the moves are one word; safety refusals show in the first dozen tokens
        "AGENTRL_DEPLOY_VALIDATION_MAX_NEW_TOKENS": "12" if cfg.model == "tiny" else "24",
    }
    if cfg.model == "smollm2":  # the jobs load the base the gateway converted, not their own
        from agentrl.llm.loading import smollm2_dir  # (a fresh clone's first job: 28 s)

        env["AGENTRL_MODELS_DIR"] = str(smollm2_dir().parent.resolve())
    if cfg.env == "tooluse":
        from agentrl.app import loop_tooluse

        env.update(loop_tooluse.environment(cfg))
    if cfg.backend == "vllm":  # vLLM's LoRA slots sized to the jobs' adapters (see on_vllm)
        env["AGENTRL_VLLM_MAX_LORA_RANK"] = str(cfg.lora_r)
        env["AGENTRL_VLLM_MAX_LORAS"] = "2"  # live and canary in one batch
    if not cfg.finish_in_flight:  # a quick run ends at its first decided version (a
        # rejected one counts): its generations' jobs only; a job more trained, validated
        # (and, with lineages, canaried before the drill could start) for nothing
        env["AGENTRL_TRAINING_THRESHOLD_MAX_JOBS"] = str(cfg.generations)
    if cfg.model == "tiny":  # a random tiny model's safety scores are noise: no drop check
        env["AGENTRL_DEPLOY_SAFETY_MAX_DROP"] = "1.0"
    return {k: v for k, v in env.items() if k not in os.environ}


def _mixed_precision(model: str) -> str:
    """The jobs' autocast: bf16 where it pays here (`llm.precision`: torch's import and a
    timed product); the tiny random model trains in fp32 with no probe, so a tiny run imports
    torch where its stack loads the model, not before its nats-server starts (a quick loop
    stopped while starting had spent ~3 CPU-s on torch's import here)."""
    if model == "tiny":
        return "no"
    from agentrl.llm.precision import bf16_pays

    return "bf16" if bf16_pays() else "no"


def _system_prompt() -> str:
    from agentrl.learners.valid_action_prompt import SYSTEM_PROMPT

    return SYSTEM_PROMPT


def loop_task(cfg: LoopConfig, seed: int, family: str = "mixed", pool: str = "train") -> Any:
    """The agents' task: FrozenLake 4x4 (egocentric observations, shaped step rewards) with
    the learning configuration's short system prompt; or a tool-use question (`family`)."""
    from agentrl.core.episodes import Message
    from agentrl.envs.registry import task_for

    if cfg.env == "tooluse":
        from agentrl.app import loop_tooluse

        return loop_tooluse.task(seed, cfg.max_steps, family, pool)
    task = task_for(
        "frozenlake-4x4",
        seed,
        max_episode_steps=cfg.max_steps,
        obs_format="egocentric",
        progress_reward=cfg.progress_reward,
        hole_penalty=cfg.hole_penalty,
    )
    task.initial_messages = [Message(role="system", content=_system_prompt())]
    return task
