"""Capture settings (AGENTRL_CAPTURE_* environment variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CaptureSettings(BaseSettings):
    """Episodes at the gateway and the OTLP receiver; every field is AGENTRL_CAPTURE_<NAME>."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTRL_CAPTURE_", env_file=".env", extra="ignore"
    )

    enabled: bool = Field(True, description="Per deployment: assemble episodes at the gateway.")
    idle_timeout_s: float = Field(300.0, gt=0.0, description="An episode idle this long ends.")
    max_open: int = Field(10_000, ge=1, description="Open episodes kept at most.")
    max_bytes: int = Field(
        256 * 2**20,
        ge=1024,
        description="Bytes of open episodes and closed ones waiting to be published, at most.",
    )
    max_turns: int = Field(512, ge=1, description="Turns per episode; later ones are dropped.")
    outbox: int = Field(10_000, ge=1, description="Closed episodes waiting to be published.")
    index_bucket: str = Field(
        "agentrl_capture_index", description="KV: episode and completion ids -> trajectory id."
    )
    index_ttl_s: float = Field(30 * 86400.0, gt=0.0, description="How long feedback can name it.")
    enrich_timeout_s: float = Field(
        2.0,
        gt=0.0,
        description="How long an OTLP receiver waits for the gateway process that holds the "
        "episode to fold a trace in.",
    )
    otlp_max_spans: int = Field(4096, ge=1, description="Spans per trace kept; more: truncated.")
    otlp_max_traces: int = Field(10_000, ge=1, description="Open traces kept at most.")
    otlp_idle_s: float = Field(30.0, gt=0.0, description="A trace without its root ends then.")
    otlp_max_bytes: int = Field(
        64 * 2**20, ge=1024, description="Bytes of open traces at most (oldest published first)."
    )
    otlp_max_body_bytes: int = Field(
        32 * 2**20, ge=1024, description="One export request's body at most (413 past it)."
    )
    otlp_max_decoded_bytes: int = Field(
        64 * 2**20, ge=1024, description="What a gzip body may inflate to at most (413 past it)."
    )
    otlp_max_attrs: int = Field(256, ge=1, description="Attributes kept per span.")
    otlp_max_attr_bytes: int = Field(
        2**20, ge=256, description="A string attribute is cut (head and tail kept) past this."
    )
