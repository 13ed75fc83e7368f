"""Episodes at the gateway, driven by the official `openai` SDK (a hand-written tool loop)
against the gateway serving a tiny model, with the real reward service behind it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from capture_kit import VERSION, Harness, stream_docs
from openai import AsyncOpenAI
from toolkit import CALL, FINAL, SYSTEM, TASK, TOOLS, add, assert_tool_episode, steer


async def tool_loop(
    h: Harness,
    *,
    headers: dict[str, str] | None = None,
    user: str | None = None,
    calls: int = 1,
    email: str = "",
) -> list[str]:
    """The classic loop: ask, run the tools it calls, send the results back, until text."""
    client = AsyncOpenAI(base_url=h.base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK + email},
    ]
    ids = []
    for choice in [CALL] * calls + [FINAL]:
        extra: dict[str, Any] = {"user": user} if user else {}
        r = await client.chat.completions.create(
            model="agentrl-policy",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            temperature=0,
            extra_headers=headers or {},
            extra_body={**steer(choice), **extra},
        )
        ids.append(r.id)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments)  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    await client.close()
    return ids


async def test_openai_sdk_episode_becomes_a_trajectory_and_feedback_a_reward_version(
    harness: Harness,
) -> None:
    session = f"sdk-{uuid.uuid4().hex[:8]}"
    ids = await tool_loop(harness, headers={"x-agentrl-session": session}, calls=2)
    ended = await harness.end(session, success=True, comment="well done")
    assert ended["turns"] == 3 and ended["serving_versions"] == [VERSION]
    traj = await harness.trajectory(ended["trajectory_id"])
    assert_tool_episode(traj, VERSION, tool_turns=2)
    assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
    assert traj["session_id"] == session
    assert traj["metadata"]["outcome"]["task_status"] == "completed_successfully"
    assert traj["metadata"]["capture"]["comment"] == "well done"
    assert traj["metadata"]["capture"]["system_prompt"] == SYSTEM
    # every action joins the completion log: exact prompt and completion tokens
    logged = {d["completion_id"]: d for d in await stream_docs(harness.bus, "RL_COMPLETIONS")}
    for cid in ids:
        assert logged[cid]["completion_token_ids"] and logged[cid]["model"] == VERSION

    v1 = await harness.reward_versions(traj["trajectory_id"], 1)
    assert v1[0]["metadata"]["version"] == 1
    r = await harness.feedback(episode_id=session, metric_name="helpful", value=False)
    assert r.status_code == 202, r.text
    got = await harness.reward_versions(traj["trajectory_id"], 2)
    assert [d["metadata"]["version"] for d in got] == [1, 2]
    assert got[1]["reward_components"]["user_feedback"]["score"] == 0.0
    fb = [d for d in await stream_docs(harness.bus, "RL_FEEDBACK")]
    assert fb[-1]["metric_name"] == "helpful" and fb[-1]["episode_id"] == session


async def test_an_episodes_end_carries_the_users_correction(harness: Harness) -> None:
    """`POST /v1/episodes/{id}/end` takes a correction beside the outcome: the trajectory
    carries it (`metadata.capture.correction`), where the reward service reads it as the
    episode's hint."""
    session = f"corr-{uuid.uuid4().hex[:8]}"
    await tool_loop(harness, headers={"x-agentrl-session": session}, calls=1)
    ended = await harness.end(session, success=False, correction="read the CSV first")
    traj = await harness.trajectory(ended["trajectory_id"])
    assert traj["metadata"]["capture"]["correction"] == "read the CSV first"
    assert "comment" not in traj["metadata"]["capture"]


async def test_feedback_by_completion_id_float_comment_and_demonstration(
    harness: Harness,
) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    ids = await tool_loop(harness, user=user)  # OpenAI's `user` alone: routed by history
    # such an episode is named by its first completion id (any of its ids ends it)
    traj = await harness.trajectory((await harness.end(ids[-1]))["trajectory_id"])
    assert traj["session_id"] == ids[0]
    assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
    trajs = [traj]
    tid = trajs[0]["trajectory_id"]
    await harness.reward_versions(tid, 1)  # earlier feedback would be folded into version 1
    assert (
        await harness.feedback(inference_id=ids[1], metric_name="score", value=0.75)
    ).status_code == 202
    got = await harness.reward_versions(tid, 2)
    assert got[1]["reward_components"]["user_feedback"]["score"] == pytest.approx(0.8)
    r = await harness.feedback(completion_id=ids[0], metric_name="comment", value="terse")
    assert r.status_code == 202, r.text
    await harness.reward_versions(tid, 3)
    r = await harness.feedback(
        trajectory_id=tid, metric_name="demonstration", value="2 + 3 = 5, so the sum is 5."
    )
    assert r.status_code == 202, r.text
    got = await harness.reward_versions(tid, 4)
    # the explicit rating still wins over a correction (FeedbackState): the score stays
    assert got[3]["reward_components"]["user_feedback"]["score"] == pytest.approx(0.8)
    assert len(got[3]["metadata"]["feedback"]["feedback_ids"]) == 3
    fb = await stream_docs(harness.bus, "RL_FEEDBACK")
    assert [f["type"] for f in fb[-3:]] == ["rating", "comment", "correction"]
    assert fb[-1]["correction"].startswith("2 + 3")


async def test_feedback_bad_input_is_a_clear_error(harness: Harness) -> None:
    cases = [
        ({"episode_id": "never-seen", "metric_name": "m", "value": True}, 404, "published"),
        ({"trajectory_id": "t", "metric_name": "m", "value": 3.5}, 422, "[0, 1]"),
        ({"trajectory_id": "t", "metric_name": "m"}, 422, "together"),
        ({"metric_name": "m", "value": True}, 422, "episode_id"),
        ({"trajectory_id": "t"}, 422, "metric_name"),
        ({"trajectory_id": "t", "type": "thumbs_up", "metric_name": "m", "value": 1.0}, 422, ""),
    ]
    for body, code, words in cases:
        r = await harness.feedback(**body)
        assert r.status_code == code, (body, r.text)
        assert words in r.text


async def test_episode_end_outcome_and_unknown_episode(harness: Harness) -> None:
    session = f"sdk-{uuid.uuid4().hex[:8]}"
    await tool_loop(harness, headers={"x-agentrl-session": session})
    async with httpx.AsyncClient() as c:
        bad = await c.post(f"{harness.base_url}/episodes/{session}/end", json={"score": 2})
        assert bad.status_code == 400 and "score" in bad.text
        ok = await c.post(f"{harness.base_url}/episodes/{session}/end", json={"score": 0.5})
        assert ok.status_code == 200
        again = await c.post(f"{harness.base_url}/episodes/{session}/end")
        # the truth: ended already, and as which trajectory
        assert again.status_code == 404 and "ended already" in again.text
        assert ok.json()["trajectory_id"] in again.text
    traj = await harness.trajectory(ok.json()["trajectory_id"])
    out = traj["metadata"]["outcome"]
    assert out["task_status"] == "partial_completion" and out["completion_percentage"] == 0.5


async def test_no_session_opt_out_and_pii(harness: Harness) -> None:
    before = len(await harness.trajectories())
    await tool_loop(harness)  # no session key: only logged
    s1 = f"off-{uuid.uuid4().hex[:8]}"
    await tool_loop(harness, headers={"x-agentrl-session": s1, "x-agentrl-capture": "off"})
    assert harness.capture.counts.no_session >= 2 and harness.capture.counts.opted_out >= 2
    assert s1 not in harness.capture.book.open
    s2 = f"pii-{uuid.uuid4().hex[:8]}"
    await tool_loop(
        harness, headers={"x-agentrl-session": s2}, email=" Mail jane.doe@example.com the result."
    )
    ended = await harness.end(s2)
    traj = await harness.trajectory(ended["trajectory_id"])
    assert len(await harness.trajectories()) == before + 1
    text = json.dumps(traj)
    assert "jane.doe@example.com" not in text and "[REDACTED:EMAIL]" in text
    assert harness.capture.counts.redacted >= 1


@pytest.mark.capture(idle_timeout_s=0.5)
async def test_idle_episode_is_closed_by_the_timeout(harness: Harness) -> None:
    session = f"idle-{uuid.uuid4().hex[:8]}"
    ids = await tool_loop(harness, headers={"x-agentrl-session": session})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        found = [t for t in await harness.trajectories() if t["session_id"] == session]
        if found:
            break
        await asyncio.sleep(0.1)
    assert found and found[0]["metadata"]["capture"]["closed_by"] == "idle"
    assert [t["action"]["completion_id"] for t in found[0]["turns"]] == ids
    assert "outcome" not in found[0]["metadata"]


async def test_streaming_requests_form_the_same_episode(harness: Harness) -> None:
    session = f"stream-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    stream = await client.chat.completions.create(
        model="agentrl-policy",
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"x-agentrl-session": session},
        extra_body=steer(CALL),
    )
    calls = []
    async for chunk in stream:
        for ch in chunk.choices:
            calls += ch.delta.tool_calls or []
    await client.close()
    assert calls and calls[0].function and calls[0].function.name == "add"
    ended = await harness.end(session)
    traj = await harness.trajectory(ended["trajectory_id"])
    assert traj["turns"][0]["action"]["tool_name"] == "add"
