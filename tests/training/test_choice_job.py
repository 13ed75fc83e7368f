"""Valid-action dataset jobs: logged guided_choice turns -> steps (with what is skipped and
why), learning that fails if it breaks (AWR and PPO raise the rewarded choice's probability
on a tiny model), and the warm start read from the deployment registry on a real
nats-server."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.learners.valid_action import Batch, Learner, Step, ValidActionConfig
from agentrl.training.choice_job import choice_data, guided_share, resolve_init, train_choices
from agentrl.training.dataset import Record

MOVES = ["up", "down", "left", "right"]


def _record(task: str, turns: list[dict[str, Any]], score: float) -> Record:
    traj = {
        "trajectory_id": str(uuid.uuid4()),
        "task_context": {"task_id": task},
        "turns": turns,
        "metadata": {"outcome": {"success": score > 0.5}},
    }
    return Record(traj, {"total_reward": score})


def _turn(cid: str | None, answer: str, choices: list[str] = MOVES, reward: float = 0.1) -> Any:
    action: dict[str, Any] = {"raw_response": answer, "guided_choice": choices}
    if cid:
        action["completion_id"] = cid
    return {"observation": {"content": f"state {cid}"}, "action": action, "reward": reward}


def test_choice_data_builds_steps_and_says_what_it_skipped() -> None:
    comps = {f"c{i}": {"prompt_token_ids": [1, 2, i]} for i in range(5)}
    records = [
        _record("map-1", [_turn("c0", "down"), _turn("c1", "right", reward=1.0)], 1.0),
        _record("map-1", [_turn("c2", "up"), _turn(None, "up")], 0.0),  # no completion id
        _record("map-2", [_turn("c3", "left", choices=["a", "b"]), _turn("c4", "sideways")], 0.0),
    ]
    assert guided_share([r.trajectory for r in records]) == 1.0
    data = choice_data(records, comps)
    assert data.choices == MOVES
    assert [len(e["steps"]) for e in data.episodes] == [2, 1]  # the third has nothing usable
    assert [s["action"] for s in data.episodes[0]["steps"]] == [1, 3]
    assert data.episodes[0]["steps"][1]["reward"] == 1.0
    assert data.episodes[0]["group"] == data.episodes[1]["group"]  # same task: one group
    assert dict(data.skipped) == {
        "no completion record": 1,
        "other choice set": 1,
        "answer not among the choices": 1,
    }
    assert data.prompt_ids[0] == [1, 2, 0]


def _bandit_batch(learner: Learner, episodes: int = 16) -> tuple[Batch, str]:
    """One prompt, one step per episode, actions round-robin; only 'right' is rewarded."""
    msgs = [{"role": "user", "content": "Pick a move."}]
    text = learner.cache.prompt(msgs[0]["content"])
    steps, ret = [], []
    for e in range(episodes):
        a = e % 4
        r = 1.0 if a == 3 else 0.0
        steps.append(Step(e, 0, text, "s", a, 0.0, r, True))
        ret.append(r)
    return Batch(steps, ret, [r > 0 for r in ret], [0] * episodes, [1] * episodes), text


@pytest.mark.parametrize("objective", ["awr", "ppo"])
def test_training_on_logged_choices_raises_the_rewarded_choice(objective: str) -> None:
    config = ValidActionConfig(
        model="tiny",
        lora_layers=2,
        algorithm="grpo",
        credit="episode",
        learning_rate=1e-2,
        epochs=8,
        minibatches=1,
        entropy_coef=0.0,
        save_adapter=False,
    )
    learner = Learner(config)
    batch, text = _bandit_batch(learner)
    with torch.no_grad():
        before = learner.scorer.logprobs([text])[0].exp()[3].item()
    history = train_choices(learner, batch, objective=objective, beta=0.5)
    with torch.no_grad():
        after = learner.scorer.logprobs([text])[0].exp()[3].item()
    assert len(history) == 8
    assert after > before + 0.15, (objective, before, after)


async def test_warm_start_reads_the_registry(nats: Any, tmp_path: Path) -> None:
    """'live' is the serving version, 'latest' the newest not rejected / rolled back; no
    registry or no such version: the base model (None); a folder is used as given. The
    service's last completed checkpoint (`recent`) wins for 'latest' until the registry
    knows it (a job started the moment its predecessor ended), unless it was rejected."""
    from agentrl.bus import Bus
    from agentrl.serving.registry import ModelRecord, Registry

    def ckpt(name: str, valid_action: bool = True) -> str:
        folder = tmp_path / name
        folder.mkdir()
        if valid_action:
            (folder / "valid_action_config.json").write_text("{}")
        return str(folder)

    fresh, rejected, token_path = ckpt("fresh"), ckpt("rejected"), ckpt("tokens", False)
    bus = await Bus.connect(nats.url)
    try:
        assert await resolve_init(bus.js, "latest") is None  # no bucket yet
        assert await resolve_init(bus.js, "latest", fresh) == fresh
        reg = await Registry.open(bus.js, "agentrl_models")
        assert await resolve_init(bus.js, "live") is None  # empty bucket
        rows = [
            (1, "live", "/ck/v1"),
            (2, "candidate", "/ck/v2"),
            (3, "rejected", "/ck/v3"),
            (4, "rejected", rejected),
        ]
        for version, state, path in rows:
            await reg.put_model(
                ModelRecord(
                    model_id=f"agentrl-policy-v{version}",
                    version=version,
                    public_name="agentrl-policy",
                    base_model="tiny",
                    checkpoint_path=path,
                    state=state,  # type: ignore[arg-type]
                )
            )
        await reg.put_model(
            ModelRecord(
                model_id="other-v9",
                version=9,
                public_name="other",
                base_model="tiny",
                checkpoint_path="/ck/o9",
                state="live",
            )
        )
        assert await resolve_init(bus.js, "live") == "/ck/v1"
        assert await resolve_init(bus.js, "latest") == "/ck/v2"  # v3 was rejected
        assert await resolve_init(bus.js, "latest:other") == "/ck/o9"
        assert await resolve_init(bus.js, "base") is None
        assert await resolve_init(bus.js, "/some/folder") == "/some/folder"
        assert await resolve_init(bus.js, "latest", fresh) == fresh  # not registered yet
        assert await resolve_init(bus.js, "latest", rejected) == "/ck/v2"
        assert await resolve_init(bus.js, "latest", token_path) == "/ck/v2"  # not continuable
        assert await resolve_init(bus.js, "live", fresh) == "/ck/v1"
    finally:
        await bus.close()


def test_settings_reach_the_generated_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.app.loop import LoopConfig, loop_environment
    from agentrl.training.choice_job import learner_config
    from agentrl.training.requests import fill_request
    from agentrl.training.settings import TrainingSettings

    hyper = loop_environment(LoopConfig())["AGENTRL_TRAINING_HYPERPARAMETERS"]
    assert json.loads(hyper)["gamma"] == 0.5  # the loop's discount (near-random acting)
    monkeypatch.setenv("AGENTRL_TRAINING_HYPERPARAMETERS", hyper)
    monkeypatch.setenv("AGENTRL_TRAINING_INIT_FROM", "latest")
    monkeypatch.setenv("AGENTRL_TRAINING_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("AGENTRL_TRAINING_DATASET_WINDOW_S", "300")
    req = fill_request({}, TrainingSettings())
    tc = req.training_config
    window = tc.dataset.filter.date_range
    assert window is not None and (window.end - window.start).total_seconds() == 300
    assert (tc.hyperparameters.model_extra or {}).get("objective") == "state_awr"
    assert tc.hyperparameters.gamma == 0.5
    assert learner_config({}, req, "gigpo").gamma == 0.5
    assert (tc.model_extra or {}).get("init_from") == "latest"
    assert tc.compute.mixed_precision == "bf16"


def test_awr_with_behaviour_log_probs_fits_the_start_policy_not_the_sampling() -> None:
    """Equal rewards, one move sampled 13 times in 16: plain AWR clones the sampling and
    raises that move; with the behaviour's log-probs (pi_start / pi_behaviour) the weighted
    data is the start policy again and the move's probability stays where it was."""
    config = ValidActionConfig(
        model="tiny", lora_layers=2, algorithm="grpo", credit="episode", learning_rate=1e-2,
        epochs=8, minibatches=1, entropy_coef=0.0, save_adapter=False,
    )  # fmt: skip
    moved = {}
    for corrected in (False, True):
        learner = Learner(config)
        text = learner.cache.prompt("Pick a move.")
        actions = [0] * 13 + [1, 2, 3]
        steps = [Step(e, 0, text, "s", a, 0.0, 0.5, True) for e, a in enumerate(actions)]
        batch = Batch(steps, [0.5] * 16, [False] * 16, [0] * 16, [1] * 16)
        sampled = [math.log(13 / 16) if a == 0 else math.log(1 / 16) for a in actions]
        with torch.no_grad():
            before = learner.scorer.logprobs([text])[0].exp()[0].item()
        train_choices(
            learner, batch, objective="awr", beta=0.5, behaviour=sampled if corrected else None
        )
        with torch.no_grad():
            moved[corrected] = learner.scorer.logprobs([text])[0].exp()[0].item() - before
    assert moved[False] > 0.2, moved
    assert abs(moved[True]) < 0.05, moved


def test_state_targets_move_the_start_policy_by_each_moves_mean_advantage() -> None:
    """q(.|s) = softmax(log pi_start + mean A(s, .) / beta): how often a move was sampled
    does not enter, a move never taken keeps its start mass, states weigh by their visits."""
    from agentrl.training.choice_job import state_targets

    start = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    # state 0: "up" sampled 9 times at -0.5, "right" once at +1; state 1: "down" twice at +0.5
    row = torch.tensor([0] * 10 + [1, 1])
    act = torch.tensor([0] * 9 + [3, 1, 1])
    adv = torch.tensor([-0.5] * 9 + [1.0, 0.5, 0.5])
    target, visits = state_targets(start, row, act, adv, beta=0.5)
    expect0 = torch.softmax(start[0] + torch.tensor([-1.0, 0.0, 0.0, 2.0]), -1)
    assert torch.allclose(target[0], expect0)
    assert int(target[0].argmax()) == 3  # "right" wins, though "up" was sampled 9 times
    assert torch.allclose(target[1], torch.softmax(torch.tensor([0.0, 1.0, 0.0, 0.0]), -1))
    assert visits.tolist() == [10.0, 2.0]
    assert torch.allclose(target.sum(-1), torch.ones(2))


def test_state_awr_ignores_how_often_the_acting_version_sampled_a_move() -> None:
    """The same data as above: sample AWR clones a lagging acting version's favourite move;
    the per-state target leaves it where the start policy had it (equal advantages), and
    raises the move whose advantage is higher."""
    config = ValidActionConfig(
        model="tiny", lora_layers=2, algorithm="grpo", credit="episode", learning_rate=1e-2,
        epochs=8, minibatches=1, entropy_coef=0.0, save_adapter=False,
    )  # fmt: skip
    learner = Learner(config)
    text = learner.cache.prompt("Pick a move.")
    actions = [0] * 13 + [1, 2, 3]
    steps = [Step(e, 0, text, "s", a, 0.0, 0.5, True) for e, a in enumerate(actions)]
    batch = Batch(steps, [0.5] * 16, [False] * 16, [0] * 16, [1] * 16)
    with torch.no_grad():
        before = learner.scorer.logprobs([text])[0].exp()
    train_choices(learner, batch, objective="state_awr", beta=0.5)
    with torch.no_grad():
        after = learner.scorer.logprobs([text])[0].exp()
    assert torch.allclose(after, before, atol=0.03), (before, after)
    rewards = [1.0 if a == 3 else 0.0 for a in actions]  # "right" pays, sampled once
    learner = Learner(config)
    paid = zip(actions, rewards, strict=True)
    steps = [Step(e, 0, text, "s", a, 0.0, r, True) for e, (a, r) in enumerate(paid)]
    batch = Batch(steps, rewards, [r > 0 for r in rewards], [0] * 16, [1] * 16)
    train_choices(learner, batch, objective="state_awr", beta=0.5)
    with torch.no_grad():
        raised = learner.scorer.logprobs([text])[0].exp()
    assert raised[3] > before[3] + 0.2 and raised[0] < before[0], (before, raised)
