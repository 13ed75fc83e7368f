"""The update on a real tiny transformer: masking, learning a rewarded action, DPO, PPO,
and the errors a training job can end with."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from agentrl.core.errors import TrainingError
from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import run_head
from agentrl.llm.loading import load_policy
from agentrl.llm.samples import (
    PolicySample,
    collate,
    encode_action,
    make_microbatches,
    padding_fraction,
    render_prompt,
    sample_from_step,
)
from agentrl.llm.trainer import PolicyTrainer, PreferencePair
from agentrl.rollout.models import StepData

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def make_trainer(**overrides) -> PolicyTrainer:
    values = {"model": "tiny", "lora_r": 0, "learning_rate": 3e-3, "batch_size": 8}
    values.update(overrides)
    cfg = TrainerConfig(**values)
    policy = load_policy("tiny", seed=cfg.seed, tiny_kwargs=TINY)
    if cfg.is_lora:
        from agentrl.llm.loading import LoraSettings, apply_lora

        policy.model = apply_lora(
            policy.model, LoraSettings(r=cfg.lora_r, target_modules=("q_proj", "v_proj"))
        )
        policy.lora = LoraSettings(r=cfg.lora_r)
    return PolicyTrainer(policy, cfg)


def seq_logp(trainer: PolicyTrainer, prompt: list[int], action: list[int]) -> float:
    mb = collate([PolicySample(prompt, action)], trainer.pad_id)
    with torch.no_grad():
        return float(run_head(trainer.head, mb, "cpu")["logp"].sum())


def test_action_only_head_matches_full_logits_and_masks_prompt(smol_tokenizer) -> None:
    trainer = make_trainer()
    tok = smol_tokenizer
    samples = [
        PolicySample(
            render_prompt(tok, [{"role": "user", "content": "Go left."}]),
            encode_action(tok, "left"),
            advantage=1.0,
        ),
        PolicySample(
            render_prompt(tok, [{"role": "user", "content": "A longer prompt here."}]),
            encode_action(tok, "up up"),
            advantage=-0.5,
        ),
    ]
    mb = collate(samples, trainer.pad_id)
    model = trainer.head.model
    # Reference: full logits at every position, masked to the action tokens.
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
    logits = out.logits
    logits.retain_grad()
    logp_full = (
        F.log_softmax(logits.float(), -1)[:, :-1]
        .gather(-1, mb.input_ids[:, 1:].unsqueeze(-1))
        .squeeze(-1)
    )
    mask = torch.zeros_like(logp_full)
    for b, s in enumerate(samples):
        start = len(s.prompt_ids)
        mask[b, start - 1 : start - 1 + len(s.action_ids)] = 1
    ref_logp = logp_full[mask.bool()]
    ours = run_head(trainer.head, mb, "cpu")["logp"]
    assert torch.allclose(ours, ref_logp, atol=1e-5)
    # No gradient reaches the logits of prompt (or padding) positions.
    (ref_logp * mb.per_token([s.advantage for s in samples])).sum().backward()
    grad = logits.grad.abs().sum(-1)[:, :-1]
    assert float(grad[~mask.bool()].sum()) == 0.0
    assert float(grad[mask.bool()].min()) > 0.0


def test_padding_does_not_change_the_loss_and_bucketing_limits_padding(smol_tokenizer) -> None:
    trainer = make_trainer()
    tok = smol_tokenizer
    short = PolicySample(
        render_prompt(tok, [{"role": "user", "content": "hi"}]), encode_action(tok, "yes")
    )
    long = PolicySample(
        render_prompt(tok, [{"role": "user", "content": "word " * 60}]), encode_action(tok, "no")
    )
    alone = run_head(trainer.head, collate([short], trainer.pad_id), "cpu")["logp"]
    padded = run_head(trainer.head, collate([short, long], trainer.pad_id), "cpu")["logp"]
    assert torch.allclose(alone, padded[: len(alone)], atol=1e-5)
    mixed = [short, long] * 4
    one = make_microbatches(mixed, max_tokens=10_000, pad_id=0, max_seqs=2)
    bucketed = make_microbatches(mixed, max_tokens=10_000, pad_id=0, max_seqs=4)
    assert padding_fraction(bucketed) < 0.05  # shorts with shorts, longs with longs
    assert sum(b.num_action_tokens for b in one) == sum(len(s.action_ids) for s in mixed)


def test_tiny_model_learns_the_rewarded_action(smol_tokenizer) -> None:
    """A bandit: the prompt offers yes/no; 'yes' always pays 1. Sample from the policy,
    GRPO advantages, clipped updates: P(yes) must rise clearly."""
    from agentrl.advantages import grpo_advantages

    trainer = make_trainer(algorithm="grpo", learning_rate=2e-3, epochs=2, batch_size=8)
    tok = smol_tokenizer
    prompt = render_prompt(tok, [{"role": "user", "content": "Answer yes or no."}])
    yes, no = encode_action(tok, "yes"), encode_action(tok, "no")
    gen = torch.Generator().manual_seed(0)

    def p_yes() -> float:
        a, b = seq_logp(trainer, prompt, yes), seq_logp(trainer, prompt, no)
        return 1.0 / (1.0 + math.exp(b - a))

    before = p_yes()
    for _ in range(8):
        p = p_yes()
        picks = torch.bernoulli(torch.full((8,), p), generator=gen).bool().tolist()
        rewards = [1.0 if pick else 0.0 for pick in picks]
        if len(set(rewards)) == 1:  # force both actions into the group so it has signal
            picks[0], rewards[0] = (not picks[0]), 1.0 - rewards[0]
        adv = grpo_advantages(rewards, [0] * 8)
        samples = [
            PolicySample(prompt, yes if pick else no, advantage=float(a), reward=r)
            for pick, a, r in zip(picks, adv, rewards, strict=True)
        ]
        trainer.train_on_samples(samples)
    after = p_yes()
    assert after > 0.9 and after > before + 0.3, (before, after)


def test_metrics_callback_and_schedule() -> None:
    seen: list[dict] = []
    trainer = make_trainer(warmup_steps=2, total_steps=6, min_lr_ratio=0.1, batch_size=2)
    trainer.callback = seen.append
    samples = [
        PolicySample([5, 6, 7], [8, 9], advantage=(-1.0) ** i, reward=float(i % 2))
        for i in range(12)
    ]
    trainer.train_on_samples(samples)
    assert len(seen) == 6
    lrs = [m["learning_rate"] for m in seen]
    base = trainer.config.learning_rate
    assert math.isclose(lrs[0], base * 1.0) and lrs[-1] == pytest.approx(base * 0.1)
    for key in (
        "loss",
        "policy_entropy",
        "approx_kl",
        "clip_fraction",
        "reward_mean",
        "reward_std",
        "learning_rate",
        "tokens_per_s",
    ):
        assert key in seen[0] and math.isfinite(seen[0][key])


def test_training_is_deterministic() -> None:
    def run() -> torch.Tensor:
        trainer = make_trainer(seed=3, batch_size=3)
        samples = [
            PolicySample([5, 6, 7 + i], [8, 9 + i], advantage=float(i - 2)) for i in range(6)
        ]
        trainer.train_on_samples(samples)
        return torch.cat([p.detach().flatten() for p in trainer.head.parameters()])

    assert torch.equal(run(), run())


def test_the_same_seed_gives_the_same_adapters_whatever_ran_before() -> None:
    """A job's LoRA init came from the global generator as earlier work left it (seeded only
    after the adapters were made), so two equal jobs in one process trained apart."""
    from agentrl.llm.loading import LoraSettings

    def adapters(noise: int) -> torch.Tensor:
        torch.randn(noise)  # earlier work in the process moves the global generator
        lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
        policy = load_policy("tiny", lora=lora, seed=5, tiny_kwargs=TINY)
        named = policy.model.named_parameters()
        return torch.cat([p.detach().flatten() for n, p in named if "lora_" in n])

    first = adapters(1)
    assert first.abs().sum() > 0 and torch.equal(first, adapters(1000))
    state = torch.random.get_rng_state()
    adapters(0)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's generator untouched


def test_sample_from_stepdata_uses_rollout_tokens_or_renders(smol_tokenizer) -> None:
    tok = smol_tokenizer
    exact = StepData(
        0,
        {"messages": [{"role": "user", "content": "x"}]},
        {"type": "text"},
        policy_logprobs={
            "prompt_ids": [1, 2, 3],
            "tokens": [4, 5],
            "token_logprobs": [-0.5, -0.25],
        },
    )
    s = sample_from_step(exact, tok, advantage=2.0)
    assert s.prompt_ids == [1, 2, 3] and s.action_ids == [4, 5]
    assert s.old_logprobs is not None and s.old_logprobs.tolist() == [-0.5, -0.25]
    history = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(6)
    ]
    step = StepData(
        1, {"messages": history}, {"type": "text", "content": "go"}, raw_policy_output="go"
    )
    s2 = sample_from_step(step, tok, advantage=1.0, history_window=2)
    text = tok.decode(s2.prompt_ids)
    assert "sys" in text and "m5" in text and "m4" in text and "m3" not in text
    assert s2.action_ids[-1] == tok.eos_token_id and s2.old_logprobs is None


def test_dpo_prefers_the_chosen_trajectory(smol_tokenizer) -> None:
    trainer = make_trainer(algorithm="dpo", learning_rate=3e-3, dpo_beta=0.5, batch_size=4)
    tok = smol_tokenizer
    prompt = render_prompt(tok, [{"role": "user", "content": "Pick."}])
    good, bad = encode_action(tok, "good"), encode_action(tok, "bad")
    pairs = [
        PreferencePair(
            [PolicySample(list(prompt), list(good))],
            [PolicySample(list(prompt), list(bad))],
            margin=1.0,
        )
        for _ in range(4)
    ]
    gap0 = seq_logp(trainer, prompt, good) - seq_logp(trainer, prompt, bad)
    history = []
    for _ in range(5):
        history += trainer.train_on_pairs(pairs)
    gap1 = seq_logp(trainer, prompt, good) - seq_logp(trainer, prompt, bad)
    assert gap1 > gap0 + 1.0
    assert history[-1]["loss"] < history[0]["loss"] and history[-1]["dpo_accuracy"] == 1.0


def test_lora_kl_reference_is_base_with_adapters_off() -> None:
    trainer = make_trainer(lora_r=4, kl_coef=0.5, learning_rate=1e-2, batch_size=4)
    samples = [
        PolicySample([5, 6, 7], [8, 9], advantage=1.0),
        PolicySample([5, 6, 7], [10, 11], advantage=-1.0),
    ]
    history = []
    for _ in range(4):
        for s in samples:
            s.old_logprobs = None
        history += trainer.train_on_samples(samples)
    assert trainer.reference is None  # no second copy of the weights
    assert history[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # adapters start at zero
    assert history[-1]["kl_ref"] > 0.0


def test_ppo_trains_value_head() -> None:
    trainer = make_trainer(algorithm="ppo", learning_rate=1e-2, batch_size=4, epochs=3)
    samples = [PolicySample([5, 6, 7 + i], [8], advantage=1.0, ret=2.0) for i in range(4)]
    hist = trainer.train_on_samples(samples)
    assert trainer.head.value_head is not None
    assert hist[-1]["value_loss"] < hist[0]["value_loss"]


def test_bad_input_maps_to_error_codes() -> None:
    with pytest.raises(TrainingError) as e1:
        TrainerConfig(algorithm="a3c")
    assert e1.value.code == "DATA" and "a3c" in str(e1.value)
    with pytest.raises(TrainingError) as e2:
        load_policy("/nonexistent/model-dir")
    assert e2.value.code == "INFRA" and "/nonexistent/model-dir" in str(e2.value)
    trainer = make_trainer()
    with pytest.raises(TrainingError) as e3:
        trainer.train_on_samples([PolicySample([1, 2], [3], advantage=0.0)])
    assert e3.value.code == "DATA"
    with pytest.raises(TrainingError) as e4:
        trainer.train_on_samples([PolicySample([1, 2], [3], advantage=float("nan"))])
    assert e4.value.code == "DATA" and "NaN" in str(e4.value)
    with torch.no_grad():  # a diverged model: NaN weights give a NaN loss
        next(trainer.head.model.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingError) as e5:
        trainer.train_on_samples([PolicySample([1, 2], [3], advantage=1.0)])
    assert e5.value.code == "CONVERGENCE" and "nan" in str(e5.value).lower()


def test_config_from_the_seed_training_request() -> None:
    from agentrl.contracts.training import TrainingRequest

    request = TrainingRequest.model_validate(
        {
            "training_job_id": "5f1f6a52-7d0b-4d7e-9f61-2b7f1b0c1a11",
            "timestamp": "2025-12-08T13:00:00Z",
            "requester": "rl-trainer-subordinate",
            "trigger_reason": "manual",
            "training_config": {
                "algorithm": "grpo",
                "base_model": "qwen2.5-32b-instruct",
                "hyperparameters": {
                    "learning_rate": 1e-5,
                    "batch_size": 32,
                    "epochs": 3,
                    "clip_epsilon": 0.2,
                    "gamma": 0.99,
                    "gae_lambda": 0.95,
                },
                "compute": {
                    "gpu_count": 2,
                    "gpu_type": "a100",
                    "distributed": True,
                    "mixed_precision": "bf16",
                },
                "checkpointing": {
                    "save_interval": 1000,
                    "max_checkpoints": 5,
                    "storage_path": "s3://pmoves-models/rl-checkpoints/",
                },
            },
        }
    )
    cfg = TrainerConfig.from_training_request(request, device="cpu")
    assert (cfg.algorithm, cfg.model, cfg.epochs, cfg.batch_size) == (
        "grpo",
        "qwen2.5-32b-instruct",
        3,
        32,
    )
    assert cfg.distributed and cfg.mixed_precision == "bf16" and cfg.device == "cpu"
    assert cfg.storage_path.startswith("s3://") and cfg.max_checkpoints == 5
