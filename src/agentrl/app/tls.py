"""One TLS context for the app's HTTP clients (the loop's, its agents', the status panel's).

httpx and httpx2 (openai's) build one per client otherwise, parsing the whole CA bundle each
time (~45-60 ms of CPU a client, measured on the 2-core machine), though these clients talk
plain http to their own stack. A context is safe to share between clients and threads."""

from __future__ import annotations

import functools
import ssl


@functools.cache
def client_tls() -> ssl.SSLContext:
    """httpx's default context (the same CA certificates, the same checks), built once."""
    import httpx

    return httpx.create_ssl_context()
