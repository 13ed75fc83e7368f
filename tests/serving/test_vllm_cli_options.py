"""`agentrl vllm setup` draws its options from `SetupOptions` (issue 55.3): each field an
option helped by its docstring, unset options keep the model's values, and `--torch-index ''`
still means no extra index (what the guide's CPU line relies on)."""

from __future__ import annotations

from agentrl.serving.vllm.env import TORCH_CPU_INDEX
from agentrl.serving.vllm.options import SetupOptions
from config_cli_check import check_fields, shown


def test_the_options_are_setup_options_fields() -> None:
    check_fields(["vllm", "setup"], SetupOptions, every_option=True, all_described=True)
    got = shown(["vllm", "setup", "--cuda", "--path", "/tmp/v"])
    assert got == {"path": "/tmp/v", "cuda": True, "torch_index": TORCH_CPU_INDEX}
    assert shown(["vllm", "setup", "--torch-index", ""])["torch_index"] is None
    assert shown(["vllm", "setup", "--torch-index", "https://x/whl"])["torch_index"] == (
        "https://x/whl"
    )
