"""The embedded backend: one Hugging Face base model in memory, each version's LoRA adapter
stacked over it (`agentrl.serving.multilora`), and concurrent requests batched together.

A batch may mix versions (lineages, canaries, the bare base "__base__"): each row gets its
own adapter in one forward pass whatever the number of adapters, so neither a canary split
nor many agents' lineages split the batch. Adapters load while batches decode and an
unloaded one goes once no row uses it. Requests wait in a queue; a batcher takes up to
`max_batch_size`, waiting at most `max_wait_ms` after the first, and decodes them in a
worker thread with `agentrl.serving.decoding.BatchDecoder` (continuous batching): requests
that arrive while a batch decodes join it between steps, a row that ends leaves the batch
and is answered at once, and the system prompt every agent sends is prefilled once per
version (prefix KV cache). Per row: temperature (0 = greedy), token limit, top-k log-probs, stop strings, and a
callback per token for streaming. Log-probs are those of the distribution sampled
(log softmax(logits / temperature); plain log softmax when greedy), as the trainers need.

`guided_choice` is answered by scoring the choices (GLAM's renormalised policy, cached per
version and prompt); a streamed one is decoded token by token over a trie of the choices
(`decoding.ChoiceMatcher`), so its chunks come as it decodes and a client that leaves stops
it. Decoding, scoring and adapter changes run on the engine's own threads (`ENGINE_WORKERS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.serving.choices import pick
from agentrl.serving.decoding import (
    BatchDecoder,
    ChoiceMatcher,
    DecodeRow,
    DecodeStats,
    PrefixCache,
)
from agentrl.serving.errors import BackendError, DeployError, VersionNotServed
from agentrl.serving.lru import ByteLRU
from agentrl.serving.multilora import MultiLora
from agentrl.serving.openai_types import ChatRequest, Generation, tool_call
from agentrl.serving.structured import (
    Constraint,
    GrammarCompiler,
    constraint_for,
    split_tool_answer,
)

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"
PROMPT_CACHE_MB = 256.0  # rendered prompts + guided_choice scores together (LRU by bytes)
# K/V of prompt prefixes (system prompts, finished conversations: an agent's next turn
# starts with its last prompt and reply), per weights, in blocks (`prefix_cache`):
# SmolLM2-135M holds ~46 KB per token, so Agent Zero's 5,408-token system prompt is ~250 MB
# and 1 GiB keeps it with ~17,000 tokens of conversations
PREFIX_CACHE_MB = 1024.0
# the engine's own threads: one decodes, one scores guided_choice prompts, one loads or
# unloads adapters. Not the loop's default executor: `asyncio.to_thread` work of other
# services (grammar compiles that run on past their timeout, evaluations) queued ahead of
# the decode and an ordinary request waited 25-42 s behind six compiles (issue 49)
ENGINE_WORKERS = 3
ChoiceScores = tuple[list[float], list[list[int]], list[list[float]]]
TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]
ChoiceKey = tuple[str, str, tuple[str, ...]]  # (adapter, prompt text, choices)
# a guided_choice prompt waiting to be scored: key, token ids, system-prompt tokens, answer
ScoreWait = tuple[ChoiceKey, list[int], int, "asyncio.Future[ChoiceScores]"]


@dataclass
class EngineStats:
    batch_sizes: list[int] = field(default_factory=list)  # rows decoding after each admission
    new_tokens: int = 0
    cancelled: int = 0  # rows stopped mid-decode because their request went away
    active: int = 0  # rows in the decode loop now (a gauge)
    decode: DecodeStats = field(default_factory=DecodeStats)  # prefill vs decode time

    def record_batch(self, size: int) -> None:
        self.batch_sizes.append(size)
        if len(self.batch_sizes) > 10_000:  # a long-running gateway: keep the recent ones
            del self.batch_sizes[:5_000]


def weights_key(folder: Path) -> str:
    """The identity of an adapter's weights: a digest of its config and weight files (two
    versions of identical weights share cached prefixes; any difference separates them)."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.startswith("adapter_"):
            h.update(path.name.encode() + b"\0")
            with path.open("rb") as f:
                for piece in iter(lambda: f.read(1 << 20), b""):
                    h.update(piece)
    return "lora:" + h.hexdigest()


def engine_threads(requested: int = 0) -> int:
    """Torch threads of a local engine: `requested`, else one per two cores. The engine
    shares its host with training jobs and the agents; OpenMP workers spinning against them
    made decoding 7-30x slower on 2 busy cores (tiny model, 4 x 200 tokens: 68.7 s with two
    threads, 2.2 s with one, load 5). Even on a quiet host two threads hardly pay for the
    decode steps of the tool-use agents (SmolLM2, 16 rows, load 1.2-1.5: 10.8 and 23.6 ms a
    token against 11.5 and 12.8 with one, twice the CPU time) and move log-probs by up to
    1.3e-5 (2026-11-30)."""
    if requested > 0:
        return requested
    return max(1, (os.cpu_count() or 1) // 2)


class LocalEngine:
    """One base model + adapters; `generate()` is safe to call from many coroutines."""

    def __init__(
        self,
        base: str = "smollm2",
        *,
        seed: int = 0,
        tiny_kwargs: dict[str, Any] | None = None,
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        default_max_tokens: int = 256,
        prompt_cache_mb: float = PROMPT_CACHE_MB,
        threads: int = 0,
        prefix_cache_mb: float = PREFIX_CACHE_MB,
        score_batch_size: int = 32,
        packed_weights: bool = False,
    ) -> None:
        from agentrl.llm.loading import load_policy
        from agentrl.serving.packed import pack_linears

        torch.set_num_threads(engine_threads(threads))

        policy = load_policy(base, seed=seed, tiny_kwargs=tiny_kwargs)
        self.base_spec = {"name": base, "seed": seed, "tiny_kwargs": tiny_kwargs}
        self.model: Any = policy.model.eval()
        # the Linear layers on weights packed once for MKL's GEMM (`serving.packed`): the
        # same results bit for bit, without repacking every weight on every decode step;
        # off by default: SmolLM2's engine 439 MB -> 1.5 GB resident for a decode step 9 %
        # faster under load and no faster on a quiet host (2026-11-30)
        self.packed_layers = pack_linears(self.model) if packed_weights else 0
        self.tokenizer = policy.tokenizer
        # every version's LoRA over the plain base, applied per batch row (`multilora`)
        self.lora = MultiLora(self.model)
        # the vocabulary projection of the rows that need next-token logits only (a row
        # whose next token its grammar forces needs none: `BatchDecoder._plan_logits`);
        # hooked once here (a forward in another thread iterates the hook dict)
        head = self.model.get_output_embeddings()
        self._head_name = next(n for n, m in self.model.named_modules() if m is head)
        self._head_rows = threading.local()
        head.register_forward_pre_hook(self._select_head_rows)
        self.adapters: dict[str, str] = {}  # model_id -> adapter name
        self.adapter_bytes: dict[str, int] = {}  # adapter name -> its weights' bytes
        # guards `adapters`/`weights` and the check that a retired adapter is unused: a
        # request resolves its adapter and queues its row under it
        self._book = threading.Lock()
        self._serial = 0
        # adapter name -> the identity of its weights (the prefix cache's key): versions
        # share cached prefixes only when their weights are identical
        self.weights: dict[str, str] = {BASE_ADAPTER: BASE_ADAPTER}
        self.max_batch_size = max_batch_size
        # guided_choice prompts scored in one pass (a prefill with no decoding after it:
        # larger batches pay; `agentrl bench choice`, SmolLM2 on one thread, 103-token
        # FrozenLake prompts: 3.7 prompts/s one by one, 6.0 at 8 in flight, 6.4 at 32; the
        # path before, a full pass per prompt: 2.7)
        self.score_batch_size = score_batch_size
        self.max_wait_ms = max_wait_ms
        self.default_max_tokens = default_max_tokens
        self.stats = EngineStats()
        self.pad_id = self.tokenizer.pad_token_id
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos_list = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in [*eos_list, self.tokenizer.eos_token_id] if e is not None}
        self.context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._lock = threading.Lock()  # one forward pass at a time: decoding or scoring
        # scoring passes waiting for the lock: the batcher holds back the next batch (a busy
        # engine decodes batch after batch, and a plain lock starved them)
        self._adapter_ops = 0
        # requests waiting to decode: appended on the event loop, taken by the batcher and,
        # between decode steps, by the decode thread (deque: thread-safe append/popleft)
        self._waiting: deque[DecodeRow] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._live: list[DecodeRow] = []  # the rows being decoded (cancel_all)
        self.prefixes = PrefixCache(int(prefix_cache_mb * 2**20))
        self._executor: ThreadPoolExecutor | None = None
        self._rng = torch.Generator()
        self._rng.manual_seed(seed)
        self._py_rng = random.Random(seed)
        # guided_choice: (adapter, prompt text, choices) -> (renormalised log-probs, each
        # choice's per-token log-probs). Agents in an environment see the same states again
        # and again; a version's answer distribution for a prompt never changes, so it is
        # computed once (entries of an adapter go when it is unloaded). Both caches are LRUs
        # bounded by bytes (`prompt_cache_mb`), keyed by a digest, token ids as array('i').
        budget = int(prompt_cache_mb * 2**20)
        self._choice_cache = ByteLRU(budget // 4, tag_of=lambda key: key[0])
        self._prompts = ByteLRU(budget - budget // 4)
        self._inflight: dict[ChoiceKey, asyncio.Future[ChoiceScores]] = {}
        # choice prompts waiting to be scored, and the task scoring them in batches
        self._to_score: deque[ScoreWait] = deque()
        self._scorer: asyncio.Task[None] | None = None
        vocab = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
        self.grammars = GrammarCompiler(self.tokenizer, vocab)  # structured outputs

    # ---- threads ----------------------------------------------------------------------
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the engine's own threads (`ENGINE_WORKERS`), never the loop's
        default executor that other services fill."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(ENGINE_WORKERS, thread_name_prefix="agentrl-engine")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ---- adapters ---------------------------------------------------------------------
    def load_adapter(self, model_id: str, folder: Path) -> None:
        """Attach the LoRA adapter in `folder` as version `model_id` (base stays loaded)."""
        from agentrl.llm.loading import BASE_FILE

        if not (folder / "adapter_config.json").exists():
            raise DeployError(
                f"{folder} holds no LoRA adapter (adapter_config.json); the local backend "
                "serves adapters over one base — serve full models through an upstream server"
            )
        spec_file = folder / BASE_FILE
        if spec_file.exists():
            spec = json.loads(spec_file.read_text())
            mine = self.base_spec
            if (
                spec.get("name", "").lower() != str(mine["name"]).lower()
                or (spec.get("tiny_kwargs") != mine["tiny_kwargs"])
                or int(spec.get("seed", 0)) != int(str(mine["seed"] or 0))
            ):
                raise DeployError(
                    f"adapter {model_id} was trained on base {spec}, but the gateway serves "
                    f"{mine}; start the gateway with that base model"
                )
        if model_id in self.adapters:
            return
        identity = weights_key(folder)
        with self._book:
            self._serial += 1
            # a name of its own per load: a version unloaded and loaded again while rows of
            # the old one still decode gets a fresh slot, the old one goes when they end
            name = f"v{self._serial}_" + "".join(c if c.isalnum() else "_" for c in model_id)
        # read and stacked here, on the loader's thread: batches go on decoding meanwhile
        # (they take the stacks snapshot as each forward starts)
        self.adapter_bytes[name] = self.lora.add(name, folder)
        with self._book:
            if model_id in self.adapters:  # a concurrent load of the same version won
                self.lora.retire(name)
            else:
                self.weights[name] = identity
                self.adapters[model_id] = name
        self._collect_if_idle()

    def use_prefix_cache(self, cache: PrefixCache) -> PrefixCache:
        """Serve with `cache` from the next decode run on and return the one before. Waits
        for a running decode to end: a run holds its cache until its last row, and requests
        queued meanwhile join it, so a plain assignment could leave them on the old cache."""
        with self._lock:
            old, self.prefixes = self.prefixes, cache
        return old

    def unload_adapter(self, model_id: str) -> None:
        """Stop routing `model_id` to its adapter now; its weights go once no queued or
        decoding row uses them (rows already admitted finish with it: nothing is lost)."""
        with self._book:
            name = self.adapters.pop(model_id, None)
            if name is None:
                return
            self.lora.retire(name)
            identity = self.weights.pop(name, name)
        self._choice_cache.drop_tag(name)
        if identity not in self.weights.values():  # no version with these weights
            self.prefixes.drop_adapter(identity)
        self._collect_if_idle()

    def adapters_loaded(self) -> dict[str, str]:
        """Served version -> adapter name, for every adapter requests can reach now (one
        base, any number of lineages' versions)."""
        with self._book:
            return dict(self.adapters)

    def adapter_memory(self) -> dict[str, int]:
        """Bytes of the adapters' stacked weights (`stacked`, padding included) and of their
        checkpoints' tensors (`weights`): what serving N adapters costs beyond the base."""
        live = set(self.lora.names())
        return {
            "adapters": len(live),
            "weights": sum(v for k, v in self.adapter_bytes.items() if k in live),
            "stacked": self.lora.nbytes(),
        }

    def _in_use(self) -> set[str]:
        """Adapter names that queued rows, choice prompts waiting to be scored and the rows
        of `rows` name (call on the decode thread or with the engine's lock held)."""
        used = {r.adapter for r in list(self._waiting)}
        used |= {w[0][0] for w in list(self._to_score)}
        used |= {k[0] for k in list(self._inflight)}
        return used

    def _collect(self, decoding: list[DecodeRow] | None = None) -> None:
        """Drop retired adapters that nothing uses (decode thread, or the lock held)."""
        if not self.lora.has_retired():
            return
        with self._book:
            used = self._in_use() | {r.adapter for r in decoding or ()}
            for name in self.lora.collect(used):
                self.adapter_bytes.pop(name, None)

    def _collect_if_idle(self) -> None:
        """Collect now when no batch decodes (else the decode thread does between steps)."""
        if self._lock.acquire(blocking=False):
            try:
                self._collect()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _adapter_turn(self) -> Iterator[None]:
        """The engine's lock for a scoring pass, taken ahead of the next batch (and of
        requests that would join the batch decoding now)."""
        self._adapter_ops += 1
        try:
            with self._lock:
                yield
        finally:
            self._adapter_ops -= 1

    def weights_of(self, adapter: str) -> str:
        """The prefix cache's key of `adapter`'s K/V."""
        return self.weights.get(adapter, adapter)

    def adapter_of(self, model_id: str | None) -> str:
        """The adapter of version `model_id` (None: the base). A version not loaded (never,
        or unloaded meanwhile) is a VersionNotServed, never the base under its name."""
        if model_id is None:
            return BASE_ADAPTER
        name = self.adapters.get(model_id)
        if name is None:
            raise VersionNotServed(
                f"model version {model_id!r} is not loaded (unloaded meanwhile, or never)"
            )
        return name

    def _text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # ---- prompts ----------------------------------------------------------------------
    def render(self, request: ChatRequest) -> str:
        """The chat-templated prompt text (tools described in the system message)."""
        messages = [_flatten(m) for m in request.messages]
        tools = request.tools if request.tool_choice != "none" else None
        if tools:
            messages = _with_tool_prompt(messages, tools, request.tool_choice)
        return str(
            self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )

    def _prompt(self, request: ChatRequest) -> tuple[str, list[int]]:
        """Rendered text and token ids of the request's prompt. Agents in an environment
        send the same messages again and again: chat-template rendering and tokenisation
        (about a millisecond together) are done once per distinct prompt."""
        text, ids, _ = self._prompt_parts(request)
        return text, ids

    def _prompt_parts(self, request: ChatRequest) -> tuple[str, list[int], int]:
        """Text, token ids, and how many leading ids are the system message (the prefix every
        agent of an environment shares; 0 when there is none or it does not tokenise apart)."""
        key = json.dumps(
            [request.messages, request.tools, request.tool_choice], sort_keys=True, default=str
        )
        hit = self._prompts.get(key)
        if hit is None:
            text = self.render(request)
            ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            hit = (text, array("i", ids), self._system_len(text, ids))
            self._prompts[key] = hit
        return hit[0], hit[1].tolist(), int(hit[2])

    def _system_len(self, text: str, ids: list[int]) -> int:
        """Tokens of `ids` up to the end of the system message, when the rendered prompt
        starts with one the template closes with its end-of-turn token."""
        for end in ("<|im_end|>\n", "<|im_end|>", "<|eot_id|>"):
            cut = text.find(end)
            if cut > 0:
                head = text[: cut + len(end)]
                head_ids = self.tokenizer(head, add_special_tokens=False)["input_ids"]
                if ids[: len(head_ids)] == head_ids and len(head_ids) < len(ids):
                    return len(head_ids)
                return 0
        return 0

    def encode(self, request: ChatRequest) -> list[int]:
        ids: list[int] = self.tokenizer(self.render(request), add_special_tokens=False)["input_ids"]
        return ids

    # ---- generation -------------------------------------------------------------------
    async def generate(
        self,
        model_id: str | None,
        request: ChatRequest,
        on_token: TokenCallback | None = None,
    ) -> Generation:
        text, prompt, system_len = self._prompt_parts(request)
        choices = request.choices()
        picker: ChoiceMatcher | None = None
        matcher: Any = None
        constraint: Constraint | None = None
        if choices and on_token is None:
            with self._book:  # (queued before an unload can drop the adapter)
                key = (self.adapter_of(model_id), text, tuple(choices))
                scored = self._choice_cache.get(key)
                if scored is None:
                    fut = self._score_future(key, prompt, system_len)
            if scored is None:  # a new prompt for this version: one forward pass, in a thread
                scored = await asyncio.shield(fut)
            return self._guided(prompt, request, *scored)
        if choices:  # a stream: decoded token by token, so it streams and stops on cancel
            picker = matcher = self._choice_matcher(choices)
            limit = max(len(ids) for ids in picker.encoded) + 1  # a whole choice, as scored
        else:
            constraint = constraint_for(request)  # StructuredOutputError: the gateway's 400
            if constraint is not None:
                matcher = await self.grammars.matcher(constraint)
            limit = request.token_limit(self.default_max_tokens)
        if len(prompt) + limit > self.context:
            limit = self.context - len(prompt)
            if limit < 1:
                raise DeployError(
                    f"prompt of {len(prompt)} tokens fills the model's context of {self.context}"
                )
        temperature = 1.0 if request.temperature is None else float(request.temperature)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._batcher = loop, None
        future: asyncio.Future[Any] = loop.create_future()
        top_k = (request.top_logprobs or 0) if request.logprobs else 0
        with self._book:  # resolved and queued before an unload can drop the adapter
            adapter = self.adapter_of(model_id)
            row = DecodeRow(
                prompt,
                adapter=adapter,
                cache_key=self.weights_of(adapter),
                temperature=temperature,
                max_new_tokens=limit,
                top_k=top_k,
                stops=() if picker is not None else request.stops(),
                matcher=matcher,
                on_token=on_token,
                prefix_len=system_len,
                cancelled=future.done,
                tag=future,
            )
            self._waiting.append(row)
        if self._batcher is None or self._batcher.done():
            self._batcher = loop.create_task(self._run_batches())
        ids, logps, tops, finish = await future
        if finish == "grammar_error":
            raise BackendError(f"grammar engine failed: {matcher.get_error() if matcher else ''}")
        gen = self._result(prompt, ids, logps, tops, finish, request, constraint)
        if constraint is not None:
            gen.constrained, gen.schema_hash = True, constraint.key
        if picker is not None and picker.chosen is not None and gen.content and choices:
            gen.content = choices[picker.chosen]  # the choice's exact text
        return gen

    def _choice_matcher(self, choices: list[str]) -> ChoiceMatcher:
        """The trie of a streamed guided_choice, over the token ids the scoring path uses."""
        from agentrl.llm.choices import candidate_ids

        try:
            encoded = candidate_ids(self.tokenizer, choices)
        except ValueError as exc:  # empty or duplicate choices
            raise DeployError(f"guided_choice: {exc}") from exc
        return ChoiceMatcher(encoded, self.eos_ids)

    def _result(
        self,
        prompt: list[int],
        ids: list[int],
        logps: list[float],
        tops: list[list[tuple[int, float]]],
        finish: str,
        request: ChatRequest,
        constraint: Constraint | None = None,
    ) -> Generation:
        text = self._text([i for i in ids if i not in self.eos_ids])
        for s in request.stops():
            if s in text:
                text = text[: text.index(s)]
        calls = None
        if constraint is not None and constraint.kind == "tools":
            text_or_none, calls = split_tool_answer(text, constraint)
            text = text_or_none or ""
        elif request.tools and request.tool_choice != "none":
            calls = parse_tool_calls(text, request.tools)
        tokens = [self._text([i]) for i in ids]
        top_text = [[(self._text([t]), v) for t, v in row] for row in tops] if tops else None
        return Generation(
            content=None if calls else text,
            finish_reason="tool_calls" if calls else finish,
            tool_calls=calls,
            prompt_token_ids=prompt,
            completion_token_ids=ids,
            token_logprobs=logps,
            tokens=tokens,
            top_logprobs=top_text,
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
        )

    async def stream(
        self, model_id: str | None, request: ChatRequest
    ) -> AsyncIterator[tuple[str, Any]]:
        """("token", (id, logprob, tops)) per token as it is generated, then ("done", Generation)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float, list[tuple[int, float]]]] = asyncio.Queue()

        def on_token(tok: int, lp: float, tops: list[tuple[int, float]]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (tok, lp, tops))

        task = asyncio.create_task(self.generate(model_id, request, on_token))
        getter: asyncio.Task[Any] | None = None
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield "token", getter.result()
                else:
                    getter.cancel()
            yield "done", task.result()
        finally:  # the consumer went away (disconnect, timeout): the decode of this row stops
            if getter is not None:
                getter.cancel()
            if not task.done():
                task.cancel()

    def partial(self, request: ChatRequest, ids: list[int], logps: list[float]) -> Generation:
        """What a cancelled stream's client was sent (`ids`, their log-probs) under the
        request's prompt, `finish_reason` "cancelled": the gateway logs it, so the completion
        id it named at stream start has a row (Agent Zero closes every normal turn early)."""
        _, prompt = self._prompt(request)  # the cached ids generate() decoded from
        constraint = None if request.choices() else constraint_for(request)
        return Generation(
            content=None,
            finish_reason="cancelled",
            prompt_token_ids=prompt,
            completion_token_ids=list(ids),
            token_logprobs=list(logps),
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
            constrained=constraint is not None,
            schema_hash=None if constraint is None else constraint.key,
        )

    def cancel_all(self) -> None:
        """Stop every queued and decoding request now (the stack is stopping): a decode
        thread left running to max_tokens kept `agentrl up` from exiting."""
        stopping = BackendError("the gateway is stopping; retry against another replica", 503)
        for row in [*self._live, *self._waiting]:
            future = row.tag
            if not future.done():  # an answer (503, in-band for a stream), not a hang
                future.set_exception(stopping)

    async def _run_batches(self) -> None:
        while self._waiting:
            while self._adapter_ops:  # a version is being loaded or dropped: let it in
                await asyncio.sleep(0.005)
            # a moment for the agents that act together to arrive together (one prefill)
            deadline = time.monotonic() + self.max_wait_ms / 1000.0
            while len(self._waiting) < self.max_batch_size and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            try:
                await self.run(self._decode)
            except Exception as exc:
                log.exception("local generation failed")
                failed = BackendError(f"local generation failed: {type(exc).__name__}: {exc}")
                for r in self._live:
                    if not r.tag.done():
                        r.tag.set_exception(failed)
            finally:
                self._live, self.stats.active = [], 0

    def _forward(
        self, adapters: list[str], logit_rows: torch.Tensor | None = None, **kw: Any
    ) -> Any:
        """The model under the rows' adapters; `logit_rows`: the batch rows projected onto
        the vocabulary (the logits then have those rows only; all of them where a LoRA
        adapter changes the projection itself)."""
        if logit_rows is not None and self._head_name in self.lora.stacks.layers:
            logit_rows = None
        self._head_rows.rows = logit_rows
        try:
            with self.lora.rows(adapters):
                return self.model(**kw)
        finally:
            self._head_rows.rows = None

    def _select_head_rows(self, _module: Any, args: tuple[Any, ...]) -> Any:
        """The vocabulary projection's pre-hook: only the rows `_forward` was asked for."""
        rows = getattr(self._head_rows, "rows", None)
        if rows is None:
            return None
        return (args[0].index_select(0, rows), *args[1:])

    def _take(self, room: int) -> list[DecodeRow]:
        """Waiting rows whose request is still there, up to `room` (decode thread)."""
        taken: list[DecodeRow] = []
        while len(taken) < room:
            try:
                row = self._waiting.popleft()
            except IndexError:
                break
            if not row.tag.done():
                taken.append(row)
        return taken

    def _answer(self, row: DecodeRow) -> None:
        """Hand a finished row to its request, from the decode thread."""
        self.stats.new_tokens += len(row.toks)
        if row.finish == "cancelled":
            self.stats.cancelled += 1
        result = (row.toks, row.lps, row.tops, row.finish)

        def deliver(future: asyncio.Future[Any] = row.tag) -> None:
            if not future.done():
                future.set_result(result)

        assert self._loop is not None
        self._loop.call_soon_threadsafe(deliver)

    @torch.no_grad()
    def _decode(self) -> None:
        """Decode waiting requests until none is left (worker thread). Requests arriving
        meanwhile join between steps while the batch has room; an adapter load or unload
        that waits for the lock stops new rows joining, so the batch drains and lets it in."""
        with self._lock:
            decoder = BatchDecoder(
                self._forward,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                generator=self._rng,
                decode_text=lambda ids: str(self.tokenizer.decode(ids)),
                prefix_cache=self.prefixes,
                stats=self.stats.decode,
                conversations=True,
                select_logits=True,
            )
            while True:
                room = self.max_batch_size - len(decoder)
                if room > 0 and not self._adapter_ops:
                    new = self._take(room)
                    if new:
                        self._live = [*decoder.rows, *new]  # answered with an error if it fails
                        decoder.admit(new)
                        self._live = list(decoder.rows)
                        self.stats.active = len(decoder)
                        self.stats.record_batch(len(decoder))
                if not len(decoder):
                    self._collect()
                    return
                finished = decoder.step()
                # collected before the answers go: a caller holding its answer never sees
                # the weights of a version unloaded meanwhile still in memory
                self._collect(decoder.rows)
                for row in finished:
                    self._answer(row)
                self._live = list(decoder.rows)
                self.stats.active = len(decoder)

    # ---- scoring ----------------------------------------------------------------------
    @torch.no_grad()
    def score(
        self, model_id: str | None, prompt: list[int], continuations: list[list[int]]
    ) -> list[list[float]]:
        """Per-token log-probs of each continuation after `prompt` under version `model_id`."""
        with self._adapter_turn():  # ahead of requests that would join the decoding batch
            return self._score_locked(self.adapter_of(model_id), prompt, continuations)

    def _score_locked(
        self, adapter: str, prompt: list[int], continuations: list[list[int]]
    ) -> list[list[float]]:
        seqs = [prompt + c for c in continuations]
        width = max(len(s) for s in seqs)
        n = len(seqs)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        start = len(prompt)
        # The vocabulary projection and log_softmax only where a continuation token is
        # predicted (positions start-1 .. width-1): over the whole prompt they were ~90 %
        # of a guided request's time.
        keep = width - start + 1
        logits = self._forward(
            [adapter] * n, input_ids=ids, attention_mask=mask, logits_to_keep=keep
        ).logits
        offset = start - 1 - (width - logits.shape[1])  # 0, or start-1 if all were kept
        out = []
        for i, c in enumerate(continuations):
            rows = torch.log_softmax(logits[i, offset : offset + len(c)].float(), -1)
            out.append(rows.gather(-1, torch.tensor(c)[:, None]).squeeze(-1).tolist())
        return out

    def _score_future(
        self, key: ChoiceKey, prompt: list[int], system_len: int = 0
    ) -> asyncio.Future[ChoiceScores]:
        """The scores of `key`, queued (on the loop). Concurrent requests for the same new
        prompt (agents of one group reach the same state together) share one computation;
        different prompts waiting together are scored in one batched pass
        (`_score_batches`)."""
        fut = self._inflight.get(key)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._inflight[key] = fut
            fut.add_done_callback(lambda _f: self._inflight.pop(key, None))
            self._to_score.append((key, prompt, system_len, fut))
            scorer = self._scorer
            if scorer is None or scorer.done() or scorer.get_loop() is not loop:
                self._scorer = loop.create_task(self._score_batches())
        return fut

    async def _score_batches(self) -> None:
        """Score the waiting choice prompts, up to `score_batch_size` per pass, until none is
        left. Agents and evaluators play many episodes at once, each waiting for its own
        state's scores: one padded forward pass over all of them replaces a pass each."""
        while self._to_score:
            batch: list[ScoreWait] = []
            while self._to_score and len(batch) < self.score_batch_size:
                batch.append(self._to_score.popleft())
            try:
                results = await self.run(self._score_many, batch)
            except Exception as exc:  # the pass itself failed: every request of it hears so
                log.exception("guided_choice scoring failed")
                failed = BackendError(f"guided_choice scoring failed: {type(exc).__name__}: {exc}")
                results = [failed] * len(batch)
            for (*_, fut), got in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(got, BaseException):
                    fut.set_exception(got)
                else:
                    fut.set_result(got)
        self._collect_if_idle()  # adapters unloaded while their prompts were scored

    @torch.no_grad()
    def _score_many(self, items: list[ScoreWait]) -> list[ChoiceScores | BaseException]:
        """log p(choice | prompt) renormalised over the choices (GLAM's valid-action policy,
        `agentrl.llm.choices`), with each choice's token ids and per-token log-probs, under
        the adapter named in each key; cached. Prompts whose choices are each one distinct
        token (moves under SmolLM2's tokenizer) are prefilled together as decoding prefills
        (`BatchDecoder.next_logits`: a pass per version and shared system prompt, whose K/V
        comes from the prefix cache; the vocabulary projection at the last position only);
        others are scored one by one. A bad request's error is its own answer."""
        from agentrl.llm.choices import candidate_ids, single_token_ids

        out: list[ChoiceScores | BaseException | None] = [None] * len(items)
        singles: list[tuple[int, list[list[int]], list[int]]] = []
        for i, (key, prompt, _, _) in enumerate(items):
            try:
                encoded = candidate_ids(self.tokenizer, key[2])
            except ValueError as exc:  # empty or duplicate choices
                out[i] = DeployError(f"guided_choice: {exc}")
                continue
            single = single_token_ids(encoded)
            if single is not None:
                singles.append((i, encoded, single))
                continue
            try:
                out[i] = self._score_choices(key, prompt, encoded)
            except Exception as exc:
                out[i] = exc
        if singles:
            rows = [
                DecodeRow(
                    items[i][1],
                    adapter=items[i][0][0],
                    cache_key=self.weights_of(items[i][0][0]),
                    prefix_len=items[i][2],
                )
                for i, _, _ in singles
            ]
            with self._adapter_turn():
                logits = self._next_logits(rows)
            logps = torch.log_softmax(logits.float(), -1)
            for row, (i, encoded, single) in enumerate(singles):
                raw = logps[row, single]
                renorm = (raw - torch.logsumexp(raw, -1)).tolist()
                scored = (renorm, encoded, [[float(x)] for x in raw.tolist()])
                self._choice_cache[items[i][0]] = scored
                out[i] = scored
        return [o if o is not None else DeployError("guided_choice: not scored") for o in out]

    def _next_logits(self, rows: list[DecodeRow]) -> torch.Tensor:
        """Next-token logits after each row's prompt, [rows, vocab] (under the lock)."""
        decoder = BatchDecoder(
            self._forward,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            generator=self._rng,
            prefix_cache=self.prefixes,
            stats=self.stats.decode,
        )
        return decoder.next_logits(rows)

    def _score_choices(
        self, key: ChoiceKey, prompt: list[int], encoded: list[list[int]]
    ) -> ChoiceScores:
        """Choices of several tokens: the prompt's KV cache is shared by its choices
        (`agentrl.llm.choices.score_choices`), under the key's adapter."""
        from agentrl.llm.choices import score_choices

        adapter, text, choices = key
        with self._adapter_turn(), self.lora.rows([adapter]):  # one name: every row
            renorm = score_choices(self.model, self.tokenizer, [text], list(choices))[0]
            per_token = self._score_locked(adapter, prompt, encoded)
        scored = (renorm, encoded, per_token)
        self._choice_cache[key] = scored
        return scored

    def _guided(
        self,
        prompt: list[int],
        request: ChatRequest,
        scores: list[float],
        encoded: list[list[int]],
        per_token: list[list[float]],
    ) -> Generation:
        """Pick one of the scored choices at the request's temperature and report it."""
        choices = list(request.choices() or [])
        temperature = 1.0 if request.temperature is None else float(request.temperature)
        index, probs = pick(scores, temperature, self._py_rng)
        ids = encoded[index]
        top = None
        if request.logprobs and request.top_logprobs:
            order = sorted(range(len(choices)), key=lambda j: -probs[j])[: request.top_logprobs]
            top = [[(choices[j], math.log(max(probs[j], 1e-300))) for j in order]]
        calls = None
        if request.tools and request.tool_choice != "none":
            calls = parse_tool_calls(choices[index], request.tools)
        return Generation(
            content=None if calls else choices[index],
            finish_reason="tool_calls" if calls else "stop",
            tool_calls=calls,
            prompt_token_ids=prompt,
            completion_token_ids=ids,
            token_logprobs=per_token[index],
            tokens=[self._text([i]) for i in ids],
            top_logprobs=(top + [[]] * (len(ids) - 1)) if top else None,
            prompt_tokens=len(prompt),
            completion_tokens=len(ids),
        )


def _flatten(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message -> {role, content: str} for a plain chat template."""
    role = message.get("role", "user")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    if content is None:
        content = ""
    if message.get("tool_calls"):
        calls = [
            {
                "name": c["function"]["name"],
                "arguments": _json_or_text(c["function"].get("arguments")),
            }
            for c in message["tool_calls"]
            if isinstance(c, dict) and "function" in c
        ]
        content = (content + "\n" if content else "") + json.dumps(
            calls[0] if len(calls) == 1 else calls
        )
    if role == "developer":
        role = "system"
    return {"role": role, "content": content}


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _with_tool_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool_choice: Any
) -> list[dict[str, Any]]:
    """SmolLM2's template ignores `tools`: describe them in the system message instead."""
    specs = [t.get("function", t) for t in tools]
    text = (
        "You can call these tools:\n"
        + "\n".join(json.dumps(s) for s in specs)
        + '\nTo call a tool, answer only with JSON: {"name": "<tool>", "arguments": {...}}.'
    )
    if tool_choice == "required" or isinstance(tool_choice, dict):
        text += " You must call a tool now."
    if messages and messages[0]["role"] == "system":
        return [
            {"role": "system", "content": messages[0]["content"] + "\n\n" + text},
            *messages[1:],
        ]
    return [{"role": "system", "content": text}, *messages]


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """A model's JSON answer -> OpenAI tool calls, when it names one of the offered tools
    (OpenAI's {"name", "arguments"} or Agent Zero's {"tool_name", "tool_args"})."""
    from agentrl.rollout.parsing import extract_json_object

    names = {t.get("function", t).get("name") for t in tools}
    obj = extract_json_object(text)
    if obj is None:
        return None
    name = obj.get("name", obj.get("tool_name"))
    args = obj.get("arguments", obj.get("tool_args", obj.get("parameters", {})))
    if name in names:
        return [tool_call(str(name), args if args is not None else {})]
    return None
