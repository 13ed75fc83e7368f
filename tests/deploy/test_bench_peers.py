"""Issue 54: the side-by-side gateway benchmark's own parts. The load generator reads a
streamed (chunked) answer to its last byte and gives up on requests that could not be sent
in time; the JSON line gives a p99 ratio only where both gateways kept up with the rate.
Real HTTP: the benchmark's scripted backend under uvicorn."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from deploy_helpers import free_port

from agentrl.deploy.bench import backend_app, latency_run
from agentrl.deploy.bench_peers import line


async def _backend() -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(backend_app, host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}/v1/chat/completions"


async def test_streamed_and_plain_answers_are_read_whole_on_kept_alive_connections() -> None:
    server, task, url = await _backend()
    try:
        for stream in (False, True):
            run = await latency_run(url, url, 50, 1.0, conns=4, stream=stream, give_up_s=10)
            # a chunked answer read short would leave bytes on the connection: the next
            # request on it would fail to parse and count as unanswered
            assert run["unanswered"] == 0 and run["late"] == 0, run
            assert run["n"] == 50 and run["gateway_p99"] < 1000
    finally:
        server.should_exit = True
        await task


async def test_requests_too_late_for_a_connection_are_given_up() -> None:
    """One connection, a rate far past what it serves: the run ends, counting the late."""
    server, task, url = await _backend()
    try:
        run = await latency_run(url, url, 3000, 1.0, conns=1, give_up_s=0.05)
        assert run["late"] > 0 and run["unanswered"] >= run["late"]
    finally:
        server.should_exit = True
        await task


def _m(p99: float, achieved: float, rate: float) -> dict[str, Any]:
    return {
        "added_p50": p99 / 2,
        "added_p99": p99,
        "achieved_rate": achieved,
        "gateway_p99": p99 + 1,
        "unanswered": 0,
        "late": 0,
        "gateway_cpu_ms_per_req": 0.3,
    }


def test_a_ratio_only_where_both_kept_up() -> None:
    def res(p99: float, achieved_1000: float) -> dict[str, Any]:
        return {
            "stream_error": None,
            "plain200": _m(p99, 200, 200),
            "plain1000": _m(p99, achieved_1000, 1000),
            "stream200": _m(p99, 200, 200),
            "stream1000": _m(p99, 1000, 1000),
            "max_rps": 700.0,
        }

    row = line({"agentrl": res(2.0, 1000), "litellm": res(8.0, 400)}, {"portkey": "no node"})
    assert row["ratio_p99_vs_litellm_200rps"] == 0.25
    assert row["ratio_p99_vs_litellm_1000rps"] is None  # LiteLLM did not keep up
    assert row["litellm_max_rps"] == 700.0 and row["portkey_error"] == "no node"
    assert row["added_p99_ms_1000rps"] == 2.0 and row["litellm_added_p99_ms_1000rps"] == 8.0
