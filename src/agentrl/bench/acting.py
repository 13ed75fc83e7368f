"""`agentrl bench acting`: how many tool-use episodes the loop's agents finish a minute, and
where the time goes.

The path is the one `agentrl loop --env tooluse` acts through: the loop's `Agents` (Agent
Zero's prompt, the reply schema, `RLRolloutWorker`s with the code sandbox in threads) send
OpenAI requests over HTTP to the gateway (uvicorn, its completion log publishing to an
embedded NATS), which decodes them on the local engine (`LocalEngine`: continuous batching,
the prefix cache, llguidance masks) over the light warm start or the base; each finished
episode is published as a trajectory. The figures come from the engine's own counters and
from timers put around its decode step and model calls for the run: forward passes
(prefill / decode), grammar masks and matcher steps, sampling and the rest of a decode step,
tool execution (the environment's steps), and what is left (the gateway, asyncio, NATS,
idle). `--set profile=FILE` also records a py-spy profile of the process (speedscope JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.bench.options import ActingBench

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2}


class Timers:
    """Timers around the engine's model calls and decode steps (seconds, and step times
    per batch size), installed for one run and removed after it."""

    def __init__(self) -> None:
        self.forward_prefill = 0.0
        self.forward_decode = 0.0
        self.step = 0.0
        self.step_forward = 0.0  # forward time spent inside steps (the decode pass)
        self.steps: dict[int, list[float]] = defaultdict(list)
        self._clocks: dict[int, tuple[int, float]] = {}  # decode threads' CPU clocks
        self._in_step = False
        self._undo: list[Any] = []

    def install(self, engine: Any) -> None:
        from agentrl.serving import decoding

        forward = engine._forward

        def timed_forward(adapters: list[str], **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return forward(adapters, **kw)
            finally:
                dt = time.perf_counter() - t0
                if self._in_step:  # a decode step's pass (its forced tokens included)
                    self.forward_decode += dt
                else:
                    self.forward_prefill += dt
                if self._in_step:
                    self.step_forward += dt

        engine._forward = timed_forward
        decode = engine._decode

        def timed_decode() -> Any:  # note the decode thread's CPU clock (read at the end)
            ident = threading.get_ident()
            if ident not in self._clocks:
                clock = time.pthread_getcpuclockid(ident)
                self._clocks[ident] = (clock, time.clock_gettime(clock))
            return decode()

        engine._decode = timed_decode
        step = decoding.BatchDecoder.step

        def timed_step(decoder: Any) -> Any:
            n = len(decoder)
            self._in_step = True
            t0 = time.perf_counter()
            try:
                return step(decoder)
            finally:
                dt = time.perf_counter() - t0
                self._in_step = False
                self.step += dt
                self.steps[n].append(dt)

        decoding.BatchDecoder.step = timed_step  # type: ignore[method-assign,assignment]
        self._undo = [lambda: setattr(engine, "_forward", forward),
                      lambda: setattr(engine, "_decode", decode),
                      lambda: setattr(decoding.BatchDecoder, "step", step)]  # fmt: skip

    def engine_cpu(self) -> float:
        """CPU seconds the decode threads used since they first decoded (a batch may still
        be decoding: continuous batching never returns under steady load)."""
        return sum(time.clock_gettime(c) - c0 for c, c0 in self._clocks.values())

    def remove(self) -> None:
        for undo in self._undo:
            undo()


def _record(checkpoint: Path, model: str) -> Any:
    from agentrl.serving.backends import manifest_sha256
    from agentrl.serving.registry import ModelRecord

    return ModelRecord(
        model_id="acting-v1", version=1, public_name="agentrl-policy", base_model=model,
        checkpoint_path=str(checkpoint), sha256=manifest_sha256(checkpoint),
    )  # fmt: skip


async def _serve(app: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    from agentrl.serving.vllm.server import free_port

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                       access_log=False, lifespan="off")
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    return server, task, port


def _profile(path: Path, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy sampling this process (all threads, native frames) for `seconds`."""
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--native", "-r", "50", "-f", "speedscope",
           "-o", str(path), "-d", str(max(1, int(seconds))), "-p", str(os.getpid())]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _p50_by_batch(steps: dict[int, list[float]]) -> dict[str, float]:
    """Median step milliseconds per batch size (sizes seen at least 5 times)."""
    return {
        str(n): round(1000 * statistics.median(v), 1)
        for n, v in sorted(steps.items())
        if len(v) >= 5
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@dataclass(frozen=True)
class _Counters:
    """The engine's counters when the measured window opened."""

    decode: dict[str, Any]
    tokens: int
    grammar_s: float
    prefix_hits: int

    @classmethod
    def of(cls, engine: Any) -> _Counters:
        from agentrl.serving import structured

        return cls(
            dict(vars(engine.stats.decode)),
            engine.stats.new_tokens,
            structured.GRAMMAR_SECONDS[0],
            engine.prefixes.hits,
        )


def _figures(
    engine: Any,
    timers: Timers,
    agents: Any,
    before: _Counters,
    started: float,
    wall: float,
    cpu: float,
    engine_cpu: float,
    tool_s: float,
) -> dict[str, Any]:
    """The window's figures: episodes, tokens, the prefix cache, decode steps, the share of
    wall in each part, and CPU per episode and per token (load-independent)."""
    from agentrl.serving import structured

    done = sorted(t - started for t in agents.published.values() if t - started <= wall)
    half = [t for t in done if t > wall / 2]
    d = {k: v - before.decode.get(k, 0) for k, v in vars(engine.stats.decode).items()
         if isinstance(v, (int, float))}  # fmt: skip
    gen = engine.stats.new_tokens - before.tokens
    grammar = structured.GRAMMAR_SECONDS[0] - before.grammar_s
    forward = timers.forward_prefill + timers.forward_decode
    sampling = max(0.0, timers.step - timers.step_forward - grammar)
    prefilled, cached = d.get("prefill_tokens", 0), d.get("cached_tokens", 0)
    return dict(
        episodes=len(done),
        episodes_per_min=round(60.0 * len(done) / wall, 2),
        episodes_per_min_second_half=round(60.0 * len(half) / (wall / 2), 2),
        gen_tokens=gen,
        gen_tokens_per_s=round(gen / wall, 2),
        decode_tokens_per_s=round(d.get("decode_rows", 0) / max(timers.forward_decode, 1e-9), 2),
        prefill_tokens=prefilled,
        prefill_tokens_per_s=round(prefilled / max(timers.forward_prefill, 1e-9), 1),
        cached_tokens=cached,
        prefix_cache_hit_share=round(cached / max(1, cached + prefilled), 3),
        prefix_hits=engine.prefixes.hits - before.prefix_hits,
        decode_steps=d.get("decode_steps", 0),
        forced_tokens=d.get("forced_tokens", 0),
        batch_mean=round(d.get("decode_rows", 0) / max(1, d.get("decode_steps", 0)), 1),
        batch_p50={
            str(n): round(1000 * statistics.median(v), 1)
            for n, v in sorted(timers.steps.items())
            if len(v) >= 5
        },
        step_ms_p50=round(1000 * _pct([x for v in timers.steps.values() for x in v], 0.5), 1),
        share_forward=round(forward / wall, 3),
        share_prefill=round(timers.forward_prefill / wall, 3),
        share_decode=round(timers.forward_decode / wall, 3),
        share_mask=round(grammar / wall, 3),
        share_sampling=round(sampling / wall, 3),
        share_tools=round(tool_s / wall, 3),
        share_other=round(max(0.0, 1 - (forward + grammar + sampling) / wall), 3),
        process_cpu_share=round(cpu / wall, 3),
        # load-independent: this process's CPU seconds per episode
        cpu_s_per_episode=round(cpu / max(1, len(done)), 2),
        # the decode thread's CPU time (one torch thread: all of the engine's work) per
        # generated token and per episode: what other processes' load does not change
        engine_cpu_s=round(engine_cpu, 1),
        engine_busy_share=round((forward + sampling + grammar) / wall, 3),
        engine_cpu_ms_per_token=round(1000 * engine_cpu / max(1, gen), 1),
        episodes_per_engine_cpu_min=round(60 * len(done) / max(engine_cpu, 1e-9), 2),
        failed_groups=agents.failed,
        cut_by_token_cap=agents.cut["acting"],
        replies=agents.cut["acting_replies"],
        wall_s=round(wall, 1),
        load_1m=round(os.getloadavg()[0], 2),
    )


async def run_acting(cfg: ActingBench) -> dict[str, Any]:
    from agentrl.app.loop_agents import Agents
    from agentrl.app.loop_config import LoopConfig
    from agentrl.app.loop_tooluse import SERVE_MAX_BATCH
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
    from agentrl.serving.local import LocalEngine

    tiny = TINY if cfg.model == "tiny" else None
    batch = cfg.max_batch_size or SERVE_MAX_BATCH
    loop_cfg = LoopConfig.tooluse(
        quick=cfg.model == "tiny", agents=cfg.agents, max_tokens=cfg.max_tokens,
        max_steps=cfg.max_steps, temperature=cfg.temperature,
    )  # fmt: skip
    out: dict[str, Any] = {"model": cfg.model, "checkpoint": str(cfg.checkpoint or "base"),
                           "agents": cfg.agents, "max_batch_size": batch,
                           "max_tokens": cfg.max_tokens, "max_steps": cfg.max_steps}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-acting-"))
    engine = await asyncio.to_thread(
        LocalEngine, cfg.model, seed=cfg.seed, tiny_kwargs=tiny, max_batch_size=batch,
        threads=cfg.threads or 0, packed_weights=cfg.packed_weights,
    )  # fmt: skip
    import torch

    out["torch_threads"] = torch.get_num_threads()
    out["dtype"] = str(next(engine.model.parameters()).dtype).replace("torch.", "")
    backend = LocalBackend(engine, tmp / "cache")
    version = "__base__"
    if cfg.checkpoint is not None:
        version = "acting-v1"
        await backend.prepare(_record(Path(cfg.checkpoint), cfg.model))
    with EmbeddedNats(data_dir=str(tmp / "nats")) as nats:
        bus = await Bus.connect(nats.url, name="bench-acting")
        await bus.ensure_streams()
        stop = asyncio.Event()
        log = CompletionLog(bus)
        state = GatewayState("agentrl-policy", completion_log=log, timeout_s=600.0)
        state.backends[version] = backend
        state.set_split({version: 100.0}, [version])
        log_task = asyncio.create_task(log.run(stop))
        server, serve_task, port = await _serve(create_gateway_app(state))
        agents = Agents(loop_cfg, bus, f"http://127.0.0.1:{port}/v1", "agentrl-policy",
                        lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
        tool_s = [0.0]
        from agentrl.rollout import worker as worker_mod

        env_call = worker_mod.RLRolloutWorker._env_call

        async def timed_env_call(self: Any, fn: Any, *args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await env_call(self, fn, *args, **kw)
            finally:
                if getattr(fn, "__name__", "") == "step":
                    tool_s[0] += time.perf_counter() - t0

        worker_mod.RLRolloutWorker._env_call = timed_env_call  # type: ignore[method-assign]
        timers = Timers()
        timers.install(engine)
        before = _Counters.of(engine)
        spy = _profile(Path(cfg.profile), cfg.seconds) if cfg.profile else None
        cpu0 = time.process_time()
        started = time.monotonic()
        acting = asyncio.create_task(agents.run(stop))
        await asyncio.sleep(cfg.seconds)
        until = started + 10 * cfg.seconds
        while len(agents.published) < cfg.min_episodes and time.monotonic() < until:
            await asyncio.sleep(0.05)
        wall = time.monotonic() - started
        cpu = time.process_time() - cpu0
        engine_cpu = timers.engine_cpu()
        stop.set()
        engine.cancel_all()
        acting.cancel()
        await asyncio.gather(acting, return_exceptions=True)
        timers.remove()
        worker_mod.RLRolloutWorker._env_call = env_call  # type: ignore[method-assign]
        out.update(
            _figures(engine, timers, agents, before, started, wall, cpu, engine_cpu, tool_s[0])
        )
        if spy is not None:
            try:
                _, err = spy.communicate(timeout=60)
                out["profile"] = str(cfg.profile)
                if spy.returncode:
                    out["profile_error"] = err.decode(errors="replace")[-300:]
            except subprocess.TimeoutExpired:
                spy.kill()
        server.should_exit = True
        await serve_task
        await agents.close()
        log_task.cancel()
        await asyncio.gather(log_task, return_exceptions=True)
        await bus.close()
    return out


def table(out: dict[str, Any]) -> str:
    keys = ("episodes_per_min", "gen_tokens_per_s", "decode_tokens_per_s", "prefill_tokens_per_s",
            "prefix_cache_hit_share", "batch_mean", "share_forward", "share_prefill",
            "share_decode", "share_mask", "share_sampling", "share_tools", "share_other",
            "process_cpu_share", "cpu_s_per_episode", "engine_cpu_ms_per_token",
            "episodes_per_engine_cpu_min", "wall_s", "load_1m")  # fmt: skip
    lines = [f"{k:>24}  {out.get(k)}" for k in keys]
    lines.append(f"{'step ms p50 by batch':>24}  {out.get('batch_p50')}")
    return "\n".join(lines)


def command(cfg: ActingBench) -> None:
    """`agentrl bench acting`: the table, then one JSON line."""
    out = asyncio.run(run_acting(cfg))
    print(table(out))
    print(json.dumps(out))
