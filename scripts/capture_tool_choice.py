"""What the default small model does with `tool_choice: "auto"` through the gateway: N
requests, each a task that one of three offered tools fits, counted by what came back.

    python scripts/capture_tool_choice.py                 # its own gateway, SmolLM2-135M
    python scripts/capture_tool_choice.py --gateway http://127.0.0.1:8700   # `agentrl up`
    python scripts/capture_tool_choice.py --tool-choice required

One JSON line: `requests`, `valid_tool_calls` (a call of an offered tool whose arguments
are a JSON object), `invalid_tool_calls` (a call of another name or with arguments that do
not parse), `plain_text`, `text_naming_a_tool` (of the plain text answers, those that
name an offered tool: a call written as prose), `errors`, and the seconds per request.
Greedy decoding (temperature 0), so a run is reproducible on one engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": what,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in params.items()},
                "required": list(params),
            },
        },
    }
    for name, what, params in (
        ("get_weather", "Current weather in a city.", {"city": "string"}),
        ("add", "Add two numbers.", {"a": "number", "b": "number"}),
        ("search_web", "Search the web and return the top results.", {"query": "string"}),
    )
]
NAMES = {t["function"]["name"] for t in TOOLS}
TASKS = [
    "What is the weather in Paris right now?",
    "Is it raining in London today?",
    "How warm is it in Tokyo at the moment?",
    "Tell me the current weather in New York.",
    "What's the temperature in Berlin?",
    "Do I need an umbrella in Seattle today?",
    "What is 17 + 25?",
    "Add 3.5 and 4.25 for me.",
    "What is the sum of 1024 and 2048?",
    "Please compute 99 plus 1.",
    "What do you get when you add 12 and 30?",
    "Sum 7 and 8.",
    "Search the web for the latest Python release.",
    "Find recent news about the James Webb telescope.",
    "Look up who won the 2022 World Cup.",
    "Search for a good recipe for banana bread.",
    "Find the population of Canada online.",
    "What are the top results for 'best hiking trails in Colorado'?",
    "What's the weather like in Sydney, and should I wear a jacket?",
    "Use a tool to add 40 and 2.",
]


def classify(message: Any) -> str:
    calls = message.tool_calls or []
    if calls:
        for c in calls:
            try:
                args = json.loads(c.function.arguments or "")
            except ValueError:
                return "invalid_tool_calls"
            if c.function.name not in NAMES or not isinstance(args, dict):
                return "invalid_tool_calls"
        return "valid_tool_calls"
    return "plain_text"


async def own_gateway(model: str) -> tuple[str, Any]:
    import socket

    import uvicorn

    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import GatewayState, create_gateway_app
    from agentrl.serving.local import LocalEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    engine = await asyncio.to_thread(LocalEngine, model, max_batch_size=8)
    state = GatewayState("agentrl-policy", timeout_s=1800)
    state.backends[model] = LocalBackend(engine, Path(tempfile.mkdtemp(prefix="agentrl-tc-")))
    state.set_split({model: 1.0}, [model])
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(state), host="127.0.0.1", port=port, log_level="warning",
            lifespan="off",
        )
    )  # fmt: skip
    asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from openai import AsyncOpenAI

    server = None
    gateway = args.gateway
    if not gateway:
        gateway, server = await own_gateway(args.model)
    client = AsyncOpenAI(base_url=gateway.rstrip("/") + "/v1", api_key="unused", max_retries=0)
    counts = dict.fromkeys(
        ("valid_tool_calls", "invalid_tool_calls", "plain_text", "text_naming_a_tool", "errors"),
        0,
    )
    examples: dict[str, str] = {}
    seconds = []
    for task in (TASKS * (args.n // len(TASKS) + 1))[: args.n]:
        t0 = time.perf_counter()
        try:
            r = await client.chat.completions.create(
                model="agentrl-policy",
                messages=[{"role": "user", "content": task}],
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice=args.tool_choice,  # type: ignore[arg-type]
                temperature=0,
                max_tokens=args.max_tokens,
            )
        except Exception as exc:
            counts["errors"] += 1
            examples.setdefault("errors", repr(exc)[:200])
            continue
        seconds.append(time.perf_counter() - t0)
        msg = r.choices[0].message
        kind = classify(msg)
        counts[kind] += 1
        shown = msg.content or json.dumps([c.model_dump() for c in msg.tool_calls or []])
        examples.setdefault(kind, shown[:200])
        if kind == "plain_text" and any(n in (msg.content or "") for n in NAMES):
            counts["text_naming_a_tool"] += 1
    await client.close()
    if server is not None:
        server.should_exit = True
    return {
        "model": args.model if not args.gateway else "(the gateway's)",
        "tool_choice": args.tool_choice,
        "requests": args.n,
        **counts,
        "s_per_request": round(sum(seconds) / max(1, len(seconds)), 2),
        "max_tokens": args.max_tokens,
        "examples": examples,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="", help="A running gateway (else one of its own).")
    ap.add_argument("--model", default="smollm2", help="Its own gateway's model.")
    ap.add_argument("--n", type=int, default=20, help="Requests.")
    ap.add_argument("--tool-choice", default="auto", help="auto, required or none.")
    ap.add_argument("--max-tokens", type=int, default=96)
    print(json.dumps(asyncio.run(main(ap.parse_args()))), flush=True)
