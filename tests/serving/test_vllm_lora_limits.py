"""vLLM's LoRA limits sized from the adapters served (issue 53): `--max-loras`,
`--max-lora-rank`, `--max-cpu-loras` on the command line, grown (a restart) when one more
adapter would not fit. vLLM itself cannot run on this machine's CPU build in a test's time:
the argument building and the sizing decisions are tested, the server is never started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.serving.errors import DeployError
from agentrl.serving.vllm.backend import VllmBackend
from agentrl.serving.vllm.lora import LoraLimits, adapter_rank, lora_limits
from agentrl.serving.vllm.server import VllmServer, _flag
from agentrl.serving.vllm.settings import VllmSettings
from deploy_helpers import write_checkpoint


def test_limits_grow_with_live_adapters_in_powers_of_two() -> None:
    assert lora_limits(0, 0) == LoraLimits(4, 16, 8)  # the floors
    assert lora_limits(5, 8) == LoraLimits(8, 16, 16)
    assert lora_limits(16, 16) == LoraLimits(16, 16, 32)
    assert lora_limits(17, 16).max_loras == 32
    assert lora_limits(3, 17).max_lora_rank == 32  # the next rank vLLM accepts
    assert lora_limits(40, 8, cap=48).max_loras == 48  # never above the cap
    with pytest.raises(DeployError, match="MAX_LORAS_CAP"):
        lora_limits(65, 8)
    with pytest.raises(DeployError, match="rank 600"):
        lora_limits(1, 600)


def test_the_command_line_carries_the_limits(tmp_path: Path) -> None:
    server = VllmServer(tmp_path / "python", "base", max_loras=16, max_lora_rank=32)
    args = server.command_args
    assert _flag(args, "--max-loras") == "16"
    assert _flag(args, "--max-lora-rank") == "32"
    assert int(_flag(args, "--max-cpu-loras") or 0) >= 16  # vLLM requires >= max-loras
    assert "--enable-lora" in args


async def test_the_backend_raises_the_limits_when_an_adapter_would_not_fit(
    tmp_path: Path,
) -> None:
    settings = VllmSettings(max_loras=2, max_lora_rank=8, max_loras_cap=8)
    server = VllmServer(tmp_path / "python", "base", max_loras=2, max_lora_rank=8)
    backend = VllmBackend(server, {"name": "tiny"}, tmp_path / "cache", settings=settings)
    small = Path(write_checkpoint(tmp_path / "small", seed=1))  # rank 4
    assert adapter_rank(small) == 4
    for i in range(2):
        await backend._fit(f"v{i}", small)
    assert backend.resizes == 0 and server.lora.max_loras == 2  # two fit two slots
    await backend._fit("v2", small)  # a third live adapter: 4 slots, one restart
    assert backend.resizes == 1 and _flag(server.command_args, "--max-loras") == "4"
    await backend._fit("v3", small)
    assert backend.resizes == 1  # room was left for it
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "adapter_config.json").write_text(json.dumps({"r": 8, "rank_pattern": {"q": 64}}))
    await backend._fit("v4", wide)
    assert _flag(server.command_args, "--max-lora-rank") == "64"
    assert _flag(server.command_args, "--max-loras") == "8"
    await backend.release("v4")
    assert server.lora.max_loras == 8  # never lowered while serving
    for i in range(4, 8):
        await backend._fit(f"w{i}", small)  # 8 live adapters: the cap
    # a ninth is refused with a clear error, vLLM's limits untouched
    with pytest.raises(DeployError, match="CAP"):
        await backend._fit("w8", small)
    assert "w8" not in backend.ranks and server.lora.max_loras == 8


async def test_with_resizing_off_vllm_s_own_limits_decide(tmp_path: Path) -> None:
    settings = VllmSettings(max_loras=2, max_lora_rank=8, resize_loras=False)
    server = VllmServer(tmp_path / "python", "base", max_loras=2, max_lora_rank=8)
    backend = VllmBackend(server, {"name": "tiny"}, tmp_path / "cache", settings=settings)
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "adapter_config.json").write_text(json.dumps({"r": 32}))
    for i in range(3):
        await backend._fit(f"v{i}", wide)
    assert backend.resizes == 0 and server.lora == LoraLimits(2, 8, 2)
