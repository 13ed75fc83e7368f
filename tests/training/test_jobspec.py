"""One typed job spec (issue 55.1): the `spec.json` an older service wrote still parses, the
request inside is validated once, the trainer comes from the request through `TRAINERS`
(the data decides only for a request that names none), and the objectives have one set of
names with the old ones as aliases."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.core.errors import TrainingError
from agentrl.training.jobspec import TRAINERS, JobSpec
from agentrl.training.requests import fill_request
from agentrl.training.settings import TrainingSettings


def _request(**hyper: Any) -> dict[str, Any]:
    req = fill_request(
        {
            "training_config": {
                "base_model": "tiny",
                "algorithm": "gigpo",
                "dataset": {"sample_size": 25},
                "hyperparameters": hyper,
            },
            "evaluation": {"enabled": True, "holdout_size": 0.0},
        },
        TrainingSettings(),
    )
    return dict(req.model_dump(mode="json"))


def _old_spec(tmp_path: Path, **hyper: Any) -> dict[str, Any]:
    """`spec.json` as the service wrote it before JobSpec (a plain dict)."""
    return {
        "request": _request(**hyper),
        "kind": "dataset",
        "job_dir": str(tmp_path),
        "nats_url": "nats://127.0.0.1:1",
        "device": "cpu",
        "storage_path": str(tmp_path / "ckpt"),
        "resume": False,
        "status_every_steps": 5,
        "heartbeat_s": 2.0,
        "max_length": 512,
        "tiny_kwargs": None,
        "lease": {"owner": "runner-1", "token": 3},
        "recent_checkpoint": "/ck/v2",
        "a_newer_services_key": {"kept": True},
    }


def test_an_old_spec_json_parses_and_round_trips(tmp_path: Path) -> None:
    old = _old_spec(tmp_path, objective="state_awr", lora_r=8)
    spec = JobSpec.of(json.loads(json.dumps(old)))
    assert spec.estimator == "gigpo"  # travels as grpo + adv_estimator, reads back as gigpo
    assert (spec.max_length, spec.status_every_steps, spec.lease) == (512, 5, old["lease"])
    assert spec.model_extra == {"a_newer_services_key": {"kept": True}}
    assert spec.extra["lora_r"] == 8 and spec.options.objective == "state_awr"
    again = JobSpec.model_validate_json(spec.model_dump_json(exclude_none=True))
    assert again.request == spec.request and again.recent_checkpoint == "/ck/v2"
    assert JobSpec.of(again) is again
    with pytest.raises(TrainingError, match="invalid job spec") as bad:
        JobSpec.of({**old, "request": {"training_config": {"algorithm": "sgd"}}})
    assert bad.value.code == "CONFIG"


def test_one_set_of_objective_names_with_the_old_ones_as_aliases(tmp_path: Path) -> None:
    def spec(**hyper: Any) -> JobSpec:
        return JobSpec.of(_old_spec(tmp_path, **hyper))

    assert spec(objective="ppo").options.objective == "pg"  # the choice path's old name
    assert spec(objective="ppo").objective("choices") == "pg"
    assert spec(objective="ppo").objective("tokens") == "pg"
    assert spec().objective("tokens") == "pg" and spec().objective("choices") == "awr"
    assert {n: t.objectives for n, t in TRAINERS.items()} == {
        "tokens": ("pg", "awr", "rs"),
        "choices": ("pg", "awr", "state_awr"),
    }
    with pytest.raises(TrainingError, match="the tokens trainer's") as wrong:
        spec(objective="rs").objective("choices")
    assert wrong.value.code == "CONFIG"
    with pytest.raises(TrainingError, match="takes pg, awr, rs"):
        spec(objective="sgd").objective("tokens")


def test_the_trainer_is_named_by_the_request(tmp_path: Path) -> None:
    def named(**hyper: Any) -> str:
        return JobSpec.of(_old_spec(tmp_path, **hyper)).trainer_named()

    assert named() == "auto"  # an old request: the data decides
    assert named(objective="state_awr") == "choices"  # only the choices trainer has it
    assert named(trainer="tokens", objective="awr") == "tokens"
    assert named(trainer="choices") == "choices"
    with pytest.raises(TrainingError, match="invalid hyperparameters"):
        named(trainer="sft")


def _guided(t: dict[str, Any]) -> dict[str, Any]:
    for turn in t["turns"]:
        turn["action"]["guided_choice"] = ["up", "down", "left", "right"]
    return t


def _publish(url: str, n: int, guided: bool) -> None:
    from agentrl.bench.training import _reward, _trajectory
    from agentrl.bus import Bus
    from agentrl.core.settings import Settings

    async def go() -> None:
        bus = await Bus.connect(url, settings=Settings(nats_url=url))
        try:
            await bus.ensure_streams()
            trajs = [_guided(_trajectory(i)) if guided else _trajectory(i) for i in range(n)]
            items = [
                ("agent.rl.trajectory.v1", json.dumps(t).encode(), t["trajectory_id"])
                for t in trajs
            ]
            items += [
                ("agent.rl.reward.v1", json.dumps(r).encode(), r["reward_id"])
                for r in (_reward(t, i) for i, t in enumerate(trajs))
            ]
            await bus.publish_many(items)
        finally:
            await bus.close()

    asyncio.run(go())


@pytest.mark.parametrize("guided", [False, True])
def test_the_request_not_the_data_chooses_the_trainer(
    nats: Any, tmp_path: Path, guided: bool
) -> None:
    """On the same data a request that names its trainer gets it (the choices trainer takes
    the newest trajectories, the tokens one a seeded sample); one that names none gets the
    old rule: guided turns -> choices."""
    from agentrl.training.jobs import check_dataset_job, load_sample
    from agentrl.training.progress import Emitter

    _publish(nats.url, 60, guided)
    got = {}
    for name in ("auto", "tokens", "choices"):
        hyper = {} if name == "auto" else {"trainer": name}
        spec = JobSpec.of({**_old_spec(tmp_path, **hyper), "nats_url": nats.url})
        emitter = Emitter(tmp_path / f"events-{name}.jsonl")
        sample = load_sample(spec, emitter, check_dataset_job(spec))
        got[name] = sample
        assert len(sample.train) == 25 and sample.trainer == (
            name if name != "auto" else ("choices" if guided else "tokens")
        )
    ends = sorted(str(r.trajectory["end_timestamp"]) for r in got["choices"].train)
    assert ends[0] >= "2026-11-20T00:00:35"  # the newest 25 of 60 (one a second)
    tokens = {r.trajectory_id for r in got["tokens"].train}
    assert tokens != {r.trajectory_id for r in got["choices"].train}  # a seeded sample
