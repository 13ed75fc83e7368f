"""Issue 54: the compiled gateway front (`gateway-front/`, Rust) routes as the gateway does.

What must hold: a session key (the same headers and body fields the gateway reads) hashes to
the same point and version as `agentrl.serving.split` (parity over thousands of keys, weights
and orders); a request reaches the chosen version's backend under its served name and comes
back named by the version and the completion id (plain and streamed, through the official
`openai` SDK); every completion is published on the completion log's subject under its id
as Nats-Msg-Id with the token ids the backend returned; the counters at `/stats` count what
the split routed, failures of the backend as errors, input problems nowhere; a route table
rewritten (a rollback) is in force within a poll, and a broken one keeps the last. Real
processes: the built front, a scripted upstream on a raw socket, a real nats-server.
The tests that need the built front skip, saying how to build it, where it is not built
(scripts/build-gateway-front.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from agentrl.serving import front, split
from raw_http import read_json_request

EXE = front.binary()
# `scripts/test.sh` builds the front beside pytest and names the file its build's exit
# status lands in (and its log): these tests wait for that build rather than skip
BUILD_DONE, BUILD_LOG = "AGENTRL_FRONT_BUILD_DONE", "AGENTRL_FRONT_BUILD_LOG"
BUILD_WAIT_S = 900.0


def need_front() -> None:
    """Wait for a build `scripts/test.sh` started; skip, saying why (the build's last lines,
    or how to build it), where the front is not built."""
    global EXE
    done = os.environ.get(BUILD_DONE)
    if EXE is None and done:
        deadline = time.monotonic() + BUILD_WAIT_S
        while not Path(done).exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        EXE = front.binary()
    if EXE is None:
        log = Path(os.environ.get(BUILD_LOG, "/nonexistent"))
        tail = " | ".join(log.read_text().splitlines()[-3:]) if log.is_file() else ""
        why = f"its build failed: {tail}" if tail else front.BUILD_HINT
        pytest.skip(f"the gateway front is not built: {why}")


SUBJECT = "agent.rl.completion.v1"


class Upstream:
    """An OpenAI-compatible server on a raw socket (keep-alive): answers with the model it
    was asked for, vLLM's token ids and log-probs; model "boom" answers 500."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self.port = 0
        self.release = asyncio.Event()  # (made in the loop's thread: Python >= 3.10)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_json_request(reader)
                self.seen.append(body)
                if body["model"] == "slow":  # held until the test lets it answer
                    await self.release.wait()
                if body["model"] in ("stall", "garbage"):  # a stream that fails mid-way
                    first = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
                    bad = b"data: <html>oops</html>\n\n" if body["model"] == "garbage" else b""
                    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
                    writer.write(b"%x\r\n%s\r\n" % (len(first + bad), first + bad))
                    await writer.drain()
                    await asyncio.sleep(5)  # stalled (the front gives up first)
                    break
                writer.write(self.answer(body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, body: dict[str, Any]) -> bytes:
        if body["model"] == "boom":
            data = b'{"error": {"message": "scripted failure"}}'
            return b"HTTP/1.1 500 Oops\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)
        lp = {"content": [{"token": "token_id:42", "logprob": -0.25}]}
        if not body.get("stream"):
            doc = {
                "id": "up",
                "object": "chat.completion",
                "model": body["model"],
                "prompt_token_ids": [1, 2, 3],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.name},
                        "finish_reason": "stop",
                        "token_ids": [42],
                        "logprobs": lp,
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
            data = json.dumps(doc).encode()
            return (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (
                    len(data),
                    data,
                )
            )
        # as vLLM streams them: each choice with its index (an OpenAI client instrumented by
        # OpenTelemetry, as another test of the worker may leave it, needs it)
        events = [
            {
                "prompt_token_ids": [1, 2, 3],
                "choices": [{"index": 0, "delta": {"role": "assistant"}}],
            },
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": self.name[:1]},
                        "token_ids": [42],
                        "logprobs": lp,
                    }
                ]
            },
            {"choices": [{"index": 0, "delta": {"content": self.name[1:]}, "token_ids": [43]}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        ]
        wire = b"".join(
            b"data: " + json.dumps({"id": "up", "model": body["model"], **e}).encode() + b"\r\n\r\n"
            for e in events
        )
        wire += b"data: [DONE]\r\n\r\n"
        # cut the events anywhere: the front reassembles them across reads
        parts = [wire[i : i + 37] for i in range(0, len(wire), 37)]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        return head + chunked


class Loop:
    """An asyncio loop in a thread: the upstreams and the NATS subscriber live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def upstreams(loop: Loop) -> dict[str, Upstream]:
    out = {}
    for name in ("u1", "u2"):
        up = Upstream(name)

        async def start(up: Upstream = up) -> int:
            server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
            return int(server.sockets[0].getsockname()[1])

        up.port = loop.run(start())
        out[name] = up
    return out


def table(upstreams: dict[str, Upstream], weights: dict[str, float], gen: int) -> dict[str, Any]:
    versions = {
        "v1": {"backend": f"http://127.0.0.1:{upstreams['u1'].port}/v1", "served_name": "m1"},
        "v2": {"backend": f"http://127.0.0.1:{upstreams['u2'].port}/v1", "served_name": "m2"},
        "v3": {"backend": f"http://127.0.0.1:{upstreams['u1'].port}/v1", "served_name": "boom"},
        "v4": {"backend": f"http://127.0.0.1:{upstreams['u2'].port}/v1", "served_name": "slow"},
        "v5": {"backend": f"http://127.0.0.1:{upstreams['u2'].port}/v1", "served_name": "stall"},
        "v6": {"backend": f"http://127.0.0.1:{upstreams['u2'].port}/v1", "served_name": "garbage"},
    }
    return {
        "public_name": "agentrl-policy",
        "lineages": {"agentrl-policy": {"weights": weights, "order": ["v2", "v1"]}},
        "versions": versions,
        "timeout_s": 10.0,
        "generation": gen,
    }


@pytest.fixture(scope="module")
def records(loop: Loop, nats_url: str) -> Iterator[list[Any]]:
    """Every message on the completion log's subject (a core subscription)."""
    import nats

    got: list[Any] = []

    async def sub() -> Any:
        nc = await nats.connect(nats_url)

        async def keep(msg: Any) -> None:
            got.append(msg)

        await nc.subscribe(SUBJECT, cb=keep)
        await nc.flush()
        return nc

    nc = loop.run(sub())
    yield got
    loop.run(nc.close())


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory,
    upstreams: dict[str, Upstream],
    nats_url: str,
    records: list[Any],
) -> Iterator[tuple[front.Front, Path]]:
    need_front()
    tmp = tmp_path_factory.mktemp("front")
    routes = tmp / "routes.json"
    front.write_routes(routes, table(upstreams, {"v1": 30.0, "v2": 70.0}, 1))
    proc = front.Front(routes, nats_url=nats_url, poll_ms=20, log=tmp / "front.log")
    proc.start()
    yield proc, routes
    proc.stop()
    assert proc.proc is not None and proc.proc.returncode == 0, (tmp / "front.log").read_text()


def wait_for(what: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out := what():
            return out
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout} s")


def test_split_parity_with_the_python_split() -> None:
    """The front's point and version for thousands of keys equal `split.choose`'s."""
    need_front()
    rng = random.Random(54)
    alphabet = "abcxyz0129-_:é漢😀\u00ff"
    lines, want = [], []
    for i in range(3000):
        n = rng.randint(1, 4)
        names = [f"v{j}" for j in range(n)]
        weights = {v: rng.choice([0.0, 1.0, 2.5, 10.0, 33.3, 50.0, 100.0]) for v in names}
        if not any(weights.values()):
            weights[names[0]] = 5.0
        order = rng.sample(names, n)
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) + str(i)
        salt = rng.choice(["agentrl-policy", "", "lineage-b"])
        lines.append(json.dumps({"weights": weights, "order": order, "key": key, "salt": salt}))
        want.append((split.choose(weights, order, key, salt), split.session_point(key, salt)))
    assert EXE is not None
    out = subprocess.run(
        [str(EXE), "split-check"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    got = [(d["version"], d["point"]) for d in map(json.loads, out)]
    assert len(got) == len(want)
    mismatched = [(lines[i], got[i], want[i]) for i in range(len(want)) if got[i] != want[i]]
    assert not mismatched, mismatched[:3]


def test_sessions_reach_the_versions_the_split_chooses_and_are_logged(
    running: tuple[front.Front, Path], upstreams: dict[str, Upstream], records: list[Any]
) -> None:
    proc, _routes = running
    client = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0)
    weights, order = {"v1": 30.0, "v2": 70.0}, ["v2", "v1"]
    before = proc.stats()["stats"]
    seen_before = {n: len(u.seen) for n, u in upstreams.items()}
    served: dict[str, str] = {}
    for i in range(24):
        key = f"session-{i}"
        # the key as the gateway reads it: a session header, or the body's `user`
        if i % 2:
            extra: dict[str, Any] = {"extra_headers": {"x-agentrl-session": key}}
        else:
            extra = {"user": key}
        raw = client.chat.completions.with_raw_response.create(
            model="agentrl-policy", messages=[{"role": "user", "content": "hi"}], **extra
        )
        answer = raw.parse()
        version = raw.headers["x-agentrl-model-version"]
        assert version == split.choose(weights, order, key, "agentrl-policy")
        assert answer.model == version
        assert answer.id == raw.headers["x-agentrl-completion-id"]
        assert answer.choices[0].message.content == {"v1": "u1", "v2": "u2"}[version]
        served[answer.id] = version
    assert set(served.values()) == {"v1", "v2"}
    # each upstream saw its version's served name, and never the session field
    for name, model in (("u1", "m1"), ("u2", "m2")):
        new = upstreams[name].seen[seen_before[name] :]
        assert new and {b["model"] for b in new} == {model}
        assert all("episode_id" not in b for b in new)
    after = proc.stats()["stats"]
    for v in ("v1", "v2"):
        n = sum(1 for x in served.values() if x == v)
        assert after[v]["requests"] - before.get(v, {}).get("requests", 0) == n
        assert after[v]["latency_p99_ms"] is not None

    # the completion log: each completion once, under its id, with the backend's token ids
    def all_logged() -> dict[str, Any] | None:
        docs = {(m.headers or {}).get("Nats-Msg-Id"): json.loads(m.data) for m in records}
        return docs if served.keys() <= docs.keys() else None

    logged = wait_for(all_logged)
    assert sum((m.headers or {}).get("Nats-Msg-Id") in served for m in records) == len(served)
    for cid, version in served.items():
        doc = logged[cid]
        assert doc["completion_id"] == cid and doc["model"] == version
        assert doc["prompt_token_ids"] == [1, 2, 3]
        assert doc["completion_token_ids"] == [42]
        assert doc["completion_logprobs"] == [-0.25]
        assert doc["session_id"].startswith("session-")
        assert doc["finish_reason"] == "stop" and doc["timestamp"].endswith("Z")


def test_jetstream_keeps_the_front_s_records_once_each(
    loop: Loop, running: tuple[front.Front, Path], nats_url: str
) -> None:
    """The completion log's stream captures the front's core publishes, and a record sent
    again under the same Nats-Msg-Id is dropped (what a replayed publish would do)."""
    from agentrl.bus import Bus

    proc, _ = running

    async def setup() -> Any:
        bus = await Bus.connect(nats_url)
        await bus.ensure_streams()
        return bus

    bus = loop.run(setup())
    try:
        body = {"model": "agentrl-policy", "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(f"{proc.url}/v1/chat/completions", json=body, timeout=10)
        cid = r.headers["x-agentrl-completion-id"]

        async def last() -> Any:
            try:
                m = await bus.js.get_last_msg("RL_COMPLETIONS", SUBJECT)
            except Exception:  # none stored yet
                return None
            return m if (m.headers or {}).get("Nats-Msg-Id") == cid else None

        msg = wait_for(lambda: loop.run(last()))
        assert json.loads(msg.data)["completion_id"] == cid

        async def again() -> Any:  # the same record, the same id: a duplicate
            ack = await bus.js.publish(SUBJECT, msg.data, headers={"Nats-Msg-Id": cid})
            return ack.duplicate

        assert loop.run(again()) is True
    finally:
        loop.run(bus.close())


def test_a_stream_passes_through_named_by_the_version(
    running: tuple[front.Front, Path], records: list[Any]
) -> None:
    proc, _ = running
    client = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0)
    key = "stream-session"
    want = split.choose({"v1": 30.0, "v2": 70.0}, ["v2", "v1"], key, "agentrl-policy")
    chunks = list(
        client.chat.completions.create(
            model="agentrl-policy",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers={"x-episode-id": key},
        )
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == {
            "v1": "u1",
            "v2": "u2",
        }[want]
    )
    assert {c.model for c in chunks} == {want}
    (cid,) = {c.id for c in chunks}
    doc = wait_for(
        lambda: next(
            (json.loads(m.data) for m in records if (m.headers or {}).get("Nats-Msg-Id") == cid),
            None,
        )
    )
    assert doc["completion_token_ids"] == [42, 43] and doc["prompt_token_ids"] == [1, 2, 3]
    assert doc["finish_reason"] == "length" and doc["session_id"] == key


def test_errors_count_as_the_gateway_counts_them(running: tuple[front.Front, Path]) -> None:
    proc, _ = running
    before = proc.stats()
    with httpx.Client(base_url=proc.url, timeout=10) as c:
        body = {"model": "v3", "messages": [{"role": "user", "content": "x"}]}
        failed = c.post("/v1/chat/completions", json=body)  # pinned; its backend says 500
        assert failed.status_code == 502 and failed.json()["error"]["type"] == "server_error"
        assert c.post("/v1/chat/completions", content=b"{not json").status_code == 400
        unknown = c.post("/v1/chat/completions", json={**body, "model": "nope"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
    after = proc.stats()
    assert after["pinned"]["v3"]["errors"] == before["pinned"].get("v3", {}).get("errors", 0) + 1
    assert after["stats"] == before["stats"]  # nothing of the split's evidence moved


def test_past_max_inflight_a_429_with_retry_after(
    loop: Loop, running: tuple[front.Front, Path], upstreams: dict[str, Upstream]
) -> None:
    """Admission as the gateway's: at most `max_inflight` chat requests at once (a stream
    until it ends); beyond, 429 `rate_limit_exceeded` with Retry-After, counted as shed."""
    proc, routes = running
    front.write_routes(
        routes, {**table(upstreams, {"v1": 30.0, "v2": 70.0}, 10), "max_inflight": 1}
    )
    wait_for(lambda: proc.stats()["generation"] == 10, timeout=2.0)
    body = {"model": "v4", "messages": [{"role": "user", "content": "x"}]}
    held: dict[str, Any] = {}
    first = threading.Thread(
        target=lambda: held.update(
            r=httpx.post(f"{proc.url}/v1/chat/completions", json=body, timeout=10)
        )
    )
    first.start()
    try:
        wait_for(lambda: proc.stats()["inflight"] == 1)
        busy = httpx.post(
            f"{proc.url}/v1/chat/completions", json={**body, "model": "v1"}, timeout=10
        )
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "rate_limit_exceeded"
        assert proc.stats()["shed"] >= 1
    finally:
        loop.loop.call_soon_threadsafe(upstreams["u2"].release.set)
        first.join(10)
    assert held["r"].status_code == 200
    assert proc.stats()["inflight"] == 0
    front.write_routes(routes, table(upstreams, {"v1": 30.0, "v2": 70.0}, 11))
    wait_for(lambda: proc.stats()["generation"] == 11, timeout=2.0)


def test_a_stream_that_stalls_or_breaks_ends_in_band_counted(
    running: tuple[front.Front, Path], upstreams: dict[str, Upstream]
) -> None:
    """As the gateway's: a backend silent for the timeout mid-stream is a 504 error event
    (a timeout and an error of the version), a chunk that is not JSON a 502 one; both end
    with [DONE], after the events that came before."""
    proc, routes = running
    front.write_routes(routes, {**table(upstreams, {"v1": 30.0, "v2": 70.0}, 20), "timeout_s": 0.3})
    wait_for(lambda: proc.stats()["generation"] == 20, timeout=2.0)
    try:
        for version, code in (("v5", "504"), ("v6", "502")):
            before = proc.stats()["pinned"].get(version, {})
            body = {
                "model": version,
                "stream": True,
                "messages": [{"role": "user", "content": "x"}],
            }
            r = httpx.post(f"{proc.url}/v1/chat/completions", json=body, timeout=10)
            events = [e for e in r.text.split("\n\n") if e]
            assert json.loads(events[0][6:])["choices"][0]["delta"]["content"] == "a"
            error = json.loads(events[-2][6:])["error"]
            assert error["code"] == code and error["type"] == "server_error", events
            assert events[-1] == "data: [DONE]"
            after = proc.stats()["pinned"][version]
            assert after["errors"] == before.get("errors", 0) + 1
            assert after["timeouts"] == before.get("timeouts", 0) + (code == "504")
    finally:
        front.write_routes(routes, table(upstreams, {"v1": 30.0, "v2": 70.0}, 21))
        wait_for(lambda: proc.stats()["generation"] == 21, timeout=2.0)


def test_a_rollback_stops_routing_to_the_version_within_a_poll(
    running: tuple[front.Front, Path], upstreams: dict[str, Upstream]
) -> None:
    proc, routes = running
    with httpx.Client(base_url=proc.url, timeout=10) as c:

        def version(key: str) -> str:
            body = {"model": "agentrl-policy", "messages": [{"role": "user", "content": "x"}]}
            r = c.post("/v1/chat/completions", json=body, headers={"x-session-id": key})
            assert r.status_code == 200, r.text
            return str(r.headers["x-agentrl-model-version"])

        keys = [f"k{i}" for i in range(40)]
        assert {version(k) for k in keys} == {"v1", "v2"}
        front.write_routes(routes, table(upstreams, {"v1": 100.0, "v2": 0.0}, 2))
        wait_for(lambda: proc.stats()["generation"] == 2, timeout=2.0)
        assert {version(k) for k in keys} == {"v1"}
        # a table that does not parse (or names a version with no backend) keeps the last
        routes.write_text('{"lineages": {"agentrl-policy": {"weights": {"v9": 1}}}}')
        time.sleep(0.1)  # five polls: the bad file was read and refused
        assert proc.stats()["generation"] == 2 and {version(k) for k in keys[:5]} == {"v1"}
        front.write_routes(routes, table(upstreams, {"v1": 30.0, "v2": 70.0}, 3))
        wait_for(lambda: proc.stats()["generation"] == 3, timeout=2.0)


def test_route_table_from_a_gateway_state(upstreams: dict[str, Upstream]) -> None:
    """`route_table` carries the state's splits, served names and keys; a version with
    traffic and no upstream URL is refused (the front could not reach it)."""
    from agentrl.serving.backends import UpstreamBackend
    from agentrl.serving.gateway import GatewayState

    state = GatewayState("agentrl-policy", api_keys=["sk-1"])
    up = UpstreamBackend(f"http://127.0.0.1:{upstreams['u1'].port}/v1", default_model="base")
    state.backends = {"v1": up, "v2": up}
    up.names["v2"] = "adapter-v2"
    state.set_split({"v1": 60.0, "v2": 40.0}, ["v2", "v1"])
    t = front.route_table(state, generation=7)
    assert t["lineages"]["agentrl-policy"] == {
        "weights": {"v1": 60.0, "v2": 40.0},
        "order": ["v2", "v1"],
    }
    assert t["versions"]["v1"]["served_name"] == "base"
    assert t["versions"]["v2"]["served_name"] == "adapter-v2"
    assert t["api_keys"] == ["sk-1"] and t["generation"] == 7
    tls = UpstreamBackend("https://api.example.invalid/v1")
    state.backends["v9"] = tls  # a spare over https: left out (pinning it is a 404)
    assert "v9" not in front.route_table(state)["versions"]
    state.weights["v9"] = 10.0  # with traffic: the table cannot be written
    with pytest.raises(ValueError, match="plain-HTTP"):
        front.route_table(state)
    del state.backends["v9"], state.weights["v9"]
    asyncio.run(tls.close())
    state.backends["v3"] = object()  # type: ignore[assignment]  # (an in-process engine)
    state.weights["v3"] = 10.0
    with pytest.raises(ValueError, match="no plain-HTTP upstream URL"):
        front.route_table(state)


async def test_up_with_the_rust_front_serves_the_split_and_a_rollback_within_a_poll(
    nats_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    upstreams: dict[str, Upstream],
) -> None:
    """`agentrl up`'s deploy service with `gateway_front = "rust"`: the front answers on the
    gateway's port (the official SDK), a canary gets its sessions under its served name, and
    a rollback stops routing to it within the serving manager's poll and the front's."""
    need_front()
    import uuid

    from openai import AsyncOpenAI

    from agentrl.bus import Bus
    from agentrl.core.settings import Settings
    from agentrl.release.actions import Deployer
    from agentrl.release.service import serve
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry
    from deploy_helpers import free_port

    env = {
        "BACKEND": "upstream",
        "UPSTREAM_URL": f"http://127.0.0.1:{upstreams['u2'].port}/v1",
        "GATEWAY_FRONT": "rust",
        "PUBLIC_MODEL": "front-policy",
        "BUCKET": "front_models",
        "BASE_MODEL": "tiny",
    }
    for k, v in env.items():
        monkeypatch.setenv(f"AGENTRL_DEPLOY_{k}", v)
    monkeypatch.setenv("AGENTRL_CAPTURE_ENABLED", "false")
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    settings = Settings(data_dir=tmp_path, gateway_port=free_port())
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, stop, settings))
    base = f"http://127.0.0.1:{settings.gateway_port}/v1"
    client = AsyncOpenAI(base_url=base, api_key="x", max_retries=0)

    async def versions(keys: list[str]) -> dict[str, str]:
        out = {}
        for k in keys:
            raw = await client.chat.completions.with_raw_response.create(
                model="front-policy", messages=[{"role": "user", "content": "hi"}], user=k
            )
            out[k] = raw.headers["x-agentrl-model-version"]
            assert raw.parse().model == out[k]
        return out

    try:
        deadline = time.monotonic() + 60
        models: list[str] = []
        while "front-policy-base" not in models:
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the front never served the base version"
            with contextlib.suppress(Exception):  # not up yet
                models = [m.id async for m in client.models.list()]
            await asyncio.sleep(0.1)
        registry = await Registry.open(bus.js, "front_models")
        deployer = Deployer(registry, bus, "front-policy", f"{base}/chat/completions")
        record = await deployer.register(
            checkpoint_path="",
            base_model="tiny",
            sha256="",
            training_job_id=str(uuid.uuid4()),
            serving={"kind": "upstream", "upstream_model": "m-canary"},
        )
        canary = record.model_id
        await registry.update_model(canary, lambda r: setattr(r, "checkpoint_path", None))
        seen = len(upstreams["u2"].seen)
        await deployer.start(canary, DeploySettings().plan(), by="test")
        keys = [f"user-{i}" for i in range(60)]
        deadline = time.monotonic() + 20
        while canary not in (await versions(keys)).values():
            assert time.monotonic() < deadline, "the canary never got traffic through the front"
        got = await versions(keys)  # (the round above may have straddled the table's change)
        assert set(got.values()) == {"front-policy-base", canary}
        assert await versions(keys) == got  # sticky
        served = {b["model"] for b in upstreams["u2"].seen[seen:]}
        assert served == {"front-policy-base", "m-canary"}
        await deployer.rollback(by="test", reason="test rollback", model_id=canary)
        rolled = time.monotonic()
        while canary in (await versions(keys)).values():
            # the manager's poll (0.2 s) then the front's (0.05 s), on a loaded host
            assert time.monotonic() - rolled < 3.0, "still routed to the rolled-back version"
        assert set((await versions(keys)).values()) == {"front-policy-base"}
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


async def test_the_runner_keeps_the_table_and_folds_the_counters_into_the_evidence(
    tmp_path: Path, upstreams: dict[str, Upstream]
) -> None:
    """`FrontRunner`: a split changed in the state reaches the front within its poll, and
    the front's split-routed counters are the controller's (`FleetStats`) evidence."""
    need_front()
    from agentrl.serving.backends import UpstreamBackend
    from agentrl.serving.gateway import GatewayState
    from agentrl.serving.gateway_workers import FleetStats
    from deploy_helpers import free_port

    state = GatewayState("agentrl-policy", api_keys=["sk-front"])  # (its /stats needs one)
    up = UpstreamBackend(f"http://127.0.0.1:{upstreams['u1'].port}/v1")
    state.backends = {"v1": up, "v2": up}
    state.set_split({"v1": 100.0}, ["v1"])
    fleet = FleetStats(state.stats)
    runner = front.FrontRunner(
        state, fleet, tmp_path / "routes.json", f"127.0.0.1:{free_port()}", None, poll_s=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            while runner.front is None:
                await asyncio.sleep(0.02)
            url = f"{runner.front.url}/v1/chat/completions"
            body = {"model": "agentrl-policy", "messages": [{"role": "user", "content": "x"}]}

            assert (await c.get(f"{runner.front.url}/stats")).status_code == 401

            async def ask() -> str:
                r = await c.post(url, json=body, headers={"Authorization": "Bearer sk-front"})
                assert r.status_code == 200, r.text
                return str(r.headers["x-agentrl-model-version"])

            assert {await ask() for _ in range(5)} == {"v1"}
            state.set_split({"v2": 100.0}, ["v2"])  # as the serving manager does
            deadline = time.monotonic() + 3
            while await ask() != "v2":
                assert time.monotonic() < deadline, "the new split never reached the front"
            n2 = 1 + sum([await ask() == "v2" for _ in range(3)])
            deadline = time.monotonic() + 3
            while "v2" not in fleet or fleet["v2"].requests < n2:
                assert time.monotonic() < deadline, dict(fleet.remote)
                await asyncio.sleep(0.02)
            assert fleet["v1"].requests >= 5 and fleet["v2"].requests == n2
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await up.close()
    assert runner.front is not None and runner.front.proc is not None
    assert runner.front.proc.returncode == 0  # stopped with the service, cleanly


async def test_a_front_killed_mid_run_is_started_again_and_its_counts_stay_evidence(
    tmp_path: Path, upstreams: dict[str, Upstream]
) -> None:
    """SIGKILL of the front while it serves: the runner starts it again on the same port
    within a poll or two, the requests counted before the kill stay in `FleetStats` (each
    process's counters under their own key: none lost, none counted twice), and the new
    process serves and counts the requests after it."""
    need_front()
    import signal

    from agentrl.serving.backends import UpstreamBackend
    from agentrl.serving.gateway import GatewayState
    from agentrl.serving.gateway_workers import FleetStats
    from deploy_helpers import free_port

    state = GatewayState("agentrl-policy")
    up = UpstreamBackend(f"http://127.0.0.1:{upstreams['u1'].port}/v1")
    state.backends = {"v1": up}
    state.set_split({"v1": 100.0}, ["v1"])
    fleet = FleetStats(state.stats)
    runner = front.FrontRunner(
        state, fleet, tmp_path / "routes.json", f"127.0.0.1:{free_port()}", None, poll_s=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    body = {"model": "agentrl-policy", "messages": [{"role": "user", "content": "x"}]}

    async def counted(n: int) -> None:
        deadline = time.monotonic() + 5
        while "v1" not in fleet or fleet["v1"].requests < n:
            assert time.monotonic() < deadline, dict(fleet.remote)
            await asyncio.sleep(0.02)

    try:
        async with httpx.AsyncClient(timeout=10) as c:
            while runner.front is None:
                await asyncio.sleep(0.02)
            url = f"{runner.front.url}/v1/chat/completions"
            for _ in range(4):
                assert (await c.post(url, json=body)).status_code == 200
            await counted(4)
            first = runner.front
            assert first.proc is not None
            first.proc.send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 30
            while runner.front is first or runner.restarts < 1:
                assert time.monotonic() < deadline, "the killed front was not started again"
                await asyncio.sleep(0.05)
            for _ in range(3):
                assert (await c.post(url, json=body)).status_code == 200
            await counted(7)
            await asyncio.sleep(0.2)  # a few more polls: nothing counted twice
            assert fleet["v1"].requests == 7
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await up.close()


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"AGENTRL_DEPLOY_BACKEND": "local"}, "AGENTRL_DEPLOY_BACKEND=upstream"),
        ({"AGENTRL_DEPLOY_BACKEND": "upstream"}, "AGENTRL_CAPTURE_ENABLED=false"),
    ],
)
def test_up_refuses_a_front_it_cannot_run_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], why: str
) -> None:
    from typer.testing import CliRunner

    from agentrl.cli import app

    monkeypatch.setenv("AGENTRL_CAPTURE_ENABLED", "true")
    monkeypatch.setenv("AGENTRL_DEPLOY_GATEWAY_WORKERS", "1")
    monkeypatch.setenv("AGENTRL_DEPLOY_GATEWAY_FRONT", "python")  # (the option sets it)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = CliRunner().invoke(
        app, ["up", "--gateway-front", "rust", "--data-dir", str(tmp_path / "d")]
    )
    assert result.exit_code == 2, result.output
    assert why in result.output
    assert not (tmp_path / "d").exists()  # nothing started
