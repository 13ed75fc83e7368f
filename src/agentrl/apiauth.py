"""Bearer-token auth with scopes for agentrl's HTTP APIs (control API and gateway).

Tokens come from settings (`AGENTRL_API_TOKENS`, JSON `{"token": ["scope", ...]}`; the scope
"*" grants everything). With no token configured the API is open, which is why it binds to
loopback by default. Missing or unknown token -> 401; a known token without the scope -> 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import HTTPException, Request, status

from agentrl.settings import Settings


def token_scopes(settings: Settings, token: str | None) -> set[str] | None:
    """The scopes of `token`, or None when it is not a configured token."""
    if token is None:
        return None
    for known, scopes in settings.api_tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            return set(scopes)
    return None


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def require_scope(scope: str) -> Callable[[Request], None]:
    """FastAPI dependency factory: `Depends(require_scope("training:write"))`."""

    def check(request: Request) -> None:
        settings: Settings = request.app.state.settings
        if not settings.api_tokens:
            return
        scopes = token_scopes(settings, bearer_token(request))
        if scopes is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing or unknown bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scope not in scopes and "*" not in scopes:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"token lacks the scope {scope!r}")

    return check
