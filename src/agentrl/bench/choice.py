"""`agentrl bench choice`: how fast the local backend answers `guided_choice` requests.

The main job's agents, validation and held-out evaluation all ask the gateway one thing per
move: the four moves' probabilities after a FrozenLake prompt (`guided_choice`). The prompts
here are the loop's own (its system prompt, egocentric observations of random episodes on
the loop's training maps), distinct; each peer scores all of them anew, by
`LocalEngine.generate` under the base model on one torch thread (what the gateway uses on 2
cores). Peers, in the same run:

- `before`: the path until 2026-11-28, one full-prompt forward pass per prompt;
- `one_by_one`: today's path with one request at a time (the system prompt's K/V from the
  prefix cache, nothing to batch with);
- `batched_8`, `batched_32`: 8 or 32 requests in flight, scored together
  (`LocalEngine.score_batch_size`).

Figures are distinct prompts scored per second; `speedup` is batched_32 over before.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Any

from agentrl.bench.options import ChoiceBench

MOVES = ["up", "down", "left", "right"]


def loop_prompts(n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """`n` distinct chats the loop's agents send: system prompt + one egocentric observation."""
    from agentrl.app.loop import LoopConfig, loop_task
    from agentrl.envs.registry import make_env

    cfg = LoopConfig()
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[list[dict[str, Any]]] = []
    map_seed = seed
    while len(out) < n:
        if map_seed - seed > 50 * n:  # egocentric views repeat: only so many distinct ones
            raise ValueError(f"only {len(out)} distinct prompts in {50 * n} maps")
        task = loop_task(cfg, map_seed)
        map_seed += 1
        system = [{"role": m.role, "content": m.content} for m in task.initial_messages or []]
        env = make_env(task.env_id, **task.env_kwargs)
        obs = env.reset(task.seed)
        for _ in range(cfg.max_steps):
            text = str(obs["text"])
            if text not in seen:
                seen.add(text)
                out.append([*system, {"role": "user", "content": text}])
            obs, _, done, _ = env.step(rng.choice(MOVES))
            if done or len(out) >= n:
                break
    return out[:n]


def run_choice_bench(model: str = "smollm2", prompts: int = 64, seed: int = 0) -> dict[str, Any]:
    import torch

    from agentrl.serving.local import BASE_ADAPTER, LocalEngine
    from agentrl.serving.openai_types import ChatRequest

    engine = LocalEngine(model, seed=seed, max_batch_size=8, threads=1, score_batch_size=32)
    chats = loop_prompts(prompts, seed)
    requests = [
        ChatRequest(model="x", messages=c, guided_choice=MOVES, temperature=1.0) for c in chats
    ]
    tokens = [len(engine._prompt(r)[1]) for r in requests]

    async def one_by_one(rs: list[ChatRequest]) -> None:
        for r in rs:
            await engine.generate(None, r)

    async def together(rs: list[ChatRequest], inflight: int) -> None:
        gate = asyncio.Semaphore(inflight)

        async def one(r: ChatRequest) -> None:
            async with gate:
                await engine.generate(None, r)

        await asyncio.gather(*(one(r) for r in rs))

    @torch.no_grad()
    def before(rs: list[ChatRequest]) -> None:
        for r in rs:
            ids = torch.tensor([engine._prompt(r)[1]])
            engine._forward([BASE_ADAPTER], input_ids=ids, logits_to_keep=1)

    asyncio.run(one_by_one(requests[:4]))  # warm-up (and the system prompt's K/V)
    rates: dict[str, float] = {}
    for name, call in (
        ("before", before),
        ("one_by_one", lambda rs: asyncio.run(one_by_one(rs))),
        ("batched_8", lambda rs: asyncio.run(together(rs, 8))),
        ("batched_32", lambda rs: asyncio.run(together(rs, 32))),
    ):
        engine._choice_cache.clear()  # every peer scores every prompt anew
        started = time.perf_counter()
        call(requests)
        rates[name] = len(requests) / (time.perf_counter() - started)
    return {
        "model": model,
        "prompts": prompts,
        "prompt_tokens_mean": round(statistics.fmean(tokens), 1),
        **{f"{k}_prompts_per_s": round(v, 2) for k, v in rates.items()},
        "speedup": round(rates["batched_32"] / rates["before"], 2),
    }


def print_choice_bench(**kwargs: Any) -> dict[str, Any]:
    out = run_choice_bench(**kwargs)
    for key, value in out.items():
        print(f"{key:>28}  {value}")
    print(json.dumps(out))
    return out


def command(cfg: ChoiceBench) -> None:
    """`agentrl bench choice`."""
    print_choice_bench(**cfg.model_dump())
