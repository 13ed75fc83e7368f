"""`agentrl bench trainer`: tokens/s of one policy-gradient update, ours vs TRL vs a ceiling.

One update = loss forward, backward, gradient clipping, AdamW step, on a batch of 8
sequences of 100 prompt + 32 action tokens, fp32, same model and weights for all three:
- ours:    `PolicyTrainer` (length-bucketed micro-batch, LM head on action positions only,
           entropy metric on action tokens, PPO-clip surrogate, token-level mean)
- trl:     TRL's `GRPOTrainer.compute_loss` on the same prompt/completion tensors (its
           loss, its log-prob path), then the same backward/clip/AdamW step
- ceiling: a plain PyTorch loop: decoder -> gather action positions -> LM head ->
           log-softmax -> clipped surrogate; nothing else (no entropy, no metrics)
Tokens/s counts every token of the batch (prompt + action) per second of update.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import body_and_head
from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
from agentrl.llm.losses import ppo_clip_token_loss
from agentrl.llm.samples import PolicySample
from agentrl.llm.trainer import PolicyTrainer

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class BenchCase:
    label: str
    model: str  # "tiny" or "smollm2"
    lora: bool


@dataclass
class Batch:
    prompt: torch.Tensor  # [B, P]
    action: torch.Tensor  # [B, A]
    advantages: torch.Tensor  # [B]

    @property
    def tokens(self) -> int:
        return int(self.prompt.numel() + self.action.numel())


def make_batch(vocab: int, n: int = 8, prompt_len: int = 100, action_len: int = 32) -> Batch:
    gen = torch.Generator().manual_seed(0)
    low = 10  # avoid special tokens
    return Batch(
        prompt=torch.randint(low, vocab, (n, prompt_len), generator=gen),
        action=torch.randint(low, vocab, (n, action_len), generator=gen),
        advantages=torch.randn(n, generator=gen),
    )


def _fresh_model(case: BenchCase, tiny_kwargs: dict[str, Any] | None) -> Any:
    policy = load_policy(
        case.model, seed=0, tiny_kwargs=tiny_kwargs if case.model == "tiny" else None
    )
    return policy


def time_round_robin(
    steps: dict[str, Callable[[], None]], warmup: int, rounds: int
) -> dict[str, float]:
    """Median seconds per update of each implementation, timed in turns (A B C, B C A,
    C A B, ...) so that load from other processes hits all of them alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate who goes first
            step = steps[name]
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def setup_ours(case: BenchCase, batch: Batch, lr: float, tiny: Any) -> Callable[[], None]:
    policy = _fresh_model(case, tiny)
    if case.lora:
        policy.lora = LoraSettings(r=16, alpha=32, target_modules=LORA_TARGETS)
        policy.model = apply_lora(policy.model, policy.lora)
    cfg = TrainerConfig(
        model=case.model,
        lora_r=16 if case.lora else 0,
        learning_rate=lr,
        batch_size=len(batch.advantages),
        micro_batch_tokens=1 << 20,
        skip_zero_advantage=False,
    )
    trainer = PolicyTrainer(policy, cfg)
    samples = [
        PolicySample(
            batch.prompt[i].tolist(), batch.action[i].tolist(), advantage=float(batch.advantages[i])
        )
        for i in range(len(batch.advantages))
    ]
    samples = trainer.prepare(samples)  # old log-probs, as a rollout would have supplied

    def step() -> None:
        trainer._pg_step(samples)

    return step


def setup_ceiling(case: BenchCase, batch: Batch, lr: float, tiny: Any) -> Callable[[], None]:
    policy = _fresh_model(case, tiny)
    model = policy.model
    if case.lora:
        model = apply_lora(model, LoraSettings(r=16, alpha=32, target_modules=LORA_TARGETS))
    model.train()
    body, head = body_and_head(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids = torch.cat([batch.prompt, batch.action], dim=1)
    mask = torch.ones_like(ids)
    p_len, a_len = batch.prompt.shape[1], batch.action.shape[1]
    pos = torch.arange(p_len - 1, p_len - 1 + a_len)
    targets = batch.action.reshape(-1)
    adv = batch.advantages[:, None].expand(-1, a_len).reshape(-1)
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        old = F.log_softmax(head(hidden[:, pos].reshape(-1, hidden.shape[-1])).float(), -1)
        old = old.gather(-1, targets[:, None]).squeeze(-1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        logits = head(hidden[:, pos].reshape(-1, hidden.shape[-1])).float()
        logp = F.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        loss, _ = ppo_clip_token_loss(logp, old, adv, 0.2)
        loss.mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


def _zero_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    return [0.0] * len(completions)  # never called: the benchmark skips generation


def setup_trl(case: BenchCase, batch: Batch, lr: float, tiny: Any) -> Callable[[], None]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    policy = _fresh_model(case, tiny)
    model, tokenizer = policy.model, policy.tokenizer
    peft_config = None
    if case.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=list(LORA_TARGETS),
            task_type="CAUSAL_LM",
        )
    n = len(batch.advantages)
    out = tempfile.mkdtemp(prefix="agentrl-bench-trl-")
    args = GRPOConfig(
        output_dir=out,
        report_to=[],
        use_cpu=True,
        bf16=False,
        learning_rate=lr,
        per_device_train_batch_size=n,
        num_generations=n,
        max_completion_length=batch.action.shape[1],
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        loss_type="bnpo",  # token-level mean over the batch, like ours
        beta=0.0,
        max_grad_norm=1.0,
        logging_steps=10**9,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=_zero_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * n}),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which we skip
    tmodel: Any = trainer.model
    tmodel.train()
    opt: Any = trainer.optimizer
    params = [p for p in tmodel.parameters() if p.requires_grad]
    inputs = {
        "prompt_ids": batch.prompt,
        "prompt_mask": torch.ones_like(batch.prompt),
        "completion_ids": batch.action,
        "completion_mask": torch.ones_like(batch.action),
        "advantages": batch.advantages,
        "num_items_in_batch": torch.tensor(float(batch.action.numel())),
    }
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            tmodel,
            torch.cat([batch.prompt, batch.action], 1),
            torch.ones(n, batch.prompt.shape[1] + batch.action.shape[1], dtype=torch.long),
            batch.action.shape[1],
        )
    inputs["old_per_token_logps"] = logps.detach()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(tmodel, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    return step


def run_trainer_benchmark(
    cases: list[BenchCase],
    warmup: int = 1,
    rounds: int = 3,
    lr: float = 1e-5,
    tiny_kwargs: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measure every case with the three implementations; rows for the table and figures."""
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}
    for case in cases:
        vocab = 49152
        batch = make_batch(vocab)
        fns = {}
        for name, setup in (("ceiling", setup_ceiling), ("ours", setup_ours), ("trl", setup_trl)):
            if progress:
                progress(f"{case.label}: setting up {name}")
            fns[name] = setup(case, batch, lr, tiny_kwargs)
        if progress:
            progress(f"{case.label}: timing {rounds} rounds")
        seconds = time_round_robin(fns, warmup, rounds)
        results = {name: batch.tokens / sec for name, sec in seconds.items()}
        del fns
        gc.collect()
        row = {
            "case": case.label,
            "ours tok/s": results["ours"],
            "trl tok/s": results["trl"],
            "ceiling tok/s": results["ceiling"],
            "ours/trl": results["ours"] / results["trl"],
            "ours/ceiling": results["ours"] / results["ceiling"],
            "trl/ceiling": results["trl"] / results["ceiling"],
        }
        rows.append(row)
        key = case.label.replace("-", "_").replace(" ", "_")
        figures[f"{key}_ours_tokens_per_s"] = results["ours"]
        figures[f"{key}_trl_tokens_per_s"] = results["trl"]
        figures[f"{key}_ceiling_tokens_per_s"] = results["ceiling"]
    headline = next((r for r in rows if "lora" in r["case"] and "smollm2" in r["case"]), rows[-1])
    figures.update(
        headline_case=headline["case"],
        ours_tokens_per_s=headline["ours tok/s"],
        trl_tokens_per_s=headline["trl tok/s"],
        ceiling_tokens_per_s=headline["ceiling tok/s"],
        ratio_vs_trl=headline["ours/trl"],
        fraction_of_ceiling=headline["ours/ceiling"],
        batch="8 x (100 prompt + 32 action) tokens, fp32, CPU",
        rounds_timed=rounds,
    )
    return rows, figures


CASES = {
    "tiny": BenchCase("tiny-full", "tiny", False),
    "smollm2-full": BenchCase("smollm2-full", "smollm2", False),
    "smollm2-lora": BenchCase("smollm2-lora", "smollm2", True),
}
