"""`agentrl bench serving`: the embedded local backend and vLLM serving the same base with
the same LoRA adapter, the same prompts at the same concurrency levels, both through the
gateway over HTTP (what agents see). Greedy decoding with a fixed token cap; output tokens
are the backends' own counts (usage.completion_tokens)."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.bench.options import ServingBench, comma_list
from agentrl.serving.errors import BackendError, DeployError
from agentrl.serving.vllm.base import VLLM_TINY


class _NoVllm(Exception):
    """vLLM could not be started at all (its environment is missing)."""


TOPICS = ["the sea", "a city", "winter", "bread", "a robot", "rivers", "music", "a garden"]


def prompts(n: int) -> list[str]:
    return [f"Write one sentence about {TOPICS[i % len(TOPICS)]} (#{i})." for i in range(n)]


def _adapter(folder: Path, spec: dict[str, Any]) -> str:
    """A LoRA checkpoint of the base (random adapter weights), written as training does."""
    import torch

    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
    from agentrl.llm.trainer import PolicyTrainer

    policy = load_policy(spec["name"], seed=spec["seed"], tiny_kwargs=spec["tiny_kwargs"])
    policy.lora = LoraSettings(r=8, target_modules=("q_proj", "v_proj"))
    policy.model = apply_lora(policy.model, policy.lora)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    cfg = TrainerConfig(model=spec["name"], lora_r=8, storage_path=str(folder))
    return CheckpointManager(str(folder)).save(PolicyTrainer(policy, cfg), {}, name="final")


async def _load(
    url: str, texts: list[str], level: int, max_tokens: int, deadline: float | None = None
) -> dict[str, Any]:
    """The prompts at `level` in flight; past `deadline` (monotonic) no new request starts
    and the rest are counted as skipped."""
    sem = asyncio.Semaphore(level)
    lat: list[float] = []
    tokens = errors = skipped = 0

    async def one(client: httpx.AsyncClient, text: str) -> None:
        nonlocal tokens, errors, skipped
        async with sem:
            if deadline is not None and time.monotonic() > deadline:
                skipped += 1
                return
            t0 = time.perf_counter()
            try:
                resp = await client.post(
                    "/chat/completions",
                    json={"model": "bench-v1", "messages": [{"role": "user", "content": text}],
                          "max_tokens": max_tokens, "temperature": 0.0},
                )  # fmt: skip
                resp.raise_for_status()
                tokens += int(resp.json()["usage"]["completion_tokens"])
                lat.append(time.perf_counter() - t0)
            except (httpx.HTTPError, KeyError, ValueError):
                errors += 1

    limits = httpx.Limits(max_connections=level + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, t) for t in texts))
        wall = time.perf_counter() - t0
    lat.sort()
    return {
        "concurrency": level,
        "requests_per_s": round(len(lat) / wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "p50_s": round(statistics.median(lat), 3) if lat else None,
        "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3) if lat else None,
        "wall_s": round(wall, 1),
        "errors": errors,
        "skipped": skipped,
    }


async def _gateway(backend: Any) -> tuple[Any, asyncio.Task[None], str]:
    import uvicorn

    from agentrl.serving.gateway import GatewayState, create_gateway_app
    from agentrl.serving.vllm.server import free_port

    state = GatewayState("bench", timeout_s=600.0)
    state.max_inflight = 1024
    state.backends["bench-v1"] = backend
    state.set_split({"bench-v1": 100.0}, ["bench-v1"])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_gateway_app(state), host="127.0.0.1", port=port,
                       log_level="warning", access_log=False, lifespan="off")
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    return server, task, f"http://127.0.0.1:{port}/v1"


def _slice(end: float, runs_left: int) -> float:
    """The deadline of the next run: an equal share of what is left of the budget."""
    now = time.monotonic()
    return now + max(0.0, end - now) / max(1, runs_left)


async def run_bench(
    model: str = "smollm2", n_prompts: int = 256, levels: list[int] | None = None,
    max_tokens: int = 32, budget_s: float | None = 540.0,
) -> dict[str, Any]:  # fmt: skip
    """`budget_s` bounds the whole run (2 cores: 360 requests through vLLM's CPU LoRA had
    not finished after 22 minutes): vLLM gets at most half of it to start, each (backend,
    concurrency) run an equal share of the rest; what did not fit is listed in `skipped`.
    None: no bound."""
    from agentrl.serving.backends import LocalBackend, manifest_sha256
    from agentrl.serving.local import LocalEngine
    from agentrl.serving.registry import ModelRecord
    from agentrl.serving.vllm.settings import VllmSettings
    from agentrl.serving.vllm.start import start_vllm

    levels = levels or [1, 8, 32]
    tiny = model.lower() in ("tiny", "tiny-random")
    spec: dict[str, Any] = {"name": model, "seed": 0, "tiny_kwargs": VLLM_TINY if tiny else None}
    texts = prompts(n_prompts)
    out: dict[str, Any] = {"model": model, "prompts": n_prompts, "max_tokens": max_tokens}
    end = time.monotonic() + budget_s if budget_s else float("inf")
    runs_left = 2 * len(levels)
    out["budget_s"], out["skipped"] = budget_s, []
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-serving-") as tmp:
        root = Path(tmp)
        ckpt = await asyncio.to_thread(_adapter, root / "adapter", spec)
        record = ModelRecord(
            model_id="bench-v1", version=1, public_name="bench", base_model=model,
            checkpoint_path=ckpt, sha256=manifest_sha256(Path(ckpt)),
        )  # fmt: skip
        results: dict[str, list[dict[str, Any]]] = {}
        # vLLM first: its start (minutes on a busy CPU) is measured apart from the load
        t0 = time.monotonic()
        start_s = min(1800.0, (end - time.monotonic()) / 2)
        try:
            vllm = await start_vllm(
                spec, root / "cache", vllm=VllmSettings(max_model_len=1024, max_loras=1),
                adapters=1,
            )  # fmt: skip
        except DeployError as exc:  # no vLLM environment here (`agentrl vllm setup`)
            out["skipped"].append(f"vllm: {exc}")
            vllm = None
        try:
            if vllm is None:
                raise _NoVllm
            await vllm.server.wait_ready(start_s)
            out["vllm_startup_s"] = round(time.monotonic() - t0, 1)
            await vllm.prepare(record)
            out["adapter_load_s"] = round(vllm.load_seconds["bench-v1"], 3)
            server, task, url = await _gateway(vllm)
            results["vllm"] = []
            for c in levels:
                results["vllm"].append(
                    await _load(url, texts, c, max_tokens, _slice(end, runs_left))
                )
                runs_left -= 1
            server.should_exit = True
            await task
        except BackendError as exc:  # not ready within its share of the budget
            out["skipped"].append(f"vllm: {exc} (waited {start_s:.0f} s of the budget)")
            results["vllm"] = []
            runs_left -= len(levels)
        except _NoVllm:
            results["vllm"] = []
            runs_left -= len(levels)
        finally:
            if vllm is not None:
                await vllm.close()
        engine = await asyncio.to_thread(
            LocalEngine, model, seed=0, tiny_kwargs=spec["tiny_kwargs"],
            max_batch_size=max(levels), default_max_tokens=max_tokens,
        )  # fmt: skip
        local = LocalBackend(engine, root / "cache")
        t0 = time.monotonic()
        await local.prepare(record)
        out["local_adapter_load_s"] = round(time.monotonic() - t0, 3)
        server, task, url = await _gateway(local)
        results["local"] = []
        for c in levels:
            results["local"].append(await _load(url, texts, c, max_tokens, _slice(end, runs_left)))
            runs_left -= 1
        server.should_exit = True
        await task
    for name, rows in results.items():
        out["skipped"] += [
            f"{name}: {r['skipped']} of {n_prompts} prompts at concurrency {r['concurrency']}"
            for r in rows
            if r["skipped"]
        ]
    out["local"], out["vllm"] = results["local"], results["vllm"]
    best = lambda rows: max((r["tokens_per_s"] for r in rows), default=0.0)  # noqa: E731
    out["local_tokens_per_s"] = best(results["local"])
    out["vllm_tokens_per_s"] = best(results["vllm"])
    out["vllm_speedup"] = (
        round(out["vllm_tokens_per_s"] / max(out["local_tokens_per_s"], 1e-9), 2)
        if results["vllm"]
        else None
    )
    out["errors"] = sum(r["errors"] for rows in results.values() for r in rows)
    return out


def command(cfg: ServingBench) -> None:
    """`agentrl bench serving`: the multi-LoRA part, the prefix part, then vLLM and the
    load levels in what is left of the budget; one JSON line."""
    import json

    from agentrl.bench.multilora import multilora_run
    from agentrl.bench.prefix import prefix_run

    budget_s = cfg.budget_s
    prompt = str(cfg.agent_zero_prompt) if cfg.agent_zero_prompt else None
    out: dict[str, object] = {}
    spent = 0.0  # the multi-LoRA and prefix parts' seconds, out of the budget
    if (cfg.multilora or cfg.multilora_only) and not cfg.prefix_only:
        started = time.monotonic()
        share = budget_s / 3 if budget_s and not cfg.multilora_only else None
        out.update(asyncio.run(multilora_run(cfg.model, max_tokens=cfg.max_tokens, budget_s=share)))
        out["multilora_s"] = spent = round(time.monotonic() - started, 1)
        if cfg.multilora_only:
            print(json.dumps(out), flush=True)
            return
    if cfg.prefix or cfg.prefix_only:
        started = time.monotonic()
        out["prefix"] = asyncio.run(prefix_run(cfg.model, prompt))
        spent += round(time.monotonic() - started, 1)
    if not cfg.prefix_only:
        levels = [int(x) for x in comma_list(cfg.concurrency)]
        left = max(1.0, budget_s - spent) if budget_s else None
        run = run_bench(cfg.model, cfg.prompts, levels, cfg.max_tokens, left)
        out = {**asyncio.run(run), **out}
    print(json.dumps(out), flush=True)
