"""A loop job continuing the tool-use warm start (`--init-checkpoint`) trains the adapters the
start has, on the layers it has them, and no others (issue 52: the job used to add fresh
adapters on every layer, 3.75 times the warm start's, each moved a full Adam step)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner
from agentrl.llm.config import TrainerConfig
from agentrl.llm.trainer import PolicyTrainer
from agentrl.training.jobs import continue_from, init_lora_shape


def adapted_layers(model: torch.nn.Module) -> set[int]:
    found = set()
    for name, p in model.named_parameters():
        m = re.search(r"layers\.(\d+)\..*lora_", name)
        if m and p.requires_grad:
            found.add(int(m.group(1)))
    return found


def test_a_job_continuing_a_top_layers_start_adapts_only_its_layers(tmp_path: Path) -> None:
    cfg = ToolUseConfig(
        model="tiny",
        threads=0,
        warm_start=False,
        lora_layers=1,
        structured=False,
        out_dir=str(tmp_path / "w"),
    )  # type: ignore[call-arg]
    start = ToolUseLearner(cfg)
    layers = int(start.model.config.num_hidden_layers)
    assert layers >= 2 and adapted_layers(start.model) == {layers - 1}
    with torch.no_grad():  # a start whose adapters do something
        for name, p in start.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    folder = start.save("warmstart", {})

    shape = init_lora_shape(folder)
    assert shape["lora_layers"] == [layers - 1]
    config = TrainerConfig(model="tiny", storage_path=str(tmp_path / "job"), **shape)
    job = PolicyTrainer.from_config(config, None)
    continue_from(job, folder)
    assert adapted_layers(job.policy.model) == {layers - 1}
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        want = start.model(input_ids=ids).logits
        got = job.policy.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)  # the job starts where the start is
    # a start saved before trainer_config.json named its layers: adapter_config.json does
    tc = Path(folder) / "trainer_config.json"
    saved = json.loads(tc.read_text())
    saved.pop("lora_layers", None)
    tc.write_text(json.dumps(saved))
    assert init_lora_shape(folder)["lora_layers"] == [layers - 1]
