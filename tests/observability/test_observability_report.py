"""`agentrl report`: events published through the contracts to the real nats-server are read
back from the streams (ephemeral consumers, deleted afterwards), plotted, and the page is
opened in headless Chromium: every image loads, no script error, a real screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentrl.app import report
from agentrl.bus.client import Bus
from agentrl.contracts.deployment import ModelDeployed
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.training import TrainingStatus

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "chromium is missing: install Debian's `chromium` package (apt-get install chromium)"


def events(now: datetime) -> list:
    out: list = []
    for i in range(40):
        version = "v1" if i % 2 else "v2"
        score = 1.0 if (i % 3 and version == "v1") else 0.0
        out.append(
            RewardEvent(
                trajectory_id=str(uuid.uuid4()),
                session_id=str(uuid.uuid4()),
                timestamp=now + timedelta(seconds=i),
                reward_components={
                    "task_completion": {"score": score, "weight": 0.4},
                    "efficiency": {"score": 0.5 + 0.01 * i, "weight": 0.3},
                },
                total_reward=0.4 * score + 0.3 * (0.5 + 0.01 * i),
                metadata={"model": version},
            )
        )
    job = str(uuid.uuid4())
    for step in range(1, 6):
        out.append(
            TrainingStatus(
                training_job_id=job,
                timestamp=now + timedelta(seconds=step),
                status="running" if step < 5 else "completed",
                progress={"current_step": step * 10},
                metrics={"current": {"loss": 2.0 / step, "reward_mean": 0.1 * step}},
            )
        )
    for j, (pct, status) in enumerate(((10, "canary"), (50, "canary"), (0, "rolled_back"))):
        out.append(
            ModelDeployed(
                training_job_id=job,
                timestamp=now + timedelta(seconds=10 + j),
                model_info={
                    "model_id": str(uuid.uuid4()),
                    "base_model": "tiny",
                    "checkpoint_path": "/c",
                },
                deployment_config={
                    "endpoint": "http://127.0.0.1:8700/v1",
                    "model_name": "agentrl-policy",
                    "traffic_percentage": pct,
                },
                validation_results={
                    "benchmark_passed": True,
                    "safety_checks_passed": True,
                    "performance_regression": status == "rolled_back",
                },
                metadata={"model_version": "v2", "status": status},
            )
        )
    return out


async def test_report_from_streams(nats_url: str, tmp_path: Path) -> None:
    since = datetime.now(UTC) - timedelta(seconds=1)
    bus = await Bus.connect(nats_url)
    try:
        await bus.ensure_streams()
        sent = events(datetime.now(UTC))
        ours = {e.trajectory_id for e in sent if isinstance(e, RewardEvent)}
        await bus.publish_many(sent)
        consumers_before = [c.name for c in await bus.js.consumers_info("RL_REWARDS")]
        data = await report.load_from_streams(bus, since)
        consumers = [c.name for c in await bus.js.consumers_info("RL_REWARDS")]
    finally:
        await bus.close()
    mine = [r for r in data.rewards if r.get("trajectory_id") in ours]
    assert len(mine) == 40 and len(data.statuses) >= 5 and len(data.deployments) >= 3
    assert consumers == consumers_before  # the report's ephemeral consumers are deleted
    page = report.write_report(data, tmp_path / "report")
    rows = report.reward_rows(mine)
    rate = {m: sum(r["success"] for r in rows if r["model"] == m) / 20 for m in ("v1", "v2")}
    assert rate["v2"] == 0.0 and rate["v1"] == pytest.approx(13 / 20)  # hand count of i%2 and i%3
    deploys = report.deployment_rows(data.deployments)
    assert any(d["rollback"] for d in deploys)
    for name, _ in report.PLOTS:
        png = (tmp_path / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000, name
    assert "agentrl report" in page.read_text()


def test_empty_report_still_has_every_image(tmp_path: Path) -> None:
    page = report.write_report(report.ReportData(), tmp_path / "empty")
    for name, _ in report.PLOTS:
        assert (tmp_path / "empty" / name).read_bytes().startswith(b"\x89PNG")
    assert page.exists()


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",  # type: ignore[list-item]
         "--no-first-run", "--disable-extensions", *args],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_report_opens_in_headless_chromium(tmp_path: Path) -> None:
    data = report.ReportData(
        rewards=[
            e.model_dump(mode="json")
            for e in events(datetime.now(UTC))
            if isinstance(e, RewardEvent)
        ]
    )
    page = report.write_report(data, tmp_path / "r")
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500] + dom.stderr[-2000:]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("images") == str(len(report.PLOTS)), attrs
    assert attrs.get("images-ok") == "true" and attrs.get("broken") == "", attrs
    assert attrs.get("errors") == "", attrs
    shot = tmp_path / "shot.png"
    out = chromium("--window-size=1200,3000", f"--screenshot={shot}", page.as_uri())
    assert shot.exists() and shot.read_bytes().startswith(b"\x89PNG"), out.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # the plots are in it, not a blank page

    # the check can fail: a page with a missing image is reported as broken
    (tmp_path / "r" / report.PLOTS[2][0]).unlink()
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    attrs = dict(
        re.findall(r'data-([\w-]+)="([^"]*)"', re.search(r"<body([^>]*)>", dom.stdout).group(1))
    )  # type: ignore[union-attr]
    assert attrs["images-ok"] == "false" and report.PLOTS[2][0] in attrs["broken"]
