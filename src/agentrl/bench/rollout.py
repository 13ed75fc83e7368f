"""`agentrl bench rollout`: environment steps per second of a GiGPO group with a local model,
batched generation against one-at-a-time generation, in the same run.

Both modes run the same group (same task, seed, model, episode length); only the policy's
`max_batch_size` differs (the group size vs 1). The model is a tiny random Llama with
SmolLM2's tokenizer, so generation is dominated by per-call overhead, as for any small
model on a CPU; the ratio is what batching buys there.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.progress import Progress

from agentrl.bench.options import RolloutBench
from agentrl.bench.report import report
from agentrl.rollout.models import Message, TaskDefinition
from agentrl.rollout.worker import EnvFactory, run_group

SYSTEM = "You are playing a puzzle. Answer with one move: up, down, left or right."


async def _timed_group(
    task: TaskDefinition,
    policy: Any,
    group: int,
    history_window: int | None,
    env_factory: EnvFactory | None,
) -> tuple[int, float]:
    started = time.perf_counter()
    episodes = await run_group(
        task, group, policy, env_factory=env_factory, history_window=history_window
    )
    elapsed = time.perf_counter() - started
    errors = [e.critical_error for e in episodes if e.critical_error]
    if errors:
        raise RuntimeError(f"benchmark episode failed: {errors[0]}")
    return sum(len(e.steps) for e in episodes), elapsed


def run_rollout_benchmark(
    *,
    env_id: str = "sokoban",
    group: int = 8,
    steps: int = 10,
    max_new_tokens: int = 32,
    history_window: int | None = 2,
    repeats: int = 3,
    seed: int = 0,
    env_factory: EnvFactory | None = None,
    env_kwargs: dict[str, Any] | None = None,
    threads: int | None = 1,
) -> dict[str, Any]:
    """Run the benchmark, print the table and JSON line, and return the figures."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    from agentrl.llm.loading import load_smollm2_tokenizer, tiny_causal_lm
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    tokenizer = load_smollm2_tokenizer()
    model = tiny_causal_lm(vocab_size=len(tokenizer), seed=seed).eval()
    if env_factory is None:
        from agentrl.envs import task_for

        # The real task: the environment's system prompt, rules and tool spec.
        task = task_for(env_id, seed, max_episode_steps=steps, **(env_kwargs or {}))
    else:
        task = TaskDefinition(
            name=f"bench-{env_id}",
            env_id=env_id,
            seed=seed,
            initial_messages=[Message(role="system", content=SYSTEM)],
            max_episode_steps=steps,
            env_kwargs=dict(env_kwargs or {}),
        )
    # name -> (max_batch_size, share_prefix)
    modes = {
        "batched": (group, True),
        "batched_no_prefix_sharing": (group, False),
        "one_at_a_time": (1, True),
    }
    best: dict[str, tuple[int, float]] = {}
    stats: dict[str, Any] = {}

    async def run_all(progress: Progress) -> None:
        job = progress.add_task("rollout groups", total=len(modes) * (repeats + 1))
        for batch_size, share in modes.values():  # warm-up: kernels, allocator, caches
            warm = HFAgentPolicy(
                model,
                tokenizer,
                max_new_tokens=max_new_tokens,
                max_batch_size=batch_size,
                share_prefix=share,
                seed=seed,
            )
            warm_task = TaskDefinition(**{**task.__dict__, "max_episode_steps": 2})
            await _timed_group(warm_task, warm, group, history_window, env_factory)
            progress.advance(job)
        for _ in range(repeats):  # interleave the modes so machine noise hits all alike
            for name, (batch_size, share) in modes.items():
                policy = HFAgentPolicy(
                    model,
                    tokenizer,
                    max_new_tokens=max_new_tokens,
                    max_batch_size=batch_size,
                    share_prefix=share,
                    seed=seed,
                )
                n_steps, elapsed = await _timed_group(
                    task, policy, group, history_window, env_factory
                )
                if name not in best or n_steps / elapsed > best[name][0] / best[name][1]:
                    best[name] = (n_steps, elapsed)
                    stats[name] = policy.stats
                progress.advance(job)

    with Progress(transient=True) as progress:
        asyncio.run(run_all(progress))

    rows = []
    rate: dict[str, float] = {}
    for name, (n_steps, elapsed) in best.items():
        rate[name] = n_steps / elapsed
        rows.append(
            {
                "generation": name,
                "env steps": n_steps,
                "seconds": elapsed,
                "env steps/s": rate[name],
                "generate calls": stats[name].calls,
                "mean batch": stats[name].mean_batch,
                "prompt tokens/call": stats[name].prompt_tokens / max(1, n_steps),
                "new tokens/call": stats[name].new_tokens / max(1, n_steps),
            }
        )
    figures = {
        "env_id": env_id,
        "group": group,
        "steps_per_episode": steps,
        "max_new_tokens": max_new_tokens,
        "history_window": history_window,
        "prompt_tokens_per_call": round(
            stats["batched"].prompt_tokens / max(1, best["batched"][0]), 1
        ),
        "model": "tiny random Llama (hidden 64, 2 layers) + SmolLM2 tokenizer",
        "env_steps_per_s_batched": round(rate["batched"], 2),
        "env_steps_per_s_one_at_a_time": round(rate["one_at_a_time"], 2),
        "env_steps_per_s_batched_no_prefix_sharing": round(rate["batched_no_prefix_sharing"], 2),
        "batched_speedup": round(rate["batched"] / rate["one_at_a_time"], 2),
        "batched_speedup_no_prefix_sharing": round(
            rate["batched_no_prefix_sharing"] / rate["one_at_a_time"], 2
        ),
        "torch_threads": torch.get_num_threads(),
        "goal_batched_speedup": 4.0,
    }
    return report("rollout: group of episodes, batched vs one-at-a-time generation", rows, figures)


def command(cfg: RolloutBench) -> None:
    """`agentrl bench rollout`."""
    run_rollout_benchmark(
        env_id=cfg.env,
        group=cfg.group,
        steps=cfg.steps,
        max_new_tokens=cfg.max_new_tokens,
        history_window=cfg.history_window,
        repeats=cfg.repeats,
        seed=cfg.seed,
        threads=cfg.threads,
    )
