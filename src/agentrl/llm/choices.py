"""Valid-action scoring (GLAM, Carta et al. 2023): the LLM's probability of each candidate
answer, renormalised over the candidates.

A free-form policy must produce a parseable move; a small model mostly does not. Scoring
the candidates instead gives zero invalid actions by construction and exact log-probs for
the policy pi(a | s) = p_LM(a | s) / sum_b p_LM(b | s), which the trainer needs for PPO
ratios, KL and entropy.

- `score_choices(model, tokenizer, prompts, choices)`: the pure core (no state, any HF
  causal LM), used by the rollout policies, the OpenAI test server's `guided_choice` and the
  gateway. One forward pass scores a prompt when every candidate is one distinct token
  (FrozenLake's and Sokoban's moves under SmolLM2's tokenizer); longer candidates share the
  prompt's KV cache (`DynamicCache.batch_repeat_interleave`), so the prompt runs once.
- `choice_logprobs(...)`: the same numbers as tensors, differentiable (the trainer's path).
- `UpperLayerScorer`: the fast path of a learner whose adapters sit on the upper layers
  only: the frozen lower layers' output is cached per prompt text, so rollouts and updates
  run only the trained layers. Exact: the cached rows are what the full model computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Prompt = str | Sequence[dict[str, Any]]  # a chat (OpenAI messages) or an already-rendered text


def render_prompt(tokenizer: Any, prompt: Prompt) -> str:
    """Chat messages -> the text the model continues (generation prompt added)."""
    if isinstance(prompt, str):
        return prompt
    text: str = tokenizer.apply_chat_template(
        list(prompt), tokenize=False, add_generation_prompt=True
    )
    return text


def candidate_ids(tokenizer: Any, choices: Sequence[str]) -> list[list[int]]:
    """Token ids of each candidate as the start of an assistant answer (no special tokens)."""
    if not choices:
        raise ValueError("no choices to score")
    if len(set(choices)) != len(choices):
        raise ValueError(f"duplicate choices: {list(choices)}")
    ids = [list(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in choices]
    for c, t in zip(choices, ids, strict=True):
        if not t:
            raise ValueError(f"choice {c!r} has no tokens")
    return ids


def single_token_ids(ids: Sequence[Sequence[int]]) -> list[int] | None:
    """The candidates' ids if each is one token and all differ (one forward pass suffices)."""
    if all(len(t) == 1 for t in ids) and len({t[0] for t in ids}) == len(ids):
        return [t[0] for t in ids]
    return None


def autocast(dtype: torch.dtype | None, device: str | torch.device = "cpu") -> Any:
    """bf16 autocast when asked (fp32 otherwise); the same context for behaviour and training."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    dev = torch.device(device).type
    return torch.autocast(dev, dtype=dtype)


def choice_logprobs(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    choices: Sequence[Sequence[str]] | Sequence[str],
    *,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Renormalised log pi(choice | prompt) per prompt (a tensor over its choices).

    `choices` is one list shared by every prompt, or one list per prompt. Differentiable
    (call under `torch.no_grad()` for rollouts). A candidate's score is the sum of its
    tokens' log-probs given the prompt; the answer's end token is not scored.
    """
    per_prompt = _per_prompt_choices(prompts, choices)
    device = next(model.parameters()).device
    texts = [render_prompt(tokenizer, p) for p in prompts]
    out: list[torch.Tensor | None] = [None] * len(texts)
    # Fast path: single distinct tokens, all prompts of a choice set in one padded batch.
    fast: dict[tuple[str, ...], list[int]] = {}
    slow: list[int] = []
    for i, cs in enumerate(per_prompt):
        if single_token_ids(candidate_ids(tokenizer, cs)) is not None:
            fast.setdefault(tuple(cs), []).append(i)
        else:
            slow.append(i)
    with autocast(dtype, device):
        for key, rows in fast.items():
            ids = single_token_ids(candidate_ids(tokenizer, key))
            assert ids is not None
            logits = _last_logits(model, tokenizer, [texts[i] for i in rows], device)
            scores = F.log_softmax(logits.float(), dim=-1)[:, ids]
            renorm = scores - torch.logsumexp(scores, dim=-1, keepdim=True)
            for k, i in enumerate(rows):
                out[i] = renorm[k]
        for i in slow:
            out[i] = _multi_token(model, tokenizer, texts[i], per_prompt[i], device)
    return [t for t in out if t is not None]


@torch.no_grad()
def score_choices(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    choices: Sequence[Sequence[str]] | Sequence[str],
    *,
    dtype: torch.dtype | None = None,
) -> list[list[float]]:
    """Renormalised log-probs (floats) of each prompt's choices; see `choice_logprobs`."""
    return [
        t.float().tolist() for t in choice_logprobs(model, tokenizer, prompts, choices, dtype=dtype)
    ]


def _per_prompt_choices(
    prompts: Sequence[Prompt], choices: Sequence[Sequence[str]] | Sequence[str]
) -> list[list[str]]:
    if choices and all(isinstance(c, str) for c in choices):
        shared = [str(c) for c in choices]
        return [shared for _ in prompts]
    per = [list(c) for c in choices]
    if len(per) != len(prompts):
        raise ValueError(f"{len(per)} choice lists for {len(prompts)} prompts")
    return per


def _last_logits(
    model: Any, tokenizer: Any, texts: Sequence[str], device: torch.device
) -> torch.Tensor:
    """Next-token logits after each text (right padding; causal attention keeps rows exact)."""
    enc = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    width = max(len(e) for e in enc)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    for r, e in enumerate(enc):
        ids[r, : len(e)] = torch.tensor(e)
        mask[r, : len(e)] = 1
    # the vocabulary projection at each row's last position only (over every position it
    # was a [rows, width, vocab] tensor: ~0.9 GB for 30 FrozenLake prompts)
    last = torch.tensor([[len(e) - 1] for e in enc], device=device)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        use_cache=False,
        logits_to_keep=last,
    )
    logits: torch.Tensor = out.logits[:, 0]
    return logits


def _multi_token(
    model: Any, tokenizer: Any, text: str, choices: Sequence[str], device: torch.device
) -> torch.Tensor:
    """Candidates of several tokens: the prompt runs once; its KV cache is shared by all."""
    prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    cands = candidate_ids(tokenizer, choices)
    p = torch.tensor([prompt_ids], device=device)
    out = model(input_ids=p, use_cache=True)
    first = F.log_softmax(out.logits[0, -1].float(), dim=-1)
    cache = out.past_key_values
    n = len(cands)
    longest = max(len(c) for c in cands)
    scores = torch.stack([first[c[0]] for c in cands])
    if longest > 1:
        cache.batch_repeat_interleave(n)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Feed tokens 0..L-2 of each candidate after the prompt; they predict tokens 1..L-1.
        feed = torch.full((n, longest - 1), pad, dtype=torch.long, device=device)
        for r, c in enumerate(cands):
            feed[r, : len(c) - 1] = torch.tensor(c[:-1], device=device)
        mask = torch.ones((n, len(prompt_ids) + longest - 1), dtype=torch.long, device=device)
        pos = torch.arange(len(prompt_ids), len(prompt_ids) + longest - 1, device=device)
        more = model(
            input_ids=feed,
            attention_mask=mask,
            past_key_values=cache,
            position_ids=pos.unsqueeze(0).expand(n, -1),
            use_cache=True,
        )
        logp = F.log_softmax(more.logits.float(), dim=-1)  # [n, L-1, V]
        extra = []
        for r, c in enumerate(cands):
            idx = torch.tensor(c[1:], dtype=torch.long, device=device)
            steps = torch.arange(len(c) - 1, device=device)
            extra.append(logp[r, steps, idx].sum() if len(c) > 1 else logp.new_zeros(()))
        scores = scores + torch.stack(extra)
    return scores - torch.logsumexp(scores, dim=-1)


# ---- the fast path of the learner: cached frozen lower layers ----------------------------


def _decoder(model: Any) -> Any:
    from agentrl.llm.forward import base_of

    base = base_of(model)
    inner = getattr(base, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        raise TypeError(f"{type(base).__name__}: no Llama-style decoder layers to split")
    return inner


class _PrefixKV:
    """The smallest KV cache HF attention layers accept (their `update` call): it records
    the keys and values of a prompt prefix shared by a batch (batch 1), then serves them,
    broadcast, in front of every row's own keys. Gradients flow into the recorded tensors,
    so the upper layers' prefix stays part of the graph."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.recording = True

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recording:
            self.kv[layer_idx] = (key, value)
            return key, value
        pk, pv = self.kv[layer_idx]
        b = key.shape[0]
        return (
            torch.cat([pk.expand(b, -1, -1, -1), key], dim=2),
            torch.cat([pv.expand(b, -1, -1, -1), value], dim=2),
        )


def common_prefix(rows: Sequence[Sequence[int]]) -> list[int]:
    """The longest common prefix of token id lists."""
    if not rows:
        return []
    first = list(rows[0])
    n = len(first)
    for r in rows[1:]:
        k = 0
        while k < min(n, len(r)) and r[k] == first[k]:
            k += 1
        n = k
    return first[:n]


class UpperLayerScorer:
    """Renormalised single-token choice log-probs that run only layers `start`..end.

    The hidden state entering layer `start` depends only on the prompt and the frozen
    lower layers, so it is computed once per prompt text and kept. Scoring (rollouts, no
    grad) and `logprobs` (training, with grad) run the same code on the same cached rows in
    the same precision, so behaviour and training log-probs agree exactly.
    `temperature` is part of the policy's definition, pi = softmax(z / T) over the choices,
    so a tempered behaviour policy is still the policy being trained (exact ratios).

    `prefix_ids`: token ids every prompt of the task starts with (system prompt and chat
    template: half of a FrozenLake prompt). Such a prefix runs once per call through the
    upper layers (batch 1; once per process through the frozen ones) and every row runs
    only its own suffix against the prefix's keys and values: the same numbers, 1.5-1.9x
    faster forward + backward. Prompts that do not start with it take the whole-prompt path.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        choices: Sequence[str],
        start: int,
        *,
        dtype: torch.dtype | None = None,
        temperature: float = 1.0,
        prefix_ids: Sequence[int] = (),
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        ids = single_token_ids(candidate_ids(tokenizer, choices))
        if ids is None:
            raise ValueError(
                f"choices {list(choices)} are not distinct single tokens; use score_choices"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.choices = list(choices)
        self.choice_ids = torch.tensor(ids)
        self.inner = _decoder(model)
        self.start = int(start)
        if not 0 <= self.start <= len(self.inner.layers):
            raise ValueError(f"start layer {start} outside 0..{len(self.inner.layers)}")
        self.dtype = dtype
        self.prefix_ids = list(prefix_ids)
        # text -> (offset, hidden entering layer `start`): offset 0 holds the whole prompt,
        # offset len(prefix_ids) only the suffix after the shared prefix.
        self.features: dict[str, tuple[int, torch.Tensor]] = {}
        self._trunk_prefix: tuple[_PrefixKV, torch.Tensor] | None = None
        self.trunk_s = 0.0

    def set_prefix(self, prefix_ids: Sequence[int]) -> None:
        """Another task's shared prefix (e.g. another system prompt); features computed
        against the old one are dropped."""
        if list(prefix_ids) != self.prefix_ids:
            self.prefix_ids = list(prefix_ids)
            self.features = {t: f for t, f in self.features.items() if f[0] == 0}
            self._trunk_prefix = None

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _run(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        *,
        offset: int = 0,
        kv: _PrefixKV | None = None,
    ) -> torch.Tensor:
        """Layers start..end over `hidden` at positions offset.. (after `kv`'s prefix)."""
        width = hidden.shape[1]
        pos = torch.arange(offset, offset + width, device=hidden.device).unsqueeze(0)
        mask: Any
        if offset == 0:
            from transformers.masking_utils import create_causal_mask

            mask = create_causal_mask(
                config=self.inner.config,
                inputs_embeds=hidden,
                attention_mask=None,
                past_key_values=None,
                position_ids=pos,
            )
        else:  # every row sees the whole prefix, then its own tokens causally
            q = torch.arange(width, device=hidden.device).unsqueeze(1)
            k = torch.arange(offset + width, device=hidden.device).unsqueeze(0)
            allowed = (k < offset) | (k - offset <= q)
            if self.inner.config._attn_implementation == "sdpa":
                mask = allowed[None, None]
            else:  # eager and the like: an additive mask
                blocked = torch.finfo(hidden.dtype).min
                mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
                mask = mask.masked_fill(~allowed, blocked)[None, None]
        pe = self.inner.rotary_emb(hidden, position_ids=pos)
        for layer in self.inner.layers[start:end]:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_embeddings=pe,
                position_ids=pos,
                past_key_values=kv,
                use_cache=kv is not None,
            )
        return hidden

    def _prefix_through(
        self, hidden: torch.Tensor, start: int, end: int
    ) -> tuple[_PrefixKV, torch.Tensor]:
        """The shared prefix through layers start..end: their keys/values and its output."""
        kv = _PrefixKV()
        out = self._run(hidden, start, end, kv=kv)
        kv.recording = False
        return kv, out

    def _trunk(self) -> tuple[_PrefixKV, torch.Tensor]:
        """The prefix through the frozen layers, once per prefix."""
        if self._trunk_prefix is None:
            device = next(self.model.parameters()).device
            ids_t = torch.tensor([self.prefix_ids], device=device)
            kv, hidden = self._prefix_through(self.inner.embed_tokens(ids_t), 0, self.start)
            self._trunk_prefix = (kv, hidden.detach().clone())
        return self._trunk_prefix

    @torch.no_grad()
    def ensure(self, texts: Sequence[str]) -> None:
        """Compute and keep the lower layers' output for texts not seen yet (batched by length)."""
        import time

        todo = [t for t in dict.fromkeys(texts) if t not in self.features]
        if not todo:
            return
        t0 = time.perf_counter()
        device = next(self.model.parameters()).device
        p = len(self.prefix_ids)
        groups: dict[tuple[int, int], list[tuple[str, list[int]]]] = {}
        for t in todo:
            ids = self._ids(t)
            offset = p if p and len(ids) > p and ids[:p] == self.prefix_ids else 0
            groups.setdefault((offset, len(ids) - offset), []).append((t, ids[offset:]))
        with autocast(self.dtype, device):
            for (offset, _), rows in groups.items():
                kv = self._trunk()[0] if offset else None
                for k in range(0, len(rows), 64):
                    chunk = rows[k : k + 64]
                    ids_t = torch.tensor([ids for _, ids in chunk], device=device)
                    emb = self.inner.embed_tokens(ids_t)
                    hidden = self._run(emb, 0, self.start, offset=offset, kv=kv)
                    for (t, _), h in zip(chunk, hidden, strict=True):
                        self.features[t] = (offset, h.detach().clone())
        self.trunk_s += time.perf_counter() - t0

    def logprobs(self, texts: Sequence[str]) -> torch.Tensor:
        """[len(texts), n_choices] renormalised log-probs (differentiable through the upper
        layers). Texts of equal token length are batched together; no padding at all."""
        return self.logprobs_and_hidden(texts)[0]

    def logprobs_and_hidden(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs as `logprobs`, plus the final normed hidden state of each prompt's last
        position (a value head's input)."""
        from agentrl.llm.forward import base_of

        self.ensure(texts)
        device = next(self.model.parameters()).device
        head: nn.Module = base_of(self.model).get_output_embeddings()
        full: torch.Tensor = head.weight  # type: ignore[assignment]
        weight = full[self.choice_ids.to(device)]  # [C, H]: only the candidates' rows
        by_offset: dict[int, list[int]] = {}
        for r, t in enumerate(texts):
            by_offset.setdefault(self.features[t][0], []).append(r)
        parts: list[torch.Tensor] = []
        order: list[int] = []
        with autocast(self.dtype, device):
            for offset, rows in by_offset.items():
                parts.append(self._last_hidden([self.features[texts[r]][1] for r in rows], offset))
                order.extend(rows)
            last = parts[0]
            if len(parts) > 1:  # both kinds of rows: back to the callers' order
                last = torch.cat(parts)[torch.argsort(torch.tensor(order, device=device))]
            logits = (last @ weight.T).float() / self.temperature
            renorm = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        return renorm, last

    def _last_hidden(self, feats: list[torch.Tensor], offset: int) -> torch.Tensor:
        """The upper layers over rows of one kind; the normed hidden of each last position."""
        device = feats[0].device
        lengths = torch.tensor([int(f.shape[0]) for f in feats], device=device)
        width = int(lengths.max())
        # Right padding: causal attention never lets a real position see the padding, so
        # each row is exactly what it would be alone; one batched call per scoring step.
        hidden = feats[0].new_zeros((len(feats), width, feats[0].shape[-1]))
        for r, f in enumerate(feats):
            hidden[r, : f.shape[0]] = f
        end = len(self.inner.layers)
        kv = None
        if offset:
            kv = self._prefix_through(self._trunk()[1], self.start, end)[0]
        hidden = self._run(hidden, self.start, end, offset=offset, kv=kv)
        rows = torch.arange(len(feats), device=device)
        last: torch.Tensor = self.inner.norm(hidden[rows, lengths - 1])
        return last

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> torch.Tensor:
        return self.logprobs(texts).detach()
