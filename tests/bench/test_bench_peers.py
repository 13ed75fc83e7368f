"""Issue 54: `agentrl bench gateway --peers` reports something for a peer that cannot keep up
with 200 requests/s (LiteLLM's proxy sustained 17 on 2 cores, and its ratios were null): the
highest rate it sustains, agentrl beside it at that rate, and a reason wherever a ratio is
missing. Real HTTP: the benchmark's scripted backend and a real server that answers one
request at a time, slowly, as the "peer"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn

from agentrl.bench import gateway as bench
from agentrl.bench import gateway_peers as bench_peers
from agentrl.bench.gateway_peers import Peer, interleaved_line, line, measure
from deploy_helpers import free_port

SERVICE_S = 0.005  # one request at a time: at most ~200 requests/s


def slow_peer() -> Any:
    lock = asyncio.Lock()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        async with lock:
            await asyncio.sleep(SERVICE_S)
        body = bench.json.dumps(bench.REPLY).encode()  # never streams
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


async def _serve(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


async def test_a_peer_that_cannot_keep_up_is_ramped_down_to_what_it_sustains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the latency bound is the bench's; a loaded test machine gets more room than 50 ms
    monkeypatch.setattr(bench_peers, "P99_LIMIT_MS", 400.0)
    servers = [await _serve(bench.backend_app), await _serve(slow_peer())]
    try:
        direct = f"http://127.0.0.1:{servers[0][2]}/v1/chat/completions"
        peer = Peer("slow", url=f"http://127.0.0.1:{servers[1][2]}/v1/chat/completions")
        peer.target = {"model": "bench"}
        said: list[str] = []
        out = await measure(
            direct,
            peer,
            1.0,
            said.append,
            rates=(600.0,),
            ramp_rates=(600.0,),
            down=(500.0, 10.0),
        )
    finally:
        for server, task, _ in servers:
            server.should_exit = True
            await task
    assert out["stream_error"]  # it never streams: said, not measured
    assert [s["rate"] for s in out["ramp"]] == [600.0, 500.0, 10.0], out["ramp"]
    assert out["max_rps"] == 10.0
    assert out["plain600"]["achieved_rate"] < 0.95 * 600


def _run(rate: float, achieved: float, added_p99: float) -> dict[str, Any]:
    return {
        "rate": rate,
        "achieved_rate": achieved,
        "added_p50": added_p99 / 2,
        "added_p99": added_p99,
        "gateway_p99": added_p99 + 1,
        "unanswered": 0,
        "late": 0,
        "gateway_cpu_ms_per_req": 0.2,
    }


def _result(achieved: dict[int, float], max_rps: float, ramp: list[dict[str, Any]]) -> Any:
    res: dict[str, Any] = {"stream_error": "no streaming here"}
    for rate, got in achieved.items():
        res[f"plain{rate}"] = _run(rate, got, 3.0)
    res["max_rps"], res["ramp"] = max_rps, ramp
    return res


def test_the_line_compares_at_the_common_rate_and_says_why_a_ratio_is_missing() -> None:
    step = {"rate": 25.0, "p99": 30.0, "achieved": 25, "added_p50": 4.0, "added_p99": 20.0}
    ours = _result({200: 200, 1000: 990}, 1000.0, [])
    ours["at"] = {25.0: {**step, "added_p99": 2.0}}
    slow = _result({200: 17, 1000: 30}, 25.0, [{**step, "rate": 200.0}, step])
    slow["at"], slow["common_rps"] = {25.0: step}, 25.0
    dead = _result({200: 3, 1000: 3}, 0.0, [{**step, "rate": 200.0}, {**step, "rate": 5.0}])
    row = line({"agentrl": ours, "litellm": slow, "portkey": dead}, {"tensorzero": "no wheel"})
    assert row["ratio_p99_vs_litellm_200rps"] is None
    assert (
        "litellm did not keep up with 200 req/s (achieved 17)"
        in row["ratio_p99_vs_litellm_200rps_why"]
    )
    assert row["common_rps_litellm"] == 25.0
    assert row["ratio_p99_vs_litellm_at_common_rps"] == 0.1
    assert (row["ratio_p99_vs_litellm"], row["ratio_p99_vs_litellm_rps"]) == (0.1, 25.0)
    assert row["litellm_max_rps"] == 25.0 and row["max_rps"] == 1000.0
    assert row["ratio_p99_vs_portkey"] is None
    assert "sustained no rate down to 5 req/s" in row["ratio_p99_vs_portkey_why"]
    assert row["tensorzero_error"] == "no wheel"
    for key, value in row.items():  # never a silent null
        if value is None and key.startswith("ratio_"):
            assert row.get(f"{key}_why") or row.get(f"{key.rsplit('_', 1)[0]}_why"), key


def test_the_rotation_gives_medians_and_ratios_only_of_rounds_both_kept_up_with() -> None:
    """`--interleave`: per gateway the median of its rounds (each round listed); the p99
    ratio of each round where both kept up, their median, and a reason when there is none."""
    runs = {
        "agentrl": {1000.0: [_run(1000, 990, 3.0), _run(1000, 700, 90.0), _run(1000, 995, 1.0)]},
        "tensorzero": {1000.0: [_run(1000, 999, 2.0), _run(1000, 998, 4.0), _run(1000, 990, 2.0)]},
        "agentrl-asyncio": {1000.0: [_run(1000, 600, 9.0)] * 3},
        "agentrl-w2": {1000.0: [_run(1000, 990, 1.0), _run(1000, 999, 2.0), _run(1000, 990, 4.0)]},
    }
    row = interleaved_line(runs, {"litellm": "no venv"})
    # a variant (e.g. two gateway processes) against each real peer, round by round
    assert row["agentrl-w2_ratio_p99_vs_tensorzero_1000rps_runs"] == [0.5, 0.5, 2.0]
    assert row["agentrl-w2_ratio_p99_vs_tensorzero_1000rps"] == 0.5
    assert "agentrl-w2_ratio_p99_vs_agentrl-asyncio_1000rps" not in row  # variants: vs peers
    assert row["added_p99_ms_1000rps"] == 3.0
    assert row["added_p99_ms_1000rps_runs"] == [3.0, 90.0, 1.0]
    assert row["tensorzero_added_p99_ms_1000rps"] == 2.0
    assert row["ratio_p99_vs_tensorzero_1000rps_runs"] == [1.5, 0.5]  # round 2: agentrl fell behind
    assert row["ratio_p99_vs_tensorzero_1000rps"] == 1.5  # (the upper median of two)
    assert row["ratio_p99_vs_agentrl-asyncio_1000rps"] is None
    assert "kept up" in row["ratio_p99_vs_agentrl-asyncio_1000rps_why"]
    assert row["litellm_error"] == "no venv"


async def test_a_peer_that_sustains_nothing_is_compared_at_the_lowest_rate_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both are measured at that rate (the peer's ramp step, agentrl's run made beside it)
    and the line says the peer did not sustain it; a peer sustaining 200 but not 1,000 got
    no comparison at all before (and a StopIteration lost its figures)."""
    monkeypatch.setattr(bench_peers, "P99_LIMIT_MS", 0.001)  # nothing sustains this
    servers = [await _serve(bench.backend_app), await _serve(slow_peer())]
    try:
        direct = f"http://127.0.0.1:{servers[0][2]}/v1/chat/completions"
        slow = Peer("slow", url=f"http://127.0.0.1:{servers[1][2]}/v1/chat/completions")
        slow.target = {"model": "bench"}
        ours = Peer("agentrl", url=direct, target={"model": "bench"})  # the backend itself
        kw: dict[str, Any] = {"rates": (400.0,), "ramp_rates": (400.0,), "down": (20.0,)}
        results = {
            "agentrl": await measure(direct, ours, 0.5, print, **kw),
            "slow": await measure(direct, slow, 0.5, print, **kw),
        }
        results["slow"]["peer"] = slow
        monkeypatch.setattr(bench_peers, "RATES", (400.0,))
        await bench_peers.compare_at_common(direct, ours, results, "slow", 0.5, print)
    finally:
        for server, task, _ in servers:
            server.should_exit = True
            await task
    assert results["slow"]["common_rps"] == 20.0
    assert results["slow"]["common_rps_sustained"] is False
    assert set(results["agentrl"]["at"]) == {20.0} and set(results["slow"]["at"]) == {20.0}


async def test_the_two_process_variant_serves_from_two_processes(nats_url: str) -> None:
    """`--only agentrl-w2`: the benchmark's gateway helper as `agentrl up --gateway-workers 2`
    serves it, two processes on one port (each answers; the second is the first's child, so
    the CPU per request counts both) and none left once it is stopped."""
    import httpx
    import psutil

    bp = free_port()
    backend = bench._spawn("backend", str(bp))
    peer = bench_peers.start_variant("agentrl-w2", f"http://127.0.0.1:{bp}/v1", nats_url)
    assert peer.proc is not None
    try:
        await bench_peers._ready(peer, timeout=60)
        children = psutil.Process(peer.proc.pid).children()
        assert len(children) == 1  # started before the first serves: both listen now
        pids: set[int] = set()
        stats = peer.url.replace("/chat/completions", "/stats")
        async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as c:
            for _ in range(60):  # a fresh connection each: the kernel picks the process
                pids.add((await c.get(stats)).json()["process"]["pid"])
                if len(pids) == 2:
                    break
        assert pids == {peer.proc.pid, children[0].pid}
    finally:
        bench_peers.stop(peer.proc)
        bench_peers.stop(backend)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive  # the second process stopped with the first
