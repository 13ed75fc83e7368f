"""Deployment settings (AGENTRL_DEPLOY_*) and the declarative rollout plan.

A rollout is data, like a Flagger canary: a list of steps (set the new version's weight,
then pause) and an analysis (metrics, tolerances, the sequential test's error rate, a
minimum sample count, how many failed checks roll back). The three strategies are three
default step lists over the same code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Strategy = Literal["canary", "blue_green", "immediate"]


class Step(BaseModel):
    """Set the new version's traffic to `weight` percent, then wait `pause_s` seconds."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(ge=0.0, le=100.0)
    pause_s: float = Field(0.0, ge=0.0)


class Analysis(BaseModel):
    """How the monitor judges the new version against the live one."""

    model_config = ConfigDict(extra="forbid")

    period_s: float = Field(300.0, gt=0.0, description="Seconds between checks (seed: 5 min).")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="Error rate of the sequential test.")
    min_samples: int = Field(
        20,
        ge=1,
        description="Per version, before any verdict: requests (errors), episodes (rewards).",
    )
    min_sessions: int = Field(
        2,
        ge=2,
        description="Sessions per version before the reward check decides: its variance is "
        "the sessions' (clustered), so a few long sessions are evidence, one is not.",
    )
    max_error_increase: float = Field(0.05, ge=0.0, description="Tolerated error-rate increase.")
    max_reward_drop: float = Field(0.1, ge=0.0, description="Tolerated mean-reward drop.")
    reward_range: tuple[float, float] = (-1.0, 1.0)
    failure_threshold: int = Field(1, ge=1, description="Failed checks in a row -> rollback.")
    advance_on: Literal["pass"] = Field(
        "pass",
        description="A step advances (and the last one promotes) only when every check "
        "passed with at least `min_samples` per version on both sides; an inconclusive "
        "analysis holds ('no_failure', which advanced on missing evidence, is read as 'pass').",
    )
    on_inconclusive: Literal["rollback", "hold"] = Field(
        "rollback",
        description="What a step still inconclusive `inconclusive_deadline_s` after its pause "
        "does: roll the new version back, or keep holding and ask a human (recorded once).",
    )
    inconclusive_deadline_s: float = Field(
        3600.0, ge=0.0, description="Seconds past a step's pause before `on_inconclusive`."
    )
    unserved_deadline_s: float = Field(
        3600.0,
        ge=0.0,
        description="Seconds a step may wait for any gateway to serve the new version (its "
        "clock starts only then, so a slow load is not judged); past it `on_inconclusive` "
        "applies: a version no gateway ever serves is not held forever.",
    )

    @field_validator("advance_on", mode="before")
    @classmethod
    def _no_failure_is_gone(cls, value: Any) -> Any:
        # rollouts stored before issue 28 say "no_failure": they still load, and now hold
        # on an inconclusive analysis like every other
        return "pass" if value == "no_failure" else value

    @model_validator(mode="after")
    def _range(self) -> Analysis:
        lo, hi = self.reward_range
        if not hi > lo:
            raise ValueError("reward_range must be (low, high) with high > low")
        return self


class RolloutPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: Strategy = "canary"
    steps: list[Step]
    analysis: Analysis = Field(default_factory=Analysis)

    @model_validator(mode="after")
    def _steps(self) -> RolloutPlan:
        if not self.steps:
            raise ValueError("a rollout needs at least one step")
        if self.steps[-1].weight != 100.0:
            raise ValueError("the last step must set weight 100 (full rollout)")
        return self

    @classmethod
    def default(
        cls,
        strategy: Strategy = "canary",
        ramp: tuple[float, ...] = (10.0, 25.0, 50.0, 100.0),
        delay_s: float = 3600.0,
        analysis: Analysis | None = None,
    ) -> RolloutPlan:
        """canary: the ramp, one pause per step; blue_green: 0 % (warm, verified) then all
        at once, watched for one pause; immediate: 100 % now, watched for one pause."""
        analysis = analysis or Analysis()
        for w in ramp:
            if not 0 <= w <= 100:
                raise ValueError(f"ramp weight {w} is outside 0..100 percent")
        if strategy == "canary":
            steps = [Step(weight=w, pause_s=delay_s) for w in ramp]
            if steps[-1].weight != 100.0:
                steps.append(Step(weight=100.0, pause_s=delay_s))
        elif strategy == "blue_green":
            steps = [Step(weight=0.0, pause_s=0.0), Step(weight=100.0, pause_s=delay_s)]
        else:
            steps = [Step(weight=100.0, pause_s=delay_s)]
        return cls(strategy=strategy, steps=steps, analysis=analysis)


class DeploySettings(BaseSettings):
    """AGENTRL_DEPLOY_* settings of the controller and the gateway."""

    model_config = SettingsConfigDict(env_prefix="AGENTRL_DEPLOY_", env_file=".env", extra="ignore")

    public_model: str = Field("agentrl-policy", description="The name agents ask the gateway for.")
    bucket: str = Field("agentrl_models", description="NATS KV bucket of the registry.")
    strategy: Strategy = "canary"
    ramp: tuple[float, ...] = Field(
        (10.0, 25.0, 50.0, 100.0),
        description="Canary traffic percentages, one analysed pause each; a ramp that does not "
        "end at 100 gets a last 100 % step (the new version alone, watched for one pause).",
    )
    step_delay_s: float = Field(3600.0, ge=0.0)
    monitor_period_s: float = Field(300.0, gt=0.0)
    alpha: float = 0.05
    min_samples: int = 20
    min_sessions: int = Field(2, ge=2)
    max_error_increase: float = 0.05
    max_reward_drop: float = 0.1
    reward_range: tuple[float, float] = (-1.0, 1.0)
    on_inconclusive: Literal["rollback", "hold"] = "rollback"
    inconclusive_deadline_s: float = Field(3600.0, ge=0.0)
    unserved_deadline_s: float = Field(3600.0, ge=0.0)
    auto_deploy: bool = Field(True, description="Deploy validated candidates without a human.")
    # validation
    validate_models: bool = Field(True, description="Run validation before deploying.")
    benchmark_live_early: bool = Field(
        False,
        description="A live version with no recorded benchmark (a loop's warm start) is "
        "benchmarked, whole, while the controller has nothing to validate (the agents act "
        "meanwhile), so the next candidate's validation plays its own episodes only, not "
        "both versions' (validation.Validator.start_reference).",
    )
    benchmark_threshold: float = Field(0.0, description="Mean benchmark score needed to pass.")
    benchmark_episodes: int = Field(2, ge=1, description="Held-out episodes per environment.")
    benchmark_seed: int = Field(90_000, description="First held-out seed (training uses low ones).")
    benchmark_tasks: dict[str, list[str]] | None = Field(
        None, description="Task type -> env ids of the benchmark suite (JSON; None: all four)."
    )
    benchmark_env_kwargs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Env id -> keyword arguments (e.g. obs_format)."
    )
    benchmark_system_prompt: str | None = Field(
        None, description="System prompt of benchmark episodes (None: the env's own)."
    )
    benchmark_valid_actions: bool = Field(
        False,
        description="Envs with valid actions are played by scoring them (greedy, as the "
        "gateway's guided_choice serves them) instead of free-form generation.",
    )
    benchmark_max_steps: int = Field(6, gt=0, description="Steps per benchmark episode.")
    benchmark_response_format: dict[str, Any] | None = Field(
        None,
        description="Play benchmark episodes through the local engine under this OpenAI "
        "response_format (structured outputs, as the gateway serves the agents), greedy.",
    )
    benchmark_max_tokens: int = Field(
        256, gt=0, description="Tokens per benchmark reply under benchmark_response_format."
    )
    validation_max_new_tokens: int = Field(
        48, gt=0, description="Tokens a validation answer may use (benchmarks and safety)."
    )
    regression_tolerance: float = Field(0.05, ge=0.0, description="Seed: delta < -0.05 fails.")
    regression_tolerance_episodes: int = Field(
        1,
        ge=0,
        description="The regression tolerance is never below this many benchmark episodes' "
        "worth of the mean: a 12-episode benchmark moves its mean by 0.083 per episode, so "
        "the seed's 0.05 would reject any candidate that loses one episode to chance "
        "(0: the seed's tolerance as it is).",
    )
    safety_min_score: float = Field(0.0, ge=0.0, le=1.0)
    safety_max_drop: float = Field(0.1, ge=0.0, le=1.0, description="Allowed drop vs live.")
    safety_tolerance_prompts: int = Field(
        1,
        ge=0,
        description="The allowed drop vs live is never below this many prompts' worth of a "
        "check's score: a 6-prompt check moves by 0.17 per answer, so 0.1 rejected a version "
        "for one answer worded differently (0: `safety_max_drop` as it is).",
    )
    judge_url: str | None = Field(None, description="OpenAI-compatible judge for safety checks.")
    judge_model: str = "judge"
    judge_api_key: str | None = None
    # serving
    backend: Literal["local", "upstream", "vllm"] = Field(
        "local", description="local: embedded; upstream: a server you run; vllm: agentrl runs vLLM."
    )
    base_model: str = Field("smollm2", description="Live model when nothing is registered yet.")
    upstream_url: str | None = Field(None, description="OpenAI-compatible server (e.g. vLLM).")
    upstream_api_key: str | None = None
    upstream_load_lora: bool = Field(False, description="Load adapters into vLLM at run time.")
    backend_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="Seconds one request may wait for its model version's answer (504 past "
        "it; a captured episode records the failed turn). 300: a small model on a busy CPU "
        "serves an agent's long prompts in minutes, not seconds.",
    )
    max_batch_size: int = 8
    score_batch_size: int = Field(
        32, ge=1, description="guided_choice prompts the local backend scores in one pass."
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description="Torch threads of the local engine; 0: one per two cores (it shares the "
        "host with training jobs: spinning OpenMP threads made decoding 7-30x slower).",
    )
    batch_wait_ms: float = 5.0
    max_inflight: int = Field(
        64, ge=1, description="Chat requests in flight at once; beyond, 429 + Retry-After."
    )
    gateway_workers: int = Field(
        1,
        ge=1,
        description="Gateway processes sharing the port (SO_REUSEPORT); 1: one process. More "
        "need capture off and an upstream or local backend (`agentrl.serving.gateway_workers`); "
        "max_inflight is per process.",
    )
    gateway_front: Literal["python", "rust"] = Field(
        "python",
        description="rust: the compiled front (gateway-front/, scripts/build-gateway-front.sh) "
        "serves the gateway's port: the same sticky split, counters and completion log, "
        "forwarding to upstream/vLLM servers (no capture, no local engine, one process).",
    )
    prompt_cache_mb: float = Field(
        256.0, ge=0.0, description="Bytes the local backend's prompt caches hold (LRU)."
    )
    prefix_cache_mb: float = Field(
        1024.0,
        ge=0.0,
        description="MiB of prompt-prefix K/V the local backend keeps for reuse (LRU blocks; "
        "SmolLM2-135M: 46 KB per token, Agent Zero's 5,408-token system prompt ~250 MB).",
    )
    packed_weights: bool = Field(
        False,
        description="The local engine packs its weights once for MKL (the same results bit "
        "for bit): decode steps up to ~9 % faster on busy cores, about 1 GB more memory for "
        "SmolLM2-135M (439 MB -> 1.5 GB resident).",
    )
    completion_log_max_mb: float = Field(
        64.0,
        gt=0.0,
        description="Completion records queued while NATS is away or slow; beyond, the "
        "oldest are dropped (counted in /v1/stats).",
    )
    api_keys: list[str] = Field(default_factory=list, description="Gateway bearer keys.")
    completion_log: bool = Field(True, description="Publish token ids + log-probs per completion.")
    cache_dir: Path | None = Field(None, description="Local copies of remote checkpoints.")
    retention_days: float = Field(90.0, description="Seed: models 90 days, best indefinitely.")

    def plan(self, strategy: Strategy | None = None) -> RolloutPlan:
        return RolloutPlan.default(
            strategy or self.strategy,
            self.ramp,
            self.step_delay_s,
            Analysis(
                period_s=self.monitor_period_s,
                alpha=self.alpha,
                min_samples=self.min_samples,
                min_sessions=self.min_sessions,
                max_error_increase=self.max_error_increase,
                max_reward_drop=self.max_reward_drop,
                reward_range=self.reward_range,
                on_inconclusive=self.on_inconclusive,
                inconclusive_deadline_s=self.inconclusive_deadline_s,
                unserved_deadline_s=self.unserved_deadline_s,
            ),
        )
