"""RLRolloutWorker with a small real environment defined here and model-free policies."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentrl.rollout import Message, RLRolloutWorker, TaskDefinition, run_group
from agentrl.rollout.policies import RandomPolicy, ScriptedPolicy
from agentrl.rollout.worker import (
    CRITICAL_ERROR,
    ENV_DONE,
    MAX_STEPS,
    TERMINATE_ACTION,
    TERMINATION_REGEX,
)


class Corridor:
    """Walk from cell 0 to cell `length` with "left"/"right"; reward 1 at the goal.

    `crash_at` makes step number k raise (a broken environment); `seed` picks the start.
    """

    env_id = "corridor"

    def __init__(self, length: int = 3, crash_at: int | None = None) -> None:
        self.length = length
        self.crash_at = crash_at
        self.pos = 0
        self.steps = 0
        self.ground_truth = "right" * length
        self.threads: set[str] = set()

    def _obs(self, extra: str = "") -> dict[str, Any]:
        return {
            "text": f"{extra}You are at {self.pos} of {self.length}.",
            "anchor": f"pos={self.pos}",
        }

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.pos = (seed or 0) % self.length
        self.steps = 0
        return self._obs()

    def step(self, action_text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        if self.crash_at is not None and self.steps == self.crash_at:
            raise RuntimeError("corridor collapsed")
        move = action_text.strip().lower()
        if move not in ("left", "right"):
            return (
                self._obs("Invalid action; say left or right. "),
                -0.1,
                False,
                {
                    "invalid_action": True,
                    "success": False,
                },
            )
        self.pos = max(0, self.pos + (1 if move == "right" else -1))
        done = self.pos == self.length
        return self._obs(), 1.0 if done else 0.0, done, {"invalid_action": False, "success": done}


def corridor_factory(**overrides: Any) -> Any:
    def factory(env_id: str, **kwargs: Any) -> Corridor:
        assert env_id == "corridor"
        return Corridor(**{**kwargs, **overrides})

    return factory


def task(**kw: Any) -> TaskDefinition:
    base: dict[str, Any] = {
        "name": "walk",
        "env_id": "corridor",
        "seed": 0,
        "initial_messages": [Message(role="system", content="Reach the end. Say left or right.")],
        "max_episode_steps": 10,
        "env_kwargs": {"length": 3},
    }
    base.update(kw)
    return TaskDefinition(**base)


async def test_successful_episode_collects_full_step_data() -> None:
    policy = ScriptedPolicy(["right", "left", "right", "right", "right"])
    worker = RLRolloutWorker(task(), policy, corridor_factory())
    steps, messages, ground_truth = await worker.run_episode()

    assert [s.system_step_index for s in steps] == [0, 1, 2, 3, 4]
    assert [s.observation_data["anchor"] for s in steps] == [
        "pos=0",
        "pos=1",
        "pos=0",
        "pos=1",
        "pos=2",
    ]
    assert [s.base_reward for s in steps] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [s.is_done for s in steps] == [False] * 4 + [True]
    last = steps[-1]
    assert last.step_info["termination_reason"] == ENV_DONE and last.step_info["success"] is True
    assert last.step_info["truncated"] is False
    assert last.action_taken == {"type": "text", "content": "right"}
    assert ground_truth == "rightrightright"  # from the environment: the task gave none
    # The message history: system, first observation, then (assistant, observation) pairs.
    assert [m.role for m in messages] == ["system", "user"] + ["assistant", "user"] * 5
    assert messages[-1].content == "You are at 3 of 3."
    assert last.resulting_messages_history == messages
    # What the policy saw at step 2 is what StepData recorded.
    seen = policy.calls[2][2]
    assert [m.to_openai() for m in seen] == steps[2].observation_data["messages"]
    assert steps[2].observation_data["env_observation"]["text"] == "You are at 0 of 3."
    assert all(s.step_info["episode_id"] == worker.episode_id for s in steps)


async def test_task_ground_truth_wins_and_env_runs_in_threads() -> None:
    envs: list[Corridor] = []

    def factory(env_id: str, **kwargs: Any) -> Corridor:
        envs.append(Corridor(**kwargs))
        return envs[-1]

    worker = RLRolloutWorker(task(ground_truth=42), ScriptedPolicy(["right"] * 3), factory)
    _, _, truth = await worker.run_episode()
    assert truth == 42
    assert threading.main_thread().name not in envs[0].threads

    inline = RLRolloutWorker(task(), ScriptedPolicy(["right"] * 3), factory, env_in_thread=False)
    await inline.run_episode()
    assert envs[1].threads == {threading.current_thread().name}


async def test_max_steps_truncates() -> None:
    worker = RLRolloutWorker(
        task(), ScriptedPolicy(["left"] * 20), corridor_factory(), max_episode_steps=4
    )
    steps, _, _ = await worker.run_episode()
    assert len(steps) == 4
    assert steps[-1].step_info["termination_reason"] == MAX_STEPS
    assert steps[-1].step_info["truncated"] is True and steps[-1].is_done


async def test_terminate_action_does_not_touch_the_environment() -> None:
    worker = RLRolloutWorker(
        task(), ScriptedPolicy(["right", {"type": "terminate"}, "right"]), corridor_factory()
    )
    steps, messages, _ = await worker.run_episode()
    assert len(steps) == 2
    assert steps[-1].step_info["termination_reason"] == TERMINATE_ACTION
    assert steps[-1].observation_data["anchor"] == "pos=1"
    assert steps[-1].base_reward == 0.0
    assert worker.env is not None and worker.env.steps == 1  # type: ignore[attr-defined]
    assert messages[-1].role == "assistant"


async def test_termination_regex_on_raw_output() -> None:
    worker = RLRolloutWorker(
        task(termination_regex=r"(?i)\bgive up\b"),
        ScriptedPolicy(["right", "I GIVE UP now", "right"]),
        corridor_factory(),
    )
    steps, _, _ = await worker.run_episode()
    assert len(steps) == 2
    # The action was still executed (invalid for this environment), then the episode ended.
    assert steps[-1].step_info["termination_reason"] == TERMINATION_REGEX
    assert steps[-1].step_info["invalid_action"] is True
    assert steps[-1].base_reward == pytest.approx(-0.1)


async def test_unparsable_output_is_an_invalid_step_not_a_crash() -> None:
    policy = ScriptedPolicy(
        ["", '{"tool_name": 3}', "right", "right", "right"], action_format="agent_zero"
    )
    worker = RLRolloutWorker(task(), policy, corridor_factory())
    steps, _, _ = await worker.run_episode()
    assert steps[0].action_taken["type"] == "invalid"
    assert steps[0].step_info["parse_error"] == "empty output"
    assert steps[0].step_info["invalid_action"] is True
    assert steps[1].step_info["invalid_action"] is True
    assert "tool_name" in steps[1].step_info["parse_error"]
    # "right" is not Agent Zero JSON either: invalid by the policy's format, passed through
    # raw, and this environment accepts it, so it is the environment that judges.
    assert steps[2].action_taken["type"] == "invalid"
    assert steps[2].step_info["invalid_action"] is False
    assert steps[-1].step_info["termination_reason"] == ENV_DONE


async def test_environment_crash_is_a_critical_error() -> None:
    worker = RLRolloutWorker(task(), ScriptedPolicy(["right"] * 5), corridor_factory(crash_at=2))
    steps, _, _ = await worker.run_episode()
    assert len(steps) == 2
    info = steps[-1].step_info
    assert info["termination_reason"] == CRITICAL_ERROR
    assert info["error_source"] == "environment"
    assert "corridor collapsed" in info["critical_error"]


async def test_policy_exception_is_a_critical_error() -> None:
    def boom(observation: Any) -> str:
        raise ConnectionError("model server gone")

    worker = RLRolloutWorker(task(), ScriptedPolicy(["right", boom]), corridor_factory())
    episode = await worker.run()
    assert len(episode.steps) == 2
    assert episode.termination_reason == CRITICAL_ERROR
    assert episode.critical_error is not None and "model server gone" in episode.critical_error
    assert episode.steps[-1].step_info["error_source"] == "policy"
    assert episode.steps[-1].policy_logprobs is None


async def test_reset_failure_gives_an_empty_episode_with_the_error() -> None:
    def factory(env_id: str, **kwargs: Any) -> Corridor:
        raise KeyError(env_id)

    episode = await RLRolloutWorker(task(), ScriptedPolicy(["right"]), factory).run()
    assert episode.steps == [] and episode.termination_reason == CRITICAL_ERROR
    assert episode.critical_error is not None and "corridor" in episode.critical_error


@pytest.mark.parametrize(
    ("window", "expected_roles"),
    [
        (None, ["system", "user"] + ["assistant", "user"] * 4),
        (2, ["system", "user"] + ["assistant", "user"] * 2),
        (0, ["system", "user", "user"]),
    ],
)
async def test_history_window(window: int | None, expected_roles: list[str]) -> None:
    policy = ScriptedPolicy(["left"] * 6)
    worker = RLRolloutWorker(
        task(), policy, corridor_factory(), history_window=window, max_episode_steps=5
    )
    steps, messages, _ = await worker.run_episode()
    seen = steps[4].observation_data["messages"]
    assert [m["role"] for m in seen] == expected_roles
    assert seen[1]["content"] == messages[1].content  # the first observation always stays
    assert seen[-1]["content"] == messages[-3].content  # the current observation is last
    assert len(messages) == 2 + 2 * 5  # the full history is kept regardless


async def test_group_runs_concurrently_with_per_episode_scripts() -> None:
    scripts = [
        ["right"] * 3,
        ["left", "right", "right", "right"],
        ["oops", "right", "right", "right"],
    ]
    policy = ScriptedPolicy(per_episode=scripts)
    started = asyncio.get_running_loop().time()
    episodes = await run_group(task(), 6, policy, env_factory=corridor_factory())
    assert len(episodes) == 6
    assert len({e.group_id for e in episodes}) == 1
    assert len({e.episode_id for e in episodes}) == 6
    assert [len(e.steps) for e in episodes] == [3, 4, 4, 3, 4, 4]
    assert all(e.success for e in episodes)
    assert [e.total_reward for e in episodes] == pytest.approx([1.0, 1.0, 0.9, 1.0, 1.0, 0.9])
    # Same task and seed: every episode starts from the same anchor (GiGPO's group).
    assert {e.steps[0].observation_data["anchor"] for e in episodes} == {"pos=0"}
    # Concurrency: the episodes' calls interleave (episode 0 is not done before 1 starts).
    order = [ep for ep, _, _ in policy.calls]
    assert order[:6] == [0, 1, 2, 3, 4, 5]
    assert asyncio.get_running_loop().time() - started < 5.0


async def test_random_policy_is_reproducible_per_episode_and_step() -> None:
    choices = ["left", "right", "jump"]
    a = await run_group(
        task(max_episode_steps=6), 4, RandomPolicy(choices, seed=3), env_factory=corridor_factory()
    )
    b = await run_group(
        task(max_episode_steps=6), 4, RandomPolicy(choices, seed=3), env_factory=corridor_factory()
    )
    acts = [[s.raw_policy_output for s in e.steps] for e in a]
    assert acts == [[s.raw_policy_output for s in e.steps] for e in b]
    assert len({tuple(x) for x in acts}) > 1  # different episodes, different draws
    lp = a[0].steps[0].policy_logprobs
    assert lp is not None and lp["sum"] == pytest.approx(-1.0986, abs=1e-4)


async def test_worker_run_group_method_and_tools_are_passed() -> None:
    seen_tools: list[Any] = []

    class Recorder(ScriptedPolicy):
        async def get_action(self, observation: Any, available_tools_specs: Any = None) -> Any:
            seen_tools.append(available_tools_specs)
            return await super().get_action(observation, available_tools_specs)

    spec = {"name": "move", "parameters": {"type": "object", "properties": {}}}
    worker = RLRolloutWorker(task(tool_specs=[spec]), Recorder(["right"] * 3), corridor_factory())
    episodes = await worker.run_group(3)
    assert [len(e.steps) for e in episodes] == [3, 3, 3]
    assert seen_tools and all(t == [spec] for t in seen_tools)


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="history_window"):
        RLRolloutWorker(task(), ScriptedPolicy(["x"]), corridor_factory(), history_window=-1)
    with pytest.raises(ValueError, match="max_episode_steps"):
        RLRolloutWorker(task(max_episode_steps=0), ScriptedPolicy(["x"]), corridor_factory())
    with pytest.raises(ValueError, match="exactly one"):
        ScriptedPolicy()


async def test_an_environment_breaking_the_protocol_is_a_critical_error() -> None:
    class Broken(Corridor):
        def step(self, action_text: str) -> Any:
            return "not a dict", 0.0, False, {}

    episode = await RLRolloutWorker(
        task(), ScriptedPolicy(["right"]), lambda e, **k: Broken()
    ).run()
    assert episode.termination_reason == CRITICAL_ERROR
    assert "not an observation dict" in str(episode.critical_error)


async def test_an_observation_that_stands_alone_drops_the_first_one() -> None:
    """FrozenLake's egocentric text holds the whole state: with history_window=0 the prompt
    is the task messages + the latest observation, so the same state is the same prompt in
    every episode (a valid-action policy scores it once); the grid format keeps the first."""
    from agentrl.envs.frozenlake import FrozenLakeTextEnv, shortest_path
    from agentrl.envs.registry import task_for

    probe = FrozenLakeTextEnv(size=4)
    probe.reset(seed=7)
    path = shortest_path(probe.desc)
    assert path is not None and len(path) >= 2
    for obs_format, stands_alone in (("egocentric", True), ("grid", False)):
        t = task_for("frozenlake-4x4", 7, max_episode_steps=len(path), obs_format=obs_format)
        t.initial_messages = [Message(role="system", content="Move.")]
        worker = RLRolloutWorker(t, ScriptedPolicy(path), history_window=0)
        steps, messages, _ = await worker.run_episode()
        assert len(steps) == len(path)
        seen = steps[1].observation_data["messages"]
        current = steps[1].observation_data["env_observation"]["text"]
        assert seen[-1]["content"] == current != messages[1].content
        if stands_alone:
            assert [m["role"] for m in seen] == ["system", "user"]
        else:
            assert [m["role"] for m in seen] == ["system", "user", "user"]
            assert seen[1]["content"] == messages[1].content
