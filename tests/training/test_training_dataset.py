"""Dataset loading as pure functions against hand-built trajectories and rewards."""

from __future__ import annotations

from datetime import timedelta

import pytest
from training_helpers import BASE_TIME, reward, trajectory

from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import (
    FILTER_ORDER,
    apply_filters,
    holdout_split,
    latest_rewards,
    seeded_sample,
)
from agentrl.training.samples import (
    build_pairs,
    build_samples,
    episode_advantages,
    trajectory_turns,
)


def _join(trajs, scores, flt):
    rewards = latest_rewards([reward(t, s) for t, s in zip(trajs, scores, strict=True)])
    return apply_filters(trajs, rewards, DatasetFilter.model_validate(flt))


def test_latest_reward_version_wins():
    t = trajectory(1)
    rewards = latest_rewards([reward(t, 0.2, 1), reward(t, 0.9, 3), reward(t, 0.5, 2)])
    assert rewards[t["trajectory_id"]]["total_reward"] == 0.9


def test_every_filter_counts_what_it_removes():
    trajs = [
        trajectory(0),  # kept
        trajectory(1),  # no reward
        trajectory(2, opt_out=True),
        trajectory(3),  # low reward
        trajectory(4, turns=5),  # too long
        trajectory(5, when=BASE_TIME - timedelta(days=30)),  # outside the date range
        trajectory(6, domain="research"),
        trajectory(7, profile="researcher"),
        trajectory(8, agent="other-agent"),
    ]
    rewards = latest_rewards(
        [reward(t, 0.1 if i == 3 else 0.8) for i, t in enumerate(trajs) if i != 1]
    )
    flt = DatasetFilter.model_validate(
        {
            "min_reward": 0.5,
            "max_trajectory_length": 3,
            "date_range": {
                "start": (BASE_TIME - timedelta(days=1)).isoformat(),
                "end": (BASE_TIME + timedelta(days=1)).isoformat(),
            },
            "task_domains": ["coding"],
            "exclude_subordinate_profiles": ["researcher"],
            "agent_ids": ["agent-zero-main"],
        }
    )
    kept, report = apply_filters(trajs, rewards, flt)
    assert [r.trajectory_id for r in kept] == [trajs[0]["trajectory_id"]]
    assert report.removed == dict.fromkeys(FILTER_ORDER, 1)
    assert report.trajectories == 9 and report.kept == 1
    # Each filter alone removes exactly its own trajectory.
    only_range, _ = apply_filters(
        trajs,
        rewards,
        DatasetFilter.model_validate({"date_range": flt.date_range.model_dump(mode="json")}),
    )
    assert trajs[5]["trajectory_id"] not in {r.trajectory_id for r in only_range}
    assert len(only_range) == 6  # 9 minus no-reward, opted-out and out-of-range


def test_empty_dataset_message_names_every_filter():
    _, report = _join([trajectory(0), trajectory(1)], [0.1, 0.2], {"min_reward": 0.9})
    msg = report.message()
    assert "min_reward -2" in msg and "kept 0" in msg
    for name in FILTER_ORDER:
        assert name in msg


def test_duplicate_trajectory_counted_once():
    t = trajectory(0)
    kept, report = _join([t, dict(t)], [0.5, 0.5], {})
    assert len(kept) == 1 and report.trajectories == 1


def test_seeded_sample_is_deterministic_and_order_free():
    trajs = [trajectory(i) for i in range(50)]
    kept, _ = _join(trajs, [0.5] * 50, {})
    a = seeded_sample(kept, 10, seed=7)
    b = seeded_sample(list(reversed(kept)), 10, seed=7)
    c = seeded_sample(kept, 10, seed=8)
    assert [r.trajectory_id for r in a] == [r.trajectory_id for r in b]
    assert [r.trajectory_id for r in a] != [r.trajectory_id for r in c]
    assert len(seeded_sample(kept, None, 0)) == 50


def test_holdout_split_keeps_tasks_together():
    trajs = [trajectory(i, task=f"t{i // 3}") for i in range(30)]
    kept, _ = _join(trajs, [0.5] * 30, {})
    train, hold = holdout_split(kept, 0.2, seed=0)
    assert len({r.task_id for r in hold}) == 2
    assert not {r.task_id for r in train} & {r.task_id for r in hold}
    assert len(train) + len(hold) == 30


def test_turns_use_chat_context_and_json_actions():
    t = trajectory(3, turns=3)
    turns = trajectory_turns(t)
    assert len(turns) == 3
    assert turns[0].prompt[0]["content"].startswith("add numbers")
    # The third turn sees both earlier observations and responses.
    roles = [m["role"] for m in turns[2].prompt]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert turns[2].prompt[2]["content"].startswith("Tool result:")
    assert '"tool_name": "code_exe"' in turns[1].action


def test_group_advantages_and_single_attempt_baseline(tokenizer):
    trajs = [trajectory(i, task="shared") for i in range(4)] + [
        trajectory(10 + i, domain="research") for i in range(3)
    ]
    scores = [0.0, 1.0, 0.5, 0.5, 0.2, 0.8, 0.5]
    kept, _ = _join(trajs, scores, {})
    kept.sort(key=lambda r: r.trajectory["start_timestamp"])
    adv, grouped = episode_advantages(kept, "grpo")
    assert grouped.tolist() == [True] * 4 + [False] * 3
    assert adv[:4].sum() == pytest.approx(0.0, abs=1e-9) and adv[1] > 0 > adv[0]
    # Research singles: baseline starts at the domain mean 0.5 and moves 10% towards each.
    assert adv[4] == pytest.approx(0.2 - 0.5)
    b = 0.5 + 0.1 * (0.2 - 0.5)
    assert adv[5] == pytest.approx(0.8 - b)
    samples, stats = build_samples(kept, tokenizer)
    assert stats.grouped_trajectories == 4 and stats.baseline_trajectories == 3
    assert stats.samples == 14 and stats.exact_token_samples == 0
    by_ep = {s.episode_id: s.advantage for s in samples}
    assert by_ep[kept[1].trajectory_id] == pytest.approx(adv[1])


def test_exact_tokens_from_the_completion_log(tokenizer):
    t = trajectory(0, completion_id="cmpl-1", turns=2)
    kept, _ = _join([t], [1.0], {})
    comp = {
        "cmpl-1": {
            "completion_id": "cmpl-1",
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [7, 8],
            "completion_logprobs": [-0.5, -1.5],
        }
    }
    samples, stats = build_samples(kept, tokenizer, completions=comp)
    assert stats.exact_token_samples == 1 and stats.samples == 2
    exact = next(s for s in samples if s.meta["exact_tokens"])
    assert exact.prompt_ids == [1, 2, 3] and exact.action_ids == [7, 8]
    assert exact.old_logprobs.tolist() == [-0.5, -1.5]
    other = next(s for s in samples if not s.meta["exact_tokens"])
    assert other.old_logprobs is None and other.action_ids[-1] == tokenizer.eos_token_id


def test_a_cancelled_completion_trains_on_the_tokens_the_client_was_sent(tokenizer):
    t = trajectory(0, completion_id="cmpl-x", turns=1)
    kept, _ = _join([t], [1.0], {})
    comp = {  # Agent Zero closed the stream at the end of its JSON: no EOS was sampled
        "cmpl-x": {
            "completion_id": "cmpl-x",
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [7, 8],
            "completion_logprobs": [-0.5, -1.5],
            "finish_reason": "cancelled",
        }
    }
    (s,), stats = build_samples(kept, tokenizer, completions=comp)
    assert stats.exact_token_samples == 1 and s.meta["exact_tokens"]
    assert s.action_ids == [7, 8]  # exactly what was sent: no EOS added
    assert s.old_logprobs.tolist() == [-0.5, -1.5]


def test_constrained_completions_keep_their_tokens_not_their_masked_logprobs(tokenizer):
    t = trajectory(0, completion_id="cmpl-c", turns=1)
    kept, _ = _join([t], [1.0], {})
    comp = {
        "cmpl-c": {
            "completion_id": "cmpl-c",
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [7, 8, 9],
            "completion_logprobs": [-0.1, 0.0, -0.2],  # under the grammar's mask
            "constrained": True,
            "schema_hash": "ab12",
        }
    }
    samples, stats = build_samples(kept, tokenizer, completions=comp)
    (s,) = samples
    assert stats.exact_token_samples == 1
    assert s.prompt_ids == [1, 2, 3] and s.action_ids == [7, 8, 9]
    assert s.meta["exact_tokens"] and s.meta["schema_hash"] == "ab12"
    assert s.old_logprobs is None  # scored under the policy, not the masked distribution


def test_gigpo_step_advantages_use_anchor_groups(tokenizer):
    trajs = [trajectory(i, task="g") for i in range(3)]
    kept, _ = _join(trajs, [0.0, 1.0, 0.5], {})
    samples, _ = build_samples(kept, tokenizer, estimator="gigpo")
    grpo, _ = build_samples(kept, tokenizer, estimator="grpo")
    assert len(samples) == 6
    assert [s.advantage for s in samples] != [s.advantage for s in grpo]


def test_gigpo_steps_use_the_rewards_per_turn_in_a_group_without_a_success(tokenizer):
    """Equal totals (no attempt succeeded, the same partial credit): without per-turn
    rewards every step of the group has advantage 0; with the reward service's
    `turn_rewards` the turn that earned the credit earlier has the larger return."""
    trajs = [trajectory(i, task="z") for i in range(3)]
    rewards = [reward(t, 0.2) for t in trajs]
    flat, _ = apply_filters(trajs, latest_rewards(rewards), DatasetFilter())
    samples, _ = build_samples(flat, tokenizer, estimator="gigpo")
    assert all(s.advantage == pytest.approx(0.0, abs=1e-6) for s in samples)
    for r, per_turn in zip(rewards, ([0.2, 0.0], [0.0, 0.2], [0.1, 0.1]), strict=True):
        r["metadata"] = {"turn_rewards": per_turn}
    kept, _ = apply_filters(trajs, latest_rewards(rewards), DatasetFilter())
    assert kept[0].turn_rewards is not None
    samples, _ = build_samples(kept, tokenizer, estimator="gigpo")
    first = {s.episode_id: s.advantage for s in samples if s.step_index == 0}
    by_traj = [first[t["trajectory_id"]] for t in trajs]
    # returns at the shared first state: 0.2, 0.95 x 0.2, 0.1 + 0.95 x 0.1
    assert by_traj[0] > by_traj[2] > by_traj[1]
    assert any(abs(a) > 1e-3 for a in by_traj)


def test_records_expose_the_users_correction_as_the_hint():
    t = trajectory(5)
    r = reward(t, 0.0, 2)
    r["metadata"] = {"feedback": {"explicit": "thumbs_down", "correction": "read the CSV first"}}
    (rec,), _ = apply_filters([t], latest_rewards([r]), DatasetFilter())
    assert rec.correction == rec.hint == "read the CSV first"
    (plain,), _ = apply_filters([t], latest_rewards([reward(t, 0.0)]), DatasetFilter())
    assert plain.correction is None and plain.hint is None
    # turn rewards that do not match the turns are not used
    r["metadata"]["turn_rewards"] = [0.1]
    (bad,), _ = apply_filters([t], latest_rewards([r]), DatasetFilter())
    assert bad.turn_rewards is None


def test_dpo_pairs_best_vs_worst_and_corrections(tokenizer):
    trajs = [trajectory(i, task="p") for i in range(3)] + [trajectory(9)]
    kept, _ = _join(trajs, [0.1, 0.9, 0.5, 0.4], {})
    corrections = [
        {
            "trajectory_id": trajs[3]["trajectory_id"],
            "type": "correction",
            "correction": '{"tool_name": "response", "tool_args": {"text": "4"}}',
        }
    ]
    pairs, stats = build_pairs(kept, tokenizer, corrections=corrections)
    assert stats.pairs == 2 and stats.correction_pairs == 1
    task_pair = pairs[0]
    assert task_pair.margin == pytest.approx(0.8)
    assert task_pair.chosen[0].episode_id == trajs[1]["trajectory_id"]
    assert task_pair.rejected[0].episode_id == trajs[0]["trajectory_id"]


async def test_load_data_from_jetstream_with_date_range_and_completion_log(nats, data_dir):
    """The job's loader against a real stream: start-time delivery, latest reward version,
    completion records by id."""
    from datetime import UTC, datetime

    from training_helpers import publish_data, publish_raw, settings_for

    from agentrl.bus import Bus
    from agentrl.contracts.completion import CompletionRecord
    from agentrl.training.dataset import read_subject
    from agentrl.training.jobs import load_data
    from agentrl.training.requests import fill_request
    from agentrl.training.settings import TrainingSettings

    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    trajs = [trajectory(i, completion_id=f"c-{i}" if i < 3 else None) for i in range(20)]
    try:
        await publish_data(bus, trajs, [0.5] * 20)
        await publish_raw(
            bus, "agent.rl.reward.v1", [reward(trajs[0], 0.9, version=2)], "reward_id"
        )
        for i in range(3):
            await bus.publish(
                CompletionRecord(
                    completion_id=f"c-{i}",
                    model="v1",
                    prompt_token_ids=[1, 2],
                    completion_token_ids=[3],
                    completion_logprobs=[-0.1],
                    timestamp=datetime.now(UTC),
                )
            )
        later = await read_subject(
            bus.js,
            "RL_TRAJECTORIES",
            "agent.rl.trajectory.v1",
            datetime(2099, 1, 1, tzinfo=UTC),
            idle_timeout=0.3,
        )
        assert later == []
        req = fill_request(
            {
                "training_config": {
                    "base_model": "tiny",
                    "dataset": {
                        "filter": {
                            "date_range": {
                                "start": "2026-11-20T12:00:00Z",
                                "end": "2026-11-20T12:09:59Z",
                            }
                        }
                    },
                }
            },
            TrainingSettings(),
        )
        data = await load_data({"request": req.model_dump(mode="json"), "nats_url": nats.url})
        assert len(data["trajectories"]) == 20 and len(data["rewards"]) == 21
        assert set(data["completions"]) == {"c-0", "c-1", "c-2"}
        kept, report = apply_filters(
            data["trajectories"],
            latest_rewards(data["rewards"]),
            req.training_config.dataset.filter,
        )
        assert report.removed["date_range"] == 10 and len(kept) == 10
        assert {r.trajectory_id: r.score for r in kept}[trajs[0]["trajectory_id"]] == 0.9
    finally:
        await bus.close()


def test_no_records_build_no_samples(tokenizer):
    samples, stats = build_samples([], tokenizer)
    assert samples == [] and stats.samples == 0
