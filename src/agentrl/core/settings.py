"""One settings object for the whole project (AGENTRL_* environment variables, .env)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process-wide settings; override with AGENTRL_<NAME> or a .env file."""

    model_config = SettingsConfigDict(env_prefix="AGENTRL_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("./.agentrl"), description="Where streams, models and state live.")
    models_dir: Path | None = Field(
        None,
        description="Where the converted base model is cached (default: the user cache, "
        "$XDG_CACHE_HOME/agentrl/models or ~/.cache/agentrl/models, shared by every data dir). "
        "`agentrl loop` points its training jobs at its own, so a run converts it once.",
    )
    nats_url: str | None = Field(
        None,
        validation_alias=AliasChoices("AGENTRL_NATS_URL", "NATS_URL"),
        description="Use an existing NATS server instead of starting the embedded one.",
    )
    nats_user: str | None = None
    nats_password: str | None = None
    nats_token: str | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    nats_tls_ca: Path | None = None
    nats_port: int = Field(0, description="Port of the embedded server; 0 picks a free one.")
    stream_replicas: int = 1
    log_json: bool = False
    log_level: str = "INFO"
    api_host: str = Field(
        "127.0.0.1", description="Control API bind address (loopback by default)."
    )
    api_port: int = Field(
        8600, description="Control API port (/training, /models, /feedback, /stats, /metrics)."
    )
    api_tokens: dict[str, list[str]] = Field(
        default_factory=dict,
        description='Bearer tokens and their scopes, JSON: {"token": {"name": "alice", "scopes": '
        '["deploy:write"]}} (or {"token": ["scope", ...]}, named token-<sha256 prefix>). The name '
        "is recorded as `by` of deploy actions. Empty: open API (loopback only, see allow_open).",
    )
    api_token_names: dict[str, str] = Field(
        default_factory=dict, description="token -> name (filled from api_tokens' named form)."
    )
    allow_open: bool = Field(
        False,
        description="AGENTRL_ALLOW_OPEN=1: serve the control API or the gateway beyond loopback "
        "without any token (refused otherwise).",
    )
    gateway_host: str = Field("127.0.0.1", description="OpenAI-compatible gateway bind address.")
    gateway_port: int = Field(8700, description="OpenAI-compatible gateway port (/v1).")

    @model_validator(mode="before")
    @classmethod
    def _named_tokens(cls, data: Any) -> Any:
        """`{"token": {"name": ..., "scopes": [...]}}` -> scopes in api_tokens (what every
        reader expects) and the name in api_token_names."""
        if not isinstance(data, dict) or not isinstance(data.get("api_tokens"), dict):
            return data
        tokens: dict[str, Any] = {}
        names = dict(data.get("api_token_names") or {})
        for token, spec in data["api_tokens"].items():
            if isinstance(spec, dict):
                tokens[token] = spec.get("scopes", [])
                if spec.get("name"):
                    names[token] = str(spec["name"])
            else:
                tokens[token] = spec
        for name in names.values():
            if name.lower().startswith("agentrl-"):
                raise ValueError(
                    f"api token name {name!r}: names starting with 'agentrl-' are the "
                    "services' own (the audit trail must tell people and services apart)"
                )
        return {**data, "api_tokens": tokens, "api_token_names": names}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
