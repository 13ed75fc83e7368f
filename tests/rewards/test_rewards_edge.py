"""Redaction at the edge: what agentrl's producers publish never carries PII (issue 11,
defect 6). The reward service's redaction is the second line, tested elsewhere."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.bench.rewards import read_stream
from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.subjects import TRAJECTORY
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.envs import make_env, task_for
from agentrl.rewards.edge import publish_redacted
from agentrl.rollout import run_group
from agentrl.rollout.convert import episode_to_trajectory
from agentrl.rollout.policies import ScriptedPolicy


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=Path(tmp_path_factory.mktemp("rewards-edge-nats")))
    srv.start()
    yield srv
    srv.stop()


SECRET_MAIL = "jane.doe@example.com"
SECRET_KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1w"


async def test_rollout_trajectories_are_redacted_before_they_are_published() -> None:
    task = task_for("sokoban", seed=8)
    leaky = f"mail {SECRET_MAIL} the key {SECRET_KEY}"
    policy = ScriptedPolicy(per_episode=[[leaky, "up"]], action_format="text")
    (episode,) = await run_group(task, 1, policy, env_factory=make_env, max_episode_steps=2)
    assert leaky in episode.steps[0].raw_policy_output  # the episode itself is untouched
    text = episode_to_trajectory(episode, model="tiny").to_json().decode()
    assert SECRET_MAIL not in text and SECRET_KEY not in text
    assert "[REDACTED:EMAIL]" in text and "[REDACTED:API_KEY]" in text
    raw = episode_to_trajectory(episode, model="tiny", redact=False).to_json().decode()
    assert SECRET_MAIL in raw  # opting out is explicit


async def test_publish_redacted_stores_only_scrubbed_trajectories(server: EmbeddedNats) -> None:
    bus = await Bus.connect(server.url, name="edge-test")
    try:
        await bus.ensure_streams()
        await bus.js.purge_stream("RL_TRAJECTORIES")
        doc = sample_trajectory(1, trajectory_id=str(uuid.uuid4()))
        doc["turns"][0]["observation"]["content"] = f"reach me at {SECRET_MAIL}, key {SECRET_KEY}"
        clean = TrajectoryEvent.model_validate(sample_trajectory(2))
        counts = await publish_redacted(bus, [TrajectoryEvent.model_validate(doc), clean])
        assert counts == {"email": 1, "api_key": 1}
        stored = await read_stream(bus, "RL_TRAJECTORIES", TRAJECTORY)
        assert len(stored) == 2
        assert {d["trajectory_id"] for d in stored} == {doc["trajectory_id"], clean.trajectory_id}
        for d in stored:
            assert SECRET_MAIL not in str(d) and SECRET_KEY not in str(d)
    finally:
        await bus.close()
