"""A user's correction (free text beside thumbs or a rating) sent through the control API's
feedback (by trajectory id), the gateway's episode feedback (by the episode's session key)
and an OTLP session's feedback (by its trace id) reaches a job's data: the real gateway and capture, control API, reward service,
nats-server, the warehouse ingester into chdb (a child process) and the jobs' loaders of both
dataset sources. Redacted on the way, like all feedback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from capture_kit import Harness
from test_gateway_episodes import tool_loop
from test_otlp import _tid, openinference_trace

from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import apply_filters, latest_rewards

CHILD = str(Path(__file__).with_name("_warehouse_child.py"))
FIX_API = "call add with a=2 and b=3 first, then answer 5"
FIX_EPISODE = "answer with the number alone; ask jane.doe@example.com if unsure"
FIX_TRACE = "run the add tool before answering"


async def test_a_correction_via_the_api_the_gateway_and_otlp_reaches_the_jobs_data(
    harness: Harness, tmp_path: Path
) -> None:
    ids = []
    for _ in range(2):
        session = f"fix-{uuid.uuid4().hex[:8]}"
        await tool_loop(harness, headers={"x-agentrl-session": session})
        ended = await harness.end(session, success=False)
        await harness.reward_versions(ended["trajectory_id"], 1)
        ids.append((session, ended["trajectory_id"]))
    (session_a, tid_a), (_, tid_b) = ids
    trace = os.urandom(16).hex()  # an OTLP session (OpenInference spans as OTLP/JSON)
    body = openinference_trace(trace)
    shift = time.time_ns() - 10**18  # its spans are of 2001: the warehouse's TTL drops those
    for scope in body["resourceSpans"][0]["scopeSpans"]:
        for span in scope["spans"]:
            for key in ("startTimeUnixNano", "endTimeUnixNano"):
                span[key] = str(int(span[key]) + shift)
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{harness.api}/v1/traces", json=body)
    assert r.status_code == 200, r.text
    tid_c = _tid(trace)
    await harness.reward_versions(tid_c, 1)

    # the gateway's episode feedback: the session key names the episode, a thumbs-down
    # (TensorZero-style metric) with the correction beside it
    r = await harness.feedback(
        episode_id=session_a, metric_name="helpful", value=False, correction=FIX_EPISODE
    )
    assert r.status_code == 202, r.text
    # the feedback API by trajectory id: a rating with a correction
    r = await harness.feedback(trajectory_id=tid_b, type="rating", rating=2, correction=FIX_API)
    assert r.status_code == 202, r.text
    # the OTLP session's feedback: the trace id names the episode
    r = await harness.feedback(episode_id=trace, type="thumbs_down", correction=FIX_TRACE)
    assert r.status_code == 202, r.text

    v2 = {t: (await harness.reward_versions(t, 2))[-1] for t in (tid_a, tid_b, tid_c)}
    got_a = v2[tid_a]["metadata"]["feedback"]["correction"]
    assert got_a.startswith("answer with the number alone; ask ")
    assert "jane.doe@example.com" not in got_a  # redacted before it was published
    assert v2[tid_b]["metadata"]["feedback"]["correction"] == FIX_API
    assert v2[tid_b]["reward_components"]["user_feedback"]["score"] == 0.4
    assert v2[tid_c]["metadata"]["feedback"]["correction"] == FIX_TRACE

    # the job's JetStream loader (dataset source nats_stream) -> Record.correction / .hint
    from agentrl.training.jobs import load_data
    from agentrl.training.requests import fill_request
    from agentrl.training.settings import TrainingSettings

    req = fill_request({"training_config": {"base_model": "tiny"}}, TrainingSettings())
    data = await load_data(
        {"request": req.model_dump(mode="json"), "nats_url": harness.bus.nc.connected_url.geturl()}
    )
    kept, _ = apply_filters(data["trajectories"], latest_rewards(data["rewards"]), DatasetFilter())
    hints = {r.trajectory_id: r.hint for r in kept}
    assert hints[tid_a] == got_a and hints[tid_b] == FIX_API and hints[tid_c] == FIX_TRACE

    # the warehouse: ingested into chdb, read back by the clickhouse dataset source
    env = {
        **os.environ,
        "AGENTRL_WAREHOUSE_PATH": str(tmp_path / "chdb"),
        "AGENTRL_CLICKHOUSE_DATABASE": "corrections",
    }
    url = harness.bus.nc.connected_url.geturl()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, CHILD, url, "2", tid_a, tid_b, tid_c,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    wh = result["data"]
    kept, _ = apply_filters(wh["trajectories"], latest_rewards(wh["rewards"]), DatasetFilter())
    hints = {r.trajectory_id: r.hint for r in kept}
    assert hints[tid_a] == got_a and hints[tid_b] == FIX_API and hints[tid_c] == FIX_TRACE
    rows = {row["trajectory_id"]: row["correction"] for row in result["feedback"]}
    assert rows[tid_a] == got_a and rows[tid_b] == FIX_API and rows[tid_c] == FIX_TRACE
