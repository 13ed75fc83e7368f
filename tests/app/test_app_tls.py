"""The app's HTTP clients share one TLS context (agentrl.app.tls): httpx's default, with its
checks, built once instead of once a client."""

from __future__ import annotations

import ssl

import httpx

from agentrl.app.tls import client_tls


def test_one_context_with_httpx_defaults_checks() -> None:
    ctx = client_tls()
    assert ctx is client_tls()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats() == httpx.create_ssl_context().cert_store_stats()
