"""`HFAgentPolicy`: a local transformers causal LM, batched across concurrent episodes.

A group of episodes calls `get_action` concurrently; generating for each alone wastes the
hardware (a small model is dominated by per-call overhead, a large one by memory
bandwidth). Calls go into a queue; a batcher takes up to `max_batch_size` of them, waiting
at most `max_wait_ms` after the first, left-pads them and runs ONE batched generation in a
worker thread (so the event loop keeps collecting the next batch). The generation is a lean
prefill + KV-cache decode loop (`use_hf_generate=True` uses `model.generate` instead, for
models the loop does not fit); both sample with `sample_tokens`.

Sampling is from the full softmax(logits / temperature) (no top-k/top-p truncation: the
log-probs a trainer recomputes for its importance ratio must be those of the distribution
that was sampled). Each token's log-prob under that distribution is recorded as it is
sampled. Greedy decoding (temperature 0) reports plain log softmax(logits).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from agentrl.rollout.batching import next_batch
from agentrl.rollout.parsing import ActionFormat, parse_policy_output
from agentrl.rollout.policy import PolicyError, PolicyOutput, as_chat_messages, openai_tools

log = logging.getLogger(__name__)

MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a separate prefill
SAMPLE_BLOCK = 256  # vocabulary block of the two-level inverse-CDF search


@dataclass
class _Pending:
    prompt_ids: list[int]
    future: asyncio.Future[tuple[list[int], list[float], bool]]


@dataclass
class BatchStats:
    """What the batcher did: one entry per `generate` call."""

    batch_sizes: list[int] = field(default_factory=list)
    generate_seconds: list[float] = field(default_factory=list)
    prompt_tokens: int = 0  # summed over requests (without padding)
    new_tokens: int = 0

    @property
    def calls(self) -> int:
        return len(self.batch_sizes)

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


class HFAgentPolicy:
    """An AgentPolicy over a local `transformers` model and its tokenizer (chat template).

    log_probs = {"tokens": [ids], "token_logprobs": [...], "sum": float,
                 "prompt_ids": [ids], "finish_reason": "stop" | "length",
                 "temperature": float}
    The action tokens include the end-of-sequence token when the model chose to stop.
    `stop_token_ids` adds stop tokens to the model's eos. `max_prompt_tokens` keeps only
    the last tokens of a longer prompt. `seed` seeds the policy's own generator (the global
    torch RNG is untouched), so a run replays exactly when its batches are the same.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        max_batch_size: int = 8,
        max_wait_ms: float = 10.0,
        action_format: ActionFormat = "auto",
        seed: int | None = None,
        max_prompt_tokens: int | None = None,
        stop_token_ids: list[int] | None = None,
        use_hf_generate: bool = False,
        share_prefix: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if temperature < 0:
            raise ValueError("temperature must be >= 0 (0 means greedy)")
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has neither a pad nor an eos token; set pad_token")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.action_format = action_format
        self.seed = seed
        self.max_prompt_tokens = max_prompt_tokens
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = {e for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        self.eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids.update(stop_token_ids or [])
        self.use_hf_generate = use_hf_generate
        self.share_prefix = share_prefix
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._keeps_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        self.context_length: int | None = getattr(model.config, "max_position_embeddings", None)
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._rng = torch.Generator()
        if seed is not None:
            self._rng.manual_seed(seed)
        else:
            self._rng.seed()

    # ---- prompts -------------------------------------------------------------------------
    def encode(self, observation: Any, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Chat-template the observation into prompt token ids."""
        messages = []
        for m in as_chat_messages(observation):
            m = dict(m)
            if m.get("content") is None:  # templates print None literally
                m["content"] = ""
            messages.append(m)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools:
            kwargs["tools"] = openai_tools(tools)
        text = self.tokenizer.apply_chat_template(messages, **kwargs)
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            ids = ids[-self.max_prompt_tokens :]
        return ids

    # ---- the protocol --------------------------------------------------------------------
    async def get_action(
        self, observation: Any, available_tools_specs: list[dict[str, Any]] | None = None
    ) -> PolicyOutput:
        prompt_ids = self.encode(observation, available_tools_specs)
        if self.context_length and len(prompt_ids) + self.max_new_tokens > self.context_length:
            raise PolicyError(
                f"prompt of {len(prompt_ids)} tokens + max_new_tokens {self.max_new_tokens} "
                f"exceeds the model's context of {self.context_length}; set the worker's "
                "history_window or the policy's max_prompt_tokens"
            )
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._queue is None:
            self._loop = loop
            self._queue = asyncio.Queue()
            self._batcher = None
        future: asyncio.Future[tuple[list[int], list[float], bool]] = loop.create_future()
        self._queue.put_nowait(_Pending(prompt_ids, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = loop.create_task(self._run_batches(self._queue))
        tokens, token_logprobs, stopped = await future
        raw = self.tokenizer.decode(tokens, skip_special_tokens=True)
        action = parse_policy_output(raw, action_format=self.action_format)
        log_probs = {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "sum": float(sum(token_logprobs)),
            "prompt_ids": prompt_ids,
            "finish_reason": "stop" if stopped else "length",
            "temperature": self.temperature,
        }
        return action, raw, log_probs, None

    async def _run_batches(self, queue: asyncio.Queue[_Pending]) -> None:
        """Drain the queue batch by batch; exits when it is empty (restarted on demand), so
        no task outlives its event loop."""
        loop = asyncio.get_running_loop()
        while not queue.empty():
            batch = await next_batch(queue, self.max_batch_size, self.max_wait_ms / 1000.0)
            live = [p for p in batch if not p.future.done()]  # cancelled callers drop out
            if not live:
                continue
            started = loop.time()
            try:
                results = await asyncio.to_thread(self.generate, [p.prompt_ids for p in live])
            except Exception as exc:
                log.exception("batched generate failed")
                err = PolicyError(f"generate failed: {type(exc).__name__}: {exc}")
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(err)
                continue
            self.stats.batch_sizes.append(len(live))
            self.stats.prompt_tokens += sum(len(p.prompt_ids) for p in live)
            self.stats.new_tokens += sum(len(r[0]) for r in results)
            self.stats.generate_seconds.append(loop.time() - started)
            for p, result in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(result)

    # ---- the model -----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float], bool]]:
        """One batched generation -> per prompt (action ids, their log-probs, stopped at
        eos). Synchronous; `get_action` runs it in a worker thread."""
        training = self.model.training  # a model being trained: no dropout while acting
        self.model.eval()
        try:
            with torch.no_grad():
                if self.use_hf_generate:
                    tokens, logps = self._hf_generate(prompts)
                else:
                    tokens, logps = self._decode_loop(prompts)
        finally:
            self.model.train(training)
        results = []
        for i in range(len(prompts)):
            row = tokens[i].tolist()
            length, stopped = len(row), False
            for j, tok in enumerate(row):
                if tok in self.eos_ids:
                    length, stopped = j + 1, True
                    break
            results.append((row[:length], logps[i, :length].tolist(), stopped))
        return results

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return ids.to(device), mask.to(device)

    def _shared_prefix(self, prompts: list[list[int]]) -> int:
        """Tokens every prompt of the batch starts with (a GiGPO group shares the task's
        system prompt and first observation), leaving each at least one token of its own."""
        if not self.share_prefix or len(prompts) < 2:
            return 0
        shortest = min(len(p) for p in prompts) - 1
        n = 0
        first = prompts[0]
        while n < shortest and all(p[n] == first[n] for p in prompts):
            n += 1
        return n if n >= MIN_SHARED_PREFIX else 0

    def _decode_loop(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill once, then one forward per new token with the KV cache.

        The prefix all prompts share is prefilled once and its cache copied to every row;
        the rest is left-padded after it (the attention mask has a hole where the padding
        is; positions continue from the prefix). Leaner than `generate` per step: one
        softmax and a block search over the vocabulary pick every row's token."""
        batch = len(prompts)
        shared = self._shared_prefix(prompts)
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        cache = None
        ids, mask = self._left_padded([p[shared:] for p in prompts])
        device = ids.device
        if shared:
            prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=device)
            cache = self.model(input_ids=prefix, use_cache=True, **keep).past_key_values
            cache.batch_repeat_interleave(batch)
            mask = torch.cat([mask.new_ones((batch, shared)), mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)[:, shared:]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **keep,
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        next_position = mask.sum(-1, keepdim=True)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        pad = torch.tensor(self.pad_id, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens, logps = [], []
        for t in range(self.max_new_tokens):
            choice, logp = sample_tokens(logits, self.temperature, self._rng)
            choice = torch.where(finished, pad, choice)
            tokens.append(choice)
            logps.append(logp)
            finished |= (choice[:, None] == eos).any(dim=-1)
            if t == self.max_new_tokens - 1 or bool(finished.all()):
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            out = self.model(
                input_ids=choice[:, None],
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            next_position = next_position + 1
            cache, logits = out.past_key_values, out.logits[:, -1, :]
        return torch.stack(tokens, dim=1).cpu(), torch.stack(logps, dim=1).float().cpu()

    def _hf_generate(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The same sampling through `model.generate` (for models the lean loop does not
        fit): the sampler runs as a logits processor and generate's argmax reads its pick."""
        input_ids, attention = self._left_padded(prompts)
        sampler = _GenerateSampler(self.temperature, self._rng)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            temperature=None,
            top_k=None,
            top_p=None,
            logits_processor=LogitsProcessorList([sampler]),
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=True,
        )
        tokens = out.sequences[:, input_ids.shape[1] :].cpu()
        return tokens, torch.stack(sampler.logprobs, dim=1).float().cpu()


def sample_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from softmax(logits / temperature), and its log-prob.

    Inverse-CDF sampling with one uniform number per row (torch.multinomial draws per
    category and is slow on CPU for a 50k vocabulary), in two levels: pick the vocabulary
    block from the cumulative block sums, then the token inside that block, so no cumsum
    runs over the whole (batch, vocab) array (that one is slow on CPU for batched rows).
    Only tokens with non-zero probability can be picked. Temperature 0 is greedy, with the
    log-probs of softmax(logits).
    """
    logits = logits.float()
    if temperature <= 0:
        choice = logits.argmax(dim=-1, keepdim=True)
        logp = logits.gather(1, choice) - torch.logsumexp(logits, dim=-1, keepdim=True)
        return choice.squeeze(1), logp.squeeze(1)
    probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
    rows, vocab = probs.shape
    n_blocks = -(-vocab // SAMPLE_BLOCK)
    padded = probs
    if n_blocks * SAMPLE_BLOCK != vocab:
        padded = torch.nn.functional.pad(probs, (0, n_blocks * SAMPLE_BLOCK - vocab))
    blocks = padded.view(rows, n_blocks, SAMPLE_BLOCK)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # (rows, n_blocks)
    u = torch.rand((rows, 1), generator=generator).to(probs.device)
    target = u * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, target, side="right").clamp_(max=n_blocks - 1)
    before = torch.where(
        block > 0, block_cdf.gather(1, (block - 1).clamp_(min=0)), torch.zeros_like(target)
    )
    inner = blocks[torch.arange(rows, device=probs.device), block.squeeze(1)]
    inner_cdf = inner.cumsum(dim=-1) + before
    offset = torch.searchsorted(inner_cdf, target, side="right").clamp_(max=SAMPLE_BLOCK - 1)
    choice = (block * SAMPLE_BLOCK + offset).clamp_(max=vocab - 1)
    picked = probs.gather(1, choice)
    lost = picked <= 0  # float rounding at a block edge: take the block's likeliest token
    if bool(lost.any()):
        fallback = block * SAMPLE_BLOCK + inner.argmax(dim=-1, keepdim=True)
        choice = torch.where(lost, fallback.clamp_(max=vocab - 1), choice)
        picked = probs.gather(1, choice)
    return choice.squeeze(1), torch.log(picked).squeeze(1)


class _GenerateSampler(LogitsProcessor):
    """`sample_tokens` as a logits processor: records log-probs, returns scores whose
    argmax is the sampled token."""

    def __init__(self, temperature: float, generator: torch.Generator) -> None:
        self.temperature = temperature
        self.generator = generator
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> Any:
        choice, logp = sample_tokens(scores, self.temperature, self.generator)
        self.logprobs.append(logp)
        return torch.full_like(scores, float("-inf")).scatter_(1, choice[:, None], 0.0)
