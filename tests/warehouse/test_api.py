"""`/stats/...` over real HTTP (uvicorn + httpx) against real chdb, auth included, and the
`clickhouse` dataset source reading through the control API."""

from __future__ import annotations

import asyncio
import io
import socket

import httpx
import pyarrow.parquet as pq
import pytest

from agentrl.app.api import serve
from agentrl.contracts.training import Dataset
from agentrl.core.settings import Settings
from agentrl.warehouse import samples as S
from agentrl.warehouse.export import clickhouse_source

from .conftest import store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_stats_endpoints_and_export(backend, wsettings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AGENTRL_WAREHOUSE_PATH", str(wsettings.path))
    monkeypatch.setenv("AGENTRL_CLICKHOUSE_DATABASE", wsettings.database)
    events = [S.trajectory(i, model=f"m-{i % 2}") for i in range(10)]
    events += [S.reward(i, i / 10, model=f"m-{i % 2}") for i in range(10)]
    events += [S.feedback(1, "thumbs_up")]
    assert store(backend, wsettings.database, events) == {}
    port = free_port()
    settings = Settings(
        data_dir=wsettings.path,
        api_port=port,
        api_tokens={"reader": ["stats:read"], "other": ["training:write"]},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(None, stop, settings))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for _ in range(100):
                try:
                    await client.get("/stats/counts")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)
            assert (await client.get("/stats/counts")).status_code == 401
            other = {"Authorization": "Bearer other"}
            assert (await client.get("/stats/counts", headers=other)).status_code == 403
            client.headers["Authorization"] = "Bearer reader"
            counts = (await client.get("/stats/counts")).json()
            assert counts["trajectories"] == 10 and counts["feedback"] == 1
            rewards = (await client.get("/stats/rewards")).json()
            assert {r["model"]: r["trajectories"] for r in rewards} == {"m-0": 5, "m-1": 5}
            mean = {r["model"]: r["mean"] for r in rewards}
            assert mean["m-1"] == pytest.approx(0.5) and mean["m-0"] == pytest.approx(0.4)
            success = (await client.get("/stats/success", params={"model": "m-1"})).json()
            assert sum(r["trajectories"] for r in success) == 5
            assert (await client.get("/stats/success", params={"bucket_s": 0})).status_code == 422
            for name in (
                "lengths",
                "tools",
                "failing-tools",
                "feedback",
                "training",
                "deployments",
                "models",
            ):
                assert (await client.get(f"/stats/{name}")).status_code == 200, name
            status = (await client.get("/stats/ingester")).json()
            assert status["running_here"] is False
            got = await client.post(
                "/stats/export", json={"filter": {"min_reward": 0.5}, "format": "parquet"}
            )
            assert got.status_code == 200 and got.headers["x-agentrl-rows"] == "5"
            assert pq.read_table(io.BytesIO(got.content)).num_rows == 5
            bad = await client.post("/stats/export", json={"filter": {"min_reward": "high"}})
            assert bad.status_code == 422
        dataset = Dataset.model_validate(
            {"source": "clickhouse", "filter": {"task_domains": ["coding"]}, "sample_size": 3}
        )
        got_ds = await asyncio.to_thread(
            clickhouse_source, dataset, api_url=base, api_token="reader"
        )
        assert len(got_ds) == 3 and all(
            g.trajectory.task_context.domain == "coding" for g in got_ds
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
