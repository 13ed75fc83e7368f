"""Job ids and checkpoint locations are file paths: hostile ones are refused at both entry
points (the control API over real HTTP, a request published on the bus straight to a running
service) and nothing is written outside the data dir; and the Idempotency-Key after a failed
publish (a retry with the same key publishes the stored request, same job id)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_training_api import W, api, serve_api  # noqa: F401 - the served API fixture
from training_helpers import Statuses, running_service, settings_for, tsettings

from agentrl.bus import Bus
from agentrl.contracts.base import new_id
from agentrl.training.paths import UnsafePath, checkpoint_base, job_dir
from agentrl.training.requests import fill_request

HOSTILE_IDS = ["/tmp/agentrl-x", "../../..", "../escape", "a/b", "..", "a" * 65, "x\x00y", " "]


def hostile_paths(data_dir: Path) -> list[str]:
    outside = data_dir.parent / "elsewhere"
    return [
        str(outside),
        "/tmp/agentrl-ckpt",
        f"{data_dir}/training/checkpoints/../../../elsewhere",
        f"file://{outside}",
        "s3://someone-elses-bucket/x",
        "memory://x",
    ]


def test_job_dir_and_checkpoint_base_checks(tmp_path: Path) -> None:
    root = tmp_path / "training"
    assert job_dir(root, "job-1_A") == (root / "jobs" / "job-1_A").resolve()
    for bad in HOSTILE_IDS:
        with pytest.raises(UnsafePath):
            job_dir(root, bad)
    ts = tsettings(checkpoint_prefixes=["s3://team-bucket/ckpt", str(tmp_path / "shared")])
    assert checkpoint_base(None, ts, tmp_path) == ts.checkpoint_root(tmp_path)
    assert checkpoint_base("./.agentrl/checkpoints", ts, tmp_path) == ts.checkpoint_root(tmp_path)
    ok = str(tmp_path / "shared" / "run-1")
    assert checkpoint_base(ok, ts, tmp_path) == ok
    assert checkpoint_base("s3://team-bucket/ckpt/a", ts, tmp_path) == "s3://team-bucket/ckpt/a"
    inside = str(tmp_path / "training" / "checkpoints" / "x")
    assert checkpoint_base(inside, ts, tmp_path) == inside
    for bad in [
        *hostile_paths(tmp_path),
        "s3://team-bucket/ckpt/../../other",
        "s3://team-bucket/ckpt-evil",
        str(tmp_path / "shared-evil"),
    ]:
        with pytest.raises(UnsafePath, match="outside the allowed checkpoint locations"):
            checkpoint_base(bad, ts, tmp_path)


def test_api_refuses_hostile_ids_and_paths(api, data_dir):  # noqa: F811
    url, _ = api
    with httpx.Client(base_url=url, headers=W) as c:
        for bad in HOSTILE_IDS:
            r = c.post("/training/start", json={"training_job_id": bad})
            assert r.status_code == 422, (bad, r.text)
            assert ["body", "training_job_id"] in [e["loc"] for e in r.json()["detail"]]
        for bad in hostile_paths(data_dir):
            body = {"training_config": {"checkpointing": {"storage_path": bad}}}
            r = c.post("/training/start", json=body)
            assert r.status_code == 422, (bad, r.text)
            err = r.json()["detail"][0]
            assert err["loc"] == ["body", "training_config", "checkpointing", "storage_path"]
            assert "outside the allowed checkpoint locations" in err["msg"]
        for bad in ["..", "..%2F..%2Fetc", "a%00b"]:  # path parameters
            assert c.get(f"/training/{bad}/status").status_code in (404, 422)
            assert c.post(f"/training/{bad}/cancel").status_code in (404, 422)
        ok = c.post("/training/start", json={"training_job_id": "my_job-1"})
        assert ok.status_code == 202 and ok.json()["training_job_id"] == "my_job-1"
    assert not (data_dir.parent / "elsewhere").exists()


async def test_bus_requests_with_hostile_ids_and_paths_write_nothing(nats, data_dir):
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings()
    # The jobs folder is <data_dir>/training/jobs: "../../../escape" would be <tmp>/escape.
    escape = data_dir.parent / "escape"
    ids = ["../../../escape", str(escape), "../../../escape/../escape"]
    try:
        async with running_service(bus, settings, ts) as svc:
            template = json.loads(fill_request({}, ts).to_json())
            for i, bad in enumerate(ids):
                payload = {**template, "training_job_id": bad}
                await bus.publish_raw(
                    "agent.rl.training.request.v1", json.dumps(payload).encode(), f"bad-{i}"
                )
            path_id = new_id()
            payload = json.loads(fill_request({"training_job_id": path_id}, ts).to_json())
            payload["training_config"]["checkpointing"]["storage_path"] = str(escape)
            await bus.publish_raw(
                "agent.rl.training.request.v1", json.dumps(payload).encode(), "bad-path"
            )
            ev = await statuses.wait(path_id, ("failed",), 20)
            assert ev["error"]["detail_code"] == "CONFIG"
            assert "outside the allowed checkpoint locations" in ev["error"]["message"]
            end = time.monotonic() + 20
            while svc.counters["invalid"] < len(ids) + 1 and time.monotonic() < end:
                await asyncio.sleep(0.1)
            assert svc.counters["invalid"] == len(ids) + 1
            assert svc.store.jobs() == []
            for _ in range(100):  # dead letters are stored after the handler returns
                dlq = await bus.dead_letters()
                if sum("training_job_id" in d["error"] for d in dlq) >= len(ids):
                    break
                await asyncio.sleep(0.1)
            assert sum("training_job_id" in d["error"] for d in dlq) >= len(ids), dlq
        assert not escape.exists()
        assert not any((data_dir / "training").glob("**/spec.json"))
    finally:
        await bus.close()


@pytest.fixture()
def api_three_tries(nats, data_dir) -> Iterator[tuple[str, Any]]:
    """The API whose bus gives up a publish after 3 tries, not 9: the failed publish below
    then takes 0.15 s of backoff instead of ~7 s; what the test checks is the same."""
    yield from serve_api(nats, data_dir, publish_retries=2)


async def test_idempotency_key_after_a_failed_publish_publishes_the_request(
    api_three_tries, nats, data_dir
):
    url, _ = api_three_tries
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    body = {"training_config": {"base_model": "tiny"}}
    key = {"Idempotency-Key": "retry-me"}
    try:
        # No stream captures training requests: the API's publish fails (after its retries).
        await bus.js.delete_stream("RL_TRAINING")
        async with httpx.AsyncClient(base_url=url, headers=W, timeout=60) as c:
            failed = await c.post("/training/start", json=body, headers=key)
            assert failed.status_code == 503, failed.text
            assert "retry" in failed.json()["detail"]
            await bus.ensure_streams()  # NATS is whole again
            retry = await c.post("/training/start", json=body, headers=key)
            assert retry.status_code == 202, retry.text
            job_id = retry.json()["training_job_id"]
            again = await c.post("/training/start", json=body, headers=key)
            assert again.json()["training_job_id"] == job_id
        info = await bus.js.stream_info("RL_TRAINING")
        assert info.state.messages == 1, "published once (same Msg-Id), never lost"
        msg = await bus.js.get_last_msg("RL_TRAINING", "agent.rl.training.request.v1")
        got: dict[str, Any] = json.loads(msg.data)
        assert got["training_job_id"] == job_id and got["training_config"]["base_model"] == "tiny"
    finally:
        await bus.close()
