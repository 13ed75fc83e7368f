"""`agentrl bench serving`'s multi-LoRA part (issue 53): N lineages' adapters over one base,
their requests decoding in one batch of the local engine.

- `multilora_tokens_per_s_{1,4,16}`: completion tokens/s of `batch` concurrent greedy
  requests spread round-robin over N live adapters (N = 1, 4, 16), through the engine
  (`generate`, the gateway's path minus HTTP); median of `rounds` rounds, each with prompts
  of its own (no round reuses another's cached prefixes). `multilora_base_tokens_per_s` is
  the same load on the bare base, for reference; `multilora_cpu_tokens_per_s_*` the same
  per CPU second of the process (what other load on a shared machine moves far less).
- `multilora_gateway_tokens_per_s_16`: N = 16 once more through the real gateway over HTTP
  (uvicorn, requests naming each version by its id).
- `adapter_mib`: the process's RSS growth per adapter while the 16 adapters load (what one
  more lineage costs, allocator included); `adapter_param_mib`: the bytes of one adapter's
  weights as the engine stacks them (padding included), to set beside it.

The adapters are random LoRA adapters in peft's files with the base's spec beside them, as
training writes them (agentrl's training defaults: r=16 on q, k, v, o).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
TOPICS = ["the sea", "a city", "winter", "bread", "a robot", "rivers", "music", "a garden"]
LEVELS = (1, 4, 16)


def write_adapters(root: Path, spec: dict[str, Any], n: int, r: int = 16) -> list[str]:
    """`n` LoRA adapters of the base with random weights (seeds 1..n), saved as training
    saves them (peft's adapter files and the base's spec); the base is loaded once."""
    import json

    import torch

    from agentrl.llm.loading import BASE_FILE, LoraSettings, apply_lora, load_policy

    policy = load_policy(spec["name"], seed=spec["seed"], tiny_kwargs=spec["tiny_kwargs"])
    model = apply_lora(
        policy.model, LoraSettings(r=r, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    )
    out = []
    for seed in range(1, n + 1):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_A" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
                elif "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.01)
        folder = root / f"a{seed}"
        model.save_pretrained(folder)
        base = {"name": spec["name"], "seed": spec["seed"], "tiny_kwargs": spec["tiny_kwargs"]}
        (folder / BASE_FILE).write_text(json.dumps(base))
        out.append(str(folder))
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _requests(batch: int, round_: int, max_tokens: int) -> list[Any]:
    from agentrl.serving.openai_types import ChatRequest

    out = []
    for i in range(batch):
        text = f"Write one sentence about {TOPICS[i % len(TOPICS)]} (round {round_}, #{i})."
        out.append(
            ChatRequest(
                model="x",
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                temperature=0.0,
            )
        )
    return out


async def _engine_round(
    engine: Any, ids: Sequence[str | None], reqs: list[Any]
) -> tuple[float, float]:
    """Completion tokens per wall second and per CPU second of this process (the second
    moves far less with other load on a shared machine)."""
    started, cpu = time.perf_counter(), time.process_time()
    gens = await asyncio.gather(
        *(engine.generate(ids[i % len(ids)], r) for i, r in enumerate(reqs))
    )
    tokens = sum(g.completion_tokens for g in gens)
    return tokens / (time.perf_counter() - started), tokens / (time.process_time() - cpu)


async def _gateway_round(engine: Any, ids: list[str], reqs: list[Any], cache: Path) -> float:
    """The same load through the gateway over HTTP, each request naming its version."""
    import httpx
    import uvicorn

    from agentrl.bus.server import free_port
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import GatewayState, create_gateway_app

    state = GatewayState("bench", timeout_s=600.0)
    backend = LocalBackend(engine, cache)
    for mid in ids:
        state.backends[mid] = backend
    state.set_split({ids[0]: 100.0}, [ids[0]])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_gateway_app(state), host="127.0.0.1", port=port,
                       log_level="warning", access_log=False, lifespan="off")
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    tokens = 0
    try:
        limits = httpx.Limits(max_connections=len(reqs) + 4)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}/v1", timeout=600, limits=limits
        ) as client:

            async def one(i: int, r: Any) -> int:
                body = {**r.model_dump(exclude_none=True), "model": ids[i % len(ids)]}
                resp = await client.post("/chat/completions", json=body)
                resp.raise_for_status()
                return int(resp.json()["usage"]["completion_tokens"])

            started = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs))))
            wall = time.perf_counter() - started
    finally:
        server.should_exit = True
        await task
    return tokens / wall


async def multilora_run(
    model: str = "smollm2",
    *,
    batch: int = 16,
    max_tokens: int = 32,
    rounds: int = 3,
    levels: tuple[int, ...] = LEVELS,
    gateway: bool = True,
    tiny_kwargs: dict[str, Any] | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """The multi-LoRA figures (module docstring); one dict of JSON-ready values. Past
    `budget_s` no further round starts (one always runs) and the gateway run is skipped;
    `multilora_rounds` says how many ran."""
    deadline = time.monotonic() + budget_s if budget_s else float("inf")
    from agentrl.serving.local import LocalEngine
    from agentrl.serving.multilora import _trim

    tiny = model.lower() in ("tiny", "tiny-random")
    spec: dict[str, Any] = {"name": model, "seed": 0, "tiny_kwargs": tiny_kwargs if tiny else None}
    n_max = max(levels)
    out: dict[str, Any] = {"multilora_batch": batch, "multilora_max_tokens": max_tokens}
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-multilora-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        folders = await asyncio.to_thread(write_adapters, root, spec, n_max)
        out["multilora_write_s"] = round(time.monotonic() - started, 1)
        engine = await asyncio.to_thread(
            LocalEngine, model, seed=0, tiny_kwargs=spec["tiny_kwargs"],
            max_batch_size=batch, default_max_tokens=max_tokens,
        )  # fmt: skip
        await engine.generate(None, _requests(1, -1, 2)[0])  # warm up
        gc.collect()
        _trim()  # pages the adapter writing freed are not counted as given back by a load
        rss0 = _rss_bytes()
        started = time.monotonic()
        for i, folder in enumerate(folders):
            await engine.run(engine.load_adapter, f"lineage-{i}", Path(folder))
        out["multilora_load_s_per_adapter"] = round((time.monotonic() - started) / n_max, 3)
        gc.collect()
        mem = engine.adapter_memory()
        out["adapter_mib"] = round((_rss_bytes() - rss0) / n_max / 2**20, 2)
        out["adapter_param_mib"] = round(mem["weights"] / mem["adapters"] / 2**20, 2)
        ids = [f"lineage-{i}" for i in range(n_max)]
        await _engine_round(engine, ids, _requests(batch, -2, 4))  # every adapter once
        runs: dict[str, list[tuple[float, float]]] = {}
        r = 0
        done = 0
        for _ in range(rounds):  # interleaved, so that load on the machine hits all alike
            if done and time.monotonic() > deadline:
                break
            done += 1
            for n in (0, *levels):
                r += 1
                chosen: list[str | None] = [None] if n == 0 else list(ids[:n])
                got = await _engine_round(engine, chosen, _requests(batch, r, max_tokens))
                runs.setdefault(str(n), []).append(got)
                log.info("multilora: N=%d round %d: %.1f tokens/s", n, done, got[0])
        for key, vals in runs.items():
            name = "base" if key == "0" else key
            out[f"multilora_tokens_per_s_{name}"] = round(statistics.median(v for v, _ in vals), 2)
            out[f"multilora_tokens_per_s_{name}_runs"] = [round(v, 2) for v, _ in vals]
            out[f"multilora_cpu_tokens_per_s_{name}"] = round(
                statistics.median(c for _, c in vals), 2
            )
        out["multilora_rounds"] = done
        out["multilora_skipped"] = []
        if done < rounds:
            out["multilora_skipped"].append(f"{rounds - done} of {rounds} rounds (budget)")
        if gateway and time.monotonic() > deadline:
            out["multilora_skipped"].append("the gateway run (budget)")
        elif gateway:
            r += 1
            out[f"multilora_gateway_tokens_per_s_{n_max}"] = round(
                await _gateway_round(engine, ids, _requests(batch, r, max_tokens), root), 2
            )
        out["multilora_batch_sizes"] = sorted(set(engine.stats.batch_sizes[-50:]))[-3:]
    return out
