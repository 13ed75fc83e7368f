"""Partial credit per turn (components.partial_credit and the calculator's bonus) on
hand-made tool-use trajectories: every component, the cap, per-turn rewards, late feedback."""

from __future__ import annotations

from typing import Any

import pytest
from tooluse_helpers import CALC_SPEC, answer, call, garbled, trajectory

from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig, ScoringInput, score_batch
from agentrl.rewards import components as C
from agentrl.rewards.calculator import rescore_with_feedback
from agentrl.rewards.config import PartialCreditConfig
from agentrl.rewards.window import WindowState


def score(c: C.PartialCredit, name: str) -> float | None:
    cs = c.components[name]
    return None if cs is None else cs.score


# ---- the components ------------------------------------------------------------------------
def test_every_component_on_a_right_answer_after_a_good_call() -> None:
    t = trajectory(
        [
            call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "calculator: ... = 10811"),
            answer("10811"),
        ],
        status="completed_successfully",
    )
    c = C.partial_credit(t)
    assert {n: score(c, n) for n in C.PARTIAL} == {
        C.TOOL_CALL_VALID: 1.0,
        C.TOOL_CALL_RAN: 1.0,
        C.NEEDED_VALUE: 1.0,
        C.ANSWER_GIVEN: 1.0,
        C.ANSWER_RIGHT: 1.0,
    }
    assert c.success is True
    # each component's credit lies on the turn that earned it
    assert c.shares[C.TOOL_CALL_VALID] == [1.0, 0.0]
    assert c.shares[C.NEEDED_VALUE] == [1.0, 0.0]
    assert c.shares[C.ANSWER_GIVEN] == [0.0, 1.0]
    assert c.shares[C.ANSWER_RIGHT] == [0.0, 1.0]


def test_invalid_calls_errors_and_a_wrong_answer_are_scored_per_turn() -> None:
    t = trajectory(
        [
            garbled(),  # not a call at all: an invalid attempt
            call(
                "calculator", {"expression": "1/0"}, "calculator error: division", tool_error=True
            ),
            call("calculator", {"expression": "418 - 37"}, "calculator: 418 - 37 = 381"),
            call("search", {"q": "x"}, "Invalid action: unknown tool", invalid_action=True),
            answer("9000", "The answer is not correct."),
        ],
        status="failed",
    )
    c = C.partial_credit(t)
    assert score(c, C.TOOL_CALL_VALID) == pytest.approx(2 / 4)  # turns 2, 3 of 1-4
    assert c.shares[C.TOOL_CALL_VALID] == [0.0, 0.25, 0.25, 0.0, 0.0]
    assert score(c, C.TOOL_CALL_RAN) == pytest.approx(1 / 2)  # turn 2 errored, turn 3 ran
    assert c.shares[C.TOOL_CALL_RAN] == [0.0, 0.0, 0.5, 0.0, 0.0]
    assert score(c, C.NEEDED_VALUE) == 0.0  # 381 is not 10811
    assert score(c, C.ANSWER_GIVEN) == 1.0
    assert score(c, C.ANSWER_RIGHT) == 0.0
    assert c.success is False


def test_needed_values_from_the_environment_include_intermediate_ones() -> None:
    steps = [call("calculator", {"expression": "418 - 37"}, "calculator: 418 - 37 = 381")]
    without = C.partial_credit(trajectory(steps, status="failed"))
    assert score(without, C.NEEDED_VALUE) == 0.0
    given = C.partial_credit(trajectory(steps, status="failed", needed=[381, 9906, 10811]))
    assert score(given, C.NEEDED_VALUE) == 1.0 and given.shares[C.NEEDED_VALUE] == [1.0]
    assert score(given, C.ANSWER_GIVEN) == 0.0  # ran out of turns without an answer
    # neither a ground truth nor needed values: the environment cannot tell
    unknown = C.partial_credit(trajectory(steps, status="failed", truth=None))
    assert unknown.components[C.NEEDED_VALUE] is None


@pytest.mark.parametrize(
    ("text", "value", "want"),
    [
        ("calculator: 418 - 37 = 381", 381, True),
        ("stdout:\n10,811\n", 10811, True),
        ("[1,2,3]", 123, False),  # a list's commas are not thousands separators
        ("mean = 12.5000001", 12.5, True),
        ("mean = 12.6", 12.5, False),
        ("the best city is Lima.", "Lima", True),
        ("the best city is Limassol", "Lima", False),
        ('{"tool_result": "-42"}', -42, True),
    ],
)
def test_a_tool_result_states_a_value(text: str, value: Any, want: bool) -> None:
    assert C.mentions(text, value) is want


def test_offered_tools_and_argument_schemas_decide_validity() -> None:
    steps = [
        {  # offered, valid arguments
            "action": {
                "type": "tool_call",
                "tool_name": "calculator",
                "tool_args": {"expression": "1+1"},
            },
            "result": {"success": True, "output": "2"},
            "step_info": {},
        },
        {  # offered, arguments that do not validate (no step_info verdict: the schema decides)
            "action": {"type": "tool_call", "tool_name": "calculator", "tool_args": {"expr": 3}},
            "result": {"success": True, "output": "3"},
            "step_info": {},
        },
        {  # not offered
            "action": {"type": "tool_call", "tool_name": "browser", "tool_args": {}},
            "result": {"success": True, "output": "page"},
            "step_info": {},
        },
        answer("2"),
    ]
    c = C.partial_credit(trajectory(steps, status="failed", tool_specs=[CALC_SPEC]))
    assert score(c, C.TOOL_CALL_VALID) == pytest.approx(1 / 3)
    assert score(c, C.TOOL_CALL_RAN) == 1.0  # the one valid call ran
    # without offered tools and without the environment's verdict: not judged
    for s in steps[:3]:
        s["step_info"] = {}
    c = C.partial_credit(trajectory(steps, status="failed"))
    assert c.components[C.TOOL_CALL_VALID] is None


def test_no_outcome_leaves_answer_right_unknown() -> None:
    c = C.partial_credit(trajectory([answer("5")], status=None))
    assert c.components[C.ANSWER_RIGHT] is None and c.success is None
    assert c.components[C.TOOL_CALL_VALID] is None  # no call was made


# ---- the calculator: totals, the cap, per-turn rewards ------------------------------------
TC_ONLY = {"task_completion": 1.0, "efficiency": 0.0, "code_quality": 0.0, "user_feedback": 0.0}


def scored(trajs: list[TrajectoryEvent], cap: float = 0.5, **weights: float) -> list[Any]:
    cfg = RewardConfig(
        weights=TC_ONLY, partial_credit=PartialCreditConfig(cap=cap, weights=weights)
    )
    out, _ = score_batch([ScoringInput(t) for t in trajs], WindowState(10, 10), cfg)
    return [r.payload for r in out]


def perfect_failure(tid: str) -> TrajectoryEvent:
    """Everything on the checklist but the right answer."""
    return trajectory(
        [
            call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811"),
            answer("10812", "not correct"),
        ],
        status="failed",
        tid=tid,
    )


def test_partial_credit_never_adds_up_to_a_success() -> None:
    success = trajectory([garbled(), answer("10811")], status="completed_successfully", tid="s")
    fail = perfect_failure("f")
    nothing = trajectory([garbled(), garbled()], status="failed", tid="n")
    for cap in (0.0, 0.5, 0.99):
        p_s, p_f, p_n = scored([success, fail, nothing], cap=cap)
        assert p_s["total_reward"] == pytest.approx(1.0)  # a success keeps its reward
        assert p_f["total_reward"] < p_s["total_reward"]
        # weights 1,1,2,2,1: a failure ticks 6 of 7 (not answer_right) -> cap x 6/7
        assert p_f["total_reward"] == pytest.approx(cap * 6 / 7)
        assert p_f["metadata"]["partial_credit"]["bonus"] == pytest.approx(cap * 6 / 7)
        assert p_n["total_reward"] == pytest.approx(0.0)  # nothing right: nothing earned
    with pytest.raises(ValueError):
        PartialCreditConfig(cap=1.0)


def test_components_are_reported_with_their_weights() -> None:
    (p,) = scored([perfect_failure("f")], needed_value=3.0)
    comps = p["reward_components"]
    for name in C.PARTIAL:
        assert name in comps
    assert comps["needed_value"]["weight"] == 3.0 and comps["needed_value"]["score"] == 1.0
    assert comps["answer_right"]["score"] == 0.0
    assert comps["tool_call_valid"]["reasoning"].startswith("1 of 1")
    # P = (1 + 1 + 3 + 2 + 0) / 8
    assert p["metadata"]["partial_credit"]["score"] == pytest.approx(7 / 8)


def test_turn_rewards_place_the_credit_on_the_turns_and_sum_to_the_total() -> None:
    fail = trajectory(
        [
            call("calculator", {"expression": "418 - 37"}, "= 381"),  # valid, ran
            garbled(),  # invalid
            call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811"),
            answer("10812", "not correct"),
        ],
        status="failed",
        tid="f2",
    )
    (p,) = scored([fail], cap=0.6)
    turns = p["metadata"]["turn_rewards"]
    assert sum(turns) == pytest.approx(p["total_reward"])
    w = 7.0  # 1 + 1 + 2 + 2 + 1
    valid, ran = 1 / 3, 1 / 2  # a valid call's share of each fraction
    want = [
        0.6 * (valid + ran) / w,
        0.0,
        0.6 * (valid + ran + 2.0) / w,
        0.6 * 2.0 / w,
    ]
    assert turns == pytest.approx(want)
    rows = p["metadata"]["step_rewards"]["partial_credit"]
    assert [r["step_index"] for r in rows] == [1, 2, 3, 4]
    assert p["reward_type"] == "dense"
    # a success: the turns' credit, the rest of the success reward on the last turn
    success = trajectory(
        [call("calculator", {"expression": "1"}, "= 10811"), answer("10811")],
        status="completed_successfully",
        tid="s2",
    )
    (q,) = scored([success])
    assert sum(q["metadata"]["turn_rewards"]) == pytest.approx(1.0)
    assert q["metadata"]["turn_rewards"][0] > 0


def test_an_answer_pays_at_least_calls_that_never_answer() -> None:
    """The default weights' order on failures (hand-made, cap 0.5): a wrong answer with no
    call is paid at least as much as a call that ran and never answered (it was 0.125
    against 0.167); a call then a wrong answer more than either; the needed value found
    and a wrong answer the most; none reaches the success reward."""
    calc = ("calculator", {"expression": "418 - 37"}, "calculator: 418 - 37 = 381")
    right = ("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811")
    cases = {
        "call_no_answer": [call(*calc)],
        "wrong_answer_no_call": [answer("9000", "not correct")],
        "call_then_wrong_answer": [call(*calc), answer("9000", "not correct")],
        "needed_value_no_answer": [call(*right)],
        "needed_value_wrong_answer": [call(*right), answer("10812", "not correct")],
    }
    trajs = [trajectory(s, status="failed", tid=k) for k, s in cases.items()]
    got = dict(zip(cases, (p["total_reward"] for p in scored(trajs)), strict=True))
    assert got["wrong_answer_no_call"] > got["call_no_answer"] > 0.0
    assert got["call_then_wrong_answer"] > got["wrong_answer_no_call"]
    assert got["needed_value_no_answer"] > got["call_no_answer"]
    assert got["needed_value_wrong_answer"] > got["needed_value_no_answer"]
    assert got["needed_value_wrong_answer"] > got["call_then_wrong_answer"]
    assert max(got.values()) <= 0.5
    assert got["call_no_answer"] == pytest.approx(0.5 * 2 / 7)
    assert got["wrong_answer_no_call"] == pytest.approx(0.5 * 2 / 5)


def test_a_group_without_a_success_still_differs() -> None:
    group = [
        perfect_failure("a"),
        trajectory([garbled(), garbled()], status="failed", tid="b"),
        trajectory(
            [call("calculator", {"expression": "2"}, "= 2"), answer("2", "no")],
            status="failed",
            tid="c",
        ),
    ]
    totals = [p["total_reward"] for p in scored(group)]
    assert len(set(totals)) == 3 and max(totals) < 1.0


def test_off_by_default_and_the_old_totals_are_unchanged() -> None:
    t = perfect_failure("x")
    plain, _ = score_batch([ScoringInput(t)], WindowState(10, 10), RewardConfig(weights=TC_ONLY))
    p = plain[0].payload
    assert "tool_call_valid" not in p["reward_components"]
    assert "partial_credit" not in p["metadata"] and "turn_rewards" not in p["metadata"]
    assert p["total_reward"] == 0.0
    assert RewardConfig().calculator_version == RewardConfig(partial_credit=None).calculator_version
    assert (
        RewardConfig(partial_credit=PartialCreditConfig()).calculator_version
        != RewardConfig().calculator_version
    )


def test_late_feedback_keeps_the_partial_credit() -> None:
    cfg = RewardConfig(
        weights={**TC_ONLY, "user_feedback": 1.0}, partial_credit=PartialCreditConfig(cap=0.5)
    )
    state = WindowState(10, 10)
    out, state = score_batch([ScoringInput(perfect_failure("late"))], state, cfg)
    v1 = out[0].payload
    fb = C.FeedbackState()
    fb.apply("thumbs_up", feedback_id="f1")
    v2 = rescore_with_feedback(v1, fb, state, cfg).payload
    # base: (0 x 1 + 1 x 1) / 2 = 0.5, plus the same bonus
    bonus = v1["metadata"]["partial_credit"]["bonus"]
    assert v2["total_reward"] == pytest.approx(0.5 + bonus)
    assert sum(v2["metadata"]["turn_rewards"]) == pytest.approx(v2["total_reward"])
    assert v2["metadata"]["turn_rewards"][:-1] == v1["metadata"]["turn_rewards"][:-1]


def test_turn_rewards_reach_gigpo_step_groups_where_no_attempt_succeeded() -> None:
    """The reward service's per-turn rewards, put on StepData, give a group of failures
    (equal outcomes) non-zero step advantages at the state they share."""
    from agentrl.advantages.steps import set_turn_rewards, system_apply_gigpo_to_batch_steps
    from agentrl.core.episodes import StepData

    group = [
        perfect_failure("g1"),
        trajectory([garbled(), answer("1", "no")], status="failed", tid="g2"),
    ]
    payloads = scored(group)
    episodes = [
        [StepData(k, {"anchor": f"task|{k}"}, {}) for k in range(len(t.turns))] for t in group
    ]
    for steps, p in zip(episodes, payloads, strict=True):
        assert set_turn_rewards(steps, p)
        assert sum(s.base_reward or 0.0 for s in steps) == pytest.approx(p["total_reward"])
    system_apply_gigpo_to_batch_steps(
        episodes,
        [p["total_reward"] for p in payloads],
        omega=1.0,
        gamma=0.95,
        combine="additive",
        final_score_at_last_step=False,
    )
    first = [ep[0].advantage or 0.0 for ep in episodes]
    assert first[0] > 0 > first[1]  # the valid call beat the garbled reply at the start
    assert not set_turn_rewards(episodes[0], {"metadata": {"turn_rewards": [1.0]}})


# ---- real tool-use episodes -----------------------------------------------------------------
@pytest.mark.parametrize("view", ["plain", "agent_zero"])
async def test_components_on_real_tool_use_episodes(view: str) -> None:
    """The tool-use environment played by scripted Agent Zero replies, converted as the loop
    publishes them (rollout.convert): the components read its real fields."""
    import json

    from agentrl.envs import make_env, task_for
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.rollout import run_group
    from agentrl.rollout.convert import episode_to_trajectory
    from agentrl.rollout.policies import ScriptedPolicy

    seed = 11
    t = generate_task(seed, "arithmetic")
    expr = t.question.removeprefix("What is ").split("?")[0]

    def reply(tool: str, **args: str) -> str:
        return json.dumps({"thoughts": ["go"], "tool_name": tool, "tool_args": args})

    scripts = [
        [reply("calculator", expression=expr), reply("response", text=str(t.answer))],
        ["I think so.", reply("calculator", expression="1/0"), reply("response", text="7")],
    ]
    task = task_for("tooluse-arithmetic", seed=seed, view=view)
    episodes = await run_group(
        task, 2, ScriptedPolicy(per_episode=scripts), env_factory=make_env, max_episode_steps=4
    )
    win, lose = (episode_to_trajectory(e, model="tiny") for e in episodes)
    c = C.partial_credit(win)
    assert {n: score(c, n) for n in C.PARTIAL} == dict.fromkeys(C.PARTIAL, 1.0)
    c = C.partial_credit(lose)
    assert score(c, C.TOOL_CALL_VALID) == pytest.approx(0.5)  # the prose reply is no call
    assert score(c, C.TOOL_CALL_RAN) == 0.0  # the calculator's division error
    assert score(c, C.NEEDED_VALUE) == 0.0
    assert score(c, C.ANSWER_GIVEN) == 1.0 and score(c, C.ANSWER_RIGHT) == 0.0


def test_a_correction_the_trajectory_carries_is_in_its_first_reward() -> None:
    """Given when the episode ended (the capture block), the correction needs no feedback
    event: version 1 carries it; a later feedback correction replaces it."""
    t = perfect_failure("carry")
    doc = t.model_dump(mode="json")
    doc["metadata"]["capture"] = {"source": "gateway", "correction": "  use the calculator  "}
    t = TrajectoryEvent.model_validate(doc)
    cfg = RewardConfig(weights=TC_ONLY)
    out, state = score_batch([ScoringInput(t)], WindowState(10, 10), cfg)
    v1 = out[0].payload
    assert v1["metadata"]["feedback"]["correction"] == "use the calculator"
    fb = C.FeedbackState.from_trajectory(t)
    fb.apply("thumbs_down", feedback_id="f", correction="read the table first")
    v2 = rescore_with_feedback(v1, fb, state, cfg).payload
    assert v2["metadata"]["feedback"]["correction"] == "read the table first"
    plain, _ = score_batch([ScoringInput(perfect_failure("p"))], WindowState(10, 10), cfg)
    assert "correction" not in plain[0].payload["metadata"]["feedback"]


def test_the_environments_own_notes_are_not_tool_output() -> None:
    """A count of 3 is not "found" in the step budget or the sandbox's exit code."""
    out = "code_exe exit code 0\nstdout:\n7\n\n(Steps left: 3. Finish with the response tool.)"
    for truth, found in ((3, 0.0), (0, 0.0), (7, 1.0)):
        t = trajectory([call("code_exe", {"code": "print(7)"}, out)], status="failed", truth=truth)
        assert score(C.partial_credit(t), C.NEEDED_VALUE) == found, truth


def test_with_other_components_a_failure_stays_below_the_same_trajectory_succeeded() -> None:
    """Under the default weights (task completion 0.4 of 1.0) an absolute bonus of cap x P
    (0.5 x 6/7 = 0.43) would exceed what succeeding adds (0.4): the bonus is scaled by
    that gain, so the failure ends below the same trajectory succeeded."""
    steps = [
        call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811"),
        answer("10811"),
    ]
    fail = trajectory(steps, status="failed", tid="d-f")
    win = trajectory(steps, status="completed_successfully", tid="d-w")
    partial = trajectory(steps, status="partial_completion", tid="d-p")
    cfg = RewardConfig(partial_credit=PartialCreditConfig(cap=0.9))
    out, _ = score_batch([ScoringInput(t) for t in (fail, win, partial)], WindowState(10, 10), cfg)
    f, w, p = (r.payload for r in out)
    assert f["total_reward"] < w["total_reward"] and p["total_reward"] < w["total_reward"]
    gain = f["metadata"]["partial_credit"]["gain"]
    assert 0.0 < gain < 1.0  # task completion's share of the applicable base weights
    assert f["metadata"]["partial_credit"]["bonus"] == pytest.approx(0.9 * gain * 6 / 7)
    # a partial completion (task completion 0.5) can gain only half as much
    assert p["metadata"]["partial_credit"]["gain"] == pytest.approx(gain / 2)
    assert sum(f["metadata"]["turn_rewards"]) == pytest.approx(f["total_reward"])


# ---- the tool-use loop's reward config (issue 52: the loop turns partial credit on) ----------
def test_the_tooluse_loops_reward_config_gives_failures_partial_credit_per_turn(
    tmp_path: Any,
) -> None:
    """`agentrl loop --env tooluse` writes the reward service's config: with it a failure
    that called the calculator well earns credit on the turns that earned it (below what
    success adds), so a group of failed attempts still differs; the ablation's is 0/1."""
    from agentrl.app.loop_tooluse import write_reward_config

    cfg = RewardConfig.load(write_reward_config(tmp_path))
    assert cfg.partial_credit is not None and cfg.partial_credit.cap == 0.5
    (out,), _ = score_batch([ScoringInput(perfect_failure("loop"))], WindowState(10, 10), cfg)
    p = out.payload
    assert 0.0 < p["total_reward"] <= 0.5
    turns = p["metadata"]["turn_rewards"]
    assert len(turns) == 2 and turns[0] > 0 and sum(turns) == pytest.approx(p["total_reward"])
    off = RewardConfig.load(write_reward_config(tmp_path, partial_credit=False))
    (plain,), _ = score_batch([ScoringInput(perfect_failure("loop"))], WindowState(10, 10), off)
    assert plain.payload["total_reward"] == 0.0
