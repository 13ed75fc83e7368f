"""The two job kinds, run inside the job process (see worker.py).

`dataset`: load the logged trajectories and their latest rewards, build samples, train with
`agentrl.llm`'s PolicyTrainer one optimiser step at a time (cancel is checked between steps,
progress is reported every N steps, a checkpoint written every save_interval steps), then
evaluate on the holdout and write the final checkpoint, the curves and the model card.

`environment`: online rollouts in one of the project's environments through the existing
`agentrl.llm` loop (`train_on_env`, one small adapter, so the entry point can change later).

Holdout evaluation of a dataset job is an off-policy estimate (`training.ope`): each logged
holdout turn is weighted by how much more (or less) likely the trained policy, and the base
model, make its action than the behaviour policy that served it (its logged log-probs),
per decision and self-normalised. `holdout_reward` is the estimate of the trained policy's
reward on the holdout tasks, `improvement_over_baseline` its difference to the base model's
estimate, reported with its 95 % interval and effective sample size.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.core.errors import TrainingError
from agentrl.core.logs import audit
from agentrl.training.jobspec import TRAINERS, JobSpec
from agentrl.training.objectives import policy_loss_of, shape_samples
from agentrl.training.progress import Emitter, Progress, current_metrics, write_curves

if TYPE_CHECKING:
    from agentrl.learners.onpolicy import LoopSettings, TrainingResult
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.samples import PolicySample
    from agentrl.llm.trainer import PolicyTrainer

log = logging.getLogger(__name__)

COMPLETION_SUBJECT = "agent.rl.completion.v1"
COMPLETION_STREAM = "RL_COMPLETIONS"


# -- shared -----------------------------------------------------------------------------------


def trainer_config(spec: JobSpec | dict[str, Any], algorithm: str) -> TrainerConfig:
    """The token trainer's configuration from the job's request."""
    from agentrl.llm.config import TrainerConfig

    spec = JobSpec.of(spec)
    tc = spec.request.training_config
    hp = tc.hyperparameters
    opts = spec.options
    try:
        return TrainerConfig(
            algorithm=algorithm,  # type: ignore[arg-type]
            model=tc.base_model,
            learning_rate=hp.learning_rate,
            batch_size=hp.batch_size,
            epochs=1,
            clip_epsilon=min(hp.clip_epsilon, 0.99),
            gamma=hp.gamma,
            gae_lambda=hp.gae_lambda,
            mixed_precision=tc.compute.mixed_precision,
            device=spec.device,
            save_interval=tc.checkpointing.save_interval,
            max_checkpoints=tc.checkpointing.max_checkpoints,
            storage_path=spec.storage_path,
            max_length=spec.max_length,
            skip_zero_advantage=False,
            seed=opts.seed,
            lora_r=int(spec.extra.get("lora_r", 16)),
            kl_coef=opts.kl_coef,
            policy_loss=policy_loss_of(opts.objective or "pg"),  # type: ignore[arg-type]
        )
    except TrainingError as exc:
        raise TrainingError(str(exc), "CONFIG") from exc
    except ValueError as exc:
        raise TrainingError(f"invalid training configuration: {exc}", "CONFIG") from exc


def init_lora_shape(folder: str | None) -> dict[str, Any]:
    """The LoRA shape of a token-level checkpoint to continue from (its trainer_config.json,
    and the layers its adapters sit on from adapter_config.json): the job's adapter must have
    that shape to load its weights, and no more. Without the layers a job continuing the
    tool-use warm start (adapters on the top 8 of 30 layers) trained fresh adapters on all 30
    (the missing ones load as zeros, silently): 3.75 times the adapted layers, each moved a
    full Adam step from the first update. {} without a checkpoint."""
    if not folder or not (Path(folder) / "trainer_config.json").exists():
        return {}
    saved = json.loads((Path(folder) / "trainer_config.json").read_text())
    keys = ("lora_r", "lora_alpha", "lora_target_modules")
    out = {k: saved[k] for k in keys if k in saved}
    if isinstance(saved.get("lora_layers"), list):  # (a choices job's is a count, not these)
        out["lora_layers"] = [int(x) for x in saved["lora_layers"]]
    adapter = Path(folder) / "adapter_config.json"
    if "lora_layers" not in out and adapter.exists():
        layers = json.loads(adapter.read_text()).get("layers_to_transform")
        if isinstance(layers, int):
            layers = [layers]
        if isinstance(layers, list) and layers:
            out["lora_layers"] = [int(x) for x in layers]
    return out


def continue_from(trainer: PolicyTrainer, folder: str) -> None:
    """Load the adapter (or full weights) of the token-level checkpoint `folder` into the
    job's fresh policy: the job continues that version instead of starting at the base."""
    from agentrl.llm.checkpoint import load_weights

    path = Path(folder)
    if not (path / "trainer_config.json").exists():
        raise TrainingError(
            f"init checkpoint {folder} was not written by a token-level job (no "
            "trainer_config.json); continue from one that was, or from the base",
            "CONFIG",
        )
    load_weights(trainer.policy, path)


def load_trainer(config: TrainerConfig, spec: JobSpec, callback: Any) -> PolicyTrainer:
    """Load the base model; an unknown or unloadable model is a CONFIG error."""
    from agentrl.llm.trainer import PolicyTrainer

    kw: dict[str, Any] = {}
    if spec.tiny_kwargs and config.model.lower() in ("tiny", "tiny-random"):
        kw["tiny_kwargs"] = spec.tiny_kwargs
    try:
        return PolicyTrainer.from_config(config, callback, **kw)
    except TrainingError as exc:
        code = "CONFIG" if "cannot load model" in str(exc) else exc.code
        raise TrainingError(str(exc), code) from exc


def check_store(storage_path: str) -> None:
    """Fail early (INFRA) when the checkpoint store cannot be written."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(storage_path)
        fs.makedirs(root, exist_ok=True)
        probe = root.rstrip("/") + "/.write-probe"
        with fs.open(probe, "wb") as fh:
            fh.write(b"ok")
        fs.rm(probe)
    except Exception as exc:
        raise TrainingError(
            f"checkpoint store {storage_path} cannot be written: {type(exc).__name__}: {exc}",
            "INFRA",
        ) from exc


# -- dataset jobs -----------------------------------------------------------------------------


async def load_data(
    spec: JobSpec | dict[str, Any], seed: int | None = None, trainer: str = "auto"
) -> dict[str, Any]:
    """Trajectories, rewards, completion log and feedback corrections from JetStream.

    With `seed` and a `sample_size`, only the sample's trajectories are read where the
    stream allows it (`dataset.sample_from_stream`: ids and rewards first, then the sampled
    payloads): the result then holds `sampled` = (records, filter report), and
    `trajectories` / `rewards` are the sample's. `trainer` (`jobspec.TRAINERS`): choices
    reads everything (its path takes the newest), auto lets the newest data decide."""
    from agentrl.training.dataset import fetch_by_ids, parse_all, read_subject

    spec = JobSpec.of(spec)
    req = spec.request
    ds = req.training_config.dataset
    start = ds.filter.date_range.start if ds.filter.date_range else None
    from agentrl.bus import Bus
    from agentrl.core.settings import Settings

    try:  # credentials and TLS come from the environment the service passed on
        bus = await Bus.connect(spec.nats_url, settings=Settings(), name="agentrl-training-job")
    except Exception as exc:
        raise TrainingError(f"cannot reach NATS at {spec.nats_url}: {exc!r}", "INFRA") from exc
    nc = bus.nc
    sampled: tuple[list[Any], Any] | None = None
    parsed_rewards: list[dict[str, Any]] | None = None
    try:
        js = nc.jetstream(timeout=10)
        if ds.source == "clickhouse":
            warehouse = await asyncio.to_thread(warehouse_data, spec, req, seed or 0)
            trajs = [orjson_dumps(t) for t in warehouse["trajectories"]]
            rewards = [orjson_dumps(r) for r in warehouse["rewards"]]
        else:
            rewards = await read_subject(js, "RL_REWARDS", "agent.rl.reward.v1", start)
            if seed is not None and ds.sample_size:
                parsed_rewards = parse_all(rewards)
                sampled = await _sample_lazily(js, ds, parsed_rewards, seed, start, trainer)
            if sampled is None:
                trajs = await read_subject(js, ds.stream_name, "agent.rl.trajectory.v1", start)
            else:
                trajs = []
        completions: list[bytes] = []
        feedback: list[bytes] = []
        try:
            lazy = None
            if sampled is not None:  # only the completions the sample's turns name
                lazy = await fetch_by_ids(
                    js,
                    COMPLETION_STREAM,
                    COMPLETION_SUBJECT,
                    completion_ids(r.trajectory for r in sampled[0]),
                    "completion_id",
                    start,
                )
            completions = (
                lazy
                if lazy is not None
                else await read_subject(js, COMPLETION_STREAM, COMPLETION_SUBJECT, start)
            )
        except Exception:  # no completion log yet: every sample is re-tokenised
            log.info("no %s stream: samples use re-tokenised text", COMPLETION_STREAM)
        if req.training_config.algorithm == "dpo":
            with _suppress():
                feedback = await read_subject(js, "RL_FEEDBACK", "agent.rl.feedback.v1", start)
        init_from = (req.training_config.model_extra or {}).get("init_from")
        if init_from and not spec.init_checkpoint:
            from agentrl.training.choice_job import resolve_init

            spec.init_checkpoint = await resolve_init(js, str(init_from), spec.recent_checkpoint)
    except TrainingError:
        raise
    except Exception as exc:
        raise TrainingError(f"reading the dataset from JetStream failed: {exc!r}", "INFRA") from exc
    finally:
        await nc.close()
    comp = {str(c["completion_id"]): c for c in parse_all(completions) if c.get("completion_id")}
    corrections = [f for f in parse_all(feedback) if f.get("type") == "correction"]
    if sampled is not None:
        records = sampled[0]
        audit("data.read", source=ds.source, trajectories=len(records), rewards=len(rewards),
              sampled_from=sampled[1].trajectories, job_id=req.training_job_id)  # fmt: skip
        return {
            "trajectories": [r.trajectory for r in records],
            "rewards": [r.reward for r in records],
            "completions": comp,
            "corrections": corrections,
            "sampled": sampled,
        }
    audit("data.read", source=ds.source, trajectories=len(trajs), rewards=len(rewards),
          job_id=req.training_job_id)  # fmt: skip
    return {
        "trajectories": parse_all(trajs),
        "rewards": parsed_rewards if parsed_rewards is not None else parse_all(rewards),
        "completions": comp,
        "corrections": corrections,
    }


def completion_ids(trajectories: Iterable[dict[str, Any]]) -> set[str]:
    """The completion log ids the turns of `trajectories` name (`action.completion_id`)."""
    out = set()
    for t in trajectories:
        for turn in t.get("turns") or ():
            cid = (turn.get("action") or {}).get("completion_id")
            if cid:
                out.add(str(cid))
    return out


async def _sample_lazily(
    js: Any, ds: Any, rewards: list[dict[str, Any]], seed: int, start: Any, trainer: str = "auto"
) -> tuple[list[Any], Any] | None:
    """`dataset.sample_from_stream` for a job's dataset, None to read everything (the choices
    trainer takes the newest trajectories from a full read)."""
    from agentrl.training.choice_job import guided_share
    from agentrl.training.dataset import FilterReport, latest_rewards, sample_from_stream

    if trainer == "choices":
        return None

    return await sample_from_stream(
        js,
        ds.stream_name,
        "agent.rl.trajectory.v1",
        latest_rewards(rewards),
        ds.filter,
        int(ds.sample_size),
        seed,
        start,
        FilterReport(rewards=len(rewards)),
        newest_guided=(lambda t: guided_share(t) > 0.5) if trainer == "auto" else None,
    )


async def load_data_retrying(
    spec: JobSpec, for_s: float = 30.0, seed: int | None = None, trainer: str = "auto"
) -> dict[str, Any]:
    """`load_data`, tried again for `for_s` seconds when NATS is unreachable (a restarting
    nats-server: reading is safe to repeat); other errors fail at once."""
    deadline = time.monotonic() + for_s
    delay = 0.5
    while True:
        try:
            return await load_data(spec, seed, trainer)
        except TrainingError as exc:
            if exc.code != "INFRA" or time.monotonic() > deadline:
                raise
            log.warning("dataset read failed (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)


def orjson_dumps(obj: Any) -> bytes:
    import orjson

    return orjson.dumps(obj, default=str)


def warehouse_data(spec: JobSpec, req: Any, seed: int = 0) -> dict[str, Any]:
    """The warehouse as the dataset source (`dataset.source == "clickhouse"`): a ClickHouse
    server directly when AGENTRL_CLICKHOUSE_URL is set, else the control API of the process
    that owns the embedded warehouse (`POST /stats/export`). The sample is drawn there, in
    SQL (`warehouse.export.dataset_sql`: the ids first, then only the sampled rows' JSON),
    for the job's seed."""
    import os

    from agentrl.core.settings import Settings
    from agentrl.warehouse.export import clickhouse_load_data

    settings = Settings()
    api_url = None
    token = None
    if not os.environ.get("AGENTRL_CLICKHOUSE_URL"):
        api_url = spec.api_url or f"http://{settings.api_host}:{settings.api_port}"
        token = next(
            (t for t, scopes in settings.api_tokens.items() if {"stats:read", "*"} & set(scopes)),
            None,
        )
    try:
        data: dict[str, Any] = clickhouse_load_data(
            req.training_config.dataset, settings, seed=seed, api_url=api_url, api_token=token
        )
    except Exception as exc:
        raise TrainingError(
            f"reading the dataset from the warehouse failed: {exc!r}", "INFRA"
        ) from exc
    return data


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def decision_logps(trainer: PolicyTrainer, samples: list[PolicySample]) -> list[float]:
    """The policy's log-prob of each sample's (turn's) action tokens, in order."""
    copies = [copy.copy(s) for s in samples]
    for s in copies:
        s.old_logprobs = None
    trainer.score(copies, force_old=True)
    return [float(s.old_logprobs.sum()) for s in copies if s.old_logprobs is not None]


def holdout_decisions(
    samples: list[PolicySample],
    new: list[float],
    base: list[float],
    rewards: dict[str, float],
) -> list[Any]:
    """One `ope.Decision` per holdout turn: its logged behaviour log-prob when the completion
    log had it (exact tokens), else None (the base model stands in)."""
    from agentrl.training.ope import Decision

    out = []
    for s, lp_new, lp_base in zip(samples, new, base, strict=True):
        if s.episode_id not in rewards:
            continue
        mu = float(s.old_logprobs.sum()) if s.old_logprobs is not None else None
        out.append(Decision(s.episode_id, rewards[s.episode_id], lp_new, lp_base, mu))
    return out


def snis_reward(
    new: dict[str, float], base: dict[str, float], rewards: dict[str, float]
) -> float | None:
    """Self-normalised importance sampling over whole trajectories (new / base): what the
    holdout estimate was before `training.ope` (kept for comparison in its tests)."""
    ids = [k for k in rewards if k in new and k in base]
    if not ids:
        return None
    logw = np.clip(np.array([new[k] - base[k] for k in ids]), -20, 20)
    w = np.exp(logw - logw.max())
    r = np.array([rewards[k] for k in ids])
    return float((w * r).sum() / w.sum())


def run_dataset_job(spec: JobSpec | dict[str, Any], emitter: Emitter) -> None:
    """A job on the logged trajectories: load -> samples -> train -> save, by the trainer
    the request names (`jobspec.TRAINERS`: the logged tokens, or valid-action choices)."""
    spec = JobSpec.of(spec)
    trainer = check_dataset_job(spec)
    data = load_sample(spec, emitter, trainer)
    if data.trainer == "choices":
        from agentrl.training.choice_job import run_choice_job

        run_choice_job(spec, emitter, spec.request, data.train, data.extra, data.report,
                       spec.estimator)  # fmt: skip
        return
    job = TokenJob(spec, emitter, data)
    job.load_model()
    job.samples()
    job.train()
    job.save()


def check_dataset_job(spec: JobSpec) -> str:
    """What can be checked before any data is read: the objective for the trainer the request
    names (`auto`: for one of them), the checkpoint store, the declared filters."""
    from agentrl.contracts.filters import declared

    trainer_config(spec, token_algorithm(spec.estimator))  # an invalid one fails at once
    trainer = spec.trainer_named()
    if trainer != "auto":
        spec.objective(trainer)
    elif spec.options.objective is not None and not any(
        spec.options.objective in t.objectives for t in TRAINERS.values()
    ):
        spec.objective("tokens")  # the error names what each trainer takes
    check_store(spec.storage_path)
    try:  # both dataset sources apply the same declared filter set
        declared(spec.request.training_config.dataset.filter)
    except ValueError as exc:
        raise TrainingError(str(exc), "CONFIG") from exc
    return trainer


def token_algorithm(estimator: str) -> str:
    """The token trainer's algorithm for the request's estimator (GiGPO's is GRPO's update)."""
    return estimator if estimator in ("dpo", "rloo") else "grpo"


@dataclass
class Sample:
    """A job's data after loading: the sample split into train and holdout, the completion
    log and corrections, the filter report, and the trainer that runs on it."""

    trainer: str
    train: list[Any]
    hold: list[Any]
    report: Any
    extra: dict[str, Any]  # completions, corrections
    load_s: float


def load_sample(spec: JobSpec, emitter: Emitter, trainer: str) -> Sample:
    """Read the data, filter and sample it (the choices trainer: the newest trajectories),
    split off the holdout. A request that names no trainer is decided here by its data:
    more than half of the newest turns answered from a guided_choice -> choices."""
    from agentrl.training.choice_job import guided_share
    from agentrl.training.dataset import (
        FilterReport,
        apply_filters,
        gc_paused,
        holdout_split,
        latest_rewards,
        seeded_sample,
    )

    req = spec.request
    ds = req.training_config.dataset
    seed = spec.options.seed
    emitter.emit("running", phase="loading data")
    t_load = time.monotonic()
    # freeze: what survives the load (the sample) lives to the job's end; without it the
    # first collection after the pause walks every object parsed (seconds for 100,000)
    with gc_paused(freeze=True):
        data = asyncio.run(load_data_retrying(spec, seed=seed, trainer=trainer))
        if data.get("sampled") is not None:  # only the sample was read (token path)
            records, report = data.pop("sampled")
            trainer = "tokens"
        else:
            report = FilterReport(rewards=len(data["rewards"]))
            report.payloads_read = len(data["trajectories"])
            records, report = apply_filters(
                data["trajectories"], latest_rewards(data["rewards"]), ds.filter, report
            )
            newest = sorted(records, key=lambda r: str(r.trajectory.get("end_timestamp") or ""))
            newest = newest[-ds.sample_size :] if ds.sample_size else newest
            if trainer == "auto":
                guided = guided_share([r.trajectory for r in newest]) > 0.5
                trainer = "choices" if guided else "tokens"
            # choices: the newest trajectories (closest to the policy now)
            records = (
                newest if trainer == "choices" else seeded_sample(records, ds.sample_size, seed)
            )
        del data["trajectories"], data["rewards"]  # only the sample lives on
    spec.objective(trainer)  # a request that named none: the data's trainer must take it
    report.sampled = len(records)
    holdout_size = req.evaluation.holdout_size if req.evaluation.enabled else 0.0
    train, hold = holdout_split(records, holdout_size, seed)
    report.holdout = len(hold)
    if not train:
        raise TrainingError(report.message(), "DATA")
    return Sample(trainer, train, hold, report, data, time.monotonic() - t_load)


class TokenJob:
    """The tokens trainer's job on its sample: `load_model`, `samples`, `train`, `save`."""

    def __init__(self, spec: JobSpec, emitter: Emitter, data: Sample) -> None:
        self.spec, self.emitter, self.data = spec, emitter, data
        self.est = spec.estimator
        self.algorithm = token_algorithm(self.est)
        self.objective = spec.objective("tokens")
        self.config = trainer_config(spec, self.algorithm)
        self.epochs = spec.request.training_config.hyperparameters.epochs
        self.history: list[dict[str, float]] = []
        self.best: dict[str, Any] | None = None
        self.init: str | None = None
        self.hinting: Any = None
        self.replay: Any = None
        # where the job's seconds went (`stages_s` of its completed status): the train_s of
        # progress reports ends at the last RL report, so a replay round and the hint items'
        # training after it read as "save" (39 s of s31's tool-use job; the save took < 0.4 s)
        self.stages: dict[str, float] = {}

    @property
    def reported_objective(self) -> str:
        return self.objective if self.algorithm != "dpo" else "dpo"

    def load_model(self) -> None:
        """The base model (torch and transformers only now: a job without data fails in a
        second), continuing `init_checkpoint` when there is one, and its checkpoint store."""
        # The model phase starts here: importing torch and transformers is part of it
        # (seconds on a busy host), not of the data phase.
        spec, data = self.spec, self.data
        self.emitter.emit(
            "running", phase="loading model", dataset=data.report.as_dict(),
            load_data_s=data.load_s,
        )  # fmt: skip
        import torch

        from agentrl.learners.valid_action import pick_threads
        from agentrl.llm.checkpoint import CheckpointManager
        from agentrl.llm.config import TrainerConfig

        torch.set_num_threads(pick_threads(self.spec.options.threads))  # 1 on a busy host
        self.init = spec.init_checkpoint if self.algorithm != "dpo" else None
        if self.init:  # the adapter must have the shape of the one it continues
            shape = init_lora_shape(self.init)
            self.config = TrainerConfig(**{**self.config.model_dump(), **shape})
        self.trainer = load_trainer(self.config, spec, None)
        self.emitter.count_work(lambda: self.trainer.updates)  # RL, replay, hint items
        if self.init:
            continue_from(self.trainer, self.init)
        tc = spec.request.training_config
        self.ckpt = CheckpointManager(
            self.config.storage_path,
            self.config.max_checkpoints,
            run_info={
                "name": f"agentrl {self.est} on logged trajectories "
                f"(job {spec.request.training_job_id})",
                "data": f"{len(data.train)} trajectories from {tc.dataset.stream_name} "
                f"(holdout {len(data.hold)}), filter {tc.dataset.filter.model_dump(mode='json')}",
            },
        )

    def samples(self) -> None:
        """Training units (samples shaped by the objective, or DPO pairs) and the holdout's
        samples, cut to the model's length."""
        from agentrl.training.samples import build_pairs, build_samples

        data, opts = self.data, self.spec.options
        tok = self.trainer.policy.tokenizer
        completions = data.extra["completions"]
        self.units: list[Any]
        if self.algorithm == "dpo":
            self.units, self.bstats = build_pairs(
                data.train, tok, corrections=data.extra["corrections"]
            )
        else:
            # `constraints` (request specs, e.g. the loop's response_format): constrained
            # completions under them train with ratios against the masked distribution
            samples, self.bstats = build_samples(
                data.train, tok, estimator=self.est, completions=completions,
                constraints=opts.constraints or (),
                advantage_scale=opts.advantage_scale,
            )  # fmt: skip
            shaped = shape_samples(
                samples, self.objective, beta=opts.awr_beta, max_weight=opts.awr_max_weight,
                min_reward=opts.min_reward,
            )  # fmt: skip
            self.units = self._fit(shaped)
        hold_samples, _ = build_samples(data.hold, tok, completions=completions)
        self.hold_samples = self._fit(hold_samples)
        self.hinting = self._hint_step(completions)
        self.replay = self._replay_step(completions)
        if (
            not self.units
            and not (self.hinting and self.hinting.items)
            and not (self.replay and len(self.replay.replay))
        ):
            raise TrainingError(
                f"nothing to train on: {len(data.train)} trajectories gave no "
                + (
                    "preference pairs (every task has one attempt or tied rewards)"
                    if self.algorithm == "dpo"
                    else f"trajectory with a reward >= min_reward {opts.min_reward}"
                    if self.objective == "rs"
                    else "sample with a non-zero advantage (all rewards equal?)"
                ),
                "DATA",
            )

    def _hint_step(self, completions: dict[str, Any]) -> Any:
        """Tool use (`hyperparameters.tooluse_hints`): hints for the tasks whose every
        attempt failed, built before any update (`learners.tooluse_job`); None otherwise."""
        hints = (self.spec.options.model_extra or {}).get("tooluse_hints")
        if self.algorithm == "dpo" or not hints:
            return None
        from agentrl.learners.tooluse_episodes import PlayTiming
        from agentrl.learners.tooluse_job import JobHints, hint_step

        self.hint_settings = JobHints.model_validate(hints)
        self.emitter.emit("running", phase="hinting failed tasks")
        timing = PlayTiming()  # its decode steps tell the service the sampling goes on
        self.emitter.count_work(lambda: timing.stats.decode_steps + timing.stats.prefill_tokens)
        found = hint_step(
            self.trainer, self.data.train, self.hint_settings, completions,
            self.spec.options.seed, timing=timing,
        )  # fmt: skip
        log.info("hints: %s in %.0fs", found.counts, found.seconds)
        self.stages["hint_sampling"] = found.seconds
        return found

    def _replay_step(self, completions: dict[str, Any]) -> Any:
        """Tool use (`hyperparameters.tooluse_replay`): the verified, hint-free successes
        among the job's trajectories, replayed after each RL epoch (`learners.tooluse_job_replay`);
        None when off."""
        replay = (self.spec.options.model_extra or {}).get("tooluse_replay")
        if self.algorithm == "dpo" or not replay:
            return None
        from agentrl.learners.tooluse_job_replay import JobReplaySettings, replay_of_records

        settings = JobReplaySettings.model_validate(replay)
        if not settings.on:
            return None
        found = replay_of_records(
            self.trainer.policy.tokenizer, self.data.train, settings, completions,
            self.spec.options.seed, self.config.max_length,
        )  # fmt: skip
        log.info("replay: %s (skipped %s)", found.counts, found.skipped)
        return found

    def _fit(self, items: list[Any]) -> list[Any]:
        from agentrl.llm.samples import truncate

        kept = []
        for s in items:
            try:
                kept.append(truncate(s, self.config.max_length))
            except ValueError:
                continue
        return kept

    def train(self) -> None:
        """Optimiser steps over the units, epoch by epoch (cancel checked between steps, a
        checkpoint every save_interval steps, the best by the holdout's estimate)."""
        spec, emitter, trainer, units = self.spec, self.emitter, self.trainer, self.units
        self.hold_rewards = {r.trajectory_id: r.score for r in self.data.hold}
        self.base_logps = decision_logps(trainer, self.hold_samples) if self.hold_samples else []
        resumed = self.ckpt.resume(trainer) if spec.resume else None
        if resumed:
            log.info("resumed from %s at step %d", resumed, trainer.global_step)
        batch = self.config.batch_size
        self.per_epoch = per_epoch = math.ceil(len(units) / batch)
        epochs = self.epochs
        self.prog = prog = Progress(emitter, per_epoch * epochs, epochs, spec.status_every_steps)
        prog.done_at_start = trainer.global_step
        emitter.emit(
            "running",
            phase="training",
            **self._sample_figures(),
            resumed_from=resumed,
            progress={
                "current_step": trainer.global_step,
                "total_steps": per_epoch * epochs,
                "total_epochs": epochs,
            },
        )
        rng = np.random.default_rng(self.spec.options.seed)
        step = 0
        last_saved = trainer.global_step
        for epoch in range(epochs):
            order = rng.permutation(len(units))
            for b in range(per_epoch):
                step += 1
                if step <= trainer.global_step:
                    continue  # done before the resume
                emitter.check()
                chunk = [units[i] for i in order[b * batch : (b + 1) * batch]]
                t0 = time.monotonic()
                if self.algorithm == "dpo":
                    metrics = trainer.train_on_pairs(chunk)
                else:
                    metrics = trainer.train_on_samples(chunk, allow_empty=True)
                prog.train_s += time.monotonic() - t0
                self._spent("rl", t0)
                if not metrics:
                    trainer.global_step = step  # nothing trainable in this chunk: count it
                    continue
                m = metrics[-1]
                if "reward_mean" not in m:
                    m["reward_mean"] = (
                        float(np.mean([p.margin for p in chunk]))
                        if self.algorithm == "dpo"
                        else 0.0
                    )
                self.history.append(m)
                if trainer.global_step - last_saved >= self.config.save_interval:
                    last_saved = trainer.global_step
                    self._checkpoint(m, epoch + 1)
                prog.report(trainer.global_step, epoch + 1, m, self.best)
            done_before = per_epoch and (epoch + 1) * per_epoch <= prog.done_at_start
            if self.replay is not None and not done_before:  # ReLIFT: after each RL epoch
                emitter.check()
                t0 = time.monotonic()
                self.replay.train(trainer)
                prog.train_s += time.monotonic() - t0
                self._spent("replay", t0)
        if self.hinting is not None and self.hinting.items:  # after the job's own steps
            emitter.check()
            t0 = time.monotonic()
            self.hinting.train(trainer, self.hint_settings, self.spec.options.seed)
            prog.train_s += time.monotonic() - t0
            self._spent("hint_training", t0)

    def _spent(self, stage: str, since: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + time.monotonic() - since

    def _checkpoint(self, m: dict[str, float], epoch: int) -> None:
        from agentrl.training import ope

        t_save = time.monotonic()
        path = self.ckpt.save(self.trainer, m)
        self._spent("save", t_save)
        self.emitter.emit("running", phase="checkpoint", last_checkpoint=path)
        if self.hold_samples:
            found = ope.estimate(self._holdout_now(), resamples=0)
            score = found.value_new if found is not None else None
            if score is not None and self.ckpt.save_best(self.trainer, score, m):
                self.best = self._best(epoch, score)

    def _holdout_now(self) -> list[Any]:
        new = decision_logps(self.trainer, self.hold_samples)
        return holdout_decisions(self.hold_samples, new, self.base_logps, self.hold_rewards)

    def _best(self, epoch: int, score: float) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "step": self.trainer.global_step,
            "reward_mean": score,
            "checkpoint_path": self.ckpt.url("best"),
        }

    def _sample_figures(self) -> dict[str, Any]:
        b = self.bstats
        return {
            "samples": b.samples,
            "trained_samples": len(self.units),
            "objective": self.reported_objective,
            "init_checkpoint": self.init,
            "exact_token_samples": b.exact_token_samples,
            "pairs": b.pairs,
            "grouped_trajectories": b.grouped_trajectories,
            "baseline_trajectories": b.baseline_trajectories,
        }

    def save(self) -> None:
        """The holdout's off-policy estimate, the final checkpoint, the curves, and the
        completed status with its artifacts."""
        from agentrl.training import ope

        self.emitter.check()
        t_eval = time.monotonic()
        evaluation: dict[str, Any] = {}
        trainer, epochs = self.trainer, self.epochs
        if self.hold_samples:
            found = ope.estimate(self._holdout_now(), seed=self.spec.options.seed)
            est_reward = found.value_new if found is not None else None
            if found is not None and est_reward is not None:
                evaluation = found.as_evaluation()
                last_m = self.history[-1] if self.history else {}
                if self.ckpt.save_best(trainer, est_reward, last_m):
                    self.best = self._best(epochs, est_reward)
        last = self.history[-1] if self.history else {}
        t_save = time.monotonic()
        final = self.ckpt.save(trainer, {**last, **evaluation}, name="final")
        self._spent("save", t_save)
        curves = write_curves(
            self.history, Path(self.spec.job_dir) / "curves.png", f"{self.est} job"
        )
        figures = self._sample_figures()
        self.emitter.emit(
            "completed",
            progress={
                "current_epoch": epochs,
                "total_epochs": epochs,
                "current_step": trainer.global_step,
                "total_steps": self.per_epoch * epochs,
                "percent_complete": 100.0,
                "eta_seconds": 0.0,
            },
            metrics={
                "current": {
                    **current_metrics(last),
                    **(self.hinting.counts if self.hinting is not None else {}),
                    **(self.replay.counts if self.replay is not None else {}),
                },
                **({"best": self.best} if self.best else {}),
            },
            evaluation_results=evaluation or None,
            artifacts={
                "final_checkpoint": final,
                "training_curves": curves,
                "model_card": f"{final}/model_card.md",
                "base_model": self.spec.request.training_config.base_model,
            },
            train_s=self.prog.train_s,
            eval_s=time.monotonic() - t_eval,
            stages_s={k: round(v, 3) for k, v in self.stages.items()},
            dataset=self.data.report.as_dict(),
            **{k: figures[k] for k in ("samples", "trained_samples", "objective")},
            init_checkpoint=self.init,
            exact_token_samples=figures["exact_token_samples"],
        )


# -- environment jobs -------------------------------------------------------------------------


def train_on_env(
    config: TrainerConfig, loop: LoopSettings, trainer: PolicyTrainer, on_iteration: Any
) -> TrainingResult:
    """The one call into agentrl.llm's online loop (swap for `train_on_env` of the learning
    configuration when it lands)."""
    from agentrl.learners.onpolicy import run_training

    return run_training(config, loop, on_iteration=on_iteration, trainer=trainer)


def run_environment_job(spec: JobSpec | dict[str, Any], emitter: Emitter) -> None:
    from dataclasses import asdict

    from agentrl.learners.onpolicy import LoopSettings

    spec = JobSpec.of(spec)
    tc = spec.request.training_config
    env = dict((tc.model_extra or {}).get("environment") or {})
    est = spec.estimator
    config = trainer_config(spec, est if est in ("gigpo", "grpo", "rloo", "ppo", "dpo") else "grpo")
    check_store(spec.storage_path)
    allowed = {
        "env_id",
        "iterations",
        "tasks_per_iteration",
        "group_size",
        "max_steps",
        "max_new_tokens",
        "eval_episodes",
        "base_seed",
        "system_prompt",
        "env_kwargs",
    }
    unknown = set(env) - allowed
    if unknown:
        raise TrainingError(
            f"unknown training_config.environment fields: {sorted(unknown)}", "CONFIG"
        )
    loop = LoopSettings(
        **env,
        resume=spec.resume,
        out_dir=Path(spec.job_dir) / "run",
        write_files=True,
    )
    prog = Progress(emitter, loop.iterations, loop.iterations, 1)
    history: list[dict[str, float]] = []

    def on_step(m: dict[str, float]) -> None:
        history.append(m)
        emitter.check()

    emitter.emit("running", phase="loading model")
    trainer = load_trainer(config, spec, on_step)
    start_step = trainer.global_step
    t_train = time.monotonic()

    def on_iteration(rec: Any) -> None:
        emitter.check()
        m = {
            "loss": rec.loss,
            "reward_mean": rec.reward_mean,
            "reward_std": rec.reward_std,
            "policy_entropy": rec.policy_entropy,
            "approx_kl": rec.approx_kl,
            "learning_rate": trainer.learning_rate,
        }
        prog.train_s = time.monotonic() - t_train
        prog.report(
            rec.iteration, rec.iteration, {k: v for k, v in m.items() if v is not None}, force=True
        )

    emitter.emit("running", phase="training", progress={"total_steps": loop.iterations})
    result = train_on_env(config, loop, trainer, on_iteration)
    last = asdict(result.records[-1]) if result.records else {}
    evaluation = None
    if last.get("eval_success") is not None:
        evaluation = {"holdout_reward": last["eval_success"], "method": "greedy_eval_success"}
        if result.initial_eval_success is not None:
            evaluation["improvement_over_baseline"] = (
                last["eval_success"] - result.initial_eval_success
            )
    metrics = {
        "loss": last.get("loss"),
        "reward_mean": last.get("reward_mean"),
        "reward_std": last.get("reward_std"),
        "policy_entropy": last.get("policy_entropy"),
        "approx_kl": last.get("approx_kl"),
        "learning_rate": trainer.learning_rate,
    }
    final = result.final_checkpoint
    emitter.emit(
        "completed",
        progress={
            "current_epoch": loop.iterations,
            "total_epochs": loop.iterations,
            "current_step": loop.iterations,
            "total_steps": loop.iterations,
            "percent_complete": 100.0,
            "eta_seconds": 0.0,
        },
        metrics={"current": current_metrics(metrics)},
        evaluation_results=evaluation,
        artifacts={
            "final_checkpoint": final,
            "training_curves": result.curve_png,
            "model_card": f"{final}/model_card.md" if final else None,
            "base_model": tc.base_model,
        },
        train_s=sum(r["rollout_s"] + r["update_s"] for r in map(asdict, result.records)),
        optimizer_steps=trainer.global_step - start_step,
    )
    (Path(spec.job_dir) / "history.json").write_text(json.dumps(history, default=float))
