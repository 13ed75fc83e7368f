"""The upstream backend against real OpenAI-compatible servers (opt-in, slow):

- llama.cpp's server (`llama-cpp-python[server]`) serving the same SmolLM2 GGUF file the
  project ships. PyPI has no prebuilt wheel for it (the sdist compiles llama.cpp: well over
  ten minutes on 2 cores), so this runs only with AGENTRL_SLOW=1 and the package installed:
  `pip install 'llama-cpp-python[server]'`.
- vLLM with two LoRA adapters loaded at run time (`/v1/load_lora_adapter`): needs a GPU
  machine running `vllm serve BASE --enable-lora` with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; point AGENTRL_TEST_VLLM_URL at its /v1 and
  AGENTRL_TEST_VLLM_ADAPTERS at two adapter folders (comma-separated) it can read.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from agentrl.serving.backends import UpstreamBackend
from agentrl.serving.gateway import VERSION_HEADER, GatewayState, create_gateway_app
from agentrl.serving.registry import ModelRecord
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "What is 2 + 2? Answer with a number."}]


async def _serve(state: GatewayState) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(state),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("AGENTRL_SLOW") != "1" or importlib.util.find_spec("llama_cpp") is None,
    reason="slow: set AGENTRL_SLOW=1 and install llama-cpp-python[server] "
    "(no prebuilt wheel on PyPI; it compiles llama.cpp)",
)
async def test_llama_cpp_server_behind_the_gateway() -> None:
    from agentrl.llm.loading import smollm2_gguf_path

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(smollm2_gguf_path()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--logits_all",
            "true",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 120
        async with httpx.AsyncClient() as h:
            while True:
                try:
                    if (await h.get(f"{base}/models")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.time() < deadline, "llama.cpp server did not start"
                await asyncio.sleep(0.5)
        state = GatewayState("agentrl-policy")
        up = UpstreamBackend(base, timeout_s=120)
        await up.prepare(
            ModelRecord(
                model_id="smol-v1",
                version=1,
                public_name="agentrl-policy",
                base_model="smollm2",
                serving={"upstream_model": "smollm2"},
            )
        )
        state.backends["smol-v1"] = up
        state.set_split({"smol-v1": 100.0}, ["smol-v1"])
        server, task, gport = await _serve(state)
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{gport}/v1", api_key="x", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="agentrl-policy", messages=MSG, max_tokens=8, temperature=0
        )
        resp = raw.parse()
        assert raw.headers[VERSION_HEADER] == "smol-v1" and resp.model == "smol-v1"
        assert resp.choices[0].message.content
        text = ""
        async for c in await client.chat.completions.create(
            model="agentrl-policy", messages=MSG, max_tokens=8, temperature=0, stream=True
        ):
            assert c.model == "smol-v1"
            text += "".join(ch.delta.content or "" for ch in c.choices)
        assert text == resp.choices[0].message.content
        await client.close()
        server.should_exit = True
        await task
        await up.close()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("AGENTRL_TEST_VLLM_URL"),
    reason="needs a GPU machine running vLLM with --enable-lora (AGENTRL_TEST_VLLM_URL)",
)
async def test_vllm_two_adapters_loaded_at_run_time() -> None:
    base = os.environ["AGENTRL_TEST_VLLM_URL"]
    adapters = os.environ["AGENTRL_TEST_VLLM_ADAPTERS"].split(",")
    state = GatewayState("agentrl-policy")
    up = UpstreamBackend(base, timeout_s=120, load_lora=True)
    for i, path in enumerate(adapters[:2], start=1):
        await up.prepare(
            ModelRecord(
                model_id=f"lora-v{i}",
                version=i,
                public_name="agentrl-policy",
                base_model="vllm",
                checkpoint_path=path,
            )
        )
        state.backends[f"lora-v{i}"] = up
    state.set_split({"lora-v1": 50.0, "lora-v2": 50.0}, ["lora-v2", "lora-v1"])
    server, task, port = await _serve(state)
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    seen = set()
    for i in range(20):
        raw = await client.chat.completions.with_raw_response.create(
            model="agentrl-policy", messages=MSG, max_tokens=4, user=f"u{i}", logprobs=True
        )
        seen.add(raw.headers[VERSION_HEADER])
        assert raw.parse().choices[0].logprobs is not None
    assert seen == {"lora-v1", "lora-v2"}
    await client.close()
    server.should_exit = True
    await task
    await up.close()
