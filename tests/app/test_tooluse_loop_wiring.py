"""What `agentrl loop --env tooluse` hands its jobs (issue 52), checked on the real parts a job
uses: the reply schema the agents send is named in the jobs' `constraints`, so a completion
the gateway's engine sampled under it trains with its logged log-probs against the rebuilt
mask; the estimator is GiGPO with PPO-clip; each task is acted on several times, so the
job's groups (same task) of failed attempts get a gradient from the partial credit per turn;
and the jobs hint the tasks whose every attempt failed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentrl.app.loop import LoopConfig, loop_environment
from agentrl.app.loop_tooluse import response_format
from agentrl.llm.forward import BITMASK_KEY
from agentrl.serving.openai_types import ChatRequest
from agentrl.training.dataset import Record
from agentrl.training.samples import build_samples

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def job_settings(**kw: Any) -> tuple[dict[str, str], dict[str, Any]]:
    env = loop_environment(LoopConfig.tooluse(**kw))
    return env, json.loads(env["AGENTRL_TRAINING_HYPERPARAMETERS"])


@pytest.fixture(scope="module")
def engine() -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine("tiny", seed=3, tiny_kwargs=TINY, max_batch_size=2, default_max_tokens=32)


def test_constrained_replies_train_under_the_rebuilt_mask(engine: Any) -> None:
    """A reply sampled under the loop's reply schema keeps its logged log-probs as the old
    log-probs and carries the mask: the PPO ratio compares the masked distributions."""
    env, hyper = job_settings()
    assert env["AGENTRL_TRAINING_ADVANTAGE_ESTIMATOR"] == "gigpo"
    assert hyper["objective"] == "pg"  # PPO-clip on the advantages (not rejection sampling)
    body = {
        "model": "agentrl-policy",
        "messages": [{"role": "user", "content": "What is 2 + 3?"}],
        "temperature": 1.0,
        "max_tokens": 32,
        "response_format": response_format(),  # what the loop's agents send
    }
    gen = asyncio.run(engine.generate(None, ChatRequest.model_validate(body)))
    assert gen.constrained
    row = {
        "completion_id": "c-1",
        "prompt_token_ids": list(gen.prompt_token_ids),
        "completion_token_ids": list(gen.completion_token_ids),
        "completion_logprobs": list(gen.token_logprobs),
        "constrained": True,
        "schema_hash": gen.schema_hash,
    }
    traj = {
        "trajectory_id": "t-1",
        "end_timestamp": "2026-01-01T00:00:00Z",
        "task_context": {"task_id": "k", "instructions": "What is 2 + 3?"},
        "turns": [
            {
                "turn_id": 1,
                "observation": {"type": "user_message", "content": "What is 2 + 3?"},
                "action": {"type": "response", "raw_response": "x", "completion_id": "c-1"},
            }
        ],
    }
    rec = Record(traj, {"trajectory_id": "t-1", "total_reward": 1.0})
    (sample,), stats = build_samples(
        [rec], engine.tokenizer, completions={"c-1": row}, constraints=hyper["constraints"]
    )
    assert stats.extra.get("masked_samples") == 1
    assert sample.old_logprobs is not None and BITMASK_KEY in sample.meta
    # the ablation (free text) names no schema
    assert job_settings(structured=False)[1]["constraints"] == []


def _attempt(seed: int, k: int, turn_rewards: list[float]) -> Record:
    turns = [
        {
            "turn_id": j + 1,
            "observation": {
                "type": "user_message" if j == 0 else "tool_result",
                "content": "What is 2 + 3?" if j == 0 else f"result {k}",
            },
            "action": {
                "type": "tool_call",
                "tool_name": "calculator",
                "raw_response": f'{{"tool_name": "calculator", "k": {k}, "j": {j}}}',
            },
        }
        for j in range(len(turn_rewards))
    ]
    traj = {
        "trajectory_id": f"t-{seed}-{k}",
        "end_timestamp": f"2026-01-01T00:00:0{k}Z",
        "task_context": {"task_id": f"tooluse/seed-{seed}", "env_id": "tooluse", "seed": seed},
        "turns": turns,
    }
    reward = {"trajectory_id": traj["trajectory_id"], "total_reward": sum(turn_rewards),
              "metadata": {"turn_rewards": turn_rewards}}  # fmt: skip
    return Record(traj, reward)


def test_each_task_is_a_group_and_failed_groups_still_have_a_gradient(smol_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The agents act on each task `task_repeats` times (one session each, as the canary
    counts them): the job sees a GiGPO group per task, and with partial credit per turn a
    group where every attempt failed has non-zero step advantages."""
    cfg = LoopConfig.tooluse()
    assert cfg.task_repeats >= 2 and cfg.group_size == 1
    seeds = [n // cfg.task_repeats for n in range(2 * cfg.task_repeats)]  # Agents.run's rule
    assert seeds.count(0) == cfg.task_repeats
    env, _ = job_settings()
    assert int(env["AGENTRL_TRAINING_SAMPLE_SIZE"]) >= 4 * cfg.threshold  # whole groups
    credit = [[0.1, 0.2], [0.0, 0.05], [0.2, 0.1], [0.0, 0.0]]  # failures: partial credit
    recs = [_attempt(0, k, credit[k]) for k in range(cfg.task_repeats)]
    samples, stats = build_samples(recs, smol_tokenizer, estimator="gigpo")
    assert stats.grouped_trajectories == cfg.task_repeats
    assert any(abs(s.advantage) > 1e-6 for s in samples)
    # with 0/1 rewards alone (no partial credit) the same failed group has nothing to learn
    flat = [_attempt(0, k, [0.0, 0.0]) for k in range(cfg.task_repeats)]
    samples, _ = build_samples(flat, smol_tokenizer, estimator="gigpo")
    assert all(abs(s.advantage) < 1e-9 for s in samples)


def test_the_jobs_hint_failed_tasks_as_the_loop_says() -> None:
    from agentrl.learners.tooluse_job import JobHints

    _, hyper = job_settings()
    hints = JobHints.model_validate(hyper["tooluse_hints"])
    assert hints.mode == "importance" and not hints.reveal_answer
    assert hints.max_new_tokens == LoopConfig.tooluse().max_tokens
    assert JobHints.model_validate(job_settings(hints="distill")[1]["tooluse_hints"]).mode == (
        "distill"
    )
    assert job_settings(hints="off")[1]["tooluse_hints"] is None
    sft = job_settings(hints="sft")[1]["tooluse_hints"]  # ReLIFT-style NLL on hinted successes
    assert JobHints.model_validate(sft).mode == "sft"
    assert hints.temperature == 0.3  # by default the hinted resamples' own temperature
    acting = job_settings(hints="sft", hint_temperature=None)[1]["tooluse_hints"]
    assert JobHints.model_validate(acting).temperature == LoopConfig.tooluse().temperature
    # the plan (the scripted solver's first call) by default; off for a run with no
    # scripted solution anywhere, where a hint is the checker's words only
    assert hints.plan
    words = JobHints.model_validate(job_settings(hint_plan=False)[1]["tooluse_hints"])
    assert not words.plan
    from agentrl.envs.tooluse.hints import hint_for
    from agentrl.envs.tooluse.tasks import generate_task

    task = generate_task(100_000, "data")
    assert "Reply with" in hint_for(task, plan=hints.plan)
    assert "Reply with" not in hint_for(task, plan=words.plan)


def test_the_hint_volume_reaches_the_jobs() -> None:
    """How many failed tasks a job hints and how often it resamples each are the loop's
    settings (`hint_tasks`, `hint_samples`), from the command line too."""
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.learners.tooluse_job import JobHints

    hints = JobHints.model_validate(job_settings()[1]["tooluse_hints"])
    assert (hints.max_tasks, hints.samples) == (8, 4)
    more = job_settings(hint_tasks=40, hint_samples=2)[1]["tooluse_hints"]
    assert (JobHints.model_validate(more).max_tasks, JobHints.model_validate(more).samples) == (
        40,
        2,
    )
    shown = CliRunner().invoke(
        app,
        ["loop", "--env", "tooluse", "--quick", "--set", "hint_tasks=24", "--show-config"],
    )
    assert shown.exit_code == 0, shown.output
    assert '"hint_tasks": 24' in shown.output.replace("'", '"')


def test_the_ablation_switches_reach_the_jobs_and_the_reward_service(tmp_path: Any) -> None:
    """`agentrl loop --env tooluse` runs without hints, without partial credit and without
    replay at the same budget: each switch is an option (or `--set`) of the command, and each
    reaches what acts on it: the jobs' hyperparameters (`tooluse_hints`, `tooluse_replay`: a
    job given None builds neither, `tests/llm/test_tooluse_job_replay.py`) and the reward
    service's `rewards.yaml` (0 or 1: `tests/rewards/test_rewards_partial_credit.py`)."""
    from typer.testing import CliRunner

    from agentrl.app.loop_tooluse import write_reward_config
    from agentrl.cli import app
    from agentrl.rewards import RewardConfig

    def config(*args: str) -> LoopConfig:
        result = CliRunner().invoke(
            app, ["loop", "--env", "tooluse", "--quick", *args, "--show-config"]
        )
        assert result.exit_code == 0, result.output
        return LoopConfig.model_validate_json(result.output)

    def wiring(cfg: LoopConfig) -> tuple[dict[str, Any], Any]:
        hyper = json.loads(loop_environment(cfg)["AGENTRL_TRAINING_HYPERPARAMETERS"])
        rewards = RewardConfig.load(write_reward_config(tmp_path, cfg.partial_credit))
        return hyper, rewards

    on = config()  # the quick profile hints by distillation (a random model's resamples fail)
    assert (on.hints, on.partial_credit, on.replay_steps) == ("distill", True, 1)
    hyper, rewards = wiring(on)
    assert hyper["tooluse_hints"]["mode"] == "distill"
    once = {"rounds": 1, "success_bar": 0.5}  # one round a job, families below half solved
    balanced = {"balance_openings": True}  # per tool of the opening turn
    assert hyper["tooluse_replay"] == {"steps": 1, "episodes_per_family": 4, **once, **balanced}
    assert hyper["tooluse_hints"]["balance_openings"] is True
    assert rewards.partial_credit is not None
    off = config("--hints", "off", "--no-partial-credit", "--replay-steps", "0")
    hyper, rewards = wiring(off)
    assert hyper["tooluse_hints"] is None and hyper["tooluse_replay"] is None
    assert rewards.partial_credit is None
    # everything else as the profile: the same budget
    same = {k: v for k, v in off.model_dump().items()
            if k not in ("hints", "partial_credit", "replay_steps")}  # fmt: skip
    assert same == {k: v for k, v in on.model_dump().items() if k in same}
    # the replay's other knob, through --set; 0 turns it off too
    two = config("--set", "replay_episodes_per_family=2")
    assert wiring(two)[0]["tooluse_replay"] == {
        "steps": 1, "episodes_per_family": 2, **once, **balanced
    }  # fmt: skip
    plain = wiring(config("--set", "balance_openings=false"))[0]  # the balance's switch
    assert "balance_openings" not in plain["tooluse_replay"]
    assert plain["tooluse_hints"]["balance_openings"] is False
    assert wiring(config("--set", "replay_episodes_per_family=0"))[0]["tooluse_replay"] is None
    warm = wiring(config("--set", "replay_warm_tasks_per_family=8"))[0]["tooluse_replay"]
    assert warm["warm_tasks_per_family"] == 8 and warm["max_steps"] >= 2
    # the scripted data programs' form (issue 52, s33): unset by default, both parts told
    assert hyper_default_form(wiring(on)[0]) == (None, None)
    shown = wiring(config("--set", "data_program=shown"))[0]
    assert hyper_default_form(shown) == ("shown", "shown")


def hyper_default_form(hyper: dict[str, Any]) -> tuple[Any, Any]:
    """(the hints' data program form, the replay's), as the jobs read them."""
    from agentrl.learners.tooluse_job import JobHints
    from agentrl.learners.tooluse_job_replay import JobReplaySettings

    hints = JobHints.model_validate(hyper["tooluse_hints"])
    replay = JobReplaySettings.model_validate(hyper["tooluse_replay"])
    return hints.data_program, replay.data_program
