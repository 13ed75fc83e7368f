"""Bearer-token auth with scopes for agentrl's HTTP APIs (control API and gateway).

Tokens come from settings (`AGENTRL_API_TOKENS`, JSON `{"token": {"name": "alice", "scopes":
["deploy:write"]}}`, or the older `{"token": ["scope", ...]}`; the scope "*" grants
everything). Each token has a name (its own, else `token-<sha256 prefix>`): the audit trail
records it as `by` of deploy actions, so a caller can no longer write someone else's name.
With no token configured the API is open, which is why it binds to loopback by default and
`check_exposure` refuses any other address unless `AGENTRL_ALLOW_OPEN=1`.
Missing or unknown token -> 401; a known token without the scope -> 403.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable

from fastapi import HTTPException, Request, status

from agentrl.core.errors import ConfigError
from agentrl.core.settings import Settings

ANONYMOUS = "api:anonymous"  # the `by` of an action on an open (token-less, loopback) API


class OpenBindRefused(ConfigError):
    """An API would listen beyond loopback with no token configured."""


def known_token(settings: Settings, token: str | None) -> str | None:
    """The configured token equal to `token` (constant-time comparisons), or None."""
    if token is None:
        return None
    found = None
    for known in settings.api_tokens:
        if hmac.compare_digest(known.encode(), token.encode()):
            found = known
    return found


def token_scopes(settings: Settings, token: str | None) -> set[str] | None:
    """The scopes of `token`, or None when it is not a configured token."""
    known = known_token(settings, token)
    return None if known is None else set(settings.api_tokens[known])


def token_name(settings: Settings, token: str) -> str:
    """A configured token's name: its own, else `token-` and 8 hex digits of its sha256."""
    return settings.api_token_names.get(token) or (
        "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]
    )


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def caller(request: Request) -> str:
    """Who is calling, for the audit trail: the token's name, or `api:anonymous` on an open
    API (the request passed `require_scope` before this is asked)."""
    settings: Settings = request.app.state.settings
    known = known_token(settings, bearer_token(request))
    return ANONYMOUS if known is None else token_name(settings, known)


def authenticated(request: Request) -> bool:
    """True when no token is configured (open API) or the request carries a known one."""
    settings: Settings = request.app.state.settings
    return not settings.api_tokens or known_token(settings, bearer_token(request)) is not None


# Routes of the control API that answer without a token: up/down and Prometheus metrics
# (counts with bounded labels). Every other route needs a known token when tokens are
# configured (`require_token`, mounted app-wide), whatever its own scope check says or
# forgets; tests/app/test_route_auth.py walks every route to keep it so.
PUBLIC_PATHS = frozenset({"/health", "/metrics"})


def require_token(request: Request) -> None:
    """FastAPI dependency of the whole control API: a known token (401 without one) on
    every route not in PUBLIC_PATHS; scopes are each route's own `require_scope`."""
    route = request.scope.get("route")
    if getattr(route, "path", request.url.path) in PUBLIC_PATHS or authenticated(request):
        return
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "missing or unknown bearer token: send 'Authorization: Bearer <token>'",
        headers={"WWW-Authenticate": "Bearer"},
    )


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


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def check_exposure(host: str, has_tokens: bool, what: str, allow_open: bool) -> None:
    """Refuse to serve `what` on a non-loopback address with no token configured (anyone
    who can reach the port could start training jobs, promote models or read the weights in
    use), unless the operator said so with AGENTRL_ALLOW_OPEN=1."""
    if has_tokens or allow_open or is_loopback(host):
        return
    env = "AGENTRL_API_TOKENS" if "gateway" not in what else "AGENTRL_DEPLOY_API_KEYS"
    raise OpenBindRefused(
        f"refusing to serve {what} on {host} without any token: anyone who can reach it "
        f"could use it. Configure tokens ({env}), bind to 127.0.0.1, or set "
        "AGENTRL_ALLOW_OPEN=1 if the network in front of it does the authentication."
    )
