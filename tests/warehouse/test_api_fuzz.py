"""schemathesis against the served `/stats` routes: no input makes them answer 5xx."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentrl.core.settings import Settings


@pytest.fixture()
def served(backend, wsettings, monkeypatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
    import uvicorn

    from agentrl.app.api import create_app

    monkeypatch.setenv("AGENTRL_WAREHOUSE_PATH", str(wsettings.path))
    monkeypatch.setenv("AGENTRL_CLICKHOUSE_DATABASE", wsettings.database)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(Settings(data_dir=wsettings.path)), port=port, log_level="error")
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/stats/counts", timeout=5)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def test_stats_routes_never_answer_5xx(served: str) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{served}/openapi.json")
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith("/stats"):
            continue

        @settings(
            max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            response = case.call(base_url=served, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        check()
        ran += 1
    assert ran == 12
