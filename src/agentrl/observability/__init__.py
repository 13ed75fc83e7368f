"""Observability: Prometheus metrics (`metrics`), the `/metrics` router (`api`), collectors
that read JetStream's consumer lag, Grafana dashboards and alert rules (generated, in
`deploy/observability/`), JSON logs with an audit log (`agentrl.core.logs`), and `agentrl report`."""
