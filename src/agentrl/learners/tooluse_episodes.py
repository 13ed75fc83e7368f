"""Tool-use episodes played by the local policy, batched.

Every live episode's next prompt (Agent Zero's messages, `agent_prompt.messages_for`) is a
row of one decode batch; the replies are decoded under the reply schema (structured
outputs) or free; each reply is stepped in its own `ToolUseEnv` (code_exe runs in the
sandbox, several at once on a thread pool) as soon as it ends, and the episode's next
prompt joins the batch at once (continuous batching: up to `batch_size` episodes decode
together; one that ended makes room for the next task). What comes back is, per turn, the
exact prompt and reply tokens with their behaviour log-probs, so training uses the tokens
that were sampled, not a re-tokenisation.

Each turn's prompt is the last one, the reply and the tool's result: a play keeps one
prefix cache (the gateway's, `conversations`), so a turn prefills only what is new, and the
system prompt once per play (re-prefilling every prompt whole each turn was 88 % of a
play's CPU). The cache lives for one `play` call (the weights do not change within it, and
a training step comes between plays) and is bounded by bytes; least recently used blocks
go first, the finished episodes' conversations.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.envs.tooluse import ToolUseEnv
from agentrl.envs.tooluse.agent_prompt import Turn, messages_for, response_schema
from agentrl.envs.tooluse.hints import with_hint
from agentrl.learners.tooluse_decode import decoder_for, shared_prefix
from agentrl.llm.samples import render_prompt
from agentrl.serving.decoding import DecodeRow, DecodeStats, PrefixCache


@dataclass
class TurnRecord:
    prompt_ids: list[int]
    action_ids: list[int]
    logprobs: list[float]
    text: str
    finish: str
    tool_name: str | None = None
    result: str | None = None
    invalid: bool = False
    free_prompt_ids: list[int] | None = None
    """The same turn's prompt without the episode's hint (None: no hint, `prompt_ids` is
    hint-free): what a hinted success is trained on."""
    answer: str | None = None  # the `response` text of a final turn
    tool_error: bool = False

    @property
    def train_prompt_ids(self) -> list[int]:
        """The prompt a training step may use: never one that holds a hint."""
        return self.free_prompt_ids if self.free_prompt_ids is not None else self.prompt_ids


@dataclass
class EpisodeRecord:
    family: str
    seed: int
    question: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    success: bool = False
    answered: bool = False
    answer_in_result: bool = False  # a tool result showed the right answer
    group: int = 0
    hint: str | None = None  # the hint in this episode's context (None: hint-free)
    pool: str = "train"

    @property
    def reward(self) -> float:
        return 1.0 if self.success else 0.0


class SchemaMatchers:
    """The reply schema compiled once against the tokenizer; a fresh matcher per reply."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        from agentrl.serving.structured import (
            Constraint,
            GrammarCompiler,
            _json_grammar,
            spec_hash,
        )

        schema = response_schema()
        self.compiler = GrammarCompiler(tokenizer, vocab_size)
        self.key = spec_hash(schema)
        self._start = self.compiler.compile(
            Constraint("json_schema", _json_grammar(schema), self.key)
        )

    def new(self) -> Any:
        return self._start.deep_copy()


@dataclass
class PlaySettings:
    temperature: float = 0.0
    max_steps: int = 4
    max_new_tokens: int = 320
    batch_size: int = 32
    structured: bool = True
    sandbox_threads: int = 4
    cache_mb: float = 3072.0
    """The play's prefix cache (0: none, each turn prefilled whole). 34 live SmolLM2
    episodes at 4 turns of 256 tokens hold at most ~3 GiB of K/V (46 KB a token, fp32)."""


@dataclass
class PlayTiming:
    decode_s: float = 0.0
    env_s: float = 0.0
    turns: int = 0
    tokens: int = 0
    stats: DecodeStats = field(default_factory=DecodeStats)
    """Prefill and decode work: prompt tokens run through the model vs taken from the
    cache (`prefill_tokens`, `cached_tokens`), their seconds, decode steps."""


def play(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[tuple[str, int]],
    settings: PlaySettings,
    *,
    matchers: SchemaMatchers | None,
    generator: torch.Generator,
    autocast: Any = None,
    groups: Sequence[int] | None = None,
    timing: PlayTiming | None = None,
    hints: Sequence[str | None] | None = None,
    pool: str = "train",
) -> list[EpisodeRecord]:
    """Play one episode per (family, seed) in `tasks` to the end. `hints[k]` (if any) is
    put after episode k's question in every prompt it sees; each turn also keeps its
    hint-free prompt (`TurnRecord.free_prompt_ids`), the one training may use."""
    timing = timing if timing is not None else PlayTiming()
    eos = {int(tokenizer.eos_token_id)}
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos.pop())
    envs = [ToolUseEnv(family=f, max_steps=settings.max_steps, pool=pool) for f, _ in tasks]
    episodes = []
    for k, ((family, seed), env) in enumerate(zip(tasks, envs, strict=True)):
        obs = env.reset(seed)
        episodes.append(EpisodeRecord(family, seed, str(obs["question"]), pool=pool))
        episodes[-1].group = groups[k] if groups is not None else k
        episodes[-1].hint = hints[k] if hints is not None else None
    state = _Play(tokenizer, settings, episodes, envs, matchers, timing)
    cache = PrefixCache(int(settings.cache_mb * 2**20)) if settings.cache_mb > 0 else None
    was_training = model.training
    model.eval()
    try:
        with (
            ThreadPoolExecutor(settings.sandbox_threads) as threads,
            torch.no_grad(),
            decoder_for(
                model,
                eos_ids=eos | {int(tokenizer.eos_token_id)},
                pad_id=pad,
                generator=generator,
                autocast=autocast,
                cache=cache,
                conversations=cache is not None,
                stats=timing.stats,
            ) as decoder,
        ):
            waiting = list(range(len(tasks)))[::-1]  # popped from the end: in order
            starting = [waiting.pop() for _ in range(min(settings.batch_size, len(waiting)))]
            t0 = time.perf_counter()
            decoder.admit(state.rows(starting))
            timing.decode_s += time.perf_counter() - t0
            while len(decoder):
                t0 = time.perf_counter()
                ended = decoder.step()
                t1 = time.perf_counter()
                timing.decode_s += t1 - t0
                if not ended:
                    continue
                going = state.step(ended, threads)
                going += [waiting.pop() for _ in range(min(len(ended) - len(going), len(waiting)))]
                t2 = time.perf_counter()
                timing.env_s += t2 - t1
                if going:
                    decoder.admit(state.rows(going))
                    timing.decode_s += time.perf_counter() - t2
    finally:
        model.train(was_training)
    return episodes


class _Play:
    """The episodes of one play: each one's next prompt as a decode row, and each finished
    reply stepped in its environment. Every reply joins the decode batch as soon as its
    episode needs it (the decoder's continuous batching): a long reply no longer keeps a
    turn's other episodes waiting, one row a step, for the next turn."""

    def __init__(
        self,
        tokenizer: Any,
        settings: PlaySettings,
        episodes: list[EpisodeRecord],
        envs: list[ToolUseEnv],
        matchers: SchemaMatchers | None,
        timing: PlayTiming,
    ) -> None:
        self.tokenizer, self.settings, self.timing = tokenizer, settings, timing
        self.episodes, self.envs, self.matchers = episodes, envs, matchers
        self.history: list[list[Turn]] = [[] for _ in episodes]
        self.prompts: dict[int, list[int]] = {}
        self.free: dict[int, list[int]] = {}  # hint-free prompts of hinted episodes

    def rows(self, ks: list[int]) -> list[DecodeRow]:
        """The next turn's decode row of each episode in `ks` (the `tag`: its index)."""
        tok, s = self.tokenizer, self.settings
        for k in ks:
            ep = self.episodes[k]
            self.prompts[k] = render_prompt(
                tok, messages_for(with_hint(ep.question, ep.hint), self.history[k])
            )
            if ep.hint:
                self.free[k] = render_prompt(tok, messages_for(ep.question, self.history[k]))
        shared = shared_prefix([self.prompts[k] for k in ks])
        return [
            DecodeRow(
                self.prompts[k],
                temperature=s.temperature,
                max_new_tokens=s.max_new_tokens,
                matcher=self.matchers.new() if self.matchers and s.structured else None,
                prefix_len=shared,
                tag=k,
            )
            for k in ks
        ]

    def step(self, ended: list[DecodeRow], threads: ThreadPoolExecutor) -> list[int]:
        """Step each finished reply's environment (in threads) and record the turn; the
        episodes that go on."""
        ended = sorted(ended, key=lambda r: int(r.tag))
        self.timing.turns += len(ended)
        self.timing.tokens += sum(len(r.toks) for r in ended)
        texts = [str(self.tokenizer.decode(r.toks, skip_special_tokens=True)) for r in ended]
        results = list(threads.map(lambda r, t: self.envs[int(r.tag)].step(t), ended, texts))
        going = []
        for r, reply, (obs, _, done, info) in zip(ended, texts, results, strict=True):
            k = int(r.tag)
            tool = info.get("tool_name")
            ep = self.episodes[k]
            text = str(obs.get("text", ""))
            ep.turns.append(
                TurnRecord(
                    prompt_ids=self.prompts.pop(k),
                    action_ids=r.toks,
                    logprobs=r.lps,
                    text=reply,
                    finish=r.finish,
                    tool_name=tool,
                    result=None if done and tool == "response" else text,
                    invalid=bool(info.get("invalid_action")),
                    free_prompt_ids=self.free.pop(k, None),
                    answer=info.get("answer") if tool == "response" else None,
                    tool_error=bool(info.get("tool_error")),
                )
            )
            if tool in ("calculator", "code_exe") and _shows_answer(text, self.envs[k]):
                ep.answer_in_result = True
            if tool == "response":
                ep.answered = True
            if done:
                ep.success = bool(info.get("success"))
            else:
                self.history[k].append(Turn(reply, text, tool))
                going.append(k)
        return going


def _shows_answer(result: str, env: ToolUseEnv) -> bool:
    """Whether a tool's output holds the task's answer (a step-level signal)."""
    from agentrl.envs.tooluse.solver import answer_from
    from agentrl.envs.tooluse.tasks import check_answer

    return env.task is not None and check_answer(answer_from(result), env.task)


def wilson(successes: int, n: int) -> tuple[float, float]:
    from agentrl.core.stats import wilson as _wilson

    return _wilson(successes, n)


def summarise(episodes: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Success with its 95 % Wilson interval, overall and per family, and what went wrong."""
    out: dict[str, Any] = {}
    fams = sorted({e.family for e in episodes})
    for name, eps in [("all", list(episodes))] + [
        (f, [e for e in episodes if e.family == f]) for f in fams
    ]:
        n = len(eps)
        k = sum(e.success for e in eps)
        lo, hi = wilson(k, n)
        turns = [t for e in eps for t in e.turns]
        out[name] = {
            "episodes": n,
            "success": k / n if n else math.nan,
            "ci": [round(lo, 3), round(hi, 3)],
            "answered": sum(e.answered for e in eps) / max(1, n),
            "answer_in_result": sum(e.answer_in_result for e in eps) / max(1, n),
            "invalid_calls": sum(t.invalid and t.finish == "stop" for t in turns),
            "cut_by_token_cap": sum(t.finish == "length" for t in turns),
            "turns": len(turns),
            "tokens_per_turn": sum(len(t.action_ids) for t in turns) / max(1, len(turns)),
        }
    return out


def episode_json(ep: EpisodeRecord) -> str:
    return json.dumps(
        {
            "family": ep.family,
            "seed": ep.seed,
            "pool": ep.pool,
            "success": ep.success,
            "turns": [{"reply": t.text, "result": t.result, "finish": t.finish} for t in ep.turns],
        }
    )
