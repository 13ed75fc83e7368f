"""Warehouse settings (AGENTRL_WAREHOUSE_* and AGENTRL_CLICKHOUSE_* environment variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DAY_S = 86_400


class WarehouseSettings(BaseSettings):
    """Where the warehouse lives, how long rows stay hot and how the ingester batches.

    Without `clickhouse_url` the warehouse is embedded chdb under `<data_dir>/warehouse`;
    with it, a ClickHouse server through clickhouse-connect. The SQL is the same.
    """

    model_config = SettingsConfigDict(
        env_prefix="AGENTRL_WAREHOUSE_", extra="ignore", populate_by_name=True
    )

    clickhouse_url: str | None = Field(
        None,
        validation_alias=AliasChoices("AGENTRL_CLICKHOUSE_URL", "AGENTRL_WAREHOUSE_CLICKHOUSE_URL"),
        description="http(s)://host:8123 of a ClickHouse server; unset: embedded chdb.",
    )
    clickhouse_user: str = Field(
        "default",
        validation_alias=AliasChoices(
            "AGENTRL_CLICKHOUSE_USER", "AGENTRL_WAREHOUSE_CLICKHOUSE_USER"
        ),
    )
    clickhouse_password: str = Field(
        "",
        validation_alias=AliasChoices(
            "AGENTRL_CLICKHOUSE_PASSWORD", "AGENTRL_WAREHOUSE_CLICKHOUSE_PASSWORD"
        ),
    )
    database: str = Field(
        "agentrl",
        validation_alias=AliasChoices("AGENTRL_CLICKHOUSE_DATABASE", "AGENTRL_WAREHOUSE_DATABASE"),
        description="Database that holds every warehouse table.",
    )
    path: Path | None = Field(None, description="chdb data path (default <data_dir>/warehouse).")
    # Retention (seed: 30 days hot, 90 days archived). Seconds so tests can use short TTLs.
    hot_ttl_s: int = Field(30 * DAY_S, gt=0, description="Age after which rows are archived.")
    delete_ttl_s: int = Field(90 * DAY_S, gt=0, description="Age after which rows are deleted.")
    archive_codec: str = Field(
        "ZSTD(17)", description="Codec archived parts are recompressed with (chdb and server)."
    )
    archive_volume: str | None = Field(
        None,
        description="Server only: move archived parts TO VOLUME this (needs a storage policy "
        "with that volume); unset: recompress in place, which works on chdb and a server alike.",
    )
    # Ingester
    batch_size: int = Field(2000, gt=0, description="Events fetched and inserted per batch.")
    batch_timeout_s: float = Field(
        0.5, gt=0, description="Longest wait to fill a batch before inserting what arrived."
    )
    ack_wait_s: float = Field(30.0, gt=0)
    backoff_max_s: float = Field(30.0, gt=0, description="Longest retry delay while it is down.")
    migrate: bool = Field(
        True,
        description="Apply the schema migrations on start; false where a deploy step runs "
        "`agentrl warehouse migrate` instead.",
    )
    durable_prefix: str = Field("warehouse", description="Durable consumer names' prefix.")

    def chdb_path(self, data_dir: Path) -> Path:
        return self.path if self.path is not None else data_dir / "warehouse"

    @property
    def backend_name(self) -> str:
        return "clickhouse" if self.clickhouse_url else "chdb"
