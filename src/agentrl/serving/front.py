"""The compiled gateway front (`gateway-front/`, Rust): its route table and its process.

The front routes `POST /v1/chat/completions` by the same sticky split as the gateway
(`agentrl.serving.split`), forwards to each version's OpenAI-compatible backend, counts per
version (`GET /stats`) and publishes the completion log on NATS. What it routes by comes from
here: `route_table` reads a `GatewayState` the serving manager keeps current, `write_routes`
replaces the JSON file atomically (write, fsync, rename), and the front re-reads the file
when it changes (every `poll_ms`). A file rather than a control endpoint: no second
authenticated port, the table survives a restart of the front, and a reader never sees half
a table. Only versions served by an upstream server (`UpstreamBackend`) can be routed by it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FRONT_ENV = "AGENTRL_GATEWAY_FRONT"  # path of the binary (else the repo's build, else PATH)
BUILD_HINT = "build it with scripts/build-gateway-front.sh (cargo, Debian's librust-*-dev)"


def binary() -> Path | None:
    """The front's executable: $AGENTRL_GATEWAY_FRONT, this checkout's release build, or
    `gateway-front` on PATH; None when none is built."""
    if env := os.environ.get(FRONT_ENV):
        return Path(env) if Path(env).is_file() else None
    built = Path(__file__).resolve().parents[3] / "gateway-front/target/release/gateway-front"
    if built.is_file():
        return built
    found = shutil.which("gateway-front")
    return Path(found) if found else None


def route_table(state: Any, generation: int = 0) -> dict[str, Any]:
    """The front's table from a `GatewayState`: every lineage's split, each routable
    version's backend URL and served name, agents/profiles to lineages, the API keys.
    ValueError when a version with traffic has no upstream URL (the front cannot reach it)."""
    versions: dict[str, dict[str, str]] = {}
    for model_id, backend in state.backends.items():
        base = getattr(backend, "base_url", None)
        if not base or not str(base).startswith("http://"):  # (it speaks plain HTTP)
            continue
        names = getattr(backend, "names", {})
        served = names.get(model_id) or getattr(backend, "default_model", None) or model_id
        versions[model_id] = {"backend": str(base), "served_name": str(served)}
        client = getattr(backend, "client", None)
        auth = client.headers.get("authorization") if client is not None else None
        if auth:  # the upstream's API key (`upstream_api_key`)
            versions[model_id]["authorization"] = str(auth)
    lineages: dict[str, dict[str, Any]] = {
        state.public_name: {"weights": dict(state.weights), "order": list(state.order)}
    }
    for name, (weights, order) in state.routes.items():
        lineages[name] = {"weights": dict(weights), "order": list(order)}
    for name, split in lineages.items():
        far = [v for v, w in split["weights"].items() if w > 0 and v not in versions]
        if far:
            raise ValueError(
                f"lineage {name!r}: versions {far} have no plain-HTTP upstream URL; the front "
                "forwards only to OpenAI-compatible servers over http://"
            )
    return {
        "public_name": state.public_name,
        "lineages": lineages,
        "versions": versions,
        "by_agent": dict(state.by_agent),
        "by_profile": dict(state.by_profile),
        "api_keys": list(state.api_keys),
        "timeout_s": float(state.timeout_s),
        "max_inflight": int(state.max_inflight),
        "generation": generation,
    }


def write_routes(path: Path, table: dict[str, Any]) -> None:
    """Replace `path` with `table` at once (the front never reads half a file); 0600: it
    holds the API keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".routes-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Front:
    """The front's process: started on `listen` with `routes` (written before it starts),
    publishing to `nats_url` when given; `stop` ends it (SIGTERM: it drains its log)."""

    def __init__(
        self,
        routes: Path,
        listen: str = "127.0.0.1:0",
        nats_url: str | None = None,
        threads: int = 1,
        poll_ms: int = 100,
        exe: Path | None = None,
        log: Path | None = None,
    ) -> None:
        self.exe = exe or binary()
        if self.exe is None:
            raise FileNotFoundError(f"the gateway front is not built: {BUILD_HINT}")
        self.routes, self.listen, self.nats_url = routes, listen, nats_url
        self.threads, self.poll_ms, self.log = threads, poll_ms, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 30.0) -> str:
        """Start it; its base URL (http://host:port) once it listens."""
        self.spawn()
        self.wait_ready(timeout)
        return self.url

    def spawn(self) -> None:
        """Start the process (call it from a thread that outlives the front: the child is
        sent SIGTERM when the thread that forked it ends, PR_SET_PDEATHSIG)."""
        from agentrl.core.deathsig import terminate_with_parent

        if self.listen.endswith(":0"):  # a free port, chosen here (the front prints its own)
            import socket

            with socket.socket() as s:
                s.bind((self.listen.rsplit(":", 1)[0], 0))
                self.listen = f"{self.listen.rsplit(':', 1)[0]}:{s.getsockname()[1]}"
        cmd = [str(self.exe), "--listen", self.listen, "--routes", str(self.routes)]
        cmd += ["--threads", str(self.threads), "--poll-ms", str(self.poll_ms)]
        if self.nats_url:
            cmd += ["--nats", self.nats_url]
        if self.log:
            self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT if self.log else None,
                stdin=subprocess.DEVNULL,
                preexec_fn=terminate_with_parent,  # a killed parent leaves no front behind
            )
        finally:
            if self.log:
                out.close()  # type: ignore[union-attr]
        self.url = f"http://{self.listen}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until it answers `/health` (RuntimeError when it exits or does not in time)."""
        import httpx

        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway-front exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"gateway-front not listening after {timeout:.0f} s: {last}")

    def stats(self, key: str | None = None) -> dict[str, Any]:
        """The front's counters: {"stats": {version: snapshot}, "pinned": ..., "refused"}
        (`key`: one of the gateway's keys, when it has any)."""
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else None
        out: dict[str, Any] = httpx.get(f"{self.url}/stats", headers=headers, timeout=5.0).json()
        return out

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Front:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check(settings: Any, capture: bool) -> None:
    """What the front cannot do, refused at start-up with why (`gateway_front = "rust"`)."""
    if settings.backend == "local":
        raise ValueError(
            "gateway_front=rust forwards to OpenAI-compatible servers: set "
            "AGENTRL_DEPLOY_BACKEND=upstream or vllm (the local engine lives in the Python "
            "gateway's process)"
        )
    if (settings.upstream_url or "").startswith("https://"):
        raise ValueError(
            "gateway_front=rust speaks plain HTTP to backends: the upstream is https "
            f"({settings.upstream_url})"
        )
    if capture:
        raise ValueError(
            "gateway_front=rust does not capture episodes: set AGENTRL_CAPTURE_ENABLED=false "
            "or use the Python gateway"
        )
    if settings.gateway_workers > 1:
        raise ValueError("gateway_front=rust is one process: leave gateway_workers at 1")
    if binary() is None:
        raise ValueError(f"gateway_front=rust but the front is not built: {BUILD_HINT}")


def counters(doc: dict[str, Any]) -> dict[str, list[int]]:
    """The front's split-routed counters as `FleetStats` holds a worker's: version ->
    [requests, errors, timeouts, completion tokens] (pinned requests are no evidence)."""
    return {
        str(v): [
            int(s.get(k) or 0) for k in ("requests", "errors", "timeouts", "completion_tokens")
        ]
        for v, s in (doc.get("stats") or {}).items()
    }


class FrontRunner:
    """`agentrl up` with `gateway_front = "rust"`: the front serves the gateway's port; every
    `poll_s` the route table is rewritten when the state changed (the serving manager keeps
    the state current) and the front's counters are folded into the controller's evidence
    (`FleetStats`, as a gateway worker's). A front that exits is started again (its counters
    start from zero under a new name, so the sum never goes back)."""

    def __init__(
        self,
        state: Any,
        fleet: Any,
        routes: Path,
        listen: str,
        nats_url: str | None,
        poll_s: float = 0.2,
        log: Path | None = None,
    ) -> None:
        self.state, self.fleet, self.routes = state, fleet, routes
        self.listen, self.nats_url, self.poll_s, self.log = listen, nats_url, poll_s, log
        self.generation = 0
        self.written: dict[str, Any] | None = None
        self.front: Front | None = None
        self.restarts = 0

    def sync_routes(self) -> bool:
        """Rewrite the table when what it routes by changed; True when written."""
        table = route_table(self.state, self.generation)
        if self.written is not None and {**table, "generation": 0} == {
            **self.written,
            "generation": 0,
        }:
            return False
        self.generation += 1
        table["generation"] = self.generation
        write_routes(self.routes, table)
        self.written = table
        return True

    def _spawn(self) -> Front:
        front = Front(
            self.routes, listen=self.listen, nats_url=self.nats_url, poll_ms=50, log=self.log
        )
        front.spawn()  # (in the loop's thread: a worker thread's end would SIGTERM it)
        return front

    async def _start(self) -> None:
        import asyncio

        front = self._spawn()
        try:
            await asyncio.to_thread(front.wait_ready)
        except BaseException:
            front.stop()
            raise
        self.front = front  # (set once it answers)

    async def run(self, stop: Any) -> None:
        import asyncio
        import logging

        import httpx

        log = logging.getLogger(__name__)
        refused: str | None = None
        self.sync_routes()
        await self._start()
        log.info("gateway front (Rust) on %s", self.front.url if self.front else "?")
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                while not stop.is_set():
                    try:
                        self.sync_routes()
                        refused = None
                    except (ValueError, OSError) as exc:  # the last table stays in force
                        if str(exc) != refused:  # (said once, not every poll)
                            log.warning("front route table not written: %s", exc)
                        refused = str(exc)
                    front = self.front
                    assert front is not None and front.proc is not None
                    if front.proc.poll() is not None:
                        self.restarts += 1
                        log.warning(
                            "gateway front exited (%s); starting it again", front.proc.returncode
                        )
                        await self._start()
                        continue
                    keys = self.state.api_keys
                    auth = {"Authorization": f"Bearer {keys[0]}"} if keys else None
                    try:
                        doc = (await client.get(f"{front.url}/stats", headers=auth)).json()
                        key = f"front-{front.proc.pid}-{self.restarts}"
                        self.fleet.remote[key] = counters(doc)
                    except (httpx.HTTPError, ValueError) as exc:
                        log.warning("front counters not read: %s", exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.poll_s)
        finally:
            if self.front is not None:
                await asyncio.to_thread(self.front.stop)
