"""A TCP proxy a test can cut: a real network path between one client and the nats-server.

`cut()` makes the path one-sided: bytes from the client are read and dropped (its requests,
renewals and publishes never reach the server) while the connection stays open and the
server's bytes still reach the client, so the client sees no error, only silence: the
partition a lease has to survive. `heal()` closes the connections cut meanwhile (their
byte streams lost data) and lets new ones through, so the client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.cut_off = False
        self.dropped = 0  # bytes from the client dropped while cut
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for a, b in list(self._pairs):
            a.close()
            b.close()

    def cut(self) -> None:
        self.cut_off = True

    def heal(self) -> None:
        self.cut_off = False
        for a, b in list(self._pairs):
            a.close()
            b.close()
        self._pairs.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:  # no new path through while cut either
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pair = (writer, up_w)
        self._pairs.add(pair)

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool
        ) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if upstream and self.cut_off:
                        self.dropped += len(data)
                        continue
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_w, True), pump(up_r, writer, False))
        self._pairs.discard(pair)
