"""The update loop: policy-gradient (GiGPO/GRPO/RLOO/PPO) and DPO steps on a causal LM.

Read top to bottom, one optimiser step is: take a minibatch of `batch_size` samples,
cut it into length-bucketed micro-batches, for each run the body, apply the LM head at the
action positions only, compute the clipped surrogate (+KL, -entropy, +value loss) scaled
so the micro-batch losses add up to the minibatch loss, backward; then clip the gradient
norm, AdamW, and advance the warmup+cosine schedule. `epochs` passes go over the batch.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from agentrl.core.errors import TrainingError
from agentrl.llm.config import TrainerConfig
from agentrl.llm.distributed import DistContext
from agentrl.llm.forward import PolicyHead, run_head, score_samples
from agentrl.llm.loading import LoraSettings, PolicyModel, load_policy
from agentrl.llm.losses import dpo_loss, policy_gradient_loss, value_loss
from agentrl.llm.samples import (
    MicroBatch,
    PolicySample,
    make_microbatches,
    minibatches,
    truncate,
)

Metrics = dict[str, float]
MetricsCallback = Callable[[Metrics], None]


log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Same seed, same run on CPU: python, numpy and torch generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@contextmanager
def training_errors(step: int) -> Iterator[None]:
    """Map failures inside an update onto the status contract's error codes."""
    try:
        yield
    except TrainingError:
        raise
    except torch.OutOfMemoryError as exc:
        raise TrainingError(
            f"out of memory at step {step}: lower micro_batch_tokens or batch_size, or use LoRA",
            "OOM",
        ) from exc
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower():
            raise TrainingError(
                f"out of memory at step {step}: lower micro_batch_tokens or batch_size ({exc})",
                "OOM",
            ) from exc
        raise


@dataclass
class PreferencePair:
    """Two trajectories of the same task; each is the list of its steps as samples."""

    chosen: list[PolicySample]
    rejected: list[PolicySample]
    margin: float = 0.0  # score(chosen) - score(rejected)


class PolicyTrainer:
    """Owns the policy module, optimiser, schedule and step counter of one training run."""

    def __init__(
        self,
        policy: PolicyModel,
        config: TrainerConfig,
        callback: MetricsCallback | None = None,
        dist_ctx: DistContext | None = None,
    ) -> None:
        self.policy = policy
        self.config = config
        self.callback = callback
        self.dist = dist_ctx or (
            DistContext.from_env(config.device) if config.distributed else DistContext.single()
        )
        seed_everything(config.seed)
        self.device = torch.device(config.device)
        self.head = PolicyHead(
            policy.model,
            value_head=config.algorithm == "ppo",
            temperature=config.temperature,
            share_prefix=config.share_prefix,
        ).to(self.device)
        self.head.train()
        # The reference policy: with LoRA the base with adapters off; else a frozen copy.
        self.reference: PolicyHead | None = None
        needs_ref = config.kl_coef > 0 or config.algorithm == "dpo"
        if needs_ref and not policy.is_lora:
            self.reference = copy.deepcopy(self.head).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
        self.module: torch.nn.Module = self.head
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.dist.local_rank] if self.device.type == "cuda" else None
            self.module = DDP(self.head, device_ids=ids)
        params = [p for p in self.head.parameters() if p.requires_grad]
        if not params:
            raise TrainingError("the model has no trainable parameters", "INFRA")
        self.optimizer = torch.optim.AdamW(
            params,
            lr=config.learning_rate,
            betas=config.adam_betas,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.global_step = 0
        self.updates = 0  # optimiser steps taken by this object: only grows (a job's liveness)
        self.samples_seen = 0
        self.generator = torch.Generator().manual_seed(config.seed)
        self.dropped_too_long = 0  # samples over max_length that carried behaviour log-probs
        pad = policy.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else policy.tokenizer.eos_token_id or 0)

    @classmethod
    def from_config(
        cls, config: TrainerConfig, callback: MetricsCallback | None = None, **load_kw: Any
    ) -> PolicyTrainer:
        """Load the model named in `config` (with LoRA if lora_r > 0) and build a trainer."""
        lora = (
            LoraSettings(
                r=config.lora_r,
                alpha=config.lora_alpha,
                dropout=config.lora_dropout,
                target_modules=tuple(config.lora_target_modules),
                layers=None if config.lora_layers is None else tuple(config.lora_layers),
            )
            if config.is_lora
            else None
        )
        policy = load_policy(
            config.model,
            lora=lora,
            dtype=config.dtype,
            device=config.device,
            seed=config.seed,
            **load_kw,
        )
        return cls(policy, config, callback)

    # -- schedule -------------------------------------------------------------------------

    def _lr_factor(self, step: int) -> float:
        """Linear warmup, then cosine decay to min_lr_ratio over total_steps (if set)."""
        cfg = self.config
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.total_steps is None:
            return 1.0
        span = max(1, cfg.total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- preparation ------------------------------------------------------------------------

    def _autocast(self) -> Any:
        mp = self.config.mixed_precision
        if mp == "no":
            return nullcontext()
        dtype = torch.bfloat16 if mp == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def prepare(self, samples: Sequence[PolicySample]) -> list[PolicySample]:
        """Truncate, drop zero-advantage samples, and fill old/ref log-probs (and V(s))."""
        cfg = self.config
        kept = []
        for s in samples:
            try:
                kept.append(truncate(s, cfg.max_length))
            except ValueError:
                self.dropped_too_long += 1  # counted, never cut: see `truncate`
        if len(kept) < len(samples):
            log.warning(
                "%d of %d samples exceed max_length=%d and were dropped (%d so far)",
                len(samples) - len(kept),
                len(samples),
                cfg.max_length,
                self.dropped_too_long,
            )
        bad = [i for i, s in enumerate(kept) if not math.isfinite(s.advantage)]
        if bad:
            raise TrainingError(
                f"{len(bad)} samples have a NaN/inf advantage (first: #{bad[0]}); check the "
                "rewards of those episodes",
                "DATA",
            )
        if cfg.skip_zero_advantage and cfg.algorithm != "ppo":
            kept = [s for s in kept if abs(s.advantage) > 1e-8]
        if not kept:
            return []
        if cfg.policy_loss == "ppo_clip" or cfg.kl_coef > 0 or cfg.algorithm == "ppo":
            self.score(kept)  # weighted NLL has no ratio: no old log-probs to fill
        return kept

    def score(self, samples: Sequence[PolicySample], force_old: bool = False) -> None:
        """Fill old log-probs (when missing), reference log-probs and V(s) in place."""
        cfg = self.config
        batches = make_microbatches(samples, cfg.micro_batch_tokens, self.pad_id)
        with self._autocast():
            score_samples(
                self.head,
                batches,
                self.device,
                reference=self.reference if cfg.kl_coef > 0 or cfg.algorithm == "dpo" else None,
                use_adapter_off_reference=(
                    self.policy.is_lora and (cfg.kl_coef > 0 or cfg.algorithm == "dpo")
                ),
                fill_old=True,
                force_old=force_old or cfg.recompute_old_logprobs,
            )

    # -- policy gradient --------------------------------------------------------------------

    def train_on_samples(
        self, samples: Sequence[PolicySample], *, allow_empty: bool = False
    ) -> list[Metrics]:
        """Run `epochs` passes of clipped policy-gradient steps over `samples`.

        Every rank must pass the same list (see `distributed`). Raises TrainingError(DATA)
        when nothing is left to train on, unless `allow_empty` (then returns []).
        """
        cfg = self.config
        if cfg.algorithm == "dpo":
            raise TrainingError("algorithm 'dpo' trains on preference pairs: use train_on_pairs")
        prepared = self.prepare(samples)
        if not prepared:
            if allow_empty:
                return []
            raise TrainingError(
                f"no trainable samples: {len(samples)} given, all with zero advantage or empty "
                "(every group scored the same?)",
                "DATA",
            )
        rewards = torch.tensor([s.reward for s in prepared], dtype=torch.float32)
        history: list[Metrics] = []
        for epoch in range(cfg.epochs):
            for idx in minibatches(len(prepared), cfg.batch_size, self.generator):
                batch = [prepared[i] for i in idx]
                metrics = self._pg_step(batch)
                metrics.update(
                    epoch=float(epoch),
                    reward_mean=float(rewards.mean()),
                    reward_std=float(rewards.std(unbiased=False)),
                )
                history.append(self._emit(metrics))
        return history

    def _local_share(self, batch: list[Any]) -> list[Any]:
        return batch[self.dist.rank :: self.dist.world_size] if self.dist.enabled else batch

    def _pg_step(self, batch: list[PolicySample]) -> Metrics:
        cfg = self.config
        t0 = time.perf_counter()
        total_tokens = sum(len(s.action_ids) for s in batch)
        normalizer = float(total_tokens if cfg.loss_aggregation == "token" else len(batch))
        share = self._local_share(batch)
        dummy = not share  # a rank with nothing this step still joins the all-reduce
        if dummy:
            share = batch[:1]
        scale = float(self.dist.world_size) * (0.0 if dummy else 1.0)
        mbs = make_microbatches(share, cfg.micro_batch_tokens, self.pad_id)
        sums: dict[str, float] = {"loss": 0.0, "pg": 0.0, "entropy": 0.0, "kl_ref": 0.0}
        sums.update(clip=0.0, approx_kl=0.0, vloss=0.0)
        n_tok = 0
        self.optimizer.zero_grad(set_to_none=True)
        with training_errors(self.global_step):
            for k, mb in enumerate(mbs):
                sync = k == len(mbs) - 1
                ctx = self.module.no_sync() if self.dist.enabled and not sync else nullcontext()  # type: ignore[operator]
                with ctx:
                    loss, parts = self._pg_loss(mb, normalizer, len(batch))
                    loss = loss * scale
                    if not torch.isfinite(loss):
                        raise TrainingError(
                            f"loss is {float(loss)} at step {self.global_step + 1}: lower the "
                            "learning rate or check the advantages for NaN/inf",
                            "CONVERGENCE",
                        )
                    loss.backward()
                tokens = mb.num_action_tokens
                n_tok += tokens
                for key, val in parts.items():
                    sums[key] += val * (tokens if key in ("entropy", "clip", "approx_kl") else 1)
            grad_norm = self._optimizer_step()
        elapsed = time.perf_counter() - t0
        n = max(1, n_tok)
        all_tokens = sum(s.length for s in share)
        return {
            "loss": sums["loss"],
            "pg_loss": sums["pg"],
            "value_loss": sums["vloss"],
            "policy_entropy": sums["entropy"] / n,
            "approx_kl": sums["approx_kl"] / n,
            "kl_ref": sums["kl_ref"],
            "clip_fraction": sums["clip"] / n,
            "grad_norm": grad_norm,
            "action_tokens": float(n_tok),
            "tokens_per_s": all_tokens / elapsed if elapsed > 0 else 0.0,
            "step_time_s": elapsed,
        }

    def _pg_loss(
        self, mb: MicroBatch, normalizer: float, num_batch_seqs: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """This micro-batch's share of the minibatch objective (sums, then / normalizer)."""
        cfg = self.config
        with self._autocast():
            exact = cfg.entropy_coef > 0 or cfg.exact_entropy
            out = run_head(
                self.module, mb, self.device, with_entropy=exact, entropy_grad=cfg.entropy_coef > 0
            )
        logp = out["logp"].float()
        old = mb.cat_token_field("old_logprobs")
        if old is None:
            assert cfg.policy_loss == "weighted_nll", "prepare() fills old log-probs"
            old = logp.detach()  # no ratio in the loss; the KL metrics read 0
        old = old.to(self.device)
        adv = mb.per_token([s.advantage for s in mb.samples]).to(self.device)
        seq = mb.seq_index.to(self.device)
        ref = mb.cat_token_field("ref_logprobs")
        ref = ref.to(self.device) if ref is not None else None
        # Without the exact entropy, -log pi(a) of the sampled actions estimates it for free
        # (E_{a~pi}[-log pi(a)] = H(pi)); only the metric uses it then.
        ent = out["entropy"] if "entropy" in out else -logp.detach()
        # policy_gradient_loss averages; rescale so micro-batches sum to the minibatch mean.
        if cfg.loss_aggregation == "token":
            weight = mb.num_action_tokens / normalizer
        else:
            weight = len(mb.samples) / normalizer
        pg, stats = policy_gradient_loss(
            logp,
            old,
            adv,
            seq,
            len(mb.samples),
            clip_epsilon=cfg.clip_epsilon,
            clip_epsilon_high=cfg.clip_epsilon_high,
            agg=cfg.loss_aggregation,
            ref_logp=ref,
            kl_coef=cfg.kl_coef,
            entropy=ent,
            entropy_coef=cfg.entropy_coef,
            kind=cfg.policy_loss,
        )
        loss = pg * weight
        parts = {
            "pg": float(pg.detach()) * weight,
            "entropy": float(ent.detach().mean()),
            "clip": stats.clip_fraction,
            "approx_kl": stats.approx_kl,
            "kl_ref": 0.0,
            "vloss": 0.0,
        }
        if ref is not None:
            d = (ref - logp).detach()
            parts["kl_ref"] = float((torch.exp(d) - d - 1).mean()) * weight
        if "values" in out:
            values = out["values"].float()
            old_v = torch.tensor([s.old_value or 0.0 for s in mb.samples], device=self.device)
            rets = torch.tensor([s.ret or 0.0 for s in mb.samples], device=self.device)
            v = value_loss(values, old_v, rets, cfg.value_clip)
            share = len(mb.samples) / num_batch_seqs
            loss = loss + cfg.vf_coef * v * share
            parts["vloss"] = float(v.detach()) * share
        parts["loss"] = float(loss.detach())
        return loss, parts

    def _optimizer_step(self) -> float:
        params = [p for p in self.head.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"gradient norm is {float(norm)} at step {self.global_step + 1}; lower the "
                "learning rate",
                "CONVERGENCE",
            )
        self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        self.updates += 1
        return float(norm)

    def _emit(self, metrics: Metrics) -> Metrics:
        metrics["step"] = float(self.global_step)
        metrics["learning_rate"] = self.learning_rate
        if self.callback is not None and self.dist.is_main:
            self.callback(dict(metrics))
        return metrics

    # -- DPO --------------------------------------------------------------------------------

    def train_on_pairs(self, pairs: Sequence[PreferencePair]) -> list[Metrics]:
        """DPO over preference pairs (sigmoid loss, beta = dpo_beta), `epochs` passes."""
        cfg = self.config
        pairs = [p for p in pairs if p.chosen and p.rejected]
        if not pairs:
            raise TrainingError(
                "no preference pairs: every group had tied scores or a single trajectory",
                "DATA",
            )
        fitted = []
        for p in pairs:
            try:
                chosen = [truncate(s, cfg.max_length) for s in p.chosen]
                rejected = [truncate(s, cfg.max_length) for s in p.rejected]
            except ValueError:
                self.dropped_too_long += 1
                continue
            fitted.append(replace(p, chosen=chosen, rejected=rejected))
        pairs = fitted
        if not pairs:
            raise TrainingError(
                f"every preference pair exceeds max_length={cfg.max_length}", "DATA"
            )
        # The reference log-probs are fixed for the whole run: score them once.
        segments = [s for p in pairs for s in (*p.chosen, *p.rejected)]
        self.score(segments)
        history: list[Metrics] = []
        for epoch in range(cfg.epochs):
            for idx in minibatches(len(pairs), cfg.batch_size, self.generator):
                metrics = self._dpo_step([pairs[i] for i in idx])
                metrics["epoch"] = float(epoch)
                history.append(self._emit(metrics))
        return history

    def _dpo_step(self, batch: list[PreferencePair]) -> Metrics:
        cfg = self.config
        t0 = time.perf_counter()
        share = self._local_share(batch)
        dummy = not share
        if dummy:
            share = batch[:1]
        # Segment -> trajectory slot: pair i's chosen steps sum into 2i, rejected into 2i+1.
        segs: list[PolicySample] = []
        slot: list[int] = []
        for i, p in enumerate(share):
            for s in p.chosen:
                segs.append(s)
                slot.append(2 * i)
            for s in p.rejected:
                segs.append(s)
                slot.append(2 * i + 1)
        for j, s in enumerate(segs):
            s.meta["dpo_slot"] = slot[j]
        self.optimizer.zero_grad(set_to_none=True)
        with training_errors(self.global_step):
            pol = torch.zeros(2 * len(share), device=self.device)
            ref = torch.zeros(2 * len(share), device=self.device)
            mbs = make_microbatches(segs, cfg.micro_batch_tokens, self.pad_id)
            for mb in mbs:
                with self._autocast():
                    out = run_head(self.module, mb, self.device)
                slots = torch.tensor([s.meta["dpo_slot"] for s in mb.samples], device=self.device)
                tok_slot = slots[mb.seq_index.to(self.device)]
                pol = pol.index_add(0, tok_slot, out["logp"].float())
                r = mb.cat_token_field("ref_logprobs")
                assert r is not None
                ref = ref.index_add(0, tok_slot, r.to(self.device))
            loss, margins = dpo_loss(pol[0::2], pol[1::2], ref[0::2], ref[1::2], cfg.dpo_beta)
            # DDP averages over ranks; weigh each rank's mean by its share of the batch.
            weight = len(share) / len(batch) * self.dist.world_size * (0.0 if dummy else 1.0)
            scaled = loss * weight
            if not torch.isfinite(scaled):
                raise TrainingError(
                    f"DPO loss is {float(loss)} at step {self.global_step + 1}", "CONVERGENCE"
                )
            scaled.backward()
            grad_norm = self._optimizer_step()
        elapsed = time.perf_counter() - t0
        tokens = sum(s.length for s in segs)
        return {
            "loss": float(loss.detach()),
            "dpo_accuracy": float((margins > 0).float().mean()),
            "dpo_margin": float(margins.mean()),
            "grad_norm": grad_norm,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            "step_time_s": elapsed,
        }

    # -- state ------------------------------------------------------------------------------

    def trainer_state(self) -> dict[str, Any]:
        """Optimiser, schedule, counters and RNG: what resuming needs besides the weights."""
        state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "global_step": self.global_step,
            "samples_seen": self.samples_seen,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.head.value_head is not None:
            state["value_head"] = self.head.value_head.state_dict()
        return state

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = int(state["global_step"])
        self.samples_seen = int(state.get("samples_seen", 0))
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if self.head.value_head is not None and "value_head" in state:
            self.head.value_head.load_state_dict(state["value_head"])
