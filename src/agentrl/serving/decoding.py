"""One batched KV-cache decode core, shared by the gateway's local engine and the learners.

`BatchDecoder` keeps a batch of rows decoding one token per step:

- rows may join between steps (`admit`: continuous batching) and leave as soon as they end
  (EOS, a stop string, the grammar's end, their token limit, a cancelled request): a
  finished row no longer costs a decode step or cache memory, and its caller gets the answer
  then, not when the longest reply of its batch ends (static batching kept every row to the
  longest, and a request arriving mid-batch waited for the whole batch);
- a prompt's prefix worth sharing (the system prompt every agent sends, `DecodeRow.prefix_len`)
  is prefilled once per (adapter, prefix tokens) and kept in a `PrefixCache` (LoRA changes
  K/V, so per adapter; LRU bounded by bytes; an adapter's entries go when it is unloaded);
- per row: adapter (a batch may mix versions: `forward` gets one adapter name per row),
  temperature (0 = greedy), token limit, top-k log-probs, stop strings, a callback per token,
  and a structured-outputs matcher (llguidance) that masks the logits token by token.

Log-probs are those of the distribution sampled (log softmax(logits / temperature), under
the grammar's mask; plain log softmax when greedy), as the trainers need.

The KV cache is a transformers `DynamicCache`; rows are left-padded to a common length and
the attention mask marks the padding (a joining row's cache is padded on the left, or the
batch's when the newcomer is longer); columns that became padding for every row are cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.rollout.policies.hf_policy import sample_tokens
from agentrl.serving.prefix_cache import KV, PrefixCache
from agentrl.serving.structured import advance, forced_token, mask_logits

TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]
# forward(adapters, **model_kwargs) -> the model's output (logits, past_key_values)
Forward = Callable[..., Any]
__all__ = ["KV", "BatchDecoder", "ChoiceMatcher", "DecodeRow", "PrefixCache", "decode_all"]

MIN_PREFIX = 16  # shorter shared prefixes are not worth a cache entry
# Forced tokens taken in one step: every row of the step's forward pass runs as many
# positions as the longest row's tokens (padding), so they pay in small batches only:
# FORCED_POSITIONS // rows forced tokens a row (one row: 16, eight: 2), none past
# FORCED_MAX_ROWS rows (the token-by-token path). Agent Zero replies under the reply schema
# (SmolLM2 with the light warm start, greedy, one busy core): one row 73 -> 35 ms a token,
# four 34 -> 20, eight 21 -> 16, sixteen 12.0 either way; with 16 rows and no bound a step ran up to 17
# positions a row (735 ms instead of 250, `agentrl bench acting`, 2026-11-29/30).
FORCED_POSITIONS = 16
FORCED_MAX_ROWS = 8


class ChoiceMatcher:
    """A `guided_choice` decoded token by token (a stream): the choices' token ids as a
    trie; each step allows only the tokens that continue some choice, and an end-of-text
    token where a choice is complete but a longer one continues it. Quacks like the
    llguidance matcher the decode loop drives (`consume_token`, `is_stopped`,
    `get_error`); `allowed()` replaces the grammar's bitmask. A choice of one token each is
    sampled with the probabilities the scoring path gives (the softmax over the allowed
    tokens); longer choices are sampled token by token, as vLLM does."""

    def __init__(self, encoded: Sequence[Sequence[int]], eos_ids: set[int]) -> None:
        self.encoded = [list(ids) for ids in encoded]
        self.root: dict[int, Any] = {}
        for index, ids in enumerate(self.encoded):
            node = self.root
            for tok in ids:
                node = node.setdefault(int(tok), {})
            node[-1] = index  # a choice ends here
        self.eos_ids = sorted(eos_ids)
        self.node = self.root
        self.chosen: int | None = None  # the choice answered, once complete
        self.error = ""

    def allowed(self) -> list[int]:
        ids = [t for t in self.node if t >= 0]
        if -1 in self.node and ids:  # complete, and a longer choice goes on
            ids.extend(self.eos_ids)
        return ids

    def consume_token(self, tok: int) -> bool:
        if -1 in self.node and tok in self.eos_ids:
            self.chosen = int(self.node[-1])
            return True
        nxt = self.node.get(int(tok)) if tok >= 0 else None
        if nxt is None:
            self.error = f"token {tok} continues no choice"
            return False
        self.node = nxt
        if -1 in nxt and len(nxt) == 1:  # a choice ended and none continues it
            self.chosen = int(nxt[-1])
        return True

    def is_stopped(self) -> bool:
        return self.chosen is not None

    def get_error(self) -> str:
        return self.error


def _mask_choices(logits: torch.Tensor, rows: list[int], matchers: list[ChoiceMatcher]) -> None:
    """Keep only the tokens each choice matcher allows in its row of `logits` (in place)."""
    for b, m in zip(rows, matchers, strict=True):
        allowed = torch.tensor(m.allowed(), dtype=torch.long)
        kept = logits[b, allowed].clone()
        logits[b].fill_(float("-inf"))
        logits[b, allowed] = kept


@dataclass(eq=False)
class DecodeRow:
    """One request to decode, and (filled in) its answer."""

    prompt_ids: list[int]
    adapter: str = "__base__"
    temperature: float = 1.0
    max_new_tokens: int = 256
    top_k: int = 0
    stops: Sequence[str] = ()
    matcher: Any = None  # llguidance matcher of a structured-output request (its own copy)
    on_token: TokenCallback | None = None
    prefix_len: int = 0  # prompt tokens to take from / put in the prefix cache (0: none)
    cache_key: str = ""  # the weights' identity in the prefix cache ("": the adapter name)
    cancelled: Callable[[], bool] | None = None  # True once the request went away
    tag: Any = None  # the caller's handle (the engine's request)
    toks: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str = "length"  # stop | length | grammar_error | cancelled
    next_forced: int | None = None  # the token its grammar forces next (no logits needed)

    @property
    def weights(self) -> str:
        """The prefix cache's key of this row's K/V: versions share it only when their
        weights are identical."""
        return self.cache_key or self.adapter


@dataclass
class DecodeStats:
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0  # prompt tokens run through the model (cache hits excluded)
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache
    decode_steps: int = 0
    decode_rows: int = 0  # sum of the batch sizes of the decode steps
    forced_tokens: int = 0  # tokens the grammar forced, taken without a decode step each


def _kv_of(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


_GROW: Any = None


def _grow_layer() -> Any:
    """A transformers cache layer whose K/V live in buffers with room to grow: a decode
    step writes its token in place. `DynamicLayer` concatenates, copying the whole cache on
    every step (Agent Zero's 5,400-token context: ~250 MB per token for SmolLM2). Tensors
    handed in (a cached prefix's blocks) are only read: the first update copies them into
    a buffer of its own."""
    global _GROW
    if _GROW is not None:
        return _GROW
    from transformers.cache_utils import DynamicLayer

    class GrowLayer(DynamicLayer):  # type: ignore[misc]
        def __init__(self, keys: Any = None, values: Any = None, adopt: bool = False) -> None:
            super().__init__()
            self._k: torch.Tensor | None = None
            self._v: torch.Tensor | None = None
            if keys is not None:
                self.keys, self.values = keys, values
                self.device, self.is_initialized = keys.device, True
            if adopt:  # views of the start of buffers that are ours alone, with room after
                self._k, self._v = _roomy(keys), _roomy(values)

        def update(self, key_states: Any, value_states: Any, *args: Any, **kw: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            have = int(self.keys.shape[-2]) if self.keys.dim() == 4 else 0
            total = have + int(key_states.shape[-2])
            buf = self._k
            if (
                buf is None
                or self._v is None
                or buf.shape[-2] < total
                or buf.shape[0] != key_states.shape[0]
                or self.keys.data_ptr() != buf.data_ptr()
            ):
                room = total + max(64, total // 4)
                b, h, _, d = key_states.shape
                k = key_states.new_empty((b, h, room, d))
                v = value_states.new_empty((b, h, room, value_states.shape[-1]))
                if have:
                    k[:, :, :have] = self.keys
                    v[:, :, :have] = self.values
                self._k, self._v = k, v
            assert self._k is not None and self._v is not None
            self._k[:, :, have:total] = key_states
            self._v[:, :, have:total] = value_states
            self.keys, self.values = self._k[:, :, :total], self._v[:, :, :total]
            return self.keys, self.values

    _GROW = GrowLayer
    return _GROW


def _roomy(t: torch.Tensor) -> torch.Tensor:
    """The whole buffer a [B, heads, T, dim] view starts: its head stride says how many
    tokens each head's row holds (`PrefixCache.longest(capacity=)` leaves room there)."""
    b, h, _, d = t.shape
    return t.as_strided((b, h, t.stride(1) // d, d), t.stride())


def _cache_of(kv: KV, adopt: bool = False) -> Any:
    """A cache over `kv` whose layers grow in place: copied at the next update into buffers
    of their own, or, with `adopt` (`kv` is views of buffers with room that nothing else
    holds), written in place from the start."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = None
    layer = _grow_layer()
    cache.layers = [layer(k, v, adopt) for k, v in kv]
    return cache


def _room(total: int) -> int:
    """Tokens a K/V buffer holds for a run of `total`: room to grow, as `GrowLayer` leaves."""
    return total + max(64, total // 4)


def _take_rows(t: torch.Tensor, rows: list[int], start: int) -> torch.Tensor:
    """Rows `rows` of a [B, heads, T, dim] K/V from column `start` on, copied into the start
    of a new buffer with room to grow (a view of it: `_roomy` finds the buffer)."""
    _, h, total, d = t.shape
    width = total - start
    buf = t.new_empty((len(rows), h, _room(width), d))
    for i, r in enumerate(rows):  # row by row: no intermediate copy of the whole batch
        buf[i, :, :width].copy_(t[r, :, start:])
    return buf[:, :, :width]


def _stack_rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """[B_i, heads, T_i, dim] K/V parts stacked by row, each right-aligned at `width` columns
    with zeros on the left, in a new buffer with room to grow (a view of its start)."""
    _, h, _, d = parts[0].shape
    n = sum(int(p.shape[0]) for p in parts)
    buf = parts[0].new_empty((n, h, _room(width), d))
    at = 0
    for p in parts:
        b, t = int(p.shape[0]), int(p.shape[2])
        if t < width:
            buf[at : at + b, :, : width - t].zero_()
        buf[at : at + b, :, width - t : width].copy_(p)
        at += b
    return buf[:, :, :width]


def _empty_cache() -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _grow_layer()
    return cache


def _pad_left(t: torch.Tensor, extra: int, dim: int) -> torch.Tensor:
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class BatchDecoder:
    """A batch of rows decoding together; `admit` adds rows, `step` advances every row by one
    token and returns the rows that ended. Not thread-safe: one thread drives it."""

    def __init__(
        self,
        forward: Forward,
        *,
        eos_ids: set[int],
        pad_id: int,
        generator: torch.Generator,
        decode_text: Callable[[list[int]], str] | None = None,
        prefix_cache: PrefixCache | None = None,
        stats: DecodeStats | None = None,
        conversations: bool = False,
        device: torch.device | str = "cpu",
        fast_forward: bool = True,
        select_logits: bool = False,
    ) -> None:
        """`conversations`: keep each finished row's K/V (prompt and reply) in the prefix
        cache, and start each row from the longest cached run of its prompt. `device`: the
        model's; the K/V cache and the inputs live there, the logits come back to the CPU
        (the grammar masks and the sampling run there). `fast_forward`: tokens the grammar
        forces (the only one its mask allows) are taken without a decode step of their own
        (`_forced`). `select_logits`: `forward` takes `logit_rows`, and a row whose next
        token its grammar forces gets no next-token logits (`_plan_logits`)."""
        self.forward = forward
        self.fast_forward = fast_forward
        # `forward` takes `logit_rows` (the rows whose next-token logits are needed: the
        # vocabulary projection only for them, `LocalEngine._forward`)
        self.select_logits = select_logits
        self.device = torch.device(device)
        self.conversations = conversations and prefix_cache is not None
        self.eos_ids = eos_ids
        self.pad_id = int(pad_id if pad_id is not None else 0)
        self.generator = generator
        self.decode_text = decode_text
        self.prefix_cache = prefix_cache
        self.stats = stats if stats is not None else DecodeStats()
        self.rows: list[DecodeRow] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # [B, T]: 1 = a real token
        self._next_pos: torch.Tensor | None = None  # [B, 1]: each row's next position
        self._logits: torch.Tensor | None = None  # [B, vocab]: each row's next-token logits

    def __len__(self) -> int:
        return len(self.rows)

    # ---- joining --------------------------------------------------------------------------
    def admit(self, rows: Sequence[DecodeRow]) -> None:
        """Prefill `rows` (those sharing an adapter and a cached prefix together) and add them
        to the batch; they take part in the next `step`."""
        self._join(self._prefills(rows))

    def next_logits(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        """Each row's next-token logits after its prompt, [rows, vocab], prefilled as `admit`
        does (shared prefixes from the cache); the rows do not join the batch. This is
        `guided_choice` scoring: one pass per group instead of one per prompt."""
        out: dict[int, torch.Tensor] = {}
        for members, prefill in self._prefills(rows):
            for r, row_logits in zip(members, prefill[3], strict=True):
                out[id(r)] = row_logits
        return torch.stack([out[id(r)] for r in rows])

    def _prefills(
        self, rows: Sequence[DecodeRow]
    ) -> list[tuple[list[DecodeRow], tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]]]:
        """The prefill of each group of `rows`; groups whose prefixes have the same length
        (other adapters' copies of one system prompt: each lineage's agents) run the rest of
        their prompts in one forward pass, their prefixes' K/V stacked by row, instead of a
        pass per adapter."""
        by_len: dict[int, list[tuple[list[DecodeRow], tuple[int, ...] | None, KV | None]]] = {}
        for members, prefix, cached in self._groups(rows):
            by_len.setdefault(len(prefix) if prefix is not None else 0, []).append(
                (members, prefix, cached)
            )
        out = []
        for p, groups in by_len.items():
            if len(groups) == 1 or p == 0:
                for members, prefix, cached in groups:
                    out.append((members, self._prefill(members, prefix, p, cached)))
                continue
            parts: list[tuple[int, KV]] = []
            rows_all: list[DecodeRow] = []
            for members, prefix, cached in groups:
                assert prefix is not None
                if cached is not None:
                    self.stats.cached_tokens += p * len(members)
                    kv = cached
                else:
                    kv = self._prefix_kv(members[0], prefix)
                parts.append((len(members), kv))
                rows_all.extend(members)
            layers = [
                (
                    torch.cat([kv[i][0].expand(n, -1, -1, -1) for n, kv in parts]),
                    torch.cat([kv[i][1].expand(n, -1, -1, -1) for n, kv in parts]),
                )
                for i in range(len(parts[0][1]))
            ]
            out.append((rows_all, self._run_prefill(rows_all, _cache_of(layers), p)))
        return out

    def _groups(
        self, rows: Sequence[DecodeRow]
    ) -> list[tuple[list[DecodeRow], tuple[int, ...] | None, KV | None]]:
        """Rows by (weights, shared prefix), with the prefix's cached K/V where the cache
        holds at least the row's system prompt (or, with no system prompt, any run of whole
        blocks); rows with no prefix form one group (adapters mixed)."""
        groups: dict[Any, list[DecodeRow]] = {}
        found: dict[Any, KV] = {}
        for r in rows:
            key = None
            p = self._prefix_len(r)
            if self.conversations and self.prefix_cache is not None:
                limit = len(r.prompt_ids) - 1
                n = self.prefix_cache.run_length(r.weights, r.prompt_ids, limit)
                if n >= max(p, MIN_PREFIX):
                    key = (r.weights, r.adapter, tuple(r.prompt_ids[:n]))
                if key is not None and key not in found:  # rows of one run share its copy
                    started = time.perf_counter()  # assembling cached K/V is prefill time
                    run, kv = self.prefix_cache.longest(
                        r.weights,
                        r.prompt_ids,
                        limit,
                        capacity=len(r.prompt_ids) + r.max_new_tokens + 1,  # grows in place
                    )
                    self.stats.prefill_s += time.perf_counter() - started
                    if len(run) == n:
                        found[key] = kv
                    else:  # evicted in between: prefilled as if never cached
                        key = None
            if key is None and p:
                key = (r.weights, r.adapter, tuple(r.prompt_ids[:p]))
            groups.setdefault(key, []).append(r)
        return [
            (members, None if key is None else key[2], None if key is None else found.get(key))
            for key, members in groups.items()
        ]

    def _prefix_len(self, r: DecodeRow) -> int:
        p = min(r.prefix_len, len(r.prompt_ids) - 1)  # a row keeps one token of its own
        return p if p >= MIN_PREFIX else 0

    def _prefix_kv(self, row: DecodeRow, prefix: Sequence[int]) -> KV:
        """The K/V of `prefix` under the row's weights: the cached run of whole blocks, and
        the rest run through the model once (then cached)."""
        run: tuple[int, ...] = ()
        kv: KV = []
        started = time.perf_counter()
        if self.prefix_cache is not None:
            run, kv = self.prefix_cache.longest(row.weights, prefix, len(prefix))
            self.stats.cached_tokens += len(run)
        if len(run) == len(prefix):
            self.stats.prefill_s += time.perf_counter() - started
            return kv
        ids = torch.tensor([list(prefix[len(run) :])], dtype=torch.long, device=self.device)
        positions = torch.arange(len(run), len(prefix), device=self.device)[None]
        out = self.forward(
            [row.adapter],
            input_ids=ids,
            position_ids=positions,
            past_key_values=_cache_of(kv) if run else _empty_cache(),
            use_cache=True,
            logits_to_keep=1,
        )
        kv = _kv_of(out.past_key_values)
        if self.prefix_cache is not None:
            self.prefix_cache.put(row.weights, prefix, kv)
        self.stats.prefill_s += time.perf_counter() - started  # storing it included
        self.stats.prefill_tokens += len(prefix) - len(run)
        return kv

    def _prefill(
        self,
        rows: list[DecodeRow],
        prefix: Sequence[int] | None,
        p: int,
        cached: KV | None = None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cache (K/V [n, heads, T, dim]), mask [n, T], next positions [n, 1], logits
        [n, vocab]."""
        n = len(rows)
        past = _empty_cache()
        if prefix is not None:
            if cached is not None:
                self.stats.cached_tokens += p * n
                kv = cached
            else:
                kv = self._prefix_kv(rows[0], prefix)
            if cached is not None and n == 1:  # a fresh copy with room: grows in place
                past = _cache_of(kv, adopt=True)
            else:
                past = _cache_of(
                    [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv]
                )
        return self._run_prefill(rows, past, p)

    def _run_prefill(
        self, rows: list[DecodeRow], past: Any, p: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows' prompts after their first `p` tokens (whose K/V `past` holds, row by
        row) through the model, each row under its own adapter."""
        n = len(rows)
        started = time.perf_counter()
        rest = [r.prompt_ids[p:] for r in rows]
        width = max(len(x) for x in rest)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        rest_mask = torch.zeros((n, width), dtype=torch.long)
        for i, x in enumerate(rest):
            ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            rest_mask[i, width - len(x) :] = 1
        ids, rest_mask = ids.to(self.device), rest_mask.to(self.device)
        mask = torch.cat([rest_mask.new_ones((n, p)), rest_mask], dim=1) if p else rest_mask
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, p:]
        out = self.forward(
            [r.adapter for r in rows],
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats.prefill_s += time.perf_counter() - started
        self.stats.prefill_tokens += int(rest_mask.sum())
        logits = out.logits[:, -1, :].float().cpu()
        return out.past_key_values, mask, mask.sum(-1, keepdim=True), logits

    def _join(
        self,
        parts: list[tuple[list[DecodeRow], tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]]],
    ) -> None:
        """Add the prefilled groups to the batch. Every group joins in one merge: each row's
        K/V is copied once (a group at a time copied the whole batch again per group, and a
        learner's turn starts up to a group per row: each conversation its own cached run)."""
        if not parts:
            return
        if not self.rows and len(parts) == 1:  # the prefill's own cache: room to grow
            members, (cache, mask, next_pos, logits) = parts[0]
            self.rows = list(members)
            self._cache, self._mask, self._next_pos, self._logits = cache, mask, next_pos, logits
            return
        batches: list[tuple[KV, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        if self.rows:
            assert self._mask is not None and self._next_pos is not None
            assert self._logits is not None
            batches.append((_kv_of(self._cache), self._mask, self._next_pos, self._logits))
        for _, (cache, mask, next_pos, logits) in parts:
            batches.append((_kv_of(cache), mask, next_pos, logits))
        width = max(int(b[1].shape[1]) for b in batches)
        # each layer's merged K/V written once into a buffer with room to grow (padded on
        # the left with zeros, as a concatenation of padded parts would give): the next
        # decode step writes in place instead of copying the whole batch's cache again
        merged = [
            (
                _stack_rows([b[0][i][0] for b in batches], width),
                _stack_rows([b[0][i][1] for b in batches], width),
            )
            for i in range(len(batches[0][0]))
        ]
        self._cache = _cache_of(merged, adopt=True)
        self._mask = torch.cat([_pad_left(b[1], width - int(b[1].shape[1]), 1) for b in batches])
        self._next_pos = torch.cat([b[2] for b in batches])
        self._logits = torch.cat([b[3] for b in batches])
        for members, _ in parts:
            self.rows.extend(members)

    # ---- decoding -------------------------------------------------------------------------
    def step(self) -> list[DecodeRow]:
        """Sample one token for every row, drop the rows that ended, run the model once for
        the rest. Returns the rows that ended (their `toks`, `lps`, `tops`, `finish` final)."""
        rows, logits = self.rows, self._logits
        if not rows or logits is None:
            return []
        ended: set[int] = set()
        for b, r in enumerate(rows):  # the request went away (disconnect, timeout, stop)
            if r.cancelled is not None and r.cancelled():
                r.finish = "cancelled"
                ended.add(b)
        forced: set[int] = set()  # rows whose token the grammar forces: all the mass on it
        for b, r in enumerate(rows):
            if r.next_forced is not None and b not in ended:
                forced.add(b)
                logits[b].fill_(float("-inf"))
                logits[b, r.next_forced] = 0.0  # log-prob 0, as the mask's one token gets
            r.next_forced = None
        guided = [
            b
            for b, r in enumerate(rows)
            if r.matcher is not None and b not in ended and b not in forced
        ]
        picks = [b for b in guided if isinstance(rows[b].matcher, ChoiceMatcher)]
        if picks:  # a streamed guided_choice: only tokens that continue a choice
            _mask_choices(logits, picks, [rows[b].matcher for b in picks])
            guided = [b for b in guided if b not in picks]
        if guided:  # structured outputs: what the grammar forbids gets probability 0
            for b in mask_logits(logits, guided, [rows[b].matcher for b in guided]):
                rows[b].finish = "grammar_error"
                ended.add(b)
                logits[b] = 0.0  # a placeholder row: its sample is discarded
        temp = rows[0].temperature
        logp: torch.Tensor | None = None
        if all(r.temperature == temp for r in rows) and not any(r.top_k for r in rows):
            # one temperature, no alternatives wanted: one uniform per row, two-level
            # inverse CDF (multinomial over 50k is slow on CPU)
            choice, chosen_lp = sample_tokens(logits, temp, self.generator)
        else:
            temps = torch.tensor([r.temperature for r in rows])
            greedy = temps <= 0
            scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
            logp = torch.log_softmax(scaled, dim=-1)
            sampled = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
            choice = torch.where(greedy, logp.argmax(-1), sampled)
            chosen_lp = logp.gather(-1, choice[:, None]).squeeze(-1)
        choice_list, lp_list = choice.tolist(), chosen_lp.tolist()
        feeds: list[list[int]] = [[int(t)] for t in choice_list]  # tokens each row runs next
        forced_cap = 0
        if self.fast_forward and len(rows) <= FORCED_MAX_ROWS:
            forced_cap = FORCED_POSITIONS // len(rows)
        for b, r in enumerate(rows):
            if b in ended:
                continue
            tok, lp = int(choice_list[b]), float(lp_list[b])
            r.toks.append(tok)
            r.lps.append(lp)
            top: list[tuple[int, float]] = []
            if r.top_k and logp is not None:
                v, k = logp[b].topk(r.top_k)
                top = list(zip(k.tolist(), v.tolist(), strict=True))
                r.tops.append(top)
            if r.on_token is not None:
                r.on_token(tok, lp, top)
            if r.matcher is not None and not advance(r.matcher, tok):
                r.finish = "grammar_error"
                ended.add(b)
            elif (
                tok in self.eos_ids
                or (r.matcher is not None and r.matcher.is_stopped())
                or (r.stops and self._stopped(r))
            ):
                r.finish = "stop"
                ended.add(b)
            elif len(r.toks) >= r.max_new_tokens or (
                forced_cap
                and r.matcher is not None
                and not r.top_k
                and self._forced(r, feeds[b], logits.shape[1], forced_cap)
            ):
                ended.add(b)
        if self.select_logits:
            self._plan_logits(rows, ended, logits.shape[1])
        done = [r for b, r in enumerate(rows) if b in ended]
        if self.conversations:
            for b in sorted(ended):
                self._keep_conversation(b, rows[b])
        if ended:
            keep = [b for b in range(len(rows)) if b not in ended]
            self.rows = [rows[b] for b in keep]
            if not keep:
                self._cache = self._mask = self._next_pos = self._logits = None
                return done
            self._select(keep)
            choice = choice[torch.tensor(keep)]
            feeds = [feeds[b] for b in keep]
        if any(len(f) > 1 for f in feeds):
            self._advance_many(feeds)
        else:
            self._advance(choice)
        return done

    def _plan_logits(self, rows: list[DecodeRow], ended: set[int], vocab: int) -> None:
        """Mark the rows whose next token their grammar forces (`next_forced`): the next
        forward pass projects only the other rows onto the vocabulary (the projection is a
        quarter of a 16-row SmolLM2 step, and 25 of a 61-token Agent Zero reply's tokens are
        forced), and the next step gives the forced token log-prob 0 without a mask."""
        for b, r in enumerate(rows):
            if (
                b not in ended
                and r.matcher is not None
                and not r.top_k
                and not isinstance(r.matcher, ChoiceMatcher)
                and not r.matcher.is_stopped()
            ):
                r.next_forced = forced_token(r.matcher, vocab)

    def _logit_rows(self) -> dict[str, Any]:
        """`forward`'s `logit_rows` when some rows need no logits (else nothing)."""
        if not self.select_logits or all(r.next_forced is None for r in self.rows):
            return {}
        need = [i for i, r in enumerate(self.rows) if r.next_forced is None]
        return {"logit_rows": torch.tensor(need, dtype=torch.long, device=self.device)}

    def _last_logits(self, out: Any, select: dict[str, Any]) -> torch.Tensor:
        """[rows, vocab] next-token logits (zeros where none were computed)."""
        logits = out.logits[:, -1, :].float().cpu()
        n = len(self.rows)
        if select and logits.shape[0] != n:
            full = logits.new_zeros((n, logits.shape[1]))
            full[select["logit_rows"].cpu()] = logits
            logits = full
        return logits

    def _forced(self, r: DecodeRow, feed: list[int], vocab: int, cap: int) -> bool:
        """Take the tokens the row's grammar forces after its sampled token, each the only
        one its mask allows (JSON keys and punctuation: 25 of a 61-token Agent Zero reply),
        without a decode step each: the token-by-token path samples exactly these, each
        with log-prob 0 (the masked distribution puts all its mass there), so the logged
        tokens and log-probs are the same; they run through the model together with the
        sampled token in the next step (`_advance_many`). Rows wanting top log-probs and
        guided_choice streams go token by token. At most `cap` tokens (`FORCED_POSITIONS`:
        in small batches only, paced acting or a validation's few episodes). True when the
        row ended."""
        if isinstance(r.matcher, ChoiceMatcher):
            return False
        for _ in range(cap):  # a longer forced run goes on in the next steps
            if len(r.toks) >= r.max_new_tokens or r.matcher.is_stopped():
                break
            tok = forced_token(r.matcher, vocab)
            if tok is None:
                return False
            r.toks.append(tok)
            r.lps.append(0.0)
            feed.append(tok)
            self.stats.forced_tokens += 1
            if r.on_token is not None:
                r.on_token(tok, 0.0, [])
            if not advance(r.matcher, tok):
                r.finish = "grammar_error"
                return True
            if tok in self.eos_ids or r.matcher.is_stopped() or (r.stops and self._stopped(r)):
                r.finish = "stop"
                return True
        return len(r.toks) >= r.max_new_tokens

    def _keep_conversation(self, b: int, r: DecodeRow) -> None:
        """Put row `b`'s K/V (its prompt and the reply tokens run through the model) in the
        prefix cache: the agent's next prompt starts with them."""
        if r.finish in ("cancelled", "grammar_error") or self._mask is None:
            return
        assert self.prefix_cache is not None
        real = self._mask[b].bool()
        tokens = [*r.prompt_ids, *r.toks][: int(real.sum())]
        kv = [(k[b : b + 1, :, real], v[b : b + 1, :, real]) for k, v in _kv_of(self._cache)]
        self.prefix_cache.put(r.weights, tokens, kv)

    def _stopped(self, r: DecodeRow) -> bool:
        text = self.decode_text(r.toks) if self.decode_text is not None else ""
        return any(s in text for s in r.stops)

    def _select(self, keep: list[int]) -> None:
        """Keep the batch rows `keep`; cut the columns that are padding for all of them."""
        assert self._mask is not None and self._next_pos is not None
        index = torch.tensor(keep, device=self.device)
        mask = self._mask[index]
        real = mask.any(0).nonzero()
        start = int(real[0]) if len(real) else 0
        # the kept rows' K/V copied once, into buffers with room to grow (adopted: the next
        # decode step writes in place, no second copy of the whole cache)
        kv = [
            (_take_rows(k, keep, start), _take_rows(v, keep, start)) for k, v in _kv_of(self._cache)
        ]
        self._cache = _cache_of(kv, adopt=True)
        self._mask = mask[:, start:]
        self._next_pos = self._next_pos[index]

    def _advance(self, choice: torch.Tensor) -> None:
        assert self._mask is not None and self._next_pos is not None
        started = time.perf_counter()
        n = len(self.rows)
        self._mask = torch.cat([self._mask, self._mask.new_ones((n, 1))], dim=1)
        select = self._logit_rows()
        out = self.forward(
            [r.adapter for r in self.rows],
            input_ids=choice[:, None].to(self.device),
            attention_mask=self._mask,
            position_ids=self._next_pos,
            past_key_values=self._cache,
            use_cache=True,
            **select,
        )
        self._next_pos = self._next_pos + 1
        self._cache, self._logits = out.past_key_values, self._last_logits(out, select)
        self.stats.decode_s += time.perf_counter() - started
        self.stats.decode_steps += 1
        self.stats.decode_rows += n

    def _advance_many(self, feeds: list[list[int]]) -> None:
        """One forward pass for rows that run several tokens (a sampled token and the
        tokens its grammar forced after it): each row's tokens right-aligned, padding on
        their left masked out (a row's K/V then has masked columns inside, as a joining
        row's padding; `_keep_conversation` keeps the real ones); the logits of each row's
        last token."""
        assert self._mask is not None and self._next_pos is not None
        started = time.perf_counter()
        n, width = len(self.rows), max(len(f) for f in feeds)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((n, width), dtype=self._mask.dtype)
        positions = torch.zeros((n, width), dtype=torch.long)
        for i, f in enumerate(feeds):
            k = len(f)
            ids[i, width - k :] = torch.tensor(f, dtype=torch.long)
            new_mask[i, width - k :] = 1
            positions[i, width - k :] = torch.arange(k) + int(self._next_pos[i, 0])
        self._mask = torch.cat([self._mask, new_mask.to(self.device)], dim=1)
        select = self._logit_rows()
        out = self.forward(
            [r.adapter for r in self.rows],
            input_ids=ids.to(self.device),
            attention_mask=self._mask,
            position_ids=positions.to(self.device),
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
            **select,
        )
        self._next_pos = self._next_pos + torch.tensor([[len(f)] for f in feeds]).to(self.device)
        self._cache, self._logits = out.past_key_values, self._last_logits(out, select)
        self.stats.decode_s += time.perf_counter() - started
        self.stats.decode_steps += 1
        self.stats.decode_rows += n


def decode_all(decoder: BatchDecoder, rows: Sequence[DecodeRow]) -> list[DecodeRow]:
    """Admit every row and step until all ended (a batch that nothing joins)."""
    if rows:
        decoder.admit(rows)
    while len(decoder):
        decoder.step()
    return list(rows)
