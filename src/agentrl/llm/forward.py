"""Score action tokens: the transformer body on every position, the LM head only where an
action token is predicted.

A policy-gradient update needs log pi(a_t | s) for the action tokens only. Computing the
vocabulary projection (and its softmax) for every prompt position, as generic trainers do,
costs vocab x hidden multiply-adds per position and a [B, T, V] tensor; on a 49k vocabulary
that is most of the update. So: run the decoder to hidden states, gather the action
positions, then apply `lm_head` to those rows alone.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agentrl.llm.samples import MicroBatch

# Grammar masks (training.masks builds them): a constrained completion is scored under the
# same mask it was sampled under, so its importance ratio compares like with like.
MASKED = -1e30  # a forbidden token's logit: exp() is 0 in float32 and 0 x MASKED is 0 (no NaN)
BITMASK_KEY = "token_bitmask"  # PolicySample.meta: llguidance's packed allowed tokens
# A micro-batch whose rows all start with at least this many equal prompt tokens runs that
# prefix once (`shared_prefix_len`); shorter common prefixes are not worth the second call.
MIN_SHARED_PREFIX = 32


def base_of(model: Any) -> Any:
    """The transformers model under an optional peft wrapper (LoRA layers stay injected)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def body_and_head(model: Any) -> tuple[nn.Module, nn.Module]:
    """(decoder that returns hidden states, output projection) of a causal LM."""
    base = base_of(model)
    head = base.get_output_embeddings()
    body = base.get_decoder() if hasattr(base, "get_decoder") else None
    if body is None or body is base:
        body = getattr(base, base.base_model_prefix, None)
    if head is None or body is None:
        raise TypeError(f"{type(base).__name__} has no decoder/LM head to split")
    return body, head


class _LogprobEntropy(torch.autograd.Function):
    """log p(target) and entropy H per row of logits, sharing one softmax.

    Autograd's log_softmax + gather + a separate entropy costs two extra passes over the
    [N, V] matrix and a zero-filled scatter in backward; here p = softmax is computed once,
    kept, and reused: d log p_t / dz = onehot_t - p, dH / dz = -p * (log p + H).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> Any:
        logp_all = F.log_softmax(logits, dim=-1)
        probs = logp_all.exp()
        target_logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(probs * logp_all).sum(-1)
        ctx.save_for_backward(probs, logp_all, entropy, targets)
        return target_logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None) -> Any:
        probs, logp_all, entropy, targets = ctx.saved_tensors
        if g_logp is None:
            g_logp = torch.zeros_like(entropy)
        grad = probs * (-g_logp).unsqueeze(-1)
        grad.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
        if g_ent is not None and bool(g_ent.ne(0).any()):
            grad -= g_ent.unsqueeze(-1) * probs * (logp_all + entropy.unsqueeze(-1))
        return grad, None


def logprob_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) per row of float logits [N, V]."""
    out: tuple[torch.Tensor, torch.Tensor] = _LogprobEntropy.apply(logits, targets)  # type: ignore[no-untyped-call]
    return out


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int) -> int:
    """Leading positions every row of a right-padded micro-batch has equal and unpadded,
    ending at `first` (the earliest position whose hidden state is read: every scored and
    value position stays in the rows' own part); 0 for one row or below MIN_SHARED_PREFIX."""
    if input_ids.shape[0] < 2 or first < MIN_SHARED_PREFIX:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    n = min(int(same.long().cumprod(0).sum()), first)
    return n if n >= MIN_SHARED_PREFIX else 0


def _cache_kwarg(body: Any) -> str | None:
    """The name the decoder's forward takes a K/V cache by (transformers renamed it), or
    None when it takes none (then every row runs whole)."""
    try:
        params = inspect.signature(body.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


class PolicyHead(nn.Module):
    """The policy as a module: (micro-batch tensors) -> log-probs of action tokens, their
    entropy and optionally V(s) from a linear value head on the last prompt position.

    It is the unit DistributedDataParallel wraps, so gradient sync covers LM and value head.

    With `share_prefix`, the prompt tokens all rows of a micro-batch begin with (a tool-use
    job's system prompt: 201 of its rows' ~450 tokens) run once, as a batch of one, and
    every row continues from that K/V (shared, so the gradient through the adapters on the
    prefix is the sum over rows, as when each row runs it); on a CPU each row's own part then
    runs unpadded. The same log-probs and gradients up to float rounding, for about half the
    positions of a tool-use job's forward and backward.
    """

    def __init__(
        self,
        model: Any,
        value_head: bool = False,
        temperature: float = 1.0,
        share_prefix: bool = True,
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.share_prefix = share_prefix
        # after a shared prefix, rows run one by one unpadded (True), expanded together
        # (False), or one by one on a CPU only (None: a GPU wants the batch)
        self.rows_apart: bool | None = None
        body, head = body_and_head(model)
        # Plain attributes (not submodules) so parameters are not registered twice.
        object.__setattr__(self, "_body", body)
        object.__setattr__(self, "_head", head)
        hidden = int(base_of(model).config.hidden_size)
        self.value_head: nn.Linear | None = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
            p = next(model.parameters())
            self.value_head.to(device=p.device, dtype=torch.float32)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pred_b: torch.Tensor,
        pred_t: torch.Tensor,
        targets: torch.Tensor,
        value_t: torch.Tensor | None = None,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        allowed: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        head: Any = self._head
        first = int(pred_t.min()) if pred_t.numel() else 0
        if self.value_head is not None and value_t is not None and value_t.numel():
            first = min(first, int(value_t.min()))
        hidden, skipped = self._hidden(input_ids, attention_mask, first)
        if skipped:  # rows start after the shared prefix: positions move back by it
            pred_t = pred_t - skipped
            value_t = value_t - skipped if value_t is not None else None
        picked = hidden[pred_b, pred_t]  # [N, H]
        logits = head(picked).float()  # [N, V]  (the only vocab projection)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if allowed is not None:  # rows of constrained completions: the grammar's mask
            logits = logits.masked_fill(~allowed, MASKED)
        if with_entropy:  # exact entropy over the vocabulary, sharing the softmax
            logp, entropy = logprob_and_entropy(logits, targets)
            result = {"logp": logp, "entropy": entropy if entropy_grad else entropy.detach()}
        else:  # autograd's log_softmax + gather is the cheapest path for log-probs alone
            logp_all = F.log_softmax(logits, dim=-1)
            result = {"logp": logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)}
        if self.value_head is not None and value_t is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            result["values"] = self.value_head(hidden[rows, value_t].float()).squeeze(-1)
        return result

    def _hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int
    ) -> tuple[torch.Tensor, int]:
        """The decoder's last hidden states of the rows, and how many leading positions
        they leave out (the shared prefix, run once; 0 when every position is there)."""
        body: Any = self._body
        key = _cache_kwarg(body) if self.share_prefix else None
        n = shared_prefix_len(input_ids, attention_mask, first) if key else 0
        cache = None
        if n:
            pre = body(
                input_ids=input_ids[:1, :n], attention_mask=attention_mask[:1, :n], use_cache=True
            )
            cache = getattr(pre, "cache", None)
            if cache is None:  # (transformers before the rename)
                cache = getattr(pre, "past_key_values", None)
        if (
            key is None or cache is None or not hasattr(cache, "layers")
        ):  # no prefix, or a cache of its own
            out = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            return (out[0] if isinstance(out, tuple) else out.last_hidden_state), 0
        rows, width = input_ids.shape
        lengths = attention_mask.sum(1)
        apart = self.rows_apart
        if apart is None:
            apart = input_ids.device.type == "cpu"
        if apart and _right_padded(attention_mask, lengths):
            # on a CPU each row's own part runs alone, unpadded: a batch of one costs a
            # matrix product no more per token there, and the padding (a fifth of a
            # tool-use job's positions) is not run at all
            parts = []
            for r, end in enumerate(lengths.tolist()):
                out = body(
                    input_ids=input_ids[r : r + 1, n:end],
                    position_ids=torch.arange(n, end, device=input_ids.device).unsqueeze(0),
                    use_cache=True, **{key: _fork(cache)},
                )  # fmt: skip
                parts.append(F.pad(out.last_hidden_state, (0, 0, 0, width - end)))
            return torch.cat(parts), n
        for layer in cache.layers:  # one row's K/V seen by every row (autograd sums)
            layer.keys = layer.keys.expand(rows, -1, -1, -1)
            layer.values = layer.values.expand(rows, -1, -1, -1)
        positions = torch.arange(n, width, device=input_ids.device).unsqueeze(0).expand(rows, -1)
        out = body(
            input_ids=input_ids[:, n:], attention_mask=attention_mask, position_ids=positions,
            use_cache=True, **{key: cache},
        )  # fmt: skip
        return out.last_hidden_state, n


def _right_padded(attention_mask: torch.Tensor, lengths: torch.Tensor) -> bool:
    """Each row's mask is ones then zeros (as `samples.collate` pads)."""
    return bool((attention_mask.cumprod(1).sum(1) == lengths).all())


def _fork(cache: Any) -> Any:
    """A cache over the same prefix K/V that a row can extend without touching the others
    (a layer's update concatenates into a new tensor; the prefix's stay shared, so autograd
    sums every row's gradient through them)."""
    own = copy.copy(cache)
    own.layers = [copy.copy(layer) for layer in cache.layers]
    return own


def run_head(
    module: nn.Module,
    mb: MicroBatch,
    device: str | torch.device,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> dict[str, torch.Tensor]:
    """Call `module` (a PolicyHead, possibly DDP-wrapped) on a micro-batch. Samples that
    carry a grammar mask (`meta[BITMASK_KEY]`) are scored under it."""
    allowed = allowed_rows(mb.samples, _vocab_of(module))
    return module(
        mb.input_ids.to(device),
        mb.attention_mask.to(device),
        mb.pred_b.to(device),
        mb.pred_t.to(device),
        mb.targets.to(device),
        mb.value_t.to(device),
        with_entropy,
        entropy_grad,
        None if allowed is None else allowed.to(device),
    )


def _vocab_of(module: nn.Module) -> int:
    head: Any = getattr(getattr(module, "module", module), "_head", None)
    return int(head.out_features) if head is not None else 0


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's packed int32 bitmask [n, words] as bool [n, vocab] (True: allowed);
    tokens past the bitmask's width (a padded LM head) are forbidden, as when decoding."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    out = np.zeros((bits.shape[0], vocab), dtype=np.bool_)
    width = min(vocab, bits.shape[1])
    out[:, :width] = bits[:, :width].astype(np.bool_)
    return torch.from_numpy(out)


def allowed_rows(samples: Any, vocab: int) -> torch.Tensor | None:
    """The allowed-token mask of a micro-batch's action rows (each sample's action tokens in
    order), or None when no sample carries a grammar mask (the common case: no cost)."""
    masks = [(s.meta or {}).get(BITMASK_KEY) for s in samples]
    if vocab <= 0 or all(m is None for m in masks):
        return None
    parts = [
        unpack(m, vocab)
        if m is not None
        else torch.ones((len(s.action_ids), vocab), dtype=torch.bool)
        for s, m in zip(samples, masks, strict=True)
    ]
    return torch.cat(parts)


def reference_context(model: Any) -> AbstractContextManager[Any]:
    """With LoRA the reference policy is the base model: the same weights, adapters off."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if callable(disable) else nullcontext()


@torch.no_grad()
def score_samples(
    head: PolicyHead,
    batches: list[MicroBatch],
    device: str | torch.device,
    *,
    reference: PolicyHead | None = None,
    use_adapter_off_reference: bool = False,
    fill_old: bool = True,
    force_old: bool = False,
) -> None:
    """Fill each sample's `old_logprobs` (if missing or `force_old`), `ref_logprobs` (if a
    reference is given, or adapters-off when `use_adapter_off_reference`) and `old_value`."""
    was_training = head.training
    head.eval()
    try:
        for mb in batches:
            splits = [len(s.action_ids) for s in mb.samples]
            need_old = fill_old and (force_old or any(s.old_logprobs is None for s in mb.samples))
            if need_old or head.value_head is not None:
                out = run_head(head, mb, device)
                if need_old:
                    for s, lp in zip(mb.samples, out["logp"].cpu().split(splits), strict=True):
                        if force_old or s.old_logprobs is None:
                            s.old_logprobs = lp.float()
                if "values" in out:
                    for s, v in zip(mb.samples, out["values"].cpu().tolist(), strict=True):
                        s.old_value = float(v)
            if reference is not None or use_adapter_off_reference:
                ref_module = reference if reference is not None else head
                ctx = reference_context(head.model) if reference is None else nullcontext()
                with ctx:
                    ref = run_head(ref_module, mb, device)["logp"].cpu()
                for s, lp in zip(mb.samples, ref.split(splits), strict=True):
                    s.ref_logprobs = lp.float()
    finally:
        head.train(was_training)
