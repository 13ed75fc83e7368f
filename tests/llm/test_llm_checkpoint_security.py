"""Loading a checkpoint never runs its code: pickles are refused, the manifest is checked
before anything is loaded, and manifest paths cannot leave the checkpoint folder. Each test
is an attack that worked against `torch.load(weights_only=False)` and an unchecked join."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from agentrl.core.errors import TrainingError
from agentrl.llm.checkpoint import (
    MANIFEST,
    STATE_FILE,
    CheckpointManager,
    check_manifest,
    load_checkpoint_policy,
    sha256_file,
)
from agentrl.llm.config import TrainerConfig
from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
from agentrl.llm.samples import PolicySample
from agentrl.llm.trainer import PolicyTrainer

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def trainer(tmp: Path, lora: bool = False) -> PolicyTrainer:
    cfg = TrainerConfig(
        model="tiny", lora_r=4 if lora else 0, batch_size=2, total_steps=4, storage_path=str(tmp)
    )
    policy = load_policy("tiny", seed=0, tiny_kwargs=TINY)
    if lora:
        policy.lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
        policy.model = apply_lora(policy.model, policy.lora)
    return PolicyTrainer(policy, cfg)


def saved(tmp: Path, lora: bool = False) -> tuple[CheckpointManager, Path]:
    t = trainer(tmp, lora)
    t.train_on_samples([PolicySample([5, 6, 7], [8, 9], advantage=1.0) for _ in range(2)])
    ckpt = CheckpointManager(str(tmp / "ckpts"))
    ckpt.save(t, name="final")
    return ckpt, tmp / "ckpts" / "final"


def relist(folder: Path, extra: dict[str, str] | None = None) -> None:
    """What an attacker who can write the folder does: rewrite the manifest to match."""
    manifest = json.loads((folder / MANIFEST).read_text())
    files = {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest["files"] = {**files, **(extra or {})}
    (folder / MANIFEST).write_text(json.dumps(manifest))


class Payload:
    """Unpickling this writes a marker file: proof that loading ran the checkpoint's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_in_trainer_state_never_runs(tmp_path: Path) -> None:
    ckpt, folder = saved(tmp_path)
    marker = tmp_path / "pwned"
    state = torch.load(folder / STATE_FILE, weights_only=True)  # the real state loads safely
    state["optimizer"]["evil"] = Payload(marker)
    with open(folder / STATE_FILE, "wb") as fh:
        pickle.dump(state, fh)  # a plain pickle: torch.load(weights_only=False) would run it
    relist(folder)  # the manifest is rewritten too, so the checksum alone cannot catch it
    with pytest.raises(TrainingError, match="unsafe or unreadable trainer state"):
        ckpt.resume(trainer(tmp_path), "final")
    assert not marker.exists()


def test_manifest_is_checked_before_loading(tmp_path: Path) -> None:
    ckpt, folder = saved(tmp_path)
    check_manifest(folder)  # a fresh checkpoint passes
    # an unlisted weights file would be globbed and loaded
    (folder / "zz-extra.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    assert not ckpt.verify("final")
    with pytest.raises(TrainingError, match="not in the manifest"):
        ckpt.resume(trainer(tmp_path), "final")
    (folder / "zz-extra.safetensors").unlink()
    # a changed weight file, manifest untouched
    raw = bytearray((folder / "model.safetensors").read_bytes())
    raw[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(TrainingError, match="does not match its sha256"):
        ckpt.resume(trainer(tmp_path), "final")


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_manifest_paths_cannot_leave_the_folder(tmp_path: Path, kind: str) -> None:
    ckpt, folder = saved(tmp_path)
    outside = tmp_path / "host-secret.txt"
    outside.write_text("secret")
    if kind == "dotdot":
        relist(folder, {"../../host-secret.txt": sha256_file(outside)})
    elif kind == "absolute":
        relist(folder, {str(outside): sha256_file(outside)})
    else:
        (folder / "link.txt").symlink_to(outside)
        relist(folder)  # lists link.txt with the outside file's hash
    with pytest.raises(TrainingError, match=r"leaves the checkpoint folder|not a relative path"):
        check_manifest(folder)
    assert not ckpt.verify("final")


def test_load_checkpoint_policy_verifies_and_refuses_pickles(tmp_path: Path) -> None:
    _, folder = saved(tmp_path, lora=True)
    policy = load_checkpoint_policy(folder)
    assert policy.is_lora
    marker = tmp_path / "pwned"
    with open(folder / "adapter_model.bin", "wb") as fh:
        pickle.dump(Payload(marker), fh)
    with pytest.raises(TrainingError, match="not in the manifest"):
        load_checkpoint_policy(folder)
    relist(folder)
    with pytest.raises(TrainingError, match="pickle files"):
        load_checkpoint_policy(folder)
    assert not marker.exists()
