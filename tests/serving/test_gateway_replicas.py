"""Two gateway processes (`agentrl deploy serve` twice, one registry) behind a load balancer.

The same session key must reach the same version whichever replica answers (the split
hashes the key; no replica-local state decides), and the completion log must hold each
completion once: ids are unique across replicas and every record is published under its
completion id as Nats-Msg-Id (a republished record is dropped by the stream). Real
processes, real HTTP, the official openai SDK, a real nats-server; the one backend both
gateways send to answers as vLLM does (`upstream_server`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from agentrl.bus import Bus
from agentrl.serving.registry import ModelRecord, Registry
from deploy_helpers import free_port
from raw_http import read_json_request

pytestmark = pytest.mark.slow  # two gateway processes start


def gateway(
    url: str, env: dict[str, str], port: int, name: str, tmp: Path
) -> subprocess.Popen[bytes]:
    env = {
        **env,
        "AGENTRL_GATEWAY_PORT": str(port),
        "AGENTRL_REPLICA_ID": name,
        "AGENTRL_DATA_DIR": str(tmp / name),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "deploy", "serve", "--nats-url", url],
        env=env,
        stdout=(tmp / f"{name}.log").open("ab"),
        stderr=subprocess.STDOUT,
    )


async def serving(
    client: AsyncOpenAI, want: set[str], proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the gateway never served {want}: {log.read_text()}"
        try:
            if want <= {m.id async for m in client.models.list()}:
                return
        except Exception:  # not up yet
            pass
        await asyncio.sleep(0.2)


async def upstream_server() -> tuple[asyncio.AbstractServer, int]:
    """An OpenAI-compatible server as vLLM answers (the backend both gateways send to, as
    two gateways in front of one vLLM): one token, with its id and log-prob, named by the
    model it was asked for. The gateways under test need no engine of their own (each
    embedded one imported torch: ~7 CPU-s a process)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_json_request(reader)
                doc = {
                    "id": "upstream",
                    "object": "chat.completion",
                    "model": body["model"],
                    "prompt_token_ids": [1, 2, 3],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "length",
                            "token_ids": [42],
                            "logprobs": {"content": [{"token": "token_id:42", "logprob": -0.25}]},
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
                data = json.dumps(doc).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(data), data)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def test_two_gateways_route_a_session_to_one_version_and_log_each_completion_once(
    nats_url: str, tmp_path: Path
) -> None:
    public = f"rep-{uuid.uuid4().hex[:6]}"
    upstream, upstream_port = await upstream_server()
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    registry = await Registry.open(bus.js, f"{public}_models")
    base, canary = f"{public}-base", f"{public}-v1"
    for i, model_id in enumerate((base, canary)):
        await registry.put_model(
            ModelRecord(
                model_id=model_id,
                version=i,
                public_name=public,
                base_model="tiny",
                state="live" if i == 0 else "canary",
            )
        )

    def half_half(s: object) -> None:
        s.weights = {canary: 50.0, base: 50.0}  # type: ignore[attr-defined]
        s.order = [canary, base]  # type: ignore[attr-defined]
        s.live, s.canary = base, canary  # type: ignore[attr-defined]

    await registry.update_split(public, half_half)
    first = int((await bus.js.stream_info("RL_COMPLETIONS")).state.last_seq) + 1
    env = {
        **os.environ,
        "AGENTRL_DEPLOY_BACKEND": "upstream",
        "AGENTRL_DEPLOY_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}/v1",
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_DEPLOY_PUBLIC_MODEL": public,
        "AGENTRL_DEPLOY_BUCKET": f"{public}_models",
        "AGENTRL_CAPTURE_ENABLED": "false",
    }
    ports = {"a": free_port(), "b": free_port()}
    procs = {n: gateway(nats_url, env, p, n, tmp_path) for n, p in ports.items()}
    clients = {
        n: AsyncOpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="x", max_retries=0)
        for n, p in ports.items()
    }
    routed: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    ids: list[str] = []
    try:
        for n in procs:
            await serving(clients[n], {base, canary}, procs[n], tmp_path / f"{n}.log")
        for k in range(24):
            session = f"session-{k}-{uuid.uuid4().hex[:6]}"
            for n in ("a", "b"):  # a load balancer may send each turn anywhere
                resp = await clients[n].chat.completions.create(
                    model=public,
                    max_tokens=2,
                    messages=[{"role": "user", "content": "hi"}],
                    extra_headers={"x-agentrl-session": session},
                )
                routed[n][session] = resp.model
                ids.append(resp.id)
        # the log task publishes within its linger; wait for every record
        deadline = time.monotonic() + 30
        logged: Counter[str] = Counter()
        headers: dict[str, str] = {}
        while set(ids) - set(logged) and time.monotonic() < deadline:
            logged, headers = await completion_log(bus, set(ids), first)
            await asyncio.sleep(0.2)
    finally:
        for c in clients.values():
            await c.close()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(30)
        upstream.close()
        await bus.close()
    assert routed["a"] == routed["b"]  # the same version for a session on either replica
    assert set(routed["a"].values()) == {base, canary}  # both versions served (a real split)
    assert len(set(ids)) == len(ids) == 48  # completion ids unique across the replicas
    assert logged == Counter({cid: 1 for cid in ids})  # each logged once
    assert all(headers[cid] == cid for cid in ids)  # under its id: a republish is dropped


async def completion_log(
    bus: Bus, ids: set[str], first: int
) -> tuple[Counter[str], dict[str, str]]:
    """How often each of `ids` is stored in RL_COMPLETIONS (from sequence `first` on), and
    its Nats-Msg-Id."""
    info = await bus.js.stream_info("RL_COMPLETIONS")
    seen: Counter[str] = Counter()
    headers: dict[str, str] = {}
    for seq in range(max(first, int(info.state.first_seq or 1)), int(info.state.last_seq) + 1):
        try:
            msg = await bus.js.get_msg("RL_COMPLETIONS", seq)
        except Exception:  # deleted by the stream's limits
            continue
        cid = json.loads(msg.data)["completion_id"]
        if cid in ids:
            seen[cid] += 1
            headers[cid] = (msg.headers or {}).get("Nats-Msg-Id", "")
    return seen, headers
