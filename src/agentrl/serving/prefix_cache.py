"""Automatic prefix caching for the local engine: the K/V of prompt prefixes kept in blocks
and reused by any later request that starts with the same tokens under the same weights.

Why: Agent Zero sends the same 5,408-token system prompt on every turn of every chat; its
prefill took minutes per turn on 2 busy cores. As vLLM's automatic prefix caching does, the
K/V is stored in blocks of `BLOCK` tokens, each block named by its tokens and its parent
block (a hash chain, here exact: the parent's id and the token tuple), so a system prompt
shared by many conversations is stored once and each conversation adds only its own blocks;
a request reuses the longest run of whole blocks it shares with anything cached.

K/V depends on the weights: blocks live under a `key` naming them (the engine's
`weights_key`: the base model, or a digest of an adapter's files), so versions share a
prefix only when their weights are identical; a LoRA adapter anywhere changes the K/V of
the layers from it on, so each adapter has its own blocks. Bounded by bytes: least recently
used blocks go first, and a block is always used at least as recently as the blocks after
it (a path is touched from its tail to its head), so eviction takes chains from their ends.
Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), [1, heads, T, dim]
BLOCK = 16  # tokens per block, as vLLM's: the granularity of reuse (the rest is prefilled)
BLOCK_OVERHEAD = 300  # bytes per block beyond its tensor: the dict slots, the token tuple


@dataclass(eq=False)
class _Block:
    ident: int
    key: str  # the weights it was computed under
    parent: int  # the previous block's ident (0: the start of a prompt)
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2, heads, BLOCK, dim]
    nbytes: int


class PrefixCache:
    """`longest(key, ids, limit)` -> the longest cached run of whole blocks at the start of
    `ids` (at most `limit` tokens) with its K/V; `put(key, ids, kv)` stores the whole blocks
    of a run whose K/V was computed; `drop_adapter(key)` forgets a key's blocks."""

    def __init__(self, budget_bytes: int, block: int = BLOCK) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.block = int(block)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._blocks: OrderedDict[int, _Block] = OrderedDict()  # LRU order, oldest first
        self._index: dict[tuple[str, int, tuple[int, ...]], int] = {}
        self._next = 1
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def weight_keys(self) -> set[str]:
        """The weight keys with blocks cached."""
        with self._lock:
            return {b.key for b in self._blocks.values()}

    def tokens(self, key: str) -> int:
        """Tokens of K/V cached under `key` (blocks x BLOCK)."""
        with self._lock:
            return sum(len(b.tokens) for b in self._blocks.values() if b.key == key)

    # ---- lookup -----------------------------------------------------------------------
    def _path(self, key: str, ids: Sequence[int], limit: int) -> list[_Block]:
        path: list[_Block] = []
        parent = 0
        for start in range(0, min(limit, len(ids)) - self.block + 1, self.block):
            ident = self._index.get((key, parent, tuple(ids[start : start + self.block])))
            if ident is None:
                break
            path.append(self._blocks[ident])
            parent = ident
        return path

    def _touch(self, path: list[_Block]) -> None:
        for b in reversed(path):  # the tail first: the head ends up the most recent
            self._blocks.move_to_end(b.ident)

    def run_length(self, key: str, ids: Sequence[int], limit: int) -> int:
        """Tokens of the cached run `longest` would give (nothing assembled, nothing counted)."""
        with self._lock:
            return len(self._path(key, ids, limit)) * self.block

    def longest(
        self, key: str, ids: Sequence[int], limit: int, capacity: int = 0
    ) -> tuple[tuple[int, ...], KV]:
        """The cached run (whole blocks, at most `limit` tokens) and its K/V per layer
        [1, heads, run, dim]; ((), []) when not a block is cached. With `capacity`, the K/V
        are views of the start of fresh buffers of `capacity` tokens (the decode loop then
        writes the rest of the prompt and the answer in place, no second copy)."""
        with self._lock:
            path = self._path(key, ids, limit)
            if not path:
                self.misses += 1
                return (), []
            self.hits += 1
            self._touch(path)
            stacked = [b.kv for b in path]
        n = len(path) * self.block
        if capacity > n:
            layers, _, heads, _, dim = stacked[0].shape
            kv = stacked[0].new_empty((layers, 2, heads, capacity, dim))[:, :, :, :n]
            for i, piece in enumerate(stacked):
                kv[:, :, :, i * self.block : (i + 1) * self.block] = piece
        else:
            kv = torch.cat(stacked, dim=3) if len(stacked) > 1 else stacked[0]
        return tuple(ids[:n]), [(layer[0][None], layer[1][None]) for layer in kv]

    # ---- storing ----------------------------------------------------------------------
    def put(self, key: str, ids: Sequence[int], kv: KV) -> None:
        """Store the whole blocks of `ids` (K/V per layer [1, heads, >= len(ids), dim]) not yet
        cached, as many as the budget holds, then evict the least recently used."""
        if not kv:
            return
        width = min(len(ids), int(kv[0][0].shape[2]))
        per_token = sum(k[0, :, :1].nbytes + v[0, :, :1].nbytes for k, v in kv)
        fits = (self.budget_bytes // (per_token * self.block + BLOCK_OVERHEAD)) * self.block
        width = min(width, fits) // self.block * self.block
        if width <= 0:
            return
        with self._lock:
            path = self._path(key, ids, width)
        # the K/V of the missing blocks, copied out of the (larger) batch tensors
        start = len(path) * self.block
        fresh: list[tuple[int, torch.Tensor]] = []
        if start < width:
            span = torch.stack(
                [torch.stack((k[0, :, start:width], v[0, :, start:width])) for k, v in kv]
            )  # [layers, 2, heads, width - start, dim]
            for s in range(start, width, self.block):
                piece = span[:, :, :, s - start : s - start + self.block].contiguous()
                fresh.append((s, piece))
        with self._lock:
            path = self._path(key, ids, start)  # blocks may have gone meanwhile
            if len(path) * self.block != start:
                return  # evicted in between: the next request stores them
            parent = path[-1].ident if path else 0
            for s, piece in fresh:
                tokens = tuple(int(t) for t in ids[s : s + self.block])
                ident = self._index.get((key, parent, tokens))
                if ident is None:
                    ident, self._next = self._next, self._next + 1
                    size = piece.nbytes + BLOCK_OVERHEAD
                    self._blocks[ident] = _Block(ident, key, parent, tokens, piece, size)
                    self._index[(key, parent, tokens)] = ident
                    self.bytes += size
                path.append(self._blocks[ident])
                parent = ident
            self._touch(path)
            self._evict()

    def _evict(self) -> None:
        while self.bytes > self.budget_bytes and self._blocks:
            _, gone = self._blocks.popitem(last=False)
            self._index.pop((gone.key, gone.parent, gone.tokens), None)
            self.bytes -= gone.nbytes
            self.evictions += 1

    def drop_adapter(self, key: str) -> None:
        """Forget every block of `key` (its adapter was unloaded: the K/V mean nothing now)."""
        with self._lock:
            for ident in [i for i, b in self._blocks.items() if b.key == key]:
                gone = self._blocks.pop(ident)
                self._index.pop((gone.key, gone.parent, gone.tokens), None)
                self.bytes -= gone.nbytes

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._index.clear()
            self.bytes = 0
