"""Holds (`agentrl.deploy.hold.<public>`): a version no split routes, served by its id while
a caller measures it, asked of the deploy service over the bus (it was a process-local map
before: worker processes and the compiled front could not serve it). Real nats-server, the
deploy service (`serve`, in this process or `agentrl deploy serve` with a worker process),
a real scripted OpenAI-compatible upstream, requests through the openai SDK / httpx.

- a held rejected version answers by its id and takes none of the public name's traffic;
  released, it is unloaded;
- a hold that is never released ends by itself after its TTL;
- malformed requests get an error reply and the service goes on answering;
- a version that cannot be loaded: the reply says why and nothing stays held;
- with two gateway processes both serve the held version;
- the compiled front's route table lists a held version, with no weight in any lineage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, NotFoundError

from agentrl.app.held import ask_hold, held_for_evaluation
from agentrl.bus import Bus
from agentrl.contracts.deployment import hold_subject
from agentrl.core.settings import Settings
from agentrl.release.holds import read_holds
from agentrl.serving.registry import ModelRecord, Registry
from deploy_helpers import free_port


async def _records(registry: Registry, public: str, bport: int) -> tuple[str, str]:
    """A live base and a rejected v1, both served by the scripted upstream on `bport`."""
    base, v1 = f"{public}-base", f"{public}-v1"
    for i, (model_id, state) in enumerate(((base, "live"), (v1, "rejected"))):
        await registry.put_model(
            ModelRecord(
                model_id=model_id,
                version=i,
                public_name=public,
                base_model="scripted",
                state=state,
                serving={"kind": "upstream", "base_url": f"http://127.0.0.1:{bport}/v1"},
            )
        )

    def live(s: Any) -> None:
        s.weights, s.order, s.live = {base: 100.0}, [base], base

    await registry.update_split(public, live)
    return base, v1


def _upstream(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.bench.gateway", "backend", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _models(port: int) -> list[str]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as c:
        r = await c.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
        return [m["id"] for m in r.json()["data"]]


async def _until(check: Any, timeout: float, what: str) -> float:
    """Seconds until `await check()` is true (AssertionError with `what` after `timeout`)."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if await check():
                return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, what
        await asyncio.sleep(0.05)


class _Service:
    bus: Bus
    registry: Registry
    public: str
    port: int
    base: str
    v1: str
    task: asyncio.Task[None]
    client: AsyncOpenAI


@contextlib.asynccontextmanager
async def _serving(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, front: bool = False
) -> AsyncIterator[_Service]:
    """`serve` in this process over a scripted upstream, a rejected v1 registered; `front`:
    the compiled front serves the port (its versions need the deployment's upstream)."""
    from agentrl.release.service import serve

    s = _Service()
    s.public = f"hold-{uuid.uuid4().hex[:6]}"
    bport, s.port = free_port(), free_port()
    env = {
        "AGENTRL_DEPLOY_BASE_MODEL": "scripted",
        "AGENTRL_DEPLOY_PUBLIC_MODEL": s.public,
        "AGENTRL_DEPLOY_BUCKET": f"{s.public}_models",
        "AGENTRL_CAPTURE_ENABLED": "false",
    }
    if front:
        env["AGENTRL_DEPLOY_GATEWAY_FRONT"] = "rust"
        env["AGENTRL_DEPLOY_BACKEND"] = "upstream"
        env["AGENTRL_DEPLOY_UPSTREAM_URL"] = f"http://127.0.0.1:{bport}/v1"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s.bus = await Bus.connect(nats_url)
    await s.bus.ensure_streams()
    s.registry = await Registry.open(s.bus.js, f"{s.public}_models")
    backend = _upstream(bport)
    s.base, s.v1 = await _records(s.registry, s.public, bport)
    stop = asyncio.Event()
    s.task = asyncio.create_task(
        serve(s.bus, stop, Settings(data_dir=tmp_path / "data", gateway_port=s.port))
    )
    s.client = AsyncOpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="x", max_retries=0)

    async def up() -> bool:
        assert not s.task.done(), s.task
        return await _answers(s.client, s.public) == s.base

    try:
        await _until(up, 60, "the gateway never served the base")
        yield s
    finally:
        await s.client.close()
        stop.set()
        await asyncio.wait_for(s.task, 30)
        backend.terminate()
        backend.wait(10)
        await s.bus.close()


@pytest.fixture
async def service(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[_Service]:
    async with _serving(nats_url, tmp_path, monkeypatch) as s:
        yield s


async def _answers(client: AsyncOpenAI, model: str, session: str = "s") -> str | None:
    """The version that answered a request for `model` (None: refused)."""
    try:
        r = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-agentrl-session": session},
        )
    except Exception:
        return None
    return r.model


async def test_a_held_version_answers_by_its_id_takes_no_traffic_and_is_unloaded_after(
    service: _Service,
) -> None:
    s = service
    assert s.v1 not in await _models(s.port)  # rejected: nothing routes it, nothing loaded
    with pytest.raises(NotFoundError):
        await s.client.chat.completions.create(
            model=s.v1, messages=[{"role": "user", "content": "hi"}]
        )
    async with held_for_evaluation(s.bus, s.public, s.v1, ttl_s=30) as why:
        assert why is None
        assert await _answers(s.client, s.v1) == s.v1  # by its id
        assert s.v1 in await _models(s.port)
        # the public name's traffic: none of it reaches the held version
        got = await asyncio.gather(*(_answers(s.client, s.public, f"p-{k}") for k in range(24)))
        assert set(got) == {s.base}, got
        split, _ = await s.registry.get_split(s.public)
        assert split is not None and split.weights == {s.base: 100.0}
        assert set(await read_holds(s.registry)) == {s.v1}
    # released: unloaded within a sync or two, and the key holds nothing
    await _until(lambda: _gone(s.port, s.v1), 10, f"{s.v1} still served after its release")
    assert await read_holds(s.registry) == {}
    record = await s.registry.get_model(s.v1)
    assert record is not None and record.state == "rejected"
    assert not [d for d in record.decisions if d.action == "refuse_to_serve"]
    assert not s.task.done()


async def _gone(port: int, model_id: str) -> bool:
    return model_id not in await _models(port)


async def test_a_hold_never_released_ends_after_its_ttl(service: _Service) -> None:
    s = service
    first = await ask_hold(s.bus, s.public, s.v1, 30)
    assert first.ok and first.gateways, first
    assert s.v1 in await _models(s.port)
    # the caller renews with a short TTL, then dies (no release): the hold ends by itself
    again = await ask_hold(s.bus, s.public, s.v1, 1.0)
    assert again.ok and again.until is not None, again
    took = await _until(lambda: _gone(s.port, s.v1), 15, f"{s.v1} still served after its TTL")
    assert time.time() >= again.until - 0.5, took  # not before its end (clock: this host's)
    assert await read_holds(s.registry) == {}
    with pytest.raises(NotFoundError):
        await s.client.chat.completions.create(
            model=s.v1, messages=[{"role": "user", "content": "hi"}]
        )


async def test_malformed_hold_requests_get_an_error_reply_and_the_service_goes_on(
    service: _Service,
) -> None:
    s = service
    subject = hold_subject(s.public)
    bad = {
        b"not json": "malformed",
        b'{"ttl_s": 5}': "model_id",
        b'{"model_id": "", "ttl_s": 5}': "model_id",
        json.dumps({"model_id": s.v1, "ttl_s": -1}).encode(): "ttl_s",
        json.dumps({"model_id": s.v1, "ttl_s": 1e9}).encode(): "ttl_s",
        json.dumps({"model_id": s.v1, "ttl_s": "long"}).encode(): "ttl_s",
        b'["a list"]': "malformed",
        f'{{"model_id": "{s.public}-v9", "ttl_s": 5}}'.encode(): "no such version",
    }
    for body, why in bad.items():
        msg = await s.bus.nc.request(subject, body, timeout=30)
        reply = json.loads(msg.data)
        assert reply["ok"] is False and why in reply["why"], (body, reply)
    await s.bus.nc.publish(subject, b"no reply subject")  # logged, nothing to answer
    assert await read_holds(s.registry) == {}
    assert not s.task.done()
    ok = await ask_hold(s.bus, s.public, s.v1, 30)  # still answering
    assert ok.ok, ok
    assert (await ask_hold(s.bus, s.public, s.v1, 0)).ok


async def test_a_version_that_cannot_load_is_refused_with_why_and_not_held(
    service: _Service,
) -> None:
    s = service
    broken = f"{s.public}-v2"
    await s.registry.put_model(
        ModelRecord(
            model_id=broken,
            version=2,
            public_name=s.public,
            base_model="scripted",
            state="rejected",
            serving={"kind": "upstream"},  # no URL, and the deployment has none
        )
    )
    reply = await ask_hold(s.bus, s.public, broken, 30)
    assert not reply.ok and reply.why is not None and "without a URL" in reply.why, reply
    assert await read_holds(s.registry) == {}
    async with held_for_evaluation(s.bus, s.public, broken) as why:
        assert why is not None and "cannot load it" in why
    record = await s.registry.get_model(broken)
    assert record is not None and record.state == "rejected" and not record.decisions
    assert await _answers(s.client, s.public) == s.base  # the gateway serves on


async def test_no_deploy_service_is_said_at_once(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    try:
        t0 = time.monotonic()
        reply = await ask_hold(bus, f"nobody-{uuid.uuid4().hex[:6]}", "x-v1", 30)
        assert not reply.ok and "no deploy service answers" in (reply.why or ""), reply
        assert time.monotonic() - t0 < 5  # (not the request's 180 s timeout)
    finally:
        await bus.close()


@pytest.mark.slow  # `agentrl deploy serve` and one worker process start (about 8 s)
async def test_both_gateway_processes_serve_a_held_version(nats_url: str, tmp_path: Path) -> None:
    public = f"holdw-{uuid.uuid4().hex[:6]}"
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    registry = await Registry.open(bus.js, f"{public}_models")
    bport, port = free_port(), free_port()
    backend = _upstream(bport)
    base, v1 = await _records(registry, public, bport)
    data = tmp_path / "data"
    env = {
        **os.environ,
        "AGENTRL_DEPLOY_BASE_MODEL": "scripted",
        "AGENTRL_DEPLOY_PUBLIC_MODEL": public,
        "AGENTRL_DEPLOY_BUCKET": f"{public}_models",
        "AGENTRL_DEPLOY_GATEWAY_WORKERS": "2",
        "AGENTRL_CAPTURE_ENABLED": "false",
        "AGENTRL_GATEWAY_PORT": str(port),
        "AGENTRL_DATA_DIR": str(data),
    }
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "deploy", "serve", "--nats-url", nats_url],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    worker_log = data / "logs" / "gateway-worker-1.log"

    def logs() -> str:
        out = log.read_text(errors="replace")[-3000:]
        if worker_log.exists():
            out += "\n--- worker ---\n" + worker_log.read_text(errors="replace")[-3000:]
        return out

    try:
        # both processes report what they serve (the worker's report names its own id)
        async def two_report() -> bool:
            assert proc.poll() is None, logs()
            return len(await registry.serving_reports(public, 6.0)) == 2

        await _until(two_report, 90, "two gateway processes never reported")
        async with held_for_evaluation(bus, public, v1, ttl_s=30) as why:
            assert why is None, (why, logs())
            reply = await ask_hold(bus, public, v1, 30)  # (a renewal: says who serves it)
            assert reply.ok and len(reply.gateways) == 2, reply
            # each request on a fresh connection: the kernel picks the process each time
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}/v1",
                timeout=10,
                limits=httpx.Limits(max_keepalive_connections=0),
            ) as c:

                async def ask(model: str, k: int) -> httpx.Response:
                    return await c.post(
                        "/chat/completions",
                        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                        headers={"x-agentrl-session": f"s-{k}"},
                    )

                held = await asyncio.gather(*(ask(v1, k) for k in range(24)))
                assert [r.status_code for r in held] == [200] * 24, [r.text for r in held]
                assert {r.json()["model"] for r in held} == {v1}
                public_ = await asyncio.gather(*(ask(public, k) for k in range(24)))
                assert {r.json()["model"] for r in public_} == {base}
                # both processes answered some of the requests naming it
                pinned: dict[int, int] = {}
                deadline = time.monotonic() + 30
                while len(pinned) < 2:
                    assert time.monotonic() < deadline, pinned
                    st = (await c.get("/stats")).json()
                    got = st["pinned"].get(v1, {}).get("requests", 0)
                    pinned[st["process"]["pid"]] = got
                assert all(n > 0 for n in pinned.values()) and sum(pinned.values()) == 24, pinned

        async def unloaded_everywhere() -> bool:
            reports = await registry.serving_reports(public, 6.0)
            return len(reports) == 2 and not any(v1 in r.loaded for r in reports)

        await _until(unloaded_everywhere, 15, f"{v1} still loaded after its release")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        finally:
            backend.terminate()
            backend.wait(10)
            await bus.close()
    assert proc.returncode == 0, logs()


async def test_the_compiled_front_serves_a_held_version_by_its_id(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gateway_front = "rust"`: the front routes by its process's table, which lists every
    loaded version; held, v1 answers by its id there and gets none of the public name's."""
    from agentrl.serving import front

    if front.binary() is None:
        pytest.skip(f"the gateway front is not built: {front.BUILD_HINT}")
    async with _serving(nats_url, tmp_path, monkeypatch, front=True) as s:
        url = f"http://127.0.0.1:{s.port}/v1"
        async with held_for_evaluation(s.bus, s.public, s.v1, 30, gateway_url=url) as why:
            assert why is None
            # (the front's table is rewritten within its runner's poll, 0.2 s, after the
            # manager's report: the hold waits until the front lists it)
            assert await _answers(s.client, s.v1) == s.v1
            got = await asyncio.gather(*(_answers(s.client, s.public, f"p-{k}") for k in range(24)))
            assert set(got) == {s.base}, got
        await _until(lambda: _gone(s.port, s.v1), 10, f"{s.v1} still routed after its release")


def test_the_fronts_route_table_lists_a_held_version_with_no_weight() -> None:
    from agentrl.serving.backends import UpstreamBackend
    from agentrl.serving.front import route_table
    from agentrl.serving.gateway import GatewayState

    state = GatewayState("pol")
    up = UpstreamBackend("http://127.0.0.1:9/v1", load_lora=False, default_model="m")
    state.backends = {"pol-base": up, "pol-v1": up}  # v1 loaded by a hold: in no split
    state.set_split({"pol-base": 100.0}, ["pol-base"], "pol")
    table = route_table(state)
    assert set(table["versions"]) == {"pol-base", "pol-v1"}
    assert table["lineages"]["pol"]["weights"] == {"pol-base": 100.0}
