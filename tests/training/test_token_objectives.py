"""Dataset jobs on free-form constrained completions: the objectives (pg, awr, rs), the
weighted-NLL loss, and continuing the newest version — through the real training service,
a real nats-server and the tiny model."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import (
    TINY,
    Statuses,
    publish_raw,
    running_service,
    settings_for,
    trajectory,
    tsettings,
)

from agentrl.bus import Bus
from agentrl.core.errors import TrainingError
from agentrl.llm.losses import policy_gradient_loss
from agentrl.llm.samples import PolicySample
from agentrl.training.objectives import shape_samples


def _sample(adv: float, reward: float) -> PolicySample:
    return PolicySample([1, 2], [3, 4], advantage=adv, reward=reward)


def test_rejection_sampling_keeps_only_good_trajectories_with_weight_one() -> None:
    out = shape_samples(
        [_sample(0.5, 1.0), _sample(-0.5, 0.0), _sample(0.0, 1.0)], "rs", min_reward=1.0
    )
    assert [s.advantage for s in out] == [1.0, 1.0] and all(s.reward == 1.0 for s in out)


def test_awr_weights_are_exponential_capped_and_mean_one() -> None:
    out = shape_samples(
        [_sample(1.0, 1.0), _sample(0.0, 0.5), _sample(-1.0, 0.0), _sample(10.0, 1.0)],
        "awr",
        beta=1.0,
        max_weight=5.0,
    )
    w = [s.advantage for s in out]
    assert math.isclose(sum(w) / len(w), 1.0)
    raw = [math.e, 1.0, math.exp(-1), 5.0]  # the last one capped
    assert all(math.isclose(a / w[1], b) for a, b in zip(w, raw, strict=True))
    assert all(x > 0 for x in w)


def test_pg_keeps_advantages_and_unknown_objective_is_a_config_error() -> None:
    out = shape_samples([_sample(0.3, 1.0), _sample(0.0, 0.0)], "pg")
    assert [s.advantage for s in out] == [0.3]
    with pytest.raises(TrainingError) as err:
        shape_samples([], "sft-please")
    assert err.value.code == "CONFIG"


def test_weighted_nll_gradient_is_minus_weight_times_score() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    w = torch.tensor([2.0, 0.5, 1.0])
    loss, stats = policy_gradient_loss(
        logp, logp.detach() - 3.0, w, torch.tensor([0, 0, 1]), 2, kind="weighted_nll"
    )
    loss.backward()
    assert logp.grad is not None
    # token mean of -w * logp: the old log-probs (far away here) do not enter
    assert torch.allclose(logp.grad, -w / 3)
    assert stats.clip_fraction == 0.0


# ---- through the training service ----------------------------------------------------------


def _constrained_rows(tokenizer: Any, trajs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One completion-log row per turn, as the gateway writes them under a schema."""
    rows = []
    for t in trajs:
        for turn in t["turns"]:
            cid = turn["action"]["completion_id"]
            text = turn["action"]["raw_response"]
            rows.append(
                {
                    "completion_id": cid,
                    "prompt_token_ids": tokenizer(f"prompt of {cid}")["input_ids"],
                    "completion_token_ids": tokenizer(text)["input_ids"],
                    "completion_logprobs": [-0.1] * len(tokenizer(text)["input_ids"]),
                    "constrained": True,
                    "schema_hash": "agent-zero",
                }
            )
    return rows


def _with_completion_ids(trajs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for t in trajs:
        for turn in t["turns"]:
            turn["action"]["completion_id"] = f"cmpl-{t['trajectory_id'][:8]}-{turn['turn_id']}"
    return trajs


async def test_rs_job_trains_on_exactly_the_logged_tokens_then_a_job_continues_it(
    nats: Any, data_dir: Path, tokenizer: Any
) -> None:
    tok = tokenizer
    bus = await Bus.connect(nats.url)
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    trajs = _with_completion_ids([trajectory(i, task=f"t{i // 4}", turns=2) for i in range(16)])
    scores = [1.0 if i % 4 == 0 else 0.0 for i in range(16)]  # 4 good trajectories
    from training_helpers import reward

    await publish_raw(bus, "agent.rl.trajectory.v1", trajs, "trajectory_id")
    await publish_raw(
        bus, "agent.rl.reward.v1", [reward(t, s) for t, s in zip(trajs, scores, strict=True)],
        "reward_id",
    )  # fmt: skip
    await publish_raw(bus, "agent.rl.completion.v1", _constrained_rows(tok, trajs), "completion_id")
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(
        threshold=16,
        sample_size=16,
        holdout_size=0.0,
        hyperparameters={"objective": "rs", "min_reward": 1.0},
        init_from="latest",
    )
    try:
        async with running_service(bus, settings, ts) as svc:
            for _ in range(600):
                if svc.store.jobs():
                    break
                await asyncio.sleep(0.1)
            first = svc.store.jobs()[0].job_id
            final = await statuses.wait(first, ("completed", "failed"), 180)
            assert final["status"] == "completed", final
            meta = final["metadata"]
            # every turn's exact logged tokens; rs trains on the good trajectories' turns only
            assert meta["exact_token_samples"] == 32 and meta["samples"] == 32
            assert meta["objective"] == "rs" and meta["trained_samples"] == 8
            assert meta.get("init_checkpoint") is None  # nothing to continue yet: the base
            ckpt = Path(final["artifacts"]["final_checkpoint"])
            saved = json.loads((ckpt / "trainer_config.json").read_text())
            assert saved["policy_loss"] == "weighted_nll"
    finally:
        await bus.close()
    # the next job continues it: the adapter's shape and weights come from the checkpoint
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer
    from agentrl.training.jobs import continue_from, init_lora_shape

    shape = init_lora_shape(str(ckpt))
    assert shape["lora_r"] == saved["lora_r"]
    config = TrainerConfig(model="tiny", storage_path=str(data_dir / "c2"), **shape)
    fresh = PolicyTrainer.from_config(config, None, tiny_kwargs=TINY)
    before = {k: v.clone() for k, v in fresh.policy.model.named_parameters() if "lora_B" in k}
    continue_from(fresh, str(ckpt))
    after = {k: v for k, v in fresh.policy.model.named_parameters() if "lora_B" in k}
    assert any(not torch.equal(before[k], after[k]) for k in before)  # lora_B starts at 0
    with pytest.raises(TrainingError):
        continue_from(fresh, str(data_dir))  # not a token-level checkpoint
