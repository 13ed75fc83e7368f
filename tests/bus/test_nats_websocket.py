"""nats-py's aiohttp is imported at a ws:// connection, not at every agentrl process's start
(`agentrl.core.aiohttp_on_use`): a process that imported the bus has no aiohttp, and then
talks to a real nats-server over WebSocket all the same."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from agentrl.bus.server import find_binary, free_port

CHILD = """
import asyncio, sys
import agentrl.bus  # noqa: F401 - nats through agentrl, as every service imports it
assert "aiohttp" not in sys.modules, "aiohttp imported with the bus"
import nats

async def main() -> None:
    nc = await nats.connect(sys.argv[1], connect_timeout=20)
    sub = await nc.subscribe("ws.check")
    await nc.publish("ws.check", b"over websocket")
    msg = await sub.next_msg(timeout=20)
    assert msg.data == b"over websocket", msg.data
    await nc.close()
    assert "aiohttp" in sys.modules
    import nats.aio.transport as transport
    assert transport.aiohttp is sys.modules["aiohttp"]  # the stand-in handed over

asyncio.run(main())
print("ok")
"""


def test_the_bus_imports_no_aiohttp_and_a_ws_url_still_works(tmp_path: Path) -> None:
    port, ws_port = free_port(), free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        json.dumps(
            {"host": "127.0.0.1", "port": port, "websocket": {"port": ws_port, "no_tls": True}}
        )
    )
    log = (tmp_path / "nats.log").open("wb")
    server = subprocess.Popen([find_binary(), "-c", str(conf)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:  # the WebSocket listener is up (a loaded host starts it late)
            try:
                socket.create_connection(("127.0.0.1", ws_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no listener"
                time.sleep(0.1)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, f"ws://127.0.0.1:{ws_port}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        server.terminate()
        server.wait(10)
        log.close()
    assert done.returncode == 0 and done.stdout.strip() == "ok", (
        done.stderr[-3000:] + (tmp_path / "nats.log").read_text()[-2000:]
    )


EAGER = """
import importlib.util, sys
from agentrl.core.aiohttp_on_use import _TransportLoader
spec = importlib.util.spec_from_file_location("eager_transport", sys.argv[1])
spec.loader = _TransportLoader(spec.loader)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import aiohttp
assert module.Session is aiohttp.ClientSession, module.Session
print("ok")
"""


def test_a_transport_that_reads_aiohttp_as_it_is_imported_gets_the_real_one(
    tmp_path: Path,
) -> None:
    """A nats-py whose transport uses aiohttp at import time still imports (the stand-in
    refuses attributes during the import; the loader then runs it with the real module)."""
    eager = tmp_path / "eager_transport.py"
    eager.write_text("import aiohttp\nSession = aiohttp.ClientSession\n")
    out = subprocess.run(
        [sys.executable, "-c", EAGER, str(eager)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
