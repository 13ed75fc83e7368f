"""The trajectory warehouse: ClickHouse schema with retention, the ingester service,
analytics queries and dataset export. Embedded chdb by default, a ClickHouse server through
clickhouse-connect when `AGENTRL_CLICKHOUSE_URL` is set; the SQL is the same."""
