"""Tool-use episodes played by the local policy, batched turn by turn.

Every live episode's next prompt (Agent Zero's messages, `agent_prompt.messages_for`) goes
into one batch; the replies are decoded under the reply schema (structured outputs) or
free; each reply is stepped in its own `ToolUseEnv` (code_exe runs in the sandbox, several
at once on a thread pool); episodes that ended leave the batch. What comes back is, per
turn, the exact prompt and reply tokens with their behaviour log-probs, so training uses
the tokens that were sampled, not a re-tokenisation.

Each turn's prompt is the last one, the reply and the tool's result: a play keeps one
prefix cache (the gateway's, `conversations`), so a turn prefills only what is new, and the
system prompt once per play (re-prefilling every prompt whole each turn was 88 % of a
play's CPU). The cache lives for one `play` call (the weights do not change within it, and
a training step comes between plays) and is bounded by bytes; episodes play in waves of
`batch_size`, each to its end, so the cache holds one wave's conversations, not a whole
held-out set's.
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
from agentrl.learners.tooluse_decode import generate
from agentrl.llm.samples import render_prompt
from agentrl.serving.decoding import DecodeStats, PrefixCache


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
    """The play's prefix cache (0: none, each turn prefilled whole). A wave of 34 SmolLM2
    episodes at 4 turns of 256 tokens holds at most ~3 GiB of K/V (46 KB a token, fp32)."""


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
    history: list[list[Turn]] = [[] for _ in tasks]
    cache = PrefixCache(int(settings.cache_mb * 2**20)) if settings.cache_mb > 0 else None
    was_training = model.training
    model.eval()
    try:
        with ThreadPoolExecutor(settings.sandbox_threads) as threads:
            for start in range(0, len(tasks), settings.batch_size):
                wave = list(range(start, min(start + settings.batch_size, len(tasks))))
                _play_wave(
                    wave,
                    model,
                    tokenizer,
                    settings,
                    episodes,
                    envs,
                    history,
                    threads,
                    matchers=matchers,
                    generator=generator,
                    autocast=autocast,
                    timing=timing,
                    cache=cache,
                    eos=eos,
                    pad=pad,
                )
    finally:
        model.train(was_training)
    return episodes


def _play_wave(
    live: list[int],
    model: Any,
    tokenizer: Any,
    settings: PlaySettings,
    episodes: list[EpisodeRecord],
    envs: list[ToolUseEnv],
    history: list[list[Turn]],
    threads: ThreadPoolExecutor,
    *,
    matchers: SchemaMatchers | None,
    generator: torch.Generator,
    autocast: Any,
    timing: PlayTiming,
    cache: PrefixCache | None,
    eos: set[int],
    pad: int,
) -> None:
    """Play the episodes `live` (at most a batch) turn by turn to their ends."""
    while live:
        prompts = {
            k: render_prompt(
                tokenizer,
                messages_for(with_hint(episodes[k].question, episodes[k].hint), history[k]),
            )
            for k in live
        }
        free = {
            k: render_prompt(tokenizer, messages_for(episodes[k].question, history[k]))
            for k in live
            if episodes[k].hint
        }
        order = sorted(live, key=lambda k: len(prompts[k]))
        t0 = time.perf_counter()
        rows = [matchers.new() if matchers else None for _ in order]
        out = generate(
            model,
            [prompts[k] for k in order],
            rows if settings.structured else [None] * len(order),
            temperature=settings.temperature,
            max_new_tokens=settings.max_new_tokens,
            eos_ids=eos | {int(tokenizer.eos_token_id)},
            pad_id=pad,
            generator=generator,
            autocast=autocast,
            cache=cache,
            stats=timing.stats,
        )
        replies: dict[int, Any] = dict(zip(order, out, strict=True))
        t1 = time.perf_counter()
        timing.decode_s += t1 - t0
        timing.turns += len(live)
        timing.tokens += sum(len(g.ids) for g in replies.values())
        texts = {k: str(tokenizer.decode(replies[k].ids, skip_special_tokens=True)) for k in live}
        results = dict(
            zip(live, threads.map(lambda k, t=texts: envs[k].step(t[k]), live), strict=True)
        )
        timing.env_s += time.perf_counter() - t1
        still = []
        for k in live:
            obs, _, done, info = results[k]
            g = replies[k]
            tool = info.get("tool_name")
            ep = episodes[k]
            text = str(obs.get("text", ""))
            ep.turns.append(
                TurnRecord(
                    prompt_ids=prompts[k],
                    action_ids=g.ids,
                    logprobs=g.logprobs,
                    text=texts[k],
                    finish=g.finish,
                    tool_name=tool,
                    result=None if done and tool == "response" else text,
                    invalid=bool(info.get("invalid_action")),
                    free_prompt_ids=free.get(k),
                    answer=info.get("answer") if tool == "response" else None,
                    tool_error=bool(info.get("tool_error")),
                )
            )
            if tool in ("calculator", "code_exe") and _shows_answer(text, envs[k]):
                ep.answer_in_result = True
            if tool == "response":
                ep.answered = True
            if done:
                ep.success = bool(info.get("success"))
            else:
                history[k].append(Turn(texts[k], text, tool))
                still.append(k)
        live = still


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
