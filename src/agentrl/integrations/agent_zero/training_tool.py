"""The RL Trainer's tool, without Agent Zero: start a job, read its status (control API).

The tool's answer is text for the LLM: what happened, the job id, the figures the API gave;
an unreachable API or a refused request is said plainly (the agent decides what next), never
raised into Agent Zero's loop.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentrl.integrations.agent_zero.config import AgentZeroConfig

# Short tool arguments -> where they go in the seed's training request.
CONFIG_ARGS = ("algorithm", "base_model")
FILTER_ARGS = (
    "min_reward",
    "max_trajectory_length",
    "task_domains",
    "exclude_subordinate_profiles",
)
HYPER_ARGS = ("learning_rate", "batch_size", "epochs", "clip_epsilon", "gamma", "gae_lambda")


def start_body(args: dict[str, Any]) -> dict[str, Any]:
    """A partial `agent.rl.training.request.v1` body from the tool's arguments (the API fills
    in the rest); a full `training_config` passed as is wins."""
    body: dict[str, Any] = {"requester": "rl-trainer-subordinate", "trigger_reason": "manual"}
    config: dict[str, Any] = dict(args.get("training_config") or {})
    for key in CONFIG_ARGS:
        if key in args:
            config.setdefault(key, args[key])
    dataset = dict(config.get("dataset") or {})
    filt = dict(dataset.get("filter") or {})
    filt.update({k: args[k] for k in FILTER_ARGS if k in args})
    if filt:
        dataset["filter"] = filt
    if "sample_size" in args:
        dataset["sample_size"] = int(args["sample_size"])
    if dataset:
        config["dataset"] = dataset
    hyper = dict(config.get("hyperparameters") or {})
    hyper.update({k: args[k] for k in HYPER_ARGS if k in args})
    if hyper:
        config["hyperparameters"] = hyper
    if config:
        body["training_config"] = config
    for key in ("priority", "trigger_reason", "requester"):
        if key in args:
            body[key] = args[key]
    if "notes" in args:
        body["metadata"] = {"notes": str(args["notes"]), "requested_by": "rl-trainer-subordinate"}
    return body


class TrainingClient:
    def __init__(self, api_url: str, token: str = "", timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(
            base_url=api_url.rstrip("/"), headers=headers, timeout=timeout
        )

    async def __aenter__(self) -> TrainingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def start(self, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.http.post("/training/start", json=body)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    async def status(self, job_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/training/{job_id}/status")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


def describe_status(status: dict[str, Any]) -> str:
    lines = [f"training job {status.get('training_job_id')}: {status.get('status')}"]
    progress = status.get("progress") or {}
    if progress:
        lines.append(
            "progress: " + ", ".join(f"{k}={v}" for k, v in progress.items() if v is not None)
        )
    current = (status.get("metrics") or {}).get("current") or {}
    if current:
        lines.append("metrics: " + ", ".join(f"{k}={v}" for k, v in current.items()))
    artifacts = status.get("artifacts") or {}
    if artifacts.get("final_checkpoint"):
        lines.append(f"final checkpoint: {artifacts['final_checkpoint']}")
    if status.get("evaluation_results"):
        lines.append("evaluation: " + json.dumps(status["evaluation_results"]))
    if status.get("error"):
        err = status["error"]
        lines.append(f"error: {err.get('code')}: {err.get('message', '')}")
    return "\n".join(lines)


async def run_training_tool(
    config: AgentZeroConfig, method: str | None, args: dict[str, Any]
) -> str:
    action = (method or args.pop("action", "") or "start").strip().lower()
    try:
        async with TrainingClient(config.api_url, config.api_token) as client:
            if action == "status":
                job_id = str(args.get("job_id") or args.get("training_job_id") or "").strip()
                if not job_id:
                    return "rl_training:status needs a job_id (the id rl_training:start returned)"
                return describe_status(await client.status(job_id))
            if action != "start":
                return f"unknown rl_training method {action!r}: use rl_training:start or rl_training:status"
            started = await client.start(start_body(args))
            return (
                f"training job {started['training_job_id']} submitted "
                f"(status: {started.get('status')}); read it with rl_training:status"
            )
    except httpx.HTTPStatusError as exc:
        detail = exc.response.text[:2000]
        return f"agentrl's API refused the request ({exc.response.status_code}): {detail}"
    except httpx.HTTPError as exc:
        return f"agentrl's API at {config.api_url} is unreachable ({type(exc).__name__}: {exc})"
