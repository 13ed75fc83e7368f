"""`agentrl up` and the embedded server's process hygiene: clean Ctrl-C, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_kit import wait_for_line

AGENTRL = str(Path(sys.executable).parent / "agentrl")


def nats_servers_using(store: Path) -> list[int]:
    """PIDs of nats-server processes whose config points into `store`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"nats-server") and any(str(store).encode() in c for c in cmd):
            pids.append(int(proc.name))
    return pids


def test_up_starts_and_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp_path), "COLUMNS": "200"}
    env.pop("NATS_URL", None)
    proc = subprocess.Popen(
        [AGENTRL, "up", "--no-services"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    out = wait_for_line(proc, "agentrl is up", timeout=60)
    assert "listening on nats://127.0.0.1:" in out
    assert nats_servers_using(tmp_path)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert "stopped cleanly" in rest
    assert nats_servers_using(tmp_path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_no_orphan_server_when_parent_is_killed(tmp_path: Path) -> None:
    code = (
        "import time; from agentrl.bus.server import EmbeddedNats\n"
        f"s = EmbeddedNats(data_dir={str(tmp_path)!r}).start(); print('ready', flush=True); time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    wait_for_line(parent, "ready", timeout=60)
    assert nats_servers_using(tmp_path)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while nats_servers_using(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert nats_servers_using(tmp_path) == []


def test_settings_read_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agentrl.core.settings import Settings

    monkeypatch.setenv("AGENTRL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NATS_URL", "nats://example:4222")
    s = Settings()
    assert s.data_dir == tmp_path and s.nats_url == "nats://example:4222"


def test_token_auth_config_is_enforced(tmp_path: Path) -> None:
    import asyncio

    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.core.errors import BusError
    from agentrl.core.settings import Settings

    settings = Settings(data_dir=tmp_path, nats_token="s3cret-token")
    with EmbeddedNats(settings=settings) as server:

        async def attempt(s: Settings) -> None:
            bus = await Bus.connect(server.url, settings=s)
            await bus.close()

        asyncio.run(attempt(settings))
        with pytest.raises(BusError, match="cannot connect"):
            asyncio.run(attempt(Settings(data_dir=tmp_path)))


def test_up_cluster_runs_three_servers_with_r3_streams(tmp_path: Path) -> None:
    import asyncio
    import re

    from agentrl.bus import Bus

    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp_path), "COLUMNS": "400"}
    env.pop("NATS_URL", None)
    env.pop("AGENTRL_STREAM_REPLICAS", None)
    proc = subprocess.Popen(
        [AGENTRL, "up", "--cluster", "3", "--no-services"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        out = wait_for_line(proc, "agentrl is up", timeout=60)
        urls = re.findall(r"agentrl-\d listening on (nats://127\.0\.0\.1:\d+)", out)
        assert len(urls) == 3
        assert len(nats_servers_using(tmp_path)) == 3

        async def replicas() -> int:
            bus = await Bus.connect(",".join(urls))
            try:
                info = await bus.js.stream_info("RL_TRAJECTORIES")
                return int(info.config.num_replicas or 1)
            finally:
                await bus.close()

        assert asyncio.run(replicas()) == 3
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert nats_servers_using(tmp_path) == []
