"""Numbered migrations, applied idempotently, with a schema-version table.

`migrations/NNNN_<table>.sql` are rendered with the database name and the retention TTL,
then applied in order; each applied number is recorded in `<db>.schema_migrations`. A
stored version newer than the newest file refuses to start (an older binary must not write
into a newer schema). Applying twice changes nothing. A changed retention setting is applied
to existing tables with ALTER TABLE ... MODIFY TTL.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from string import Template

from agentrl.warehouse.backend import Backend, SchemaTooNew
from agentrl.warehouse.config import WarehouseSettings

TTL_TABLES: dict[str, str] = {
    "trajectories": "end_timestamp",
    "turns": "timestamp",
    "rewards": "timestamp",
    "feedback": "timestamp",
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    template: str

    def render(self, settings: WarehouseSettings) -> str:
        return Template(self.template).substitute(render_values(settings))

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()[:16]


def render_values(settings: WarehouseSettings) -> dict[str, str]:
    return {
        "db": settings.database,
        "hot_ttl_s": str(settings.hot_ttl_s),
        "delete_ttl_s": str(settings.delete_ttl_s),
        "archive_action": archive_action(settings),
    }


def archive_action(settings: WarehouseSettings) -> str:
    """What happens to a part whose rows are all older than the hot TTL.

    Default: recompress with a stronger codec in place (chdb and a server alike, no storage
    configuration); with `archive_volume` on a server: move to that volume (cold disk/S3).
    """
    if settings.archive_volume:
        return f"TO VOLUME '{settings.archive_volume}'"
    return f"RECOMPRESS CODEC({settings.archive_codec})"


def ttl_clause(settings: WarehouseSettings, column: str) -> str:
    at = f"toDateTime({column})"
    return (
        f"{at} + toIntervalSecond({settings.hot_ttl_s}) {archive_action(settings)}, "
        f"{at} + toIntervalSecond({settings.delete_ttl_s}) DELETE"
    )


def load_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("agentrl.warehouse.migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


LATEST = len(load_migrations())


def current_version(backend: Backend, settings: WarehouseSettings) -> int:
    table = backend.query(
        f"SELECT max(version) AS v, count() AS n FROM {settings.database}.schema_migrations"
    )
    return int(table.column("v")[0].as_py() or 0) if table.num_rows else 0


def apply(backend: Backend, settings: WarehouseSettings) -> list[str]:
    """Bring the schema to the newest version; returns what it did (empty when up to date)."""
    db = settings.database
    did: list[str] = []
    backend.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    backend.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations (version UInt32, name String, "
        "checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = ReplacingMergeTree ORDER BY version"
    )
    migrations = load_migrations()
    stored = current_version(backend, settings)
    if stored > len(migrations):
        raise SchemaTooNew(
            f"the warehouse schema in {db} is at version {stored}, newer than this agentrl "
            f"knows ({len(migrations)}): upgrade agentrl, or point it at another database "
            "(AGENTRL_CLICKHOUSE_DATABASE) / data dir"
        )
    for migration in migrations[stored:]:
        backend.command(migration.render(settings))
        backend.command(
            f"INSERT INTO {db}.schema_migrations (version, name, checksum) VALUES "
            f"({migration.version}, '{migration.name}', '{migration.checksum}')"
        )
        did.append(f"applied {migration.version:04d}_{migration.name}")
    did.extend(sync_ttl(backend, settings))
    return did


def sync_ttl(backend: Backend, settings: WarehouseSettings) -> list[str]:
    """ALTER the TTL of tables created under other retention settings."""
    db = settings.database
    rows = backend.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String}",
        {"db": db},
    ).to_pylist()
    created = {r["name"]: _squash(r["create_table_query"]) for r in rows}
    did = []
    for table, column in TTL_TABLES.items():
        clause = ttl_clause(settings, column)
        # the engine prints the default DELETE action of a TTL without the keyword
        if table in created and _squash(clause.removesuffix(" DELETE")) not in created[table]:
            backend.command(f"ALTER TABLE {db}.{table} MODIFY TTL {clause}")
            did.append(f"retention of {table} set to: {clause}")
    return did


def _squash(sql: str) -> str:
    return re.sub(r"\s+", "", sql)
