"""Dataset jobs on valid-action trajectories: turns answered from a `guided_choice`.

Such a turn's action is one of a few choices and the policy that chose it is the model's
distribution renormalised over them (`agentrl.llm.choices`, GLAM). Training the free-form
token log-prob instead would push probability onto tokens outside the choice set, so these
turns get a path of their own: the learning configuration's machinery
(`agentrl.learners.valid_action`: LoRA on the top layers, frozen trunk cached per prompt, the same
precision for scoring and training) on the exact prompts the gateway logged.

Data: every turn with `action.guided_choice` and a completion-log record (`completion_id`)
becomes a step: prompt = the logged prompt token ids, action = the index of the answer in
the choices, step reward = the turn's `reward` (the environment's shaped reward) with the
reward service's `total_reward` added to the last step as the terminal reward, group = the
task id, GiGPO anchor = the observation text. Turns without a record, or with another choice set, are skipped and
counted.

Objective (`hyperparameters.objective`):
- `awr` (default): advantage-weighted regression (Peng et al. 2019): maximise
  sum w log pi(a|s) / sum w with w = min(exp(A / beta), w_max), plus the entropy bonus.
  Logged data comes from earlier versions, often sampled at a high temperature to explore;
  AWR fits pi ~ pi_behaviour x exp(A / beta) with no importance ratio, so one batch can move
  the policy as far as its advantages say. Measured (FrozenLake 4x4, SmolLM2, behaviour at
  temperature 6): greedy held-out success 0.0 -> 0.8 after 160 AWR steps, where PPO-clip on
  the same kind of batches stayed at 0.0 after 128 steps (the clip bounds each batch's move).
- `state_awr` (`agentrl loop`'s): per distinct prompt, cross-entropy to the target
  softmax(log pi_start + A(s, .) / beta), A(s, a) the mean advantage of the move there
  (`state_targets`, MPO's E-step). Sample AWR's target carries the acting version's move
  frequencies; the loop's agents act with the live version, two or three jobs behind the
  training chain, and that pulled every job back toward the base's moves. Measured
  (`scripts/probe_loop_chain.py --lag 2`, seeds 3-6, held-out success after the 4th job):
  awr 0.56 / 0.08 / 0.20 / 0.00, state_awr 0.80 / 0.82 / 0.78 / 0.82.
- `pg` (the old name `ppo` still works): PPO-clip against the starting policy's log-probs
  (recomputed here, in the same precision, so ratios are exact for data of the starting
  version). The names are `training.jobspec`'s, shared with the token trainer.

Warm start: `init_checkpoint` (a checkpoint folder with a LoRA adapter) continues training
an earlier version instead of the base, so generations compound.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.core.errors import TrainingError
from agentrl.training.jobspec import JobSpec

log = logging.getLogger(__name__)

AWR_MAX_WEIGHT = 20.0


@dataclass
class ChoiceData:
    """The valid-action steps of a dataset (built before any model is loaded)."""

    choices: list[str]
    episodes: list[dict[str, Any]]  # per episode: group, score, success, steps
    prompt_ids: dict[int, list[int]] = field(default_factory=dict)  # step key -> token ids
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def steps(self) -> int:
        return sum(len(e["steps"]) for e in self.episodes)


def guided_share(trajectories: list[dict[str, Any]]) -> float:
    """The share of turns answered from a guided_choice (decides the job's path)."""
    total = guided = 0
    for t in trajectories:
        for turn in t.get("turns") or ():
            total += 1
            guided += bool((turn.get("action") or {}).get("guided_choice"))
    return guided / total if total else 0.0


def choice_data(records: list[Any], completions: dict[str, dict[str, Any]]) -> ChoiceData:
    """Records (trajectory + latest reward) -> episodes of valid-action steps."""
    sets: Counter[tuple[str, ...]] = Counter()
    for r in records:
        for turn in r.trajectory.get("turns") or ():
            cs = (turn.get("action") or {}).get("guided_choice")
            if cs:
                sets[tuple(str(c) for c in cs)] += 1
    if not sets:
        raise TrainingError("no turn carries a guided_choice: not a valid-action dataset", "DATA")
    choices = list(sets.most_common(1)[0][0])
    data = ChoiceData(choices, [])
    groups: dict[str, int] = {}
    key = 0
    for r in records:
        steps = []
        for turn in r.trajectory.get("turns") or ():
            action = turn.get("action") or {}
            cs = action.get("guided_choice")
            if not cs:
                data.skipped["not guided"] += 1
                continue
            if [str(c) for c in cs] != choices:
                data.skipped["other choice set"] += 1
                continue
            comp = completions.get(str(action.get("completion_id") or ""))
            if not comp or not comp.get("prompt_token_ids"):
                data.skipped["no completion record"] += 1
                continue
            answer = _answer(action)
            if answer not in choices:
                data.skipped["answer not among the choices"] += 1
                continue
            data.prompt_ids[key] = [int(x) for x in comp["prompt_token_ids"]]
            obs = turn.get("observation") or {}
            steps.append(
                {
                    "key": key,
                    "action": choices.index(answer),
                    "reward": float(turn.get("reward") or 0.0),
                    "anchor": str(obs.get("content") or ""),
                    "done": bool(turn.get("done")),
                }
            )
            key += 1
        if not steps:
            continue
        outcome = (r.trajectory.get("metadata") or {}).get("outcome") or {}
        data.episodes.append(
            {
                "group": groups.setdefault(r.task_id, len(groups)),
                "score": r.score,
                "success": bool(outcome.get("success", r.trajectory.get("success", False))),
                "steps": steps,
                "trajectory_id": r.trajectory_id,
            }
        )
    return data


def _answer(action: dict[str, Any]) -> str:
    """What the agent did: its raw answer (the chosen choice), else a tool argument."""
    for k in ("raw_response", "content"):
        if action.get(k):
            return str(action[k]).strip()
    args = action.get("tool_args") or {}
    return str(args.get("direction") or args.get("choice") or "").strip()


REGISTRY_BUCKET = "agentrl_models"  # the deployment registry's KV bucket (its documented keys)
CONTINUABLE = ("candidate", "canary", "live")


async def resolve_init(js: Any, init_from: str | None, recent: str | None = None) -> str | None:
    """`init_from` -> the checkpoint folder a job continues from (None: the base model).

    'live' and 'latest' read the deployment registry (KV `agentrl_models`: `split.<name>`
    names the live version, `model.<id>` holds each version's record): 'live' is the version
    serving now, 'latest' the newest version not rejected or rolled back, so a job that
    starts while its predecessor is still in validation or canary builds on it. `recent` is
    the training service's last completed checkpoint: a job that starts the moment its
    predecessor ends would otherwise miss it (the registry has not registered it yet), so
    for 'latest' it wins unless the registry knows it and rejected or rolled it back. A
    folder path is used as it is. No such version yet: the base model.
    """
    if not init_from or init_from == "base":
        return None
    mode, _, public = init_from.partition(":")
    if mode not in ("live", "latest"):
        return init_from
    from agentrl.bus.kv import kv_keys

    public = public or "agentrl-policy"
    if recent and not any(
        (Path(recent) / name).exists()
        for name in ("valid_action_config.json", "trainer_config.json")
    ):
        recent = None  # not a valid-action checkpoint (or not a local folder): not continuable
    try:
        kv = await js.key_value(REGISTRY_BUCKET)
    except Exception:  # no registry yet: nothing deployed
        return recent if mode == "latest" else None
    records = []
    try:
        keys = await kv_keys(kv)
    except Exception:  # an empty bucket raises NoKeysError
        keys = []
    for key in keys:
        if not key.startswith("model."):
            continue
        try:
            records.append(json.loads((await kv.get(key)).value))
        except Exception:
            continue
    mine = [r for r in records if r.get("public_name") == public and r.get("checkpoint_path")]
    if mode == "live":
        live = [r for r in mine if r.get("state") == "live"]
        return str(live[0]["checkpoint_path"]) if live else None
    if recent and not any(_same(r.get("checkpoint_path"), recent) for r in records):
        return recent  # newer than every registered version
    fresh = [r for r in mine if r.get("state") in CONTINUABLE]
    if not fresh:
        return None
    return str(max(fresh, key=lambda r: int(r.get("version", 0)))["checkpoint_path"])


def _same(a: Any, b: str) -> bool:
    return bool(a) and str(a).rstrip("/") == b.rstrip("/")


def learner_config(spec: JobSpec | dict[str, Any], req: Any, estimator: str) -> Any:
    """The job's `ValidActionConfig` from the request (hyperparameter extras override)."""
    from agentrl.learners.valid_action import ValidActionConfig

    tc = req.training_config
    hp = tc.hyperparameters
    extra = dict(hp.model_extra or {})
    init = _init_settings(
        spec.init_checkpoint if isinstance(spec, JobSpec) else spec.get("init_checkpoint")
    )
    algorithm = estimator if estimator in ("gigpo", "grpo", "rloo") else "gigpo"
    try:
        return ValidActionConfig(
            model=tc.base_model,
            lora_r=int({**extra, **init}.get("lora_r", 16)),
            lora_alpha=int({**extra, **init}.get("lora_alpha", 32)),
            lora_layers=int({**extra, **init}.get("lora_layers", 4)),
            dtype="bf16" if tc.compute.mixed_precision == "bf16" else "fp32",
            algorithm=algorithm,
            gamma=hp.gamma,
            gigpo_omega=float(extra.get("gigpo_omega", 1.0)),
            temperature=float(extra.get("policy_temperature", 2.0)),
            learning_rate=hp.learning_rate,
            entropy_coef=float(extra.get("entropy_coef", 0.02)),
            clip_epsilon=min(float(hp.clip_epsilon), 0.99),
            epochs=max(1, int(hp.epochs)),
            minibatches=max(1, int(extra.get("minibatches", 2))),
            seed=int(extra.get("seed", 0)),
            threads=int(extra.get("threads", 0)),
            save_adapter=False,
        )
    except ValueError as exc:
        raise TrainingError(f"invalid valid-action configuration: {exc}", "CONFIG") from exc


def _init_settings(folder: str | None) -> dict[str, Any]:
    """LoRA shape of the checkpoint to continue from (it must match to load its weights)."""
    if not folder:
        return {}
    path = Path(folder) / "valid_action_config.json"
    if not path.exists():
        raise TrainingError(
            f"init checkpoint {folder} was not written by a valid-action job "
            "(no valid_action_config.json); continue from one that was, or from the base",
            "CONFIG",
        )
    cfg = json.loads(path.read_text())
    return {k: cfg[k] for k in ("lora_r", "lora_alpha", "lora_layers") if k in cfg}


def warm_start(learner: Any, folder: str) -> None:
    """Load the LoRA weights of checkpoint `folder` (verified against its manifest)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from agentrl.llm.checkpoint import check_manifest

    path = Path(folder)
    check_manifest(path)
    weights = path / "adapter_model.safetensors"
    if not weights.exists():
        raise TrainingError(f"init checkpoint {folder} holds no adapter_model.safetensors", "DATA")
    result = set_peft_model_state_dict(learner.policy.model, load_file(str(weights)))
    missing = [k for k in getattr(result, "unexpected_keys", []) or [] if "lora" in k]
    if missing:
        raise TrainingError(f"init checkpoint {folder}: adapter keys do not fit: {missing[:3]}")


def build_batch(data: ChoiceData, texts: dict[int, str]) -> Any:
    """ChoiceData -> `valid_action.Batch`. Rewards: each turn's environment reward, and the
    reward service's score as the episode's terminal reward (added to its last step), so an
    episode's return is its shaped progress plus the service's judgement of the outcome."""
    from agentrl.learners.valid_action import Batch, Step

    steps: list[Step] = []
    returns: list[float] = []
    for i, ep in enumerate(data.episodes):
        last = len(ep["steps"]) - 1
        for k, st in enumerate(ep["steps"]):
            reward = st["reward"] + (float(ep["score"]) if k == last else 0.0)
            steps.append(
                Step(
                    i,
                    ep["group"],
                    texts[st["key"]],
                    st["anchor"],
                    st["action"],
                    0.0,
                    reward,
                    st["done"],
                )
            )
        returns.append(sum(st["reward"] for st in ep["steps"]) + float(ep["score"]))
    return Batch(
        steps,
        returns,
        [bool(e["success"]) for e in data.episodes],
        [int(e["group"]) for e in data.episodes],
        [len(e["steps"]) for e in data.episodes],
    )


def state_targets(start: Any, row: Any, act: Any, adv: Any, beta: float) -> tuple[Any, Any]:
    """Per distinct prompt s: the target q(.|s) = softmax(log pi_start(.|s) + A(s, .) / beta)
    and the visit count of s. A(s, a) is the mean advantage of the logged steps that took a
    in s (0 for a move never taken there: advantages are relative to the state's mean).

    This is the non-parametric E-step of MPO (Abdolmaleki et al. 2018): each state's policy
    moves from where the job started by its own estimated advantages, whoever acted. Sample
    AWR fits pi_acting x exp(A / beta) instead, and in `agentrl loop` the acting version
    trails the chain by two or three jobs (validation and canary come first): every job was
    pulled back toward the base's moves (`scripts/probe_loop_chain.py --lag 2`)."""
    import torch

    n, k = start.shape
    sums = torch.zeros(n, k).index_put_((row, act), adv.float(), accumulate=True)
    counts = torch.zeros(n, k).index_put_((row, act), torch.ones(len(act)), accumulate=True)
    mean = torch.where(counts > 0, sums / counts.clamp(min=1.0), torch.zeros(()))
    target = torch.softmax(start.float() + mean / beta, -1)
    return target, counts.sum(-1)


def train_choices(
    learner: Any,
    batch: Any,
    *,
    objective: str,
    beta: float,
    on_step: Any = None,
    check: Any = None,
    behaviour: Any = None,
) -> list[dict[str, float]]:
    """epochs x minibatches optimiser steps over the batch's distinct prompts.

    `behaviour` (per step, the log-prob of its action under the policy that acted): AWR's
    weights get the ratio pi_start / pi_behaviour, so the fit is pi_start x exp(A / beta)
    rather than pi_behaviour x exp(A / beta) -- each job sharpens the policy it starts from
    instead of refitting a flattened copy of it."""
    import torch

    from agentrl.learners.valid_action import advantages

    cfg = learner.config
    steps = batch.steps
    texts = sorted({s.text for s in steps})
    index = {t: k for k, t in enumerate(texts)}
    adv = torch.tensor(np.asarray(advantages(cfg, batch), dtype=np.float64), dtype=torch.float32)
    act = torch.tensor([s.action for s in steps])
    row = torch.tensor([index[s.text] for s in steps])
    with torch.no_grad():  # the starting policy: PPO's old log-probs, in the same precision
        start = learner.scorer.logprobs(texts)
    old = start[row].gather(1, act[:, None]).squeeze(1)
    log_w = adv / beta
    if behaviour is not None:
        log_w = log_w + (old - torch.as_tensor(behaviour, dtype=torch.float32))
    weight = torch.clamp(torch.exp(log_w), max=AWR_MAX_WEIGHT)
    if objective == "state_awr":
        target, visits = state_targets(start, row, act, adv, beta)
    history: list[dict[str, float]] = []
    rng = np.random.default_rng(cfg.seed + len(steps))
    order = np.arange(len(texts))
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for part in np.array_split(order, cfg.minibatches):
            if check is not None:
                check()
            if len(part) == 0:
                continue
            local = {int(k): j for j, k in enumerate(part)}
            mask = torch.tensor([int(r) in local for r in row.tolist()])
            if not bool(mask.any()):
                continue
            rows = torch.tensor([local[int(r)] for r in row[mask].tolist()])
            lp_part = learner.scorer.logprobs([texts[k] for k in part])
            lp_all = lp_part[rows]
            logp = lp_all.gather(1, act[mask].unsqueeze(1)).squeeze(1)
            entropy = -(lp_all.exp() * lp_all).sum(-1).mean()
            if objective == "state_awr":  # cross-entropy to each state's target
                idx = torch.as_tensor(part)
                v = visits[idx]
                pg = -(v * (target[idx] * lp_part).sum(-1)).sum() / v.sum()
            elif objective == "awr":
                w = weight[mask]
                pg = -(w * logp).sum() / w.sum()
            else:
                ratio = torch.exp(logp - old[mask])
                a = adv[mask]
                eps = cfg.clip_epsilon
                pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a).mean()
            loss = pg - cfg.entropy_coef * entropy
            learner.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(learner.params, cfg.max_grad_norm)
            learner.optimizer.step()
            with torch.no_grad():
                kl = float((old[mask] - logp).mean())
            m = {
                "loss": float(loss.detach()),
                "policy_entropy": float(entropy.detach()),
                "approx_kl": kl,
                "reward_mean": float(np.mean(batch.episode_return)),
                "learning_rate": cfg.learning_rate,
                "epoch": float(epoch + 1),
            }
            history.append(m)
            if on_step is not None:
                on_step(m)
    learner.cache.new_version()
    return history


def save_choice_checkpoint(
    learner: Any, ckpt: Any, name: str, metrics: dict[str, Any], step: int
) -> str:
    """The adapter in `agentrl.llm.checkpoint`'s format (sha256 manifest), through `ckpt`'s
    store (local folder or fsspec URL)."""
    from agentrl.learners.valid_action import write_adapter

    with tempfile.TemporaryDirectory(prefix="agentrl-choice-") as tmp:
        local = Path(tmp) / name
        write_adapter(learner, local, metrics, step)
        return str(ckpt.put(local, name))


def run_choice_job(
    spec: JobSpec,
    emitter: Any,
    req: Any,
    train: list[Any],
    data: dict[str, Any],
    report: Any,
    estimator: str,
) -> None:
    """The whole valid-action job: data -> (warm-started) learner -> steps -> checkpoint."""
    import torch

    from agentrl.learners.valid_action import Learner, pick_threads
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.training.progress import Progress, current_metrics, write_curves

    tc = req.training_config
    objective = spec.objective("choices")  # pg (old name ppo), awr or state_awr
    beta = spec.options.awr_beta
    cd = choice_data(train, data["completions"])
    if not cd.episodes:
        raise TrainingError(
            f"no valid-action step to train on ({dict(cd.skipped)}); turns need a "
            "completion_id found in the completion log",
            "DATA",
        )
    config = learner_config(spec, req, estimator)
    emitter.emit(
        "running",
        phase="loading model",
        dataset=report.as_dict(),
        valid_action={
            "episodes": len(cd.episodes),
            "steps": cd.steps,
            "choices": cd.choices,
            "skipped": dict(cd.skipped),
            "objective": objective,
            "init_checkpoint": spec.init_checkpoint,
        },
    )
    torch.set_num_threads(pick_threads(config.threads))
    learner = Learner(config, choices=cd.choices)
    if spec.init_checkpoint:
        warm_start(learner, spec.init_checkpoint)
    tok = learner.tokenizer
    decoded: dict[tuple[int, ...], str] = {}  # states repeat: decode each prompt once
    texts = {}
    for k, ids in cd.prompt_ids.items():
        key = tuple(ids)
        if key not in decoded:
            decoded[key] = str(tok.decode(ids, skip_special_tokens=False))
        texts[k] = decoded[key]
    batch = build_batch(cd, texts)
    per_epoch = config.minibatches
    total = per_epoch * config.epochs
    prog = Progress(emitter, total, config.epochs, spec.status_every_steps)
    emitter.emit(
        "running",
        phase="training",
        samples=len(batch.steps),
        distinct_prompts=len({s.text for s in batch.steps}),
        progress={"current_step": 0, "total_steps": total, "total_epochs": config.epochs},
    )
    done = 0

    def on_step(m: dict[str, float]) -> None:
        nonlocal done
        done += 1
        prog.report(done, int(m["epoch"]), m)

    t0 = time.monotonic()
    history = train_choices(
        learner, batch, objective=objective, beta=beta, on_step=on_step, check=emitter.check
    )
    prog.train_s = time.monotonic() - t0
    emitter.check()
    ckpt = CheckpointManager(spec.storage_path, 1)
    last = history[-1] if history else {}
    final = save_choice_checkpoint(
        learner,
        ckpt,
        "final",
        {**last, "objective": objective, "init_checkpoint": spec.init_checkpoint},
        done,
    )
    curves = write_curves(
        [{**h, "step": i + 1} for i, h in enumerate(history)],
        Path(spec.job_dir) / "curves.png",
        f"{estimator} ({objective}) on valid-action trajectories",
    )
    emitter.emit(
        "completed",
        progress={
            "current_epoch": config.epochs,
            "total_epochs": config.epochs,
            "current_step": done,
            "total_steps": total,
            "percent_complete": 100.0,
            "eta_seconds": 0.0,
        },
        metrics={"current": current_metrics(last)},
        artifacts={
            "final_checkpoint": final,
            "training_curves": curves,
            "base_model": tc.base_model,
        },
        train_s=prog.train_s,
        dataset=report.as_dict(),
        samples=len(batch.steps),
        exact_token_samples=len(batch.steps),
    )
