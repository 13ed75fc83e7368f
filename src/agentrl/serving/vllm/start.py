"""Build and start the supervised vLLM for one base model (settings -> server -> backend)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentrl.serving.config import DeploySettings
from agentrl.serving.vllm.backend import VllmBackend
from agentrl.serving.vllm.base import base_folder
from agentrl.serving.vllm.env import find_python
from agentrl.serving.vllm.lora import lora_limits
from agentrl.serving.vllm.server import VllmServer
from agentrl.serving.vllm.settings import VllmSettings


async def start_vllm(
    spec: dict[str, Any],
    cache_dir: Path,
    deploy: DeploySettings | None = None,
    vllm: VllmSettings | None = None,
    data_dir: Path | None = None,
    adapters: int = 0,
    rank: int = 0,
) -> VllmBackend:
    """Find vLLM's Python (VllmNotInstalled names `agentrl vllm setup`), materialise the base
    folder, start the supervisor (it keeps restarting vLLM) and return the backend at once.
    `adapters`/`rank`: the adapters expected live at once and their largest rank, to size
    vLLM's LoRA limits from the start (the backend raises them later if needed, by a
    restart)."""
    from agentrl.core.settings import get_settings

    deploy = deploy or DeploySettings()
    vllm = vllm or VllmSettings()
    data = Path(data_dir or get_settings().data_dir)
    python = await asyncio.to_thread(find_python, vllm.python, data)
    model = await asyncio.to_thread(base_folder, spec, data)
    (data / "deploy").mkdir(parents=True, exist_ok=True)
    limits = lora_limits(
        adapters, rank, floor_loras=vllm.max_loras, floor_rank=vllm.max_lora_rank,
        cap=vllm.max_loras_cap,
    )  # fmt: skip
    server = VllmServer(
        python,
        model,
        host=vllm.host,
        port=vllm.port,
        served_name=vllm.served_name,
        max_model_len=vllm.max_model_len,
        max_lora_rank=limits.max_lora_rank,
        max_loras=limits.max_loras,
        max_cpu_loras=limits.max_cpu_loras,
        dtype=vllm.dtype,
        kv_cache_gib=vllm.kv_cache_gib,
        tool_call_parser=vllm.tool_call_parser,
        extra_args=vllm.extra_args,
        log_path=data / "deploy" / "vllm.log",
        startup_timeout_s=vllm.startup_timeout_s,
        restart_base_s=vllm.restart_base_s,
        restart_max_s=vllm.restart_max_s,
    )
    spec = {"name": spec.get("name"), "seed": spec.get("seed") or 0,
            "tiny_kwargs": spec.get("tiny_kwargs")}  # fmt: skip
    backend = VllmBackend(
        server, spec, cache_dir, timeout_s=deploy.backend_timeout_s, settings=vllm
    )
    server.start()
    return backend
