"""Run the heavy agent frameworks (CrewAI, DSPy, LlamaIndex) against agentrl's gateway and
check what capture made of each run: one episode, one trajectory, every request a turn.

    python scripts/capture_frameworks.py                       # its own gateway (tiny model)
    python scripts/capture_frameworks.py --gateway http://127.0.0.1:8700 \\
        --api http://127.0.0.1:8600                            # a running `agentrl up`
    python scripts/capture_frameworks.py --frameworks dspy,crewai
    python scripts/capture_frameworks.py --serve-for 600   # only serve (frameworks elsewhere)

It installs nothing: a framework that does not import is reported as skipped (install it
in this environment, or a throwaway venv with agentrl, to run it). With its own gateway the
model is a tiny random one, so the frameworks get nonsense answers: their retries and
parse-error loops are exactly the traffic that used to split an episode. Each run is ended
with `POST /v1/episodes/{key}/end`, then feedback by the key must reach exactly one
trajectory. One JSON line per framework, then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TASK = "What is 2 + 3? Use the add tool, then answer with the number."


def add(a: float, b: float) -> str:
    """Add two numbers."""
    return str(a + b)


def run_dspy(base: str, session: str) -> None:
    import dspy

    lm = dspy.LM(
        "openai/agentrl-policy",
        api_base=base,
        api_key="unused",
        extra_headers={"x-agentrl-session": session},
        cache=False,
        max_tokens=64,
        num_retries=0,
    )
    dspy.configure(lm=lm)
    react = dspy.ReAct("question -> answer", tools=[add], max_iters=3)
    with contextlib.suppress(Exception):  # a tiny model's answers do not parse: fine
        react(question=TASK)


def run_crewai(base: str, session: str) -> None:
    from crewai import LLM, Agent, Crew, Task

    llm = LLM(
        model="openai/agentrl-policy",
        base_url=base,
        api_key="unused",
        extra_headers={"x-agentrl-session": session},
        max_tokens=64,
    )
    agent = Agent(role="calculator", goal="add numbers", backstory="careful", llm=llm, max_iter=2)
    tasks = [
        Task(description=TASK, expected_output="a number", agent=agent),
        Task(description="Now add 4 and 4.", expected_output="a number", agent=agent),
    ]
    with contextlib.suppress(Exception):
        Crew(agents=[agent], tasks=tasks).kickoff()


def run_llamaindex(base: str, session: str) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model="agentrl-policy",
        api_base=base,
        api_key="unused",
        is_chat_model=True,
        default_headers={"x-agentrl-session": session},
        max_tokens=64,
    )
    history = [ChatMessage(role="user", content=TASK)]
    with contextlib.suppress(Exception):
        for _ in range(2):
            reply = llm.chat(history)
            history += [reply.message, ChatMessage(role="user", content="Are you sure?")]


FRAMEWORKS = {"dspy": run_dspy, "crewai": run_crewai, "llamaindex": run_llamaindex}
MODULES = {"dspy": "dspy", "crewai": "crewai", "llamaindex": "llama_index.llms.openai_like"}


async def check(name: str, gateway: str, api: str) -> dict[str, Any]:
    import importlib

    import httpx

    try:
        importlib.import_module(MODULES[name])
    except Exception as exc:
        return {"framework": name, "skipped": f"{type(exc).__name__}: {exc}"[:300]}
    session = f"{name}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    await asyncio.to_thread(FRAMEWORKS[name], f"{gateway}/v1", session)
    async with httpx.AsyncClient(timeout=60) as c:
        end = await c.post(f"{gateway}/v1/episodes/{session}/end", json={"success": True})
        out: dict[str, Any] = {"framework": name, "seconds": round(time.perf_counter() - started)}
        if end.status_code != 200:
            return out | {"ok": False, "end": end.status_code, "why": end.text[:300]}
        ended = end.json()
        fb: Any = None
        for _ in range(50):  # the index write follows the publish
            fb = await c.post(
                f"{api}/feedback", json={"episode_id": session, "metric_name": "ok", "value": True}
            )
            if fb.status_code == 202:
                break
            await asyncio.sleep(0.2)
    reached = fb.json().get("trajectory_ids") if fb is not None and fb.status_code == 202 else []
    return out | {
        "ok": bool(ended["turns"]) and len(reached or []) == 1,
        "turns": ended["turns"],
        "threads": ended["threads"],
        "failed_turns": ended["failed_turns"],
        "trajectories_reached_by_feedback": len(reached or []),
    }


async def own_stack(stop: asyncio.Event) -> tuple[str, str, list[Any]]:
    """NATS, the gateway (tiny model, capture on) and the control API, in this process."""
    import socket

    import uvicorn

    from agentrl.app.api import create_app
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.capture.service import CaptureService
    from agentrl.core.settings import Settings
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
    from agentrl.serving.local import LocalEngine

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-capture-frameworks-"))
    nats = EmbeddedNats(data_dir=tmp / "nats")
    nats.start()
    bus = await Bus.connect(nats.url, name="capture-frameworks")
    await bus.ensure_streams()
    capture = CaptureService(bus)
    log = CompletionLog(bus)
    state = GatewayState("agentrl-policy", completion_log=log, capture=capture, timeout_s=300)
    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
    engine = LocalEngine("tiny", seed=0, tiny_kwargs=tiny, default_max_tokens=32)
    state.backends["tiny"] = LocalBackend(engine, tmp)
    state.set_split({"tiny": 1.0}, ["tiny"])
    servers = []
    urls = []
    for app in (create_gateway_app(state), create_app(Settings(data_dir=tmp), bus)):
        p = port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=p, log_level="warning", lifespan="off")
        )
        asyncio.get_running_loop().create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        servers.append(server)
        urls.append(f"http://127.0.0.1:{p}")
    tasks = [
        asyncio.create_task(capture.run(stop, tick_s=0.2)),
        asyncio.create_task(log.run(stop)),
    ]
    return urls[0], urls[1], [servers, tasks, bus, nats]


async def main(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    held: list[Any] = []
    gateway, api = args.gateway, args.api
    if not gateway:
        gateway, api, held = await own_stack(stop)
    if args.serve_for:  # the frameworks run in another environment (a throwaway venv)
        print(json.dumps({"gateway": gateway, "api": api}), flush=True)
        await asyncio.sleep(args.serve_for)
        args.frameworks = ""
    results = []
    for name in filter(None, args.frameworks.split(",")):
        r = await check(name.strip(), gateway.rstrip("/"), api.rstrip("/"))
        print(json.dumps(r), flush=True)
        results.append(r)
    ran = [r for r in results if "skipped" not in r]
    print(
        json.dumps(
            {
                "frameworks_run": len(ran),
                "skipped": [r["framework"] for r in results if "skipped" in r],
                "ok": all(r.get("ok") for r in ran),
            }
        )
    )
    if held:
        stop.set()
        servers, tasks, bus, nats = held
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()
        nats.stop()
    return 0 if all(r.get("ok") for r in ran) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="", help="A running gateway (default: its own).")
    parser.add_argument("--api", default="http://127.0.0.1:8600", help="The control API.")
    parser.add_argument("--frameworks", default="crewai,dspy,llamaindex")
    parser.add_argument("--serve-for", type=float, default=0, help="Only serve, this long (s).")
    sys.exit(asyncio.run(main(parser.parse_args())))
