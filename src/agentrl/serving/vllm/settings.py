"""AGENTRL_VLLM_*: where vLLM's environment is and how its server is started."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class VllmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTRL_VLLM_", env_file=".env", extra="ignore")

    python: Path | None = Field(
        None,
        description="The Python of vLLM's environment (default: <data_dir>/vllm-env/bin/python, "
        "as `agentrl vllm setup` builds it).",
    )
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, description="vLLM's port (0: a free one, kept across restarts).")
    served_name: str = Field("base", description="vLLM's name of the base model.")
    max_model_len: int = Field(2048, gt=0)
    max_lora_rank: int = Field(
        16, gt=0, description="Largest adapter rank vLLM accepts, at least (raised to fit)."
    )
    max_loras: int = Field(
        4, gt=0, description="Adapters in one batch, at least (raised with the live adapters)."
    )
    resize_loras: bool = Field(
        True,
        description="Restart vLLM with larger LoRA limits when one more adapter would not fit "
        "them (false: vLLM refuses the adapter, e.g. a rank above MAX_LORA_RANK).",
    )
    max_loras_cap: int = Field(
        64, gt=0, description="Most adapters in one batch: more live adapters are refused."
    )
    dtype: str = Field("float32", description="vLLM's --dtype (float32 on CPU is exact).")
    kv_cache_gib: float = Field(1.0, gt=0.0, description="VLLM_CPU_KVCACHE_SPACE on CPU hosts.")
    tool_call_parser: str | None = Field(
        "pythonic",
        description="vLLM's --tool-call-parser (with --enable-auto-tool-choice): vLLM answers "
        "tool_choice auto/required/named only with one. pythonic needs no special tokens "
        "(SmolLM2 has none); hermes, llama3_json, ... for models trained on those formats.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` flags.")
    startup_timeout_s: float = Field(900.0, gt=0.0, description="One start, ready or killed.")
    restart_base_s: float = Field(1.0, gt=0.0)
    restart_max_s: float = Field(60.0, gt=0.0)
