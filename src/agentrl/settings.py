"""One settings object for the whole project (AGENTRL_* environment variables, .env)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process-wide settings; override with AGENTRL_<NAME> or a .env file."""

    model_config = SettingsConfigDict(env_prefix="AGENTRL_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("./.agentrl"), description="Where streams, models and state live.")
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
        description='Bearer tokens and their scopes, JSON: {"token": ["training:write", "*"]}. Empty: open API.',
    )
    gateway_host: str = Field("127.0.0.1", description="OpenAI-compatible gateway bind address.")
    gateway_port: int = Field(8700, description="OpenAI-compatible gateway port (/v1).")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
