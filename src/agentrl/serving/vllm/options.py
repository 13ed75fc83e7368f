"""The settings of `agentrl vllm setup`: the command draws its options from the fields and
docstrings (`agentrl.core.configcli`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from agentrl.serving.vllm.env import TORCH_CPU_INDEX


class SetupOptions(BaseModel):
    """`agentrl vllm setup`: vLLM's own Python environment."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    path: Path | None = None
    """Where to create the environment (default: <data_dir>/vllm-env)."""
    cuda: bool = False
    """The CUDA build (GPU hosts)."""
    torch_index: str | None = TORCH_CPU_INDEX
    """Extra index with PyTorch's CPU wheels ('' for none)."""

    @field_validator("torch_index")
    @classmethod
    def _none_when_empty(cls, url: str | None) -> str | None:
        return url or None
