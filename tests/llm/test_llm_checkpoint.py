"""Checkpoints: save, rotate, verify, resume (optimiser + schedule), LoRA reload, S3."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.core.errors import TrainingError
from agentrl.llm.checkpoint import CheckpointManager
from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import run_head
from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
from agentrl.llm.samples import PolicySample, collate
from agentrl.llm.trainer import PolicyTrainer

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def trainer_for(tmp: Path | str, lora: bool = False, **kw) -> PolicyTrainer:
    cfg = TrainerConfig(
        model="tiny",
        lora_r=4 if lora else 0,
        learning_rate=1e-2,
        batch_size=2,
        warmup_steps=2,
        total_steps=20,
        storage_path=str(tmp),
        **kw,
    )
    policy = load_policy("tiny", seed=0, tiny_kwargs=TINY)
    if lora:
        policy.lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
        policy.model = apply_lora(policy.model, policy.lora)
    return PolicyTrainer(policy, cfg)


def batch(i: int) -> list[PolicySample]:
    return [
        PolicySample([5, 6, 7 + i], [8 + i, 9], advantage=1.0 if j % 2 else -1.0) for j in range(4)
    ]


def logps(trainer: PolicyTrainer) -> torch.Tensor:
    mb = collate(
        [PolicySample([5, 6, 7], [8, 9, 10]), PolicySample([11, 12], [13])], trainer.pad_id
    )
    with torch.no_grad():
        return run_head(trainer.head, mb, "cpu")["logp"]


def params(trainer: PolicyTrainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.head.parameters()])


def test_save_rotate_resume_round_trip(tmp_path: Path) -> None:
    a = trainer_for(tmp_path)
    ckpt = CheckpointManager(str(tmp_path), max_checkpoints=2, run_info={"data": "unit test"})
    for i in range(3):
        a.train_on_samples(batch(i))  # 2 optimiser steps each
        ckpt.save(a, {"reward_mean": float(i)})
    assert ckpt.list_steps() == ["step-00000004", "step-00000006"]  # step-2 rotated away
    name = ckpt.latest()
    assert name is not None and ckpt.verify(name)
    folder = tmp_path / name
    card = (folder / "model_card.md").read_text()
    assert "tiny-random-llama" in card and "algorithm: gigpo" in card and "unit test" in card
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "trainer_state.pt" in manifest["files"] and "tokenizer_config.json" in manifest["files"]

    # Resume into a fresh trainer: same weights, step, lr; continuing gives the same result.
    b = trainer_for(tmp_path)
    assert not torch.equal(params(a), params(b))
    assert ckpt.resume(b) == name
    assert torch.equal(params(a), params(b))
    assert b.global_step == 6 and b.learning_rate == pytest.approx(a.learning_rate)
    a.train_on_samples(batch(7))
    b.train_on_samples(batch(7))
    assert torch.allclose(params(a), params(b), atol=1e-6)  # optimiser moments restored

    # A tampered file fails verification and refuses to resume.
    (folder / "metrics.json").write_text("{}")
    assert not ckpt.verify(name)
    with pytest.raises(TrainingError):
        ckpt.resume(trainer_for(tmp_path), name)


def test_best_and_final_are_kept(tmp_path: Path) -> None:
    t = trainer_for(tmp_path)
    ckpt = CheckpointManager(str(tmp_path), max_checkpoints=1)
    assert ckpt.save_best(t, 0.5, {})
    t.train_on_samples(batch(1))
    assert not ckpt.save_best(t, 0.4, {})
    assert ckpt.save_best(t, 0.7, {})
    ckpt.save(t, name="final")
    for _ in range(3):
        t.train_on_samples(batch(2))
        ckpt.save(t)
    assert ckpt.verify("best") and ckpt.verify("final") and len(ckpt.list_steps()) == 1
    assert json.loads((tmp_path / "best" / "metrics.json").read_text())["best_score"] == 0.7
    assert CheckpointManager(str(tmp_path)).best_score == 0.7  # survives a restart


def test_lora_save_and_reload_gives_identical_logprobs(tmp_path: Path) -> None:
    t = trainer_for(tmp_path, lora=True)
    t.train_on_samples(batch(0))
    ckpt = CheckpointManager(str(tmp_path))
    ckpt.save(t, name="final")
    folder = tmp_path / "final"
    assert (folder / "adapter_model.safetensors").exists()
    assert not (folder / "model.safetensors").exists()  # adapters only, not the base
    reloaded = load_policy(str(folder))
    assert reloaded.is_lora
    t2 = PolicyTrainer(reloaded, t.config)
    assert torch.equal(logps(t), logps(t2))


def test_failed_save_leaves_earlier_checkpoints(tmp_path: Path) -> None:
    t = trainer_for(tmp_path)
    ckpt = CheckpointManager(str(tmp_path), max_checkpoints=5)
    t.train_on_samples(batch(0))
    first = ckpt.save(t)

    class Broken:
        def save_pretrained(self, *a, **k):
            raise OSError("disk full")

    good_tok = t.policy.tokenizer
    t.policy.tokenizer = Broken()  # type: ignore[assignment]
    t.train_on_samples(batch(1))
    with pytest.raises(TrainingError) as err:
        ckpt.save(t)
    assert err.value.code == "INFRA" and "disk full" in str(err.value)
    t.policy.tokenizer = good_tok
    assert ckpt.list_steps() == [first.rsplit("/", 1)[-1]] and ckpt.verify(ckpt.list_steps()[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def s3_endpoint():
    pytest.importorskip("moto")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_s3_checkpoints_through_s3fs(s3_endpoint: str, tmp_path: Path, monkeypatch) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="models")
    url = "s3://models/rl-checkpoints/job-1"
    opts = {"endpoint_url": s3_endpoint, "key": "test", "secret": "test"}
    t = trainer_for(tmp_path, lora=True)
    ckpt = CheckpointManager(url, max_checkpoints=1, storage_options=opts)
    t.train_on_samples(batch(0))
    ckpt.save(t)
    t.train_on_samples(batch(1))
    saved = ckpt.save(t)
    assert saved == f"{url}/step-00000004"
    assert ckpt.list_steps() == ["step-00000004"] and ckpt.verify("step-00000004")
    fresh = trainer_for(tmp_path, lora=True)
    CheckpointManager(url, storage_options=opts).resume(fresh)
    assert torch.equal(logps(t), logps(fresh)) and fresh.global_step == 4
