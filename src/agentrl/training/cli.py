"""`agentrl train start|status|cancel|list|serve` and `agentrl bench training`.

The commands talk to the control API (default http://127.0.0.1:8600, bearer token from
--token or AGENTRL_API_TOKEN) or, with --nats URL, straight to the bus (request and cancel
subjects, the service's KV bucket). Heavy imports stay inside the commands.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import typer

TERMINAL = ("completed", "failed", "cancelled")


class Client:
    """The same five calls over HTTP (control API) or NATS."""

    def __init__(self, api: str | None, token: str | None, nats_url: str | None) -> None:
        from agentrl.settings import get_settings

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


def register(app: typer.Typer, bench: typer.Typer) -> None:
    train = typer.Typer(
        help="Training jobs: start one, watch its progress, cancel it, list jobs, run the service.",
        no_args_is_help=True,
    )
    app.add_typer(train, name="train")
    api_opt = typer.Option(None, "--api", help="Control API URL (default from settings).")
    token_opt = typer.Option(None, "--token", envvar="AGENTRL_API_TOKEN", help="Bearer token.")
    nats_opt = typer.Option(None, "--nats", help="Talk to NATS at this URL instead of the API.")

    @train.command("start")
    def start(
        config: Path = typer.Option(None, "--config", help="JSON/YAML with request fields."),
        base_model: str = typer.Option(None, help="e.g. smollm2, tiny, or a HF id/folder."),
        algorithm: str = typer.Option(None, help="grpo, rloo, dpo, ppo (gigpo: see --estimator)."),
        estimator: str = typer.Option(None, help="Advantage estimator, e.g. gigpo (with grpo)."),
        priority: str = typer.Option(None, help="urgent, high, normal or low."),
        sample_size: int = typer.Option(None, help="Trajectories to sample."),
        min_reward: float = typer.Option(None, help="Dataset filter: minimum total reward."),
        env: str = typer.Option(None, help="Train online in this environment instead."),
        iterations: int = typer.Option(10, help="Environment jobs: iterations."),
        idempotency_key: str = typer.Option(None, help="Start at most once per key (API)."),
        follow_: bool = typer.Option(False, "--follow", help="Show progress until it ends."),
        api: str = api_opt,
        token: str = token_opt,
        nats: str = nats_opt,
    ) -> None:
        """Start a training job (a manual trigger) and print its id."""
        body: dict[str, Any] = {}
        if config is not None:
            text = config.read_text()
            if config.suffix in (".yaml", ".yml"):
                import yaml

                body = dict(yaml.safe_load(text) or {})
            else:
                body = dict(json.loads(text))
        tc: dict[str, Any] = body.setdefault("training_config", {})
        if base_model:
            tc["base_model"] = base_model
        if algorithm:
            tc["algorithm"] = algorithm
        if estimator:
            tc.setdefault("hyperparameters", {})["adv_estimator"] = estimator
        if sample_size:
            tc.setdefault("dataset", {})["sample_size"] = sample_size
        if min_reward is not None:
            tc.setdefault("dataset", {}).setdefault("filter", {})["min_reward"] = min_reward
        if env:
            tc["environment"] = {"env_id": env, "iterations": iterations}
        if priority:
            body["priority"] = priority
        body.setdefault("metadata", {}).setdefault("requested_by", os.environ.get("USER", "cli"))
        client = Client(api, token, nats)
        out = client.start(body, idempotency_key)
        typer.echo(f"started {out['training_job_id']} ({out['status']})")
        if follow_:
            last = follow(client, out["training_job_id"])
            if last:
                _print_status(last)

    @train.command("status")
    def status(
        job_id: str,
        follow_: bool = typer.Option(False, "--follow", "-f", help="Progress until it ends."),
        api: str = api_opt,
        token: str = token_opt,
        nats: str = nats_opt,
    ) -> None:
        """A job's latest status event (with --follow: a live progress bar)."""
        client = Client(api, token, nats)
        s = follow(client, job_id) if follow_ else client.status(job_id)
        if s is None:
            raise typer.BadParameter(f"unknown training job {job_id}")
        _print_status(s)
        if s["status"] == "failed":
            raise typer.Exit(1)

    @train.command("cancel")
    def cancel(
        job_id: str, api: str = api_opt, token: str = token_opt, nats: str = nats_opt
    ) -> None:
        """Cancel a queued or running job (it stops within 5 s; checkpoints stay)."""
        out = Client(api, token, nats).cancel(job_id)
        typer.echo(f"cancel requested for {out['training_job_id']}")

    @train.command("list")
    def list_(
        status: str = typer.Option(None, help="Only jobs with this status."),
        api: str = api_opt,
        token: str = token_opt,
        nats: str = nats_opt,
    ) -> None:
        """Jobs and their latest status."""
        from rich.console import Console
        from rich.table import Table

        table = Table("job", "status", "progress", "updated", "checkpoint / error")
        for j in Client(api, token, nats).list(status):
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

    @train.command("serve")
    def serve(
        nats: str = typer.Option(None, "--nats", help="NATS URL (default: settings)."),
    ) -> None:
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
        from agentrl.settings import get_settings
        from agentrl.training.service import TrainingService

        async def go() -> None:
            settings = get_settings()
            bus = await Bus.connect(nats, settings=settings, name="agentrl-training")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                await TrainingService(bus, settings).run(stop)
            finally:
                await bus.close()

        asyncio.run(go())

    @bench.command("training")
    def bench_training(
        trajectories: int = typer.Option(100_000, help="Trajectories for the loading figure."),
        jobs: int = typer.Option(5, help="Jobs for the control-path latencies."),
        job_seconds: float = typer.Option(300.0, help="Length of the overhead job (seconds)."),
        quick: bool = typer.Option(False, help="Small sizes (a smoke run, not a figure)."),
    ) -> None:
        """Dataset loading rate, request->running and cancel latencies, job overhead."""
        from agentrl.training.bench import run_bench

        if quick:
            trajectories, jobs, job_seconds = 5_000, 2, 20.0
        run_bench(trajectories=trajectories, jobs=jobs, job_seconds=job_seconds)
