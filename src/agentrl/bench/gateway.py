"""`agentrl bench gateway`: what the gateway costs and how fast it reacts.

1. Added latency: a fast scripted OpenAI-compatible backend and the gateway (upstream
   backend, completion log on, both in their own processes) are called side by side in one
   run: an open-loop client alternates direct and gateway requests at the target rate for
   each path, so both see the same machine load. Added = gateway percentile - direct one;
   the same again streamed (server-sent events, to the last byte: keys `..._stream`).
   The gateway's server is uvicorn (httptools); `BENCH_GATEWAY_SERVER=granian` puts the
   same app behind granian's Rust HTTP server instead (`pip install granian` first), and
   `BENCH_GATEWAY_LOG=off` runs it without its completion log (what the log costs); its loop
   is `agentrl up`'s (uvloop), `BENCH_GATEWAY_LOOP=asyncio` asyncio's own.
2. Rollback time: a canary on a backend that always answers 500, with the gateway under
   traffic; from the first error a client sees to the moment every answer comes from the
   live version again (the monitor period is printed beside it).
3. Batching: completion tokens/s of the local backend (LoRA over one base) with 8
   concurrent sessions vs one at a time.
4. Split accuracy and stickiness over 10,000 sessions.
The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPLY = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


# ---- processes -------------------------------------------------------------------------
STREAM_CHUNKS = [
    {"role": "assistant", "content": ""},
    {"content": "ok"},
]


def _sse(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


# A streamed answer: role, one content token, the finish and usage, [DONE] (as OpenAI sends).
STREAM_BODY = [
    *(_sse(d) for d in STREAM_CHUNKS),
    _sse({}, "stop"),
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [],
            "usage": REPLY["usage"],
        }
    ).encode()
    + b"\n\n",
    b"data: [DONE]\n\n",
]


async def backend_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A minimal ASGI chat-completions server: the fastest honest backend we can write. A
    request with `"stream": true` gets server-sent events (chunked), like OpenAI's."""
    if scope["type"] != "http":
        return
    more, raw = True, b""
    while more:
        msg = await receive()
        raw += msg.get("body", b"")
        more = msg.get("more_body", False)
    status = int(os.environ.get("BENCH_STATUS", "200"))
    if status == 200 and b'"stream"' in raw and json.loads(raw).get("stream"):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for part in STREAM_BODY:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = json.dumps(
        REPLY
        if status == 200
        else {"error": {"message": "scripted failure", "type": "server_error"}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _serve_backend(port: int) -> None:
    import uvicorn

    uvicorn.run(backend_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _serve_gateway(port: int, upstream: str, nats_url: str) -> None:
    import uvicorn

    from agentrl.serving.backends import UpstreamBackend
    from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app

    async def main() -> None:
        from agentrl.bus import Bus

        bus = await Bus.connect(nats_url)
        await bus.ensure_streams()
        log = CompletionLog(bus) if os.environ.get("BENCH_GATEWAY_LOG") != "off" else None
        state = GatewayState("agentrl-policy", completion_log=log)  # None: what the log costs
        state.backends["v1"] = UpstreamBackend(upstream, timeout_s=30)
        state.set_split({"v1": 100.0}, ["v1"])
        stop = asyncio.Event()
        log_task = asyncio.create_task(log.run(stop)) if log is not None else None
        if os.environ.get("BENCH_GATEWAY_GC") != "default":  # as `agentrl up` does
            from agentrl.serving import gctune

            # BENCH_GATEWAY_SLICE=<us>: the loop's thread asks for that scheduler slice
            slice_us = os.environ.get("BENCH_GATEWAY_SLICE")
            gctune.settle(slice_us=int(slice_us) if slice_us else None)
        if os.environ.get("BENCH_GATEWAY_SERVER") == "granian":  # Rust HTTP, Python app
            from granian.constants import Interfaces
            from granian.server.embed import Server as Granian

            await Granian(
                create_gateway_app(state),
                address="127.0.0.1",
                port=port,
                interface=Interfaces.ASGI,
                log_enabled=False,
            ).serve()
        else:
            from agentrl.core.httpserve import one_write_http

            # BENCH_GATEWAY_WORKERS=N: N processes on the port (SO_REUSEPORT), as `agentrl up
            # --gateway-workers N` serves it; this one starts the others (its children, so
            # the CPU per request counts them)
            workers = int(os.environ.get("BENCH_GATEWAY_WORKERS") or 1)
            sockets = None
            if workers > 1 or os.environ.get("BENCH_GATEWAY_REUSEPORT"):
                from agentrl.serving.gateway_workers import reuse_port_socket

                sockets = [reuse_port_socket("127.0.0.1", port)]
            ready = Path(tempfile.mkdtemp(prefix="agentrl-bench-workers-"))
            children = [
                _spawn(
                    "gateway",
                    str(port),
                    upstream,
                    nats_url,
                    env={
                        "BENCH_GATEWAY_WORKERS": "1",
                        "BENCH_GATEWAY_REUSEPORT": "1",
                        "BENCH_GATEWAY_READY": str(ready / str(i)),
                    },
                )
                for i in range(workers - 1)
            ]
            # serve once every other process listens: a run measures them all, warm
            while len(list(ready.iterdir())) < len(children):
                if any(c.poll() is not None for c in children):
                    raise RuntimeError("a gateway worker exited at start-up")
                await asyncio.sleep(0.05)
            shutil.rmtree(ready, ignore_errors=True)
            server = uvicorn.Server(
                uvicorn.Config(
                    create_gateway_app(state),
                    host="127.0.0.1",
                    port=port,
                    log_level="warning",
                    access_log=False,
                    lifespan="off",
                    # as `agentrl up` serves it (httpserve: head and body in one write)
                    http=os.environ.get("BENCH_GATEWAY_HTTP") or one_write_http(),
                )
            )
            if os.environ.get("BENCH_GATEWAY_READY"):  # (a worker: say when it listens)

                async def say_ready() -> None:
                    while not server.started:
                        await asyncio.sleep(0.02)
                    Path(os.environ["BENCH_GATEWAY_READY"]).touch()

                stop.ready = asyncio.ensure_future(say_ready())  # type: ignore[attr-defined]
            try:
                await server.serve(sockets=sockets)
            finally:
                for child in children:
                    child.terminate()
        stop.set()
        if log_task is not None:
            await log_task

    if os.environ.get("BENCH_GATEWAY_LOOP") == "asyncio":  # asyncio's loop, not `up`'s
        asyncio.run(main())
    else:  # as `agentrl up` runs it (uvloop when installed)
        from agentrl.serving import gctune

        gctune.run(main())


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    from agentrl.core.deathsig import terminate_with_parent

    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.bench.gateway", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=terminate_with_parent,  # a killed benchmark leaves no helper behind
    )


async def _wait_http(url: str, timeout: float = 30.0) -> None:
    import httpx

    start = time.time()
    async with httpx.AsyncClient() as c:
        while time.time() - start < timeout:
            try:
                await c.post(
                    url, json={"model": "x", "messages": [{"role": "user", "content": "hi"}]}
                )
                return
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _free_port() -> int:
    from agentrl.bus.server import free_port

    return free_port()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live children (a peer gateway may fork workers)."""
    total = _cpu_s(pid)
    try:
        import psutil

        for child in psutil.Process(pid).children(recursive=True):
            cpu = _cpu_s(child.pid)
            total += cpu if cpu == cpu else 0.0  # (NaN: it ended meanwhile)
    except Exception:  # psutil missing or the process gone: its own CPU
        pass
    return total


# ---- 1. added latency ------------------------------------------------------------------
class _Conn:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for the benchmark (a
    general client such as httpx costs more CPU per request than the gateway itself on this
    machine, and would measure the client). Reads a Content-Length body or a chunked one (a
    stream: to its last byte)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.host, self.port = host, port
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked, close = 0, False, False
        for line in head.split(b"\r\n"):
            low = line.lower()
            if low[:15] == b"content-length:":
                length = int(line[15:])
            elif low.startswith(b"transfer-encoding:") and b"chunked" in low:
                chunked = True
            elif low.startswith(b"connection:") and b"close" in low:
                close = True
        if chunked:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")  # (no trailers)
                    break
                await self.reader.readexactly(size + 2)
        else:
            await self.reader.readexactly(length)
        if close:
            self.writer.close()
            self.writer = None
        return status


async def latency_run(
    direct: str,
    gateway: str,
    rate: float,
    duration: float,
    conns: int = 64,
    pids: dict[str, int] | None = None,
    target: dict[str, Any] | None = None,
    stream: bool = False,
    give_up_s: float | None = None,
) -> dict[str, Any]:
    """Open-loop arrivals at `rate` per path, alternating direct and gateway; latency is
    send -> last byte on a keep-alive connection. `pids` ({"gateway": pid, "backend": pid})
    adds each process's CPU milliseconds per gateway request: it bounds the rate one core
    can serve, and load on a shared machine moves it far less than the latencies (it drops
    somewhat when a busy process handles several requests per wake-up). `target` ({"model":
    ..., "headers": {...}}) is what the gateway path needs (another gateway: its model name
    and headers); `stream` asks both paths for server-sent events. A pid's CPU counts its
    child processes too. `give_up_s`: a request still waiting for a free connection that
    long after its time is not sent and counts as unanswered (`late`), so a run against a
    saturated server ends instead of draining its backlog for minutes."""
    from urllib.parse import urlsplit

    def body(model: str) -> bytes:
        req: dict[str, Any] = {
            "model": model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}],
        }
        if stream:
            req["stream"] = True
        return json.dumps(req).encode()

    target = target or {}
    pools: dict[str, asyncio.Queue[_Conn]] = {}
    for name, url, model, headers in (
        ("direct", direct, "bench", None),
        ("gateway", gateway, target.get("model", "agentrl-policy"), target.get("headers")),
    ):
        u = urlsplit(url)
        q: asyncio.Queue[_Conn] = asyncio.Queue()
        for _ in range(conns):
            q.put_nowait(
                _Conn(u.hostname or "127.0.0.1", u.port or 80, u.path, body(model), headers)
            )
        pools[name] = q
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    unanswered = late = sent = 0

    async def one(path: str, record: bool = True, due: float | None = None) -> None:
        nonlocal unanswered, late, sent
        conn = await pools[path].get()
        t = time.perf_counter()
        if give_up_s is not None and due is not None and t - due > give_up_s:
            late += 1
            unanswered += 1
            pools[path].put_nowait(conn)
            return
        if record and path == "gateway":
            sent += 1
        try:
            status = await asyncio.wait_for(conn.call(), 30)
            if status != 200:
                unanswered += 1
            elif record:
                lat[path].append((time.perf_counter() - t) * 1000)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            unanswered += 1
            conn.writer = None
        finally:
            pools[path].put_nowait(conn)

    await asyncio.gather(*(one(p, False) for p in ("direct", "gateway") for _ in range(conns)))
    n = int(rate * duration) * 2
    tasks = []
    cpu0 = {k: _tree_cpu_s(p) for k, p in (pids or {}).items()}
    client0 = time.process_time()
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / (2 * rate) - time.perf_counter()  # (the request's due time)
        if delay > 0:
            await asyncio.sleep(delay)
        due = start + i / (2 * rate)
        tasks.append(asyncio.create_task(one("direct" if i % 2 == 0 else "gateway", True, due)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    # ms per gateway request sent (the backend also served direct); a request given up as
    # late was never sent and cost the gateway nothing (counting it understated a saturated
    # gateway's CPU per request)
    per_req = 1000 / max(1, sent)
    cpu = {
        f"{k}_cpu_ms_per_req": (_tree_cpu_s(p) - cpu0[k]) * per_req for k, p in (pids or {}).items()
    }
    cpu["client_cpu_ms_per_req"] = (time.process_time() - client0) * per_req
    for q in pools.values():
        while not q.empty():
            c = q.get_nowait()
            if c.writer is not None:
                c.writer.close()
    d, g = lat["direct"], lat["gateway"]
    return {
        "rate": rate,
        "achieved_rate": len(g) / wall,
        "n": len(g),
        "direct_p50": _pct(d, 0.5),
        "direct_p99": _pct(d, 0.99),
        "gateway_p50": _pct(g, 0.5),
        "gateway_p99": _pct(g, 0.99),
        "added_p50": _pct(g, 0.5) - _pct(d, 0.5),
        "added_p99": _pct(g, 0.99) - _pct(d, 0.99),
        "unanswered": unanswered,
        "late": late,
        **cpu,
    }


# ---- 2. rollback time ------------------------------------------------------------------
async def rollback_run(
    nats_url: str, good: str, bad: str, period: float, data_dir: Path
) -> dict[str, Any]:
    import httpx
    import uvicorn

    from agentrl.bus import Bus
    from agentrl.core.settings import Settings
    from agentrl.release.service import build
    from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step
    from agentrl.serving.gateway import VERSION_HEADER, create_gateway_app

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    port = _free_port()
    plan = RolloutPlan(
        steps=[Step(weight=10, pause_s=3600), Step(weight=100, pause_s=0)],
        analysis=Analysis(period_s=period, min_samples=10),
    )
    d = await build(
        bus,
        Settings(data_dir=data_dir, gateway_port=port),
        DeploySettings(
            public_model="bench-policy",
            bucket="bench_models",
            monitor_period_s=period,
            completion_log=False,
        ),
        validate=None,
        plan=plan,
    )
    base = await d.deployer.bootstrap("upstream")
    assert base is not None
    await d.registry.update_model(
        base.model_id, lambda r: r.serving.update(kind="upstream", base_url=good)
    )
    cand = await d.deployer.register(
        checkpoint_path="",
        base_model="upstream",
        sha256="",
        serving={"kind": "upstream", "base_url": bad},
    )
    await d.registry.update_model(cand.model_id, lambda r: setattr(r, "checkpoint_path", None))
    stop = asyncio.Event()
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(d.state),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
    )
    tasks = [
        asyncio.create_task(x)
        for x in (d.manager.run(stop, poll_s=0.05), d.controller.run(stop), server.serve())
    ]
    while not server.started:
        await asyncio.sleep(0.01)
    await d.manager.sync(force=True)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    first_error: float | None = None
    last_bad: float | None = None
    unanswered = 0
    body = {
        "model": "bench-policy",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    }
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        await d.deployer.start(cand.model_id, plan, by="bench")
        t0 = time.time()
        i = 0

        async def one(k: int) -> None:
            nonlocal first_error, last_bad, unanswered
            try:
                r = await client.post(url, json={**body, "user": f"s{k}"})
            except httpx.HTTPError:
                unanswered += 1
                return
            if r.headers.get(VERSION_HEADER) == cand.model_id:
                now = time.time()
                first_error = first_error or now
                last_bad = now

        while time.time() - t0 < period * 4 + 10:
            await asyncio.gather(*(one(i + k) for k in range(20)))
            i += 20
            await asyncio.sleep(0.05)  # ~200 requests/s offered
            if d.controller.last_action and time.time() - d.controller.last_action[0] > 2:
                break
    stop.set()
    server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    record = await d.registry.require_model(cand.model_id)
    await bus.close()
    rolled = record.state == "rolled_back"
    # The first bad window closes at the first look after the first error; from then to the
    # last answer the bad version gave is what the issue bounds by one period + 1 s.
    window_end = min(
        (t for t in d.controller.ticks if first_error and t >= first_error), default=float("nan")
    )
    took = (last_bad - window_end) if (rolled and first_error and last_bad) else float("nan")
    from_first = (last_bad - first_error) if (rolled and first_error and last_bad) else float("nan")
    decision_at = d.controller.last_action[0] if d.controller.last_action else float("nan")
    return {
        "rolled_back": rolled,
        "rollback_s": max(took, 0.0),
        "first_error_to_live_s": from_first,
        "period_s": period,
        "decision_after_first_error_s": decision_at - (first_error or decision_at),
        "unanswered": unanswered,
        "evidence": record.decisions[-1].evidence if rolled else None,
    }


# ---- 3. batching -----------------------------------------------------------------------
async def batching_run(model: str, tokens: int) -> dict[str, Any]:
    from agentrl.serving.local import LocalEngine
    from agentrl.serving.openai_types import ChatRequest

    engine = LocalEngine(model, max_batch_size=8, max_wait_ms=5.0)
    reqs = [
        ChatRequest(
            model="x",
            max_tokens=tokens,
            temperature=1.0,
            messages=[{"role": "user", "content": f"Tell me about the number {i}."}],
        )
        for i in range(8)
    ]
    await engine.generate(None, reqs[0])  # warm up
    runs = []
    for _ in range(5):  # five rounds, median: the machine is shared
        t, c = time.perf_counter(), time.process_time()
        seq_tokens = 0
        for r in reqs:
            seq_tokens += (await engine.generate(None, r)).completion_tokens
        seq, seq_cpu = (
            seq_tokens / (time.perf_counter() - t),
            seq_tokens / (time.process_time() - c),
        )
        t, c = time.perf_counter(), time.process_time()
        gens = await asyncio.gather(*(engine.generate(None, r) for r in reqs))
        n = sum(g.completion_tokens for g in gens)
        conc, conc_cpu = n / (time.perf_counter() - t), n / (time.process_time() - c)
        runs.append((conc / seq, seq, conc, conc_cpu / seq_cpu))
    runs.sort()
    factor, seq, conc, cpu_factor = runs[2]
    return {
        "model": model,
        "tokens_per_s_sequential": seq,
        "tokens_per_s_8_concurrent": conc,
        "batching_factor": factor,
        "batching_factor_runs": [round(r[0], 2) for r in runs],
        "cpu_batching_factor": cpu_factor,
        "batch_sizes": engine.stats.batch_sizes[-3:],
    }


# ---- 3b. memory -------------------------------------------------------------------------
def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the peak instead
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_run(model: str, prompts: int = 10_000, budget_mb: float = 32.0) -> dict[str, Any]:
    """RSS after `prompts` distinct agent-like 10-turn conversations went through the local
    backend's prompt cache, and their completion records into a completion log whose
    publisher is not running (NATS away): both must stay within their byte budgets."""
    import gc

    from agentrl.contracts.base import utcnow
    from agentrl.contracts.completion import CompletionRecord
    from agentrl.serving.gateway import CompletionLog
    from agentrl.serving.local import LocalEngine
    from agentrl.serving.openai_types import ChatRequest

    engine = LocalEngine(model, prompt_cache_mb=budget_mb)
    log = CompletionLog(None, max_bytes=int(budget_mb * 2**20))
    gc.collect()
    before = _rss_mb()
    for i in range(prompts):
        turns: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {i}."}]
        for t in range(10):
            turns.append({"role": "user", "content": f"Step {t} of task {i}: the tool said " * 8})
            turns.append({"role": "assistant", "content": f'{{"tool": "shell", "arg": "{i}-{t}"}}'})
        _, ids = engine._prompt(ChatRequest(model="x", messages=turns))
        log.submit(
            CompletionRecord(
                completion_id=f"c-{i}",
                model="bench",
                prompt_token_ids=ids,
                completion_token_ids=ids[:16],
                completion_logprobs=[-1.0] * 16,
                timestamp=utcnow(),
            )
        )
    gc.collect()
    after = _rss_mb()
    return {
        "prompts": prompts,
        "prompt_tokens_last": len(ids),
        "budget_mb": budget_mb,
        "rss_mb_before": round(before, 1),
        "rss_mb_after_10k_distinct_prompts": round(after, 1),
        "rss_growth_mb": round(after - before, 1),
        "prompt_cache_mb": round((engine._prompts.bytes + engine._choice_cache.bytes) / 2**20, 1),
        "prompt_cache_entries": len(engine._prompts),
        "completion_log_queued_mb": round(log.bytes / 2**20, 1),
        "completion_log_dropped": log.dropped,
    }


# ---- 4. split --------------------------------------------------------------------------
def split_run(sessions: int = 10_000) -> dict[str, Any]:
    from agentrl.serving.split import choose

    worst, sticky_same, total = 0.0, 0, 0
    for weights in (
        {"new": 10.0, "live": 90.0},
        {"new": 25.0, "live": 75.0},
        {"new": 50.0, "live": 50.0},
    ):
        order = list(weights)
        keys = [f"session-{i}" for i in range(sessions)]
        first = [choose(weights, order, k, "agentrl-policy") for k in keys]
        again = [choose(weights, order, k, "agentrl-policy") for k in keys]
        for v, w in weights.items():
            worst = max(worst, abs(first.count(v) / sessions - w / 100))
        sticky_same += sum(a == b for a, b in zip(first, again, strict=True))
        total += sessions
    return {"split_max_abs_err": worst, "sticky_fraction": sticky_same / total}


# ---- driver ----------------------------------------------------------------------------
def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose gateway p99 is the median of `runs`, with every run's added p99."""
    ordered = sorted(runs, key=lambda r: r["added_p99"])
    return {**ordered[len(ordered) // 2], "added_p99_runs": [r["added_p99"] for r in runs]}


def run_bench(
    duration: float = 3.0,
    model: str = "tiny",
    tokens: int = 32,
    period: float = 2.0,
    latency_only: bool = False,
    repeat: int = 1,
) -> None:
    """The figures measured (`_measure`), then the latency line alone (`latency_only`) or
    the split's figures added, the table and the full JSON line."""
    import logging

    from rich.console import Console

    logging.getLogger("httpx").setLevel(logging.WARNING)
    console = Console()
    load = os.getloadavg()
    results = _measure(console, duration, model, tokens, period, latency_only, repeat)
    if latency_only:
        _print_latency(results, load)
        return
    results["split"] = split_run()
    console.print(_table(results, load))
    print(json.dumps(_full_line(results)))


def _measure(
    console: Any,
    duration: float,
    model: str,
    tokens: int,
    period: float,
    latency_only: bool,
    repeat: int,
) -> dict[str, Any]:
    """The helper processes up (a backend, a failing one, the gateway over NATS), the
    latency runs (plain, then streamed) and unless `latency_only` the rollback, batching
    and memory figures; the helpers stopped however it ends."""
    from agentrl.bus.server import EmbeddedNats

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-gw-"))
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {}
    with EmbeddedNats(data_dir=tmp) as nats:
        try:
            bp, fp, gp = _free_port(), _free_port(), _free_port()
            procs.append(_spawn("backend", str(bp)))
            procs.append(_spawn("backend", str(fp), env={"BENCH_STATUS": "500"}))
            procs.append(_spawn("gateway", str(gp), f"http://127.0.0.1:{bp}/v1", nats.url))
            direct = f"http://127.0.0.1:{bp}/v1/chat/completions"
            gateway = f"http://127.0.0.1:{gp}/v1/chat/completions"

            pids = {"gateway": procs[2].pid, "backend": procs[0].pid}

            async def main() -> None:
                await _wait_http(direct)
                await _wait_http(gateway)
                for rate in (200.0, 1000.0):
                    runs = []
                    for _ in range(max(1, repeat)):
                        console.print(f"latency at {rate:g} requests/s per path ...")
                        runs.append(await latency_run(direct, gateway, rate, duration, pids=pids))
                    results[f"lat{int(rate)}"] = _median_runs(runs)
                for rate in (200.0, 1000.0):  # server-sent events through both paths
                    console.print(f"streaming latency at {rate:g} requests/s per path ...")
                    results[f"stream{int(rate)}"] = await latency_run(
                        direct, gateway, rate, duration, pids=pids, stream=True
                    )
                if latency_only:
                    return
                console.print(f"rollback with a {period:g} s monitor period ...")
                results["rollback"] = await rollback_run(
                    nats.url, f"http://127.0.0.1:{bp}/v1", f"http://127.0.0.1:{fp}/v1", period, tmp
                )
                console.print(f"batching on the local backend ({model}) ...")
                results["batching"] = await batching_run(model, tokens)
                console.print("memory: 10,000 distinct prompts through the caches ...")
                out = subprocess.run(  # its own process: the RSS is the caches', not ours
                    [sys.executable, "-m", "agentrl.bench.gateway", "memory", model],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results["memory"] = json.loads(out.stdout.strip().splitlines()[-1])

            asyncio.run(main())
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    return results


def _table(results: dict[str, Any], load: tuple[float, float, float]) -> Any:
    """The figures as a rich table: latency per rate, streamed, rollback, batching, the
    split, memory, and TensorZero's published figure for scale."""
    from rich.table import Table

    table = Table(
        title=f"agentrl bench gateway (load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores)"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for rate in (200, 1000):
        r = results[f"lat{rate}"]
        table.add_row(f"{rate} req/s: achieved gateway rate", f"{r['achieved_rate']:.0f}/s")
        table.add_row(
            f"{rate} req/s: direct p50 / p99 ms", f"{r['direct_p50']:.2f} / {r['direct_p99']:.2f}"
        )
        table.add_row(
            f"{rate} req/s: gateway p50 / p99 ms",
            f"{r['gateway_p50']:.2f} / {r['gateway_p99']:.2f}",
        )
        table.add_row(
            f"{rate} req/s: added p50 / p99 ms", f"{r['added_p50']:.2f} / {r['added_p99']:.2f}"
        )
        table.add_row(
            f"{rate} req/s: CPU ms per request gateway / backend / client",
            f"{r.get('gateway_cpu_ms_per_req', float('nan')):.3f} / "
            f"{r.get('backend_cpu_ms_per_req', float('nan')):.3f} / "
            f"{r['client_cpu_ms_per_req']:.3f}",
        )
    for rate in (200, 1000):
        st = results[f"stream{rate}"]
        table.add_row(
            f"{rate} req/s streamed: added p50 / p99 ms; gateway CPU ms per request",
            f"{st['added_p50']:.2f} / {st['added_p99']:.2f}; "
            f"{st.get('gateway_cpu_ms_per_req', float('nan')):.3f}",
        )
    rb, bt, sp = results["rollback"], results["batching"], results["split"]
    table.add_row("rollback: first bad window -> all traffic on live", f"{rb['rollback_s']:.2f} s")
    table.add_row(
        "rollback: first error -> all traffic on live", f"{rb['first_error_to_live_s']:.2f} s"
    )
    table.add_row("rollback: monitor period", f"{rb['period_s']:.2f} s")
    table.add_row(
        f"batching ({bt['model']}): sequential tokens/s", f"{bt['tokens_per_s_sequential']:.1f}"
    )
    table.add_row(
        f"batching ({bt['model']}): 8 concurrent tokens/s", f"{bt['tokens_per_s_8_concurrent']:.1f}"
    )
    table.add_row(
        "batching factor (wall, median of 5)",
        f"{bt['batching_factor']:.2f} {bt['batching_factor_runs']}",
    )
    table.add_row("batching factor (tokens per CPU-second)", f"{bt['cpu_batching_factor']:.2f}")
    table.add_row("split max abs error (10,000 sessions)", f"{sp['split_max_abs_err']:.4f}")
    table.add_row("sticky fraction", f"{sp['sticky_fraction']:.4f}")
    mem = results["memory"]
    table.add_row(
        f"RSS after 10k distinct prompts (budget {mem['budget_mb']:g} MB)",
        f"{mem['rss_mb_after_10k_distinct_prompts']:.0f} MB (+{mem['rss_growth_mb']:.0f})",
    )
    table.add_row("TensorZero (published, Rust)", "< 1 ms p99 added at 10,000 QPS")
    return table


def _full_line(results: dict[str, Any]) -> dict[str, Any]:
    """The full run's JSON line: the latency figures, then the others'."""
    rb, bt, sp, mem = results["rollback"], results["batching"], results["split"], results["memory"]
    unanswered = rb["unanswered"] + sum(
        results[k]["unanswered"] for k in ("lat200", "lat1000", "stream200", "stream1000")
    )
    return {
        **_latency_line(results),
        "rollback_s": round(rb["rollback_s"], 3),
        "monitor_period_s": rb["period_s"],
        "batching_factor": round(bt["batching_factor"], 3),
        "split_max_abs_err": round(sp["split_max_abs_err"], 5),
        "sticky_fraction": sp["sticky_fraction"],
        "errors_unanswered": unanswered,
        "rss_mb_after_10k_distinct_prompts": mem["rss_mb_after_10k_distinct_prompts"],
        "rss_growth_mb_10k_prompts": mem["rss_growth_mb"],
        "prompt_cache_budget_mb": mem["budget_mb"],
    }


def _latency_line(results: dict[str, Any]) -> dict[str, Any]:
    hi, lo = results["lat1000"], results["lat200"]
    streamed: dict[str, Any] = {}
    for rate in (200, 1000):
        if (st := results.get(f"stream{rate}")) is not None:
            streamed[f"added_p50_ms_{rate}rps_stream"] = round(st["added_p50"], 3)
            streamed[f"added_p99_ms_{rate}rps_stream"] = round(st["added_p99"], 3)
            streamed[f"achieved_rps_{rate}_stream"] = round(st["achieved_rate"], 1)
            streamed[f"gateway_cpu_ms_per_req_{rate}rps_stream"] = round(
                st.get("gateway_cpu_ms_per_req", float("nan")), 3
            )
    return {
        **streamed,
        "added_p50_ms_1000rps": round(hi["added_p50"], 3),
        "added_p99_ms_1000rps": round(hi["added_p99"], 3),
        "added_p99_ms_1000rps_runs": [round(x, 3) for x in hi["added_p99_runs"]],
        "added_p99_ms_200rps": round(lo["added_p99"], 3),
        "added_p99_ms_200rps_runs": [round(x, 3) for x in lo["added_p99_runs"]],
        "achieved_rps_1000": round(hi["achieved_rate"], 1),
        "gateway_cpu_ms_per_req": round(hi.get("gateway_cpu_ms_per_req", float("nan")), 3),
        "backend_cpu_ms_per_req": round(hi.get("backend_cpu_ms_per_req", float("nan")), 3),
        "client_cpu_ms_per_req": round(hi.get("client_cpu_ms_per_req", float("nan")), 3),
    }


def _print_latency(results: dict[str, Any], load: tuple[float, float, float]) -> None:
    line = _latency_line(results)
    line["errors_unanswered"] = sum(
        results[k]["unanswered"] for k in ("lat200", "lat1000", "stream200", "stream1000")
    )
    line["load_at_start"] = [round(x, 2) for x in load]
    line["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(line))


if __name__ == "__main__":  # the benchmark's helper processes
    kind = sys.argv[1]
    if kind == "backend":
        _serve_backend(int(sys.argv[2]))
    elif kind == "gateway":
        _serve_gateway(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif kind == "memory":
        n = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
        print(json.dumps(memory_run(sys.argv[2], n)))
