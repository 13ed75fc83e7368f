"""Tool use in Agent Zero's JSON format: calculator, sandboxed code_exe, answer checking."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.envs import ToolUseEnv, make_env
from agentrl.envs.tooluse import (
    CalculatorError,
    ToolTask,
    check_answer,
    evaluate,
    generate_task,
)


def a0(tool: str, **args: Any) -> str:
    """An action as Agent Zero writes it."""
    return json.dumps(
        {
            "thoughts": ["working on it"],
            "headline": f"use {tool}",
            "tool_name": tool,
            "tool_args": args,
        }
    )


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(3 + 4) * 2", 14),
        ("2 ** 10", 1024),
        ("2 ^ 10", 1024),
        ("7 // 2 + 7 % 2", 4),
        ("-3 * -(2 + 1)", 9),
        ("sqrt(16) + abs(-2)", 6.0),
        ("max(3, 9, 4) - min(1, 2)", 8),
        ("round(pi, 3)", 3.142),
        ("factorial(5)", 120),
        ("1 / 4", 0.25),
    ],
)
def test_calculator_evaluates(expression: str, value: float) -> None:
    assert evaluate(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("__import__('os')", "unknown function"),
        ("().__class__", "not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("9 ** 9 ** 9", "exponent"),
        ("1 / 0", "division by zero"),
        ("'a' * 3", "only numbers"),
        ("2 +", "not a valid expression"),
        ("factorial(100000)", "factorial"),
        ("[1, 2]", "not allowed"),
        ("lambda: 1", "not allowed"),
    ],
)
def test_calculator_rejects(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)


# The sandbox's tests (isolation, escapes, limits) are in test_envs_sandbox.py.


# ---------------------------------------------------------------- tasks and answers


def test_tasks_are_deterministic_and_cover_families() -> None:
    assert generate_task(11) == generate_task(11)
    families = {generate_task(s).family for s in range(30)}
    assert families == {"arithmetic", "data", "numbers"}
    with pytest.raises(ValueError, match="unknown tool-use family"):
        generate_task(0, "poetry")


def test_arithmetic_answers_match_the_calculator() -> None:
    for seed in range(25):
        task = generate_task(seed, "arithmetic")
        assert evaluate(task.spec["expression"]) == task.answer


def test_check_answer() -> None:
    num = ToolTask("t", "arithmetic", "q", 1234)
    assert check_answer("1234", num) and check_answer("The answer is 1,234.", num)
    assert check_answer(1234, num) and not check_answer("1235", num) and not check_answer("", num)
    dec = ToolTask("t", "data", "q", 12.35, tolerance=0.011)
    assert check_answer("12.35", dec) and check_answer("about 12.351", dec)
    assert not check_answer("12.5", dec)
    name = ToolTask("t", "data", "q", "Lima", candidates=("Oslo", "Lima", "Rome"))
    assert check_answer("lima", name) and check_answer("The coldest city is Lima.", name)
    assert not check_answer("Lima or Oslo", name) and not check_answer("Rome", name)


# ---------------------------------------------------------------- the environment


def test_tooluse_episode_calculator_then_correct_answer() -> None:
    env = ToolUseEnv(family="arithmetic")
    obs = env.reset(4)
    assert obs["text"].startswith("Task: ") and "tool_name" in obs["text"]
    assert env.task is not None
    expr = env.task.spec["expression"]
    obs, reward, done, info = env.step(a0("calculator", expression=expr))
    assert not done and reward == 0.0 and info["tool_name"] == "calculator"
    value = obs["text"].split("= ")[1].split("\n")[0]
    assert int(value) == env.ground_truth
    obs, reward, done, info = env.step(a0("response", text=value))
    assert done and reward == 1.0 and info["success"] and "correct" in obs["text"]


def test_tooluse_wrong_answer_scores_zero() -> None:
    env = make_env("tooluse-arithmetic")
    env.reset(4)
    _, reward, done, info = env.step(a0("response", text="-1"))
    assert done and reward == 0.0 and info["success"] is False


def test_tooluse_code_exe_solves_a_numbers_task() -> None:
    env = ToolUseEnv(family="numbers")
    for seed in range(40):
        obs = env.reset(seed)
        if env.task is not None and env.task.kind == "sum_primes":
            break
    assert env.task is not None and env.task.kind == "sum_primes"
    n = env.task.spec["n"]
    code = (f"print(sum(p for p in range(2, {n}) "
            f"if all(p % d for d in range(2, int(p ** 0.5) + 1))))")  # fmt: skip
    obs, _, done, info = env.step(a0("code_exe", code=code))
    assert not done and info["tool_error"] is False and info["sandbox_isolation"]
    printed = obs["text"].split("stdout:\n")[1].split("\n")[0]
    _, reward, done, info = env.step(a0("response", text=printed))
    assert done and reward == 1.0


def test_tooluse_invalid_actions_and_tool_errors() -> None:
    env = ToolUseEnv(family="data", invalid_action_penalty=-0.2, max_steps=10)
    start = env.reset(2)
    for text in ["the answer is 5", a0("browser", url="x"), a0("calculator"), "{not json"]:
        obs, reward, done, info = env.step(text)
        assert info["invalid_action"] and reward == -0.2 and not done
        assert obs["text"].startswith("Invalid action") and obs["anchor"] == start["anchor"]
    obs, _, done, info = env.step(a0("calculator", expression="import os"))
    assert not done and not info["invalid_action"] and info["tool_error"]
    assert "calculator error" in obs["text"]
    # OpenAI-style call and Agent Zero's tool alias are accepted.
    obs, _, _, info = env.step(
        json.dumps({"name": "calculator", "arguments": '{"expression": "6*7"}'})
    )
    assert "= 42" in obs["text"]
    obs, _, _, info = env.step(a0("code_execution_tool", runtime="python", code="print(6*7)"))
    assert info["tool_name"] == "code_exe" and "42" in obs["text"]


def test_tooluse_max_steps_and_anchors() -> None:
    env = ToolUseEnv(family="arithmetic", max_steps=2)
    first = env.reset(9)
    obs1, _, _, _ = env.step(a0("calculator", expression="1+1"))
    other = ToolUseEnv(family="arithmetic", max_steps=2)
    other.reset(9)
    other.step("garbage")
    obs_same, _, _, _ = other.step(a0("calculator", expression="1+1"))
    assert obs1["anchor"] == obs_same["anchor"] != first["anchor"]  # same state, other history
    obs, reward, done, info = env.step(a0("calculator", expression="2+2"))
    assert done and info["truncated"] and reward == 0.0 and "Out of steps" in obs["text"]
    _, _, done, info = env.step(a0("response", text="4"))
    assert done and info["invalid_action"]


def test_tooluse_is_deterministic() -> None:
    a, b = make_env("tooluse"), make_env("tooluse")
    assert a.reset(21) == b.reset(21)
    action = a0("calculator", expression="12*12")
    assert a.step(action) == b.step(action)
