"""`agentrl train start|status|cancel|list|serve`.

The commands talk to the control API (default http://127.0.0.1:8600, bearer token from
--token or AGENTRL_API_TOKEN) or, with --nats URL, straight to the bus (request and cancel
subjects, the service's KV bucket). Heavy imports stay inside the commands.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import typer

from agentrl.core.configcli import argument, config_command
from agentrl.training.options import (
    Connection,
    ListOptions,
    ServeOptions,
    StartOptions,
    StatusOptions,
)

TERMINAL = ("completed", "failed", "cancelled")


class Client:
    """The same five calls over HTTP (control API) or NATS."""

    def __init__(self, api: str | None, token: str | None, nats_url: str | None) -> None:
        from agentrl.core.settings import get_settings

        s = get_settings()
        self.nats_url = nats_url
        self.api = (api or f"http://{s.api_host}:{s.api_port}").rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _http(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = httpx.request(
                method,
                self.api + path,
                headers={**self.headers, **kw.pop("headers", {})},
                timeout=30,
                **kw,
            )
        except httpx.HTTPError as exc:
            raise typer.BadParameter(
                f"cannot reach the control API at {self.api}: {exc} "
                "(is `agentrl up` running? or pass --nats URL)"
            ) from exc
        if r.status_code >= 400:
            raise typer.BadParameter(f"{method} {path} -> {r.status_code}: {r.text}")
        return r.json()

    def _nats(self, coro_fn: Any) -> Any:
        import asyncio

        from agentrl.bus import Bus

        async def go() -> Any:
            bus = await Bus.connect(self.nats_url, name="agentrl-train-cli")
            try:
                return await coro_fn(bus)
            finally:
                await bus.close()

        return asyncio.run(go())

    def start(self, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        if not self.nats_url:
            return dict(
                self._http(
                    "POST",
                    "/training/start",
                    json=body,
                    headers={"Idempotency-Key": key} if key else {},
                )
            )
        from agentrl.training.requests import fill_request
        from agentrl.training.settings import TrainingSettings

        body = {"trigger_reason": "manual", "requester": "agentrl-cli", **body}
        req = fill_request(body, TrainingSettings())

        async def go(bus: Any) -> dict[str, Any]:
            await bus.publish(req)
            return {"training_job_id": req.training_job_id, "status": "submitted"}

        return dict(self._nats(go))

    def status(self, job_id: str) -> dict[str, Any] | None:
        if not self.nats_url:
            import httpx

            r = httpx.get(f"{self.api}/training/{job_id}/status", headers=self.headers, timeout=30)
            if r.status_code == 404:
                return None
            r.raise_for_status()
            return dict(r.json())
        from agentrl.training.kv import read_status

        return self._nats(lambda bus: read_status(bus.js, job_id))  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        if not self.nats_url:
            return dict(self._http("POST", f"/training/{job_id}/cancel"))
        from agentrl.contracts.base import utcnow
        from agentrl.training.kv import CANCEL_SUBJECT

        async def go(bus: Any) -> dict[str, Any]:
            await bus.publish_json(
                CANCEL_SUBJECT,
                {"training_job_id": job_id, "timestamp": utcnow().isoformat()},
                msg_id=f"cancel:{job_id}",
            )
            return {"training_job_id": job_id, "cancel_requested": True}

        return dict(self._nats(go))

    def list(self, status: str | None) -> list[dict[str, Any]]:
        if not self.nats_url:
            params = {"status": status} if status else {}
            return list(self._http("GET", "/training", params=params)["jobs"])
        from agentrl.training.kv import all_statuses

        jobs = self._nats(lambda bus: all_statuses(bus.js))
        return [j for j in jobs if not status or j.get("status") == status]


def follow(client: Client, job_id: str, timeout: float = 24 * 3600) -> dict[str, Any] | None:
    """Show a progress bar until the job ends; returns its last status."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    last: dict[str, Any] | None = None
    end = time.monotonic() + timeout
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    ) as bar:
        task = bar.add_task(f"job {job_id[:8]}", total=100, info="waiting")
        while time.monotonic() < end:
            last = client.status(job_id) or last
            if last is not None:
                p = last.get("progress") or {}
                cur = (last.get("metrics") or {}).get("current") or {}
                info = (
                    f"{last['status']}  step {p.get('current_step', 0)}/{p.get('total_steps', 0)}"
                )
                if cur.get("loss") is not None:
                    info += f"  loss {cur['loss']:+.4f}"
                if p.get("eta_seconds") is not None and last["status"] == "running":
                    info += f"  eta {p['eta_seconds']:.0f}s"
                bar.update(task, completed=float(p.get("percent_complete", 0.0)), info=info)
                if last["status"] in TERMINAL:
                    break
            time.sleep(1.0)
    return last


def _print_status(s: dict[str, Any]) -> None:
    from rich.console import Console

    Console().print_json(json.dumps(s, default=str))


def register(app: typer.Typer) -> None:
    train = typer.Typer(
        help="Training jobs: start one, watch its progress, cancel it, list jobs, run the service.",
        no_args_is_help=True,
    )
    app.add_typer(train, name="train")
    conn = ("api", "token", "nats")
    job_id = argument("job_id", "The training job's id.", str)
    start = [*StartOptions.model_fields]  # all of them, the connection last
    start = [*(f for f in start if f not in conn), *conn]
    train.command("start")(config_command(StartOptions, start, _start))
    flags = {"follow": ["--follow", "-f"]}
    status = config_command(StatusOptions, ("follow", *conn), _status, [job_id], flags)
    train.command("status")(status)
    train.command("cancel")(config_command(Connection, conn, _cancel, [job_id]))
    train.command("list")(config_command(ListOptions, ("status", *conn), _list))
    train.command("serve")(config_command(ServeOptions, ("nats",), _serve))


def _client(cfg: Connection) -> Client:
    return Client(cfg.api, cfg.token or os.environ.get("AGENTRL_API_TOKEN"), cfg.nats)


def request_body(cfg: StartOptions) -> dict[str, Any]:
    """The training request the options describe: the --config file's fields, then the
    options on top of them."""
    body: dict[str, Any] = {}
    if cfg.config is not None:
        text = cfg.config.read_text()
        if cfg.config.suffix in (".yaml", ".yml"):
            import yaml

            body = dict(yaml.safe_load(text) or {})
        else:
            body = dict(json.loads(text))
    tc: dict[str, Any] = body.setdefault("training_config", {})
    if cfg.base_model:
        tc["base_model"] = cfg.base_model
    if cfg.algorithm:
        tc["algorithm"] = cfg.algorithm
    if cfg.estimator:
        tc.setdefault("hyperparameters", {})["adv_estimator"] = cfg.estimator
    if cfg.sample_size is not None:
        tc.setdefault("dataset", {})["sample_size"] = cfg.sample_size
    if cfg.min_reward is not None:
        tc.setdefault("dataset", {}).setdefault("filter", {})["min_reward"] = cfg.min_reward
    if cfg.env:
        tc["environment"] = {"env_id": cfg.env, "iterations": cfg.iterations}
    if cfg.priority:
        body["priority"] = cfg.priority
    body.setdefault("metadata", {}).setdefault("requested_by", os.environ.get("USER", "cli"))
    return body


def _start(cfg: StartOptions) -> None:
    """Start a training job (a manual trigger) and print its id."""
    client = _client(cfg)
    out = client.start(request_body(cfg), cfg.idempotency_key)
    typer.echo(f"started {out['training_job_id']} ({out['status']})")
    if cfg.follow:
        last = follow(client, out["training_job_id"])
        if last:
            _print_status(last)


def _status(cfg: StatusOptions, *, job_id: str) -> None:
    """A job's latest status event (with --follow: a live progress bar)."""
    client = _client(cfg)
    s = follow(client, job_id) if cfg.follow else client.status(job_id)
    if s is None:
        raise typer.BadParameter(f"unknown training job {job_id}")
    _print_status(s)
    if s["status"] == "failed":
        raise typer.Exit(1)


def _cancel(cfg: Connection, *, job_id: str) -> None:
    """Cancel a queued or running job (it stops within 5 s; checkpoints stay)."""
    out = _client(cfg).cancel(job_id)
    typer.echo(f"cancel requested for {out['training_job_id']}")


def _list(cfg: ListOptions) -> None:
    """Jobs and their latest status."""
    from rich.console import Console
    from rich.table import Table

    table = Table("job", "status", "progress", "updated", "checkpoint / error")
    for j in _client(cfg).list(cfg.status):
        p = j.get("progress") or {}
        tail = (j.get("artifacts") or {}).get("final_checkpoint") or (
            (j.get("error") or {}).get("message") or ""
        )
        table.add_row(
            j["training_job_id"],
            j["status"],
            f"{p.get('percent_complete', 0):.0f}%",
            str(j["timestamp"]),
            tail[:80],
        )
    Console().print(table)


def _serve(cfg: ServeOptions) -> None:
    """Run the training service alone (`agentrl up` runs it with everything else).

    On its own host (a GPU machine) it needs NATS_URL (a cluster: also
    AGENTRL_STREAM_REPLICAS=3), its devices, and AGENTRL_TRAINING_STORAGE_PATH on storage
    every runner reaches (s3://… or a shared mount): a job a dead runner leaves is resumed
    by another from its newest checkpoint there. A local data dir holds job folders and
    logs; no port (the control API serves /training).

    N copies may run with the same settings: they share one job queue (NATS KV
    agentrl_training_queue), own each job through a lease renewed while it runs
    (AGENTRL_TRAINING_LEASE_TTL_S, default 10 s: longer than a NATS leader election),
    and one of them, the trigger lease's holder, fires triggers. AGENTRL_REPLICA_ID names
    a copy (default host-pid). See docs/guide/replicas.md."""
    import asyncio
    import signal

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.training.service import TrainingService

    async def go() -> None:
        settings = get_settings()
        bus = await Bus.connect(cfg.nats, settings=settings, name="agentrl-training")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await TrainingService(bus, settings).run(stop)
        finally:
            await bus.close()

    asyncio.run(go())
