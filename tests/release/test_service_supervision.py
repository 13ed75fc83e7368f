"""Issue 29.1 (deployment half): the deployment service's inner tasks are supervised. An
inner task that dies fails the whole service (the stack's supervisor restarts it and shows
the error) instead of ending silently while the service says "running"; an inner loop that
fails now and then is retried with backoff."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agentrl.app.stack import ServiceHealth, supervise
from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.core.supervision import InnerTaskFailed, keep_running, run_tasks
from deploy_helpers import free_port


async def test_gateway_port_taken_fails_the_deployment_service_visibly(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.release.service import serve

    monkeypatch.setenv("AGENTRL_DEPLOY_BASE_MODEL", "tiny")
    monkeypatch.setenv("AGENTRL_DEPLOY_PUBLIC_MODEL", "sup-policy")
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", "sup_models")
    port = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    stop = asyncio.Event()
    health = ServiceHealth("deployment controller")
    task = asyncio.create_task(
        supervise(
            "deployment controller",
            serve,
            bus,
            stop,
            Settings(data_dir=tmp_path, gateway_port=port),
            health,
            backoff=(0.2,),
        )
    )
    try:
        for _ in range(600):
            if health.restarts >= 1:
                break
            await asyncio.sleep(0.1)
        assert health.restarts >= 1, health
        assert "gateway" in (health.last_error or "") and str(port) in (health.last_error or "")
    finally:
        holder.close()
        stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()
    assert health.state == "stopped"


async def test_an_inner_task_that_dies_fails_the_set_and_stops_the_others() -> None:
    stop = asyncio.Event()
    others_stopped = asyncio.Event()

    async def dies() -> None:
        await asyncio.sleep(0.05)
        raise ConnectionError("nats away")

    async def runs() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            others_stopped.set()

    with pytest.raises(InnerTaskFailed, match="statuses: ConnectionError: nats away"):
        await asyncio.wait_for(run_tasks({"statuses": dies(), "tracker": runs()}, stop), 5)
    assert others_stopped.is_set()


async def test_an_inner_task_returning_early_is_a_failure() -> None:
    async def returns() -> None:
        return None

    with pytest.raises(InnerTaskFailed, match="returned before"):
        await asyncio.wait_for(run_tasks({"tracker": returns()}, asyncio.Event()), 5)


async def test_keep_running_retries_then_gives_up() -> None:
    stop = asyncio.Event()
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError(f"away {calls}")
        await stop.wait()

    task = asyncio.create_task(keep_running("consumer", flaky, stop, backoff=(0.01,)))
    for _ in range(100):
        if calls >= 3:
            break
        await asyncio.sleep(0.01)
    assert calls == 3 and not task.done()
    stop.set()
    await asyncio.wait_for(task, 2)

    async def broken() -> None:
        raise ConnectionError("still away")

    with pytest.raises(InnerTaskFailed, match=r"failed 3 times in a row.*still away"):
        await keep_running("consumer", broken, asyncio.Event(), backoff=(0.0,), max_failures=3)


async def test_statuses_consumer_survives_nats_away_longer_than_its_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The deployment controller's statuses consumer, started while nats-server is away
    (its consumer setup gives up after its retries and raises), is retried with backoff and
    consumes again once the server is back: it no longer ends silently."""
    import uuid

    from agentrl.bus import EmbeddedNats
    from agentrl.contracts.base import utcnow
    from agentrl.contracts.training import TrainingStatus

    server = EmbeddedNats(data_dir=tmp_path / "nats")
    server.start()
    # two API tries, each with a 2 s timeout: the first consumer setup gives up in ~4 s
    bus = await Bus.connect(server.url, api_attempts=2, publish_timeout=2.0)
    await bus.ensure_streams()
    seen: list[str] = []

    async def handle(event: TrainingStatus) -> None:
        seen.append(event.training_job_id)

    stop = asyncio.Event()
    server.stop()  # away before the consumer starts: its setup fails after its retries
    task = asyncio.create_task(
        keep_running(
            "training statuses consumer",
            lambda: bus.consume(
                "agent.rl.training.status.v1", "sup-statuses", handle, stop=stop, batch=8
            ),
            stop,
            backoff=(0.5,),
            max_failures=1000,
        )
    )
    try:
        for _ in range(1200):  # the first attempt gives up (about 4 to 10 s)
            if "training statuses consumer failed" in caplog.text:
                break
            await asyncio.sleep(0.1)
        assert "training statuses consumer failed" in caplog.text
        assert not task.done()
        server.start()  # back on the same port and store
        try:
            job = str(uuid.uuid4())
            last: Exception | None = None
            for _ in range(200):
                try:
                    await bus.publish(
                        TrainingStatus(training_job_id=job, timestamp=utcnow(), status="running")
                    )
                    break
                except Exception as exc:
                    last = exc
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError(
                    f"could not publish after nats-server came back: {last!r} "
                    f"closed={bus.nc.is_closed} connected={bus.nc.is_connected}"
                )
            for _ in range(600):
                if job in seen:
                    break
                await asyncio.sleep(0.1)
            assert job in seen and not task.done(), caplog.text[-3000:]
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await bus.close()
            server.stop()
    finally:
        if not task.done():
            task.cancel()
