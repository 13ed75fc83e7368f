"""The request side of the tests' raw-socket HTTP servers (upstreams that answer as vLLM or a
script does): one keep-alive request read off a stream, its JSON body returned."""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def read_json_request(reader: asyncio.StreamReader) -> Any:
    """The next request's JSON body (its head read up to the blank line, then
    Content-Length bytes). asyncio.IncompleteReadError when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return json.loads(await reader.readexactly(length))
