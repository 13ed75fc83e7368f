"""`agentrl bench lineages`: one controller tick per lineage with 1 lineage and with 100, on
a real nats-server and the real registry and controllers (`agentrl.release.fleet`).

Each lineage has its live base version and a registered candidate; half of them (and the
single one of the 1-lineage run, measured both ways) have a canary rollout running, so a
tick reads its rollout, reconciles its split, reads the gateways' serving reports and holds;
the others are idle (a tick looks for waiting candidates). The figure is a tick's wall time
per lineage (p50 / p99 over `rounds` rounds of the many, as many ticks of the one): the issue's bar is that 100 lineages do not
make one lineage's tick slower than a single lineage's. One JSON line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.bench.options import LineagesBench
from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step


def _plan() -> RolloutPlan:
    return RolloutPlan(
        strategy="canary",
        steps=[Step(weight=10.0, pause_s=3600.0), Step(weight=100.0, pause_s=3600.0)],
        analysis=Analysis(period_s=3600.0, min_samples=10, reward_range=(0.0, 1.0)),
    )


async def _setup(bus: Any, n: int, running: str, tmp: Path) -> Any:
    """A deployment with `n` lineages (the default one included); `running`: which have a
    canary rollout ('all', 'none' or 'half')."""
    from agentrl.core.settings import Settings
    from agentrl.release.actions import Deployer
    from agentrl.release.lineage import Lineages
    from agentrl.release.service import build

    tag = uuid.uuid4().hex[:8]
    deploy = DeploySettings(public_model=f"bench-{tag}", bucket=f"bench_lineages_{tag}")
    settings = Settings(data_dir=tmp / tag)
    d = await build(bus, settings, deploy, engine=object(), validate=None, plan=_plan())
    await d.deployer.bootstrap("tiny")
    lineages = Lineages(d.registry, deploy.public_model)
    names = [deploy.public_model]
    for i in range(n - 1):
        name = f"agent{i}/role"
        await lineages.create(name, base_model="tiny", agents=[f"a{i}"], by="bench")
        names.append(name)
    for i, name in enumerate(names):
        dep = Deployer(d.registry, None, name)
        record = await dep.register(
            checkpoint_path=f"/nonexistent/{name}",
            base_model="tiny",
            sha256="0" * 64,
            training_job_id=str(uuid.uuid4()),
        )
        if running == "all" or (running == "half" and i % 2 == 0):
            await dep.start(record.model_id, _plan(), by="bench")
    await d.fleet.refresh(force=True)
    for c in d.fleet.controllers.values():
        c.deployer.bus = None  # no deployed events: the registry and the controller only
        c.tracker.rebuild = _no_rebuild  # type: ignore[method-assign]
    return d, names


async def _no_rebuild(bus: Any, since: float) -> int:
    return 0


async def _report(d: Any) -> None:
    """Every lineage's serving report, as a gateway writes them every few seconds."""
    from agentrl.serving.registry import ServingReport

    for name in d.fleet.controllers:
        split, _ = await d.registry.get_split(name)
        weights = dict(split.weights) if split else {}
        await d.registry.report_serving(
            ServingReport(
                gateway="bench-gw", public_name=name, weights=weights, loaded=list(weights)
            )
        )


async def _measure(d: Any, rounds: int) -> dict[str, list[float]]:
    """Wall ms of each lineage's tick, by what the tick did ('hold' / idle)."""
    out: dict[str, list[float]] = {"rollout": [], "idle": []}
    for k in range(rounds):
        if k % 20 == 0:  # fresh reports (not timed): a gateway rewrites its own every 2 s
            await _report(d)
        for c in d.fleet.controllers.values():
            t0 = time.perf_counter()
            action = await c.tick()
            ms = (time.perf_counter() - t0) * 1000
            out["idle" if action is None else "rollout"].append(ms)
    return out


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


async def bench(url: str, tmp: Path, many: int, rounds: int) -> dict[str, Any]:
    from agentrl.bus import Bus

    bus = await Bus.connect(url)
    await bus.ensure_streams()
    out: dict[str, Any] = {"lineages": many, "rounds": rounds}
    try:
        for label, n, running in (
            ("1", 1, "all"),
            ("1_idle", 1, "none"),
            (str(many), many, "half"),
        ):
            d, _ = await _setup(bus, n, running, tmp)
            await _measure(d, 1)  # warm: first looks record their holds
            times = rounds * many // n  # as many ticks measured at 1 lineage as at many
            t0 = time.perf_counter()
            ticks = await _measure(d, times)
            wall = (time.perf_counter() - t0) * 1000 / times
            for kind, xs in ticks.items():
                if xs:
                    out[f"tick_{kind}_p50_ms_{label}"] = _p(xs, 0.5)
                    out[f"tick_{kind}_p99_ms_{label}"] = _p(xs, 0.99)
            out[f"round_ms_{label}"] = round(wall, 2)
        r1, rn = out.get("tick_rollout_p50_ms_1"), out.get(f"tick_rollout_p50_ms_{many}")
        i1, i_n = out.get("tick_idle_p50_ms_1_idle"), out.get(f"tick_idle_p50_ms_{many}")
        out["tick_ratio_rollout"] = round(rn / r1, 2) if r1 and rn else None
        out["tick_ratio_idle"] = round(i_n / i1, 2) if i1 and i_n else None
    finally:
        await bus.close()
    return out


def run_bench(many: int = 100, rounds: int = 5) -> dict[str, Any]:
    from agentrl.bus.server import EmbeddedNats

    for name in ("agentrl", "agentrl.audit"):
        logging.getLogger(name).setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-lineages-"))
    t0 = time.time()
    with EmbeddedNats(data_dir=tmp / "nats") as nats:
        out = asyncio.run(bench(nats.url, tmp, many, rounds))
    out["wall_s"] = round(time.time() - t0, 1)
    out["load_1m"] = round(os.getloadavg()[0], 2)
    out = {"bench": "lineages", **out}
    print(json.dumps(out))
    return out


def command(cfg: LineagesBench) -> None:
    """`agentrl bench lineages`."""
    run_bench(many=cfg.many, rounds=cfg.rounds)
