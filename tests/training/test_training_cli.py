"""`agentrl train start|status|cancel|list` over NATS (the API path is the same client)."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from agentrl.cli import app


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_train_commands_over_nats(nats, data_dir, monkeypatch):
    monkeypatch.setenv("AGENTRL_DATA_DIR", str(data_dir))
    import asyncio

    from agentrl.bus import Bus

    async def prepare() -> None:
        bus = await Bus.connect(nats.url)
        await bus.ensure_streams()
        await bus.close()

    asyncio.run(prepare())
    out = _run(
        "train",
        "start",
        "--nats",
        nats.url,
        "--base-model",
        "tiny",
        "--estimator",
        "gigpo",
        "--priority",
        "high",
        "--min-reward",
        "0.5",
    )
    assert out.exit_code == 0, out.output
    job_id = out.output.split()[1]

    async def read_back() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        bus = await Bus.connect(nats.url)
        info = await bus.js.stream_info("RL_TRAINING")
        msgs = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msgs.append(json.loads((await bus.js.get_msg("RL_TRAINING", seq)).data))
        await bus.close()
        return msgs[0], msgs

    req, _ = asyncio.run(read_back())
    assert req["training_job_id"] == job_id and req["priority"] == "high"
    tc = req["training_config"]
    assert tc["algorithm"] == "grpo" and tc["hyperparameters"]["adv_estimator"] == "gigpo"
    assert tc["dataset"]["filter"]["min_reward"] == 0.5 and tc["base_model"] == "tiny"
    status = _run("train", "status", job_id, "--nats", nats.url)
    assert status.exit_code != 0 and "unknown training job" in status.output
    assert _run("train", "cancel", job_id, "--nats", nats.url).exit_code == 0
    _, msgs = asyncio.run(read_back())
    assert msgs[-1] == {"training_job_id": job_id, "timestamp": msgs[-1]["timestamp"]}
    listed = _run("train", "list", "--nats", nats.url)
    assert listed.exit_code == 0, listed.output
