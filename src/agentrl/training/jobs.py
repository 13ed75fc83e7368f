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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.errors import TrainingError
from agentrl.logs import audit
from agentrl.training.objectives import OBJECTIVES, policy_loss_of, shape_samples
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


def trainer_config(spec: dict[str, Any], algorithm: str) -> TrainerConfig:
    from agentrl.contracts.training import TrainingRequest
    from agentrl.llm.config import TrainerConfig

    req = TrainingRequest.model_validate(spec["request"])
    tc = req.training_config
    hp = tc.hyperparameters
    extra = hp.model_extra or {}
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
            device=spec.get("device", "cpu"),
            save_interval=tc.checkpointing.save_interval,
            max_checkpoints=tc.checkpointing.max_checkpoints,
            storage_path=spec["storage_path"],
            max_length=int(spec.get("max_length", 1024)),
            skip_zero_advantage=False,
            seed=int(extra.get("seed", 0)),
            lora_r=int(extra.get("lora_r", 16)),
            kl_coef=float(extra.get("kl_coef", 0.0)),
            policy_loss=policy_loss_of(objective_of(extra)),  # type: ignore[arg-type]
        )
    except TrainingError as exc:
        raise TrainingError(str(exc), "CONFIG") from exc
    except ValueError as exc:
        raise TrainingError(f"invalid training configuration: {exc}", "CONFIG") from exc


def objective_of(extra: dict[str, Any]) -> str:
    """The token path's objective (`training.objectives`); the choice path's 'ppo' is 'pg'."""
    objective = str(extra.get("objective", "pg"))
    return "pg" if objective == "ppo" else objective


def init_lora_shape(folder: str | None) -> dict[str, Any]:
    """The LoRA shape of a token-level checkpoint to continue from (its trainer_config.json):
    the job's adapter must have that shape to load its weights. {} without one."""
    if not folder or not (Path(folder) / "trainer_config.json").exists():
        return {}
    saved = json.loads((Path(folder) / "trainer_config.json").read_text())
    keys = ("lora_r", "lora_alpha", "lora_target_modules")
    return {k: saved[k] for k in keys if k in saved}


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


def load_trainer(config: TrainerConfig, spec: dict[str, Any], callback: Any) -> PolicyTrainer:
    """Load the base model; an unknown or unloadable model is a CONFIG error."""
    from agentrl.llm.trainer import PolicyTrainer

    kw: dict[str, Any] = {}
    if spec.get("tiny_kwargs") and config.model.lower() in ("tiny", "tiny-random"):
        kw["tiny_kwargs"] = spec["tiny_kwargs"]
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


async def load_data(spec: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """Trajectories, rewards, completion log and feedback corrections from JetStream.

    With `seed` and a `sample_size`, only the sample's trajectories are read where the
    stream allows it (`dataset.sample_from_stream`: ids and rewards first, then the sampled
    payloads): the result then holds `sampled` = (records, filter report), and
    `trajectories` / `rewards` are the sample's."""
    from agentrl.contracts.training import TrainingRequest
    from agentrl.training.dataset import fetch_by_ids, parse_all, read_subject

    req = TrainingRequest.model_validate(spec["request"])
    ds = req.training_config.dataset
    start = ds.filter.date_range.start if ds.filter.date_range else None
    from agentrl.bus import Bus
    from agentrl.settings import Settings

    try:  # credentials and TLS come from the environment the service passed on
        bus = await Bus.connect(spec["nats_url"], settings=Settings(), name="agentrl-training-job")
    except Exception as exc:
        raise TrainingError(f"cannot reach NATS at {spec['nats_url']}: {exc!r}", "INFRA") from exc
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
                sampled = await _sample_lazily(js, ds, parsed_rewards, seed, start)
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
        if init_from and not spec.get("init_checkpoint"):
            from agentrl.training.choice_job import resolve_init

            spec["init_checkpoint"] = await resolve_init(
                js, str(init_from), spec.get("recent_checkpoint")
            )
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
    js: Any, ds: Any, rewards: list[dict[str, Any]], seed: int, start: Any
) -> tuple[list[Any], Any] | None:
    """`dataset.sample_from_stream` for a job's dataset, None to read everything."""
    from agentrl.training.choice_job import guided_share
    from agentrl.training.dataset import FilterReport, latest_rewards, sample_from_stream

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
        newest_guided=lambda trajectories: guided_share(trajectories) > 0.5,
    )


async def load_data_retrying(
    spec: dict[str, Any], for_s: float = 30.0, seed: int | None = None
) -> dict[str, Any]:
    """`load_data`, tried again for `for_s` seconds when NATS is unreachable (a restarting
    nats-server: reading is safe to repeat); other errors fail at once."""
    deadline = time.monotonic() + for_s
    delay = 0.5
    while True:
        try:
            return await load_data(spec, seed)
        except TrainingError as exc:
            if exc.code != "INFRA" or time.monotonic() > deadline:
                raise
            log.warning("dataset read failed (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 4.0)


def orjson_dumps(obj: Any) -> bytes:
    import orjson

    return orjson.dumps(obj, default=str)


def warehouse_data(spec: dict[str, Any], req: Any, seed: int = 0) -> dict[str, Any]:
    """The warehouse as the dataset source (`dataset.source == "clickhouse"`): a ClickHouse
    server directly when AGENTRL_CLICKHOUSE_URL is set, else the control API of the process
    that owns the embedded warehouse (`POST /stats/export`). The sample is drawn there, in
    SQL (`warehouse.export.dataset_sql`: the ids first, then only the sampled rows' JSON),
    for the job's seed."""
    import os

    from agentrl.settings import Settings
    from agentrl.warehouse.export import clickhouse_load_data

    settings = Settings()
    api_url = None
    token = None
    if not os.environ.get("AGENTRL_CLICKHOUSE_URL"):
        api_url = spec.get("api_url") or f"http://{settings.api_host}:{settings.api_port}"
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


def run_dataset_job(spec: dict[str, Any], emitter: Emitter) -> None:
    from agentrl.contracts.training import TrainingRequest
    from agentrl.training import ope
    from agentrl.training.choice_job import guided_share
    from agentrl.training.dataset import (
        FilterReport,
        apply_filters,
        gc_paused,
        holdout_split,
        latest_rewards,
        seeded_sample,
    )
    from agentrl.training.requests import estimator as estimator_of

    req = TrainingRequest.model_validate(spec["request"])
    tc = req.training_config
    est = estimator_of(req)
    algorithm = "dpo" if est == "dpo" else ("rloo" if est == "rloo" else "grpo")
    config = trainer_config(spec, algorithm)
    extra = dict(tc.hyperparameters.model_extra or {})
    objective = objective_of(extra)
    if objective not in (*OBJECTIVES, "state_awr"):  # state_awr: valid-action data only
        raise TrainingError(
            f"objective {objective!r}: use one of {', '.join(OBJECTIVES)} (the valid-action "
            "path also takes 'ppo' and 'state_awr')",
            "CONFIG",
        )
    check_store(spec["storage_path"])
    from agentrl.contracts.filters import declared

    try:  # both dataset sources apply the same declared filter set
        declared(tc.dataset.filter)
    except ValueError as exc:
        raise TrainingError(str(exc), "CONFIG") from exc
    emitter.emit("running", phase="loading data")
    t_load = time.monotonic()
    # freeze: what survives the load (the sample) lives to the job's end; without it the
    # first collection after the pause walks every object parsed (seconds for 100,000)
    with gc_paused(freeze=True):
        seed = config.seed
        data = asyncio.run(load_data_retrying(spec, seed=seed))
        if data.get("sampled") is not None:  # only the sample was read (token path)
            records, report = data.pop("sampled")
            guided = False
        else:
            report = FilterReport(rewards=len(data["rewards"]))
            report.payloads_read = len(data["trajectories"])
            records, report = apply_filters(
                data["trajectories"], latest_rewards(data["rewards"]), tc.dataset.filter, report
            )
            # Valid-action data (turns answered from a guided_choice) trains the renormalised
            # policy on the newest trajectories (closest to the policy now); the path is
            # chosen by the sample itself, so other traffic on the same stack keeps the token
            # path.
            newest = sorted(records, key=lambda r: str(r.trajectory.get("end_timestamp") or ""))
            newest = newest[-tc.dataset.sample_size :] if tc.dataset.sample_size else newest
            guided = guided_share([r.trajectory for r in newest]) > 0.5
            records = newest if guided else seeded_sample(records, tc.dataset.sample_size, seed)
        del data["trajectories"], data["rewards"]  # only the sample lives on
    report.sampled = len(records)
    holdout_size = req.evaluation.holdout_size if req.evaluation.enabled else 0.0
    train, hold = holdout_split(records, holdout_size, seed)
    report.holdout = len(hold)
    if not train:
        raise TrainingError(report.message(), "DATA")
    if guided:
        from agentrl.training.choice_job import run_choice_job

        run_choice_job(spec, emitter, req, train, data, report, est)
        return
    # The model phase starts here: importing torch and transformers is part of it (seconds
    # on a busy host), not of the data phase.
    emitter.emit(
        "running",
        phase="loading model",
        dataset=report.as_dict(),
        load_data_s=time.monotonic() - t_load,
    )
    # torch and transformers only now: a job without data fails in a second
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.samples import truncate
    from agentrl.training.samples import build_pairs, build_samples

    history: list[dict[str, float]] = []
    state: dict[str, Any] = {"best": None}
    import torch

    from agentrl.learners.valid_action import pick_threads

    torch.set_num_threads(pick_threads(int(extra.get("threads", 0))))  # 1 on a busy host
    init = spec.get("init_checkpoint") if algorithm != "dpo" else None
    if init:  # the adapter must have the shape of the one it continues
        config = TrainerConfig(**{**config.model_dump(), **init_lora_shape(str(init))})
    trainer = load_trainer(config, spec, None)
    if init:
        continue_from(trainer, str(spec["init_checkpoint"]))
    tok = trainer.policy.tokenizer
    ckpt = CheckpointManager(
        config.storage_path,
        config.max_checkpoints,
        run_info={
            "name": f"agentrl {est} on logged trajectories (job {req.training_job_id})",
            "data": f"{len(train)} trajectories from {tc.dataset.stream_name} "
            f"(holdout {len(hold)}), filter {tc.dataset.filter.model_dump(mode='json')}",
        },
    )

    def fit(items: list[Any]) -> list[Any]:
        kept = []
        for s in items:
            try:
                kept.append(truncate(s, config.max_length))
            except ValueError:
                continue
        return kept

    units: list[Any]
    if algorithm == "dpo":
        units, bstats = build_pairs(train, tok, corrections=data["corrections"])
        hold_samples, _ = build_samples(hold, tok, completions=data["completions"])
    else:
        # `constraints` (request specs, e.g. the loop's response_format): constrained
        # completions under them train with ratios against the masked distribution
        grammars = extra.get("constraints") or ()
        units, bstats = build_samples(
            train, tok, estimator=est, completions=data["completions"], constraints=grammars
        )
        units = fit(
            shape_samples(
                units,
                objective,
                beta=float(extra.get("awr_beta", 0.5)),
                max_weight=float(extra.get("awr_max_weight", 20.0)),
                min_reward=float(extra.get("min_reward", 1.0)),
            )
        )
        hold_samples, _ = build_samples(hold, tok, completions=data["completions"])
    hold_samples = fit(hold_samples)
    hinting = None  # tool use: hints where every attempt of a task failed (before any update)
    if algorithm != "dpo" and extra.get("tooluse_hints"):
        from agentrl.learners.tooluse_job import JobHints, hint_step

        hint_settings = JobHints.model_validate(extra["tooluse_hints"])
        emitter.emit("running", phase="hinting failed tasks")
        hinting = hint_step(trainer, train, hint_settings, data["completions"], seed)
        log.info("hints: %s in %.0fs", hinting.counts, hinting.seconds)
    if not units and not (hinting and hinting.items):
        raise TrainingError(
            f"nothing to train on: {len(train)} trajectories gave no "
            + (
                "preference pairs (every task has one attempt or tied rewards)"
                if algorithm == "dpo"
                else f"trajectory with a reward >= min_reward {extra.get('min_reward', 1.0)}"
                if objective == "rs"
                else "sample with a non-zero advantage (all rewards equal?)"
            ),
            "DATA",
        )
    hold_rewards = {r.trajectory_id: r.score for r in hold}
    base_logps = decision_logps(trainer, hold_samples) if hold_samples else []
    resumed = ckpt.resume(trainer) if spec.get("resume") else None
    if resumed:
        log.info("resumed from %s at step %d", resumed, trainer.global_step)
    batch = config.batch_size
    per_epoch = math.ceil(len(units) / batch)
    epochs = tc.hyperparameters.epochs
    prog = Progress(emitter, per_epoch * epochs, epochs, int(spec.get("status_every_steps", 10)))
    prog.done_at_start = trainer.global_step
    emitter.emit(
        "running",
        phase="training",
        samples=bstats.samples,
        trained_samples=len(units),
        objective=objective if algorithm != "dpo" else "dpo",
        init_checkpoint=init,
        exact_token_samples=bstats.exact_token_samples,
        pairs=bstats.pairs,
        grouped_trajectories=bstats.grouped_trajectories,
        baseline_trajectories=bstats.baseline_trajectories,
        resumed_from=resumed,
        progress={
            "current_step": trainer.global_step,
            "total_steps": per_epoch * epochs,
            "total_epochs": epochs,
        },
    )
    rng = np.random.default_rng(seed)
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
            if algorithm == "dpo":
                metrics = trainer.train_on_pairs(chunk)
            else:
                metrics = trainer.train_on_samples(chunk, allow_empty=True)
            prog.train_s += time.monotonic() - t0
            if not metrics:
                trainer.global_step = step  # nothing trainable in this chunk: count it anyway
                continue
            m = metrics[-1]
            if "reward_mean" not in m:
                m["reward_mean"] = (
                    float(np.mean([p.margin for p in chunk])) if algorithm == "dpo" else 0.0
                )
            history.append(m)
            if trainer.global_step - last_saved >= config.save_interval:
                path = ckpt.save(trainer, m)
                last_saved = trainer.global_step
                state["last_checkpoint"] = path
                emitter.emit("running", phase="checkpoint", last_checkpoint=path)
                if hold_samples:
                    now = holdout_decisions(
                        hold_samples,
                        decision_logps(trainer, hold_samples),
                        base_logps,
                        hold_rewards,
                    )
                    found = ope.estimate(now, resamples=0)
                    score = found.value_new if found is not None else None
                    if score is not None and ckpt.save_best(trainer, score, m):
                        state["best"] = {
                            "epoch": epoch + 1,
                            "step": trainer.global_step,
                            "reward_mean": score,
                            "checkpoint_path": ckpt.url("best"),
                        }
            prog.report(trainer.global_step, epoch + 1, m, state["best"])
    if hinting is not None and hinting.items:
        emitter.check()
        t0 = time.monotonic()
        hinting.train(trainer, hint_settings, seed)
        prog.train_s += time.monotonic() - t0
    emitter.check()
    t_eval = time.monotonic()
    evaluation: dict[str, Any] = {}
    if hold_samples:
        found = ope.estimate(
            holdout_decisions(
                hold_samples, decision_logps(trainer, hold_samples), base_logps, hold_rewards
            ),
            seed=seed,
        )
        est_reward = found.value_new if found is not None else None
        if found is not None and est_reward is not None:
            evaluation = found.as_evaluation()
            if ckpt.save_best(trainer, est_reward, history[-1] if history else {}):
                state["best"] = {
                    "epoch": epochs,
                    "step": trainer.global_step,
                    "reward_mean": est_reward,
                    "checkpoint_path": ckpt.url("best"),
                }
    last = history[-1] if history else {}
    final = ckpt.save(trainer, {**last, **evaluation}, name="final")
    curves = write_curves(history, Path(spec["job_dir"]) / "curves.png", f"{est} job")
    emitter.emit(
        "completed",
        progress={
            "current_epoch": epochs,
            "total_epochs": epochs,
            "current_step": trainer.global_step,
            "total_steps": per_epoch * epochs,
            "percent_complete": 100.0,
            "eta_seconds": 0.0,
        },
        metrics={
            "current": {**current_metrics(last), **(hinting.counts if hinting else {})},
            **({"best": state["best"]} if state["best"] else {}),
        },
        evaluation_results=evaluation or None,
        artifacts={
            "final_checkpoint": final,
            "training_curves": curves,
            "model_card": f"{final}/model_card.md",
            "base_model": tc.base_model,
        },
        train_s=prog.train_s,
        eval_s=time.monotonic() - t_eval,
        dataset=report.as_dict(),
        samples=bstats.samples,
        trained_samples=len(units),
        objective=objective if algorithm != "dpo" else "dpo",
        init_checkpoint=init,
        exact_token_samples=bstats.exact_token_samples,
    )


# -- environment jobs -------------------------------------------------------------------------


def train_on_env(
    config: TrainerConfig, loop: LoopSettings, trainer: PolicyTrainer, on_iteration: Any
) -> TrainingResult:
    """The one call into agentrl.llm's online loop (swap for `train_on_env` of the learning
    configuration when it lands)."""
    from agentrl.learners.onpolicy import run_training

    return run_training(config, loop, on_iteration=on_iteration, trainer=trainer)


def run_environment_job(spec: dict[str, Any], emitter: Emitter) -> None:
    from dataclasses import asdict

    from agentrl.contracts.training import TrainingRequest
    from agentrl.learners.onpolicy import LoopSettings

    req = TrainingRequest.model_validate(spec["request"])
    tc = req.training_config
    env = dict((tc.model_extra or {}).get("environment") or {})
    from agentrl.training.requests import estimator as estimator_of

    est = estimator_of(req)
    config = trainer_config(spec, est if est in ("gigpo", "grpo", "rloo", "ppo", "dpo") else "grpo")
    check_store(spec["storage_path"])
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
        resume=bool(spec.get("resume")),
        out_dir=Path(spec["job_dir"]) / "run",
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
    (Path(spec["job_dir"]) / "history.json").write_text(json.dumps(history, default=float))
