"""Issue 49.5: the supervised vLLM runs with runtime LoRA updating, so without a key any
local process could load an adapter of its choice past the gateway. Each server now gets a
random key that vLLM requires on `/v1` and the backend sends. vLLM itself does not run here
(tests/serving/test_vllm.py runs it where it is installed): a stand-in `vllm` package (FastAPI, as vLLM's), started
by the real supervisor as it starts vLLM (`python -m vllm.entrypoints.openai.api_server`),
enforces the key exactly as vLLM's api_server does (`--api-key`, else `VLLM_API_KEY`; every
path under /v1; `/health` open) and answers over real HTTP."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.registry import ModelRecord
from agentrl.serving.vllm.backend import VllmBackend
from agentrl.serving.vllm.server import VllmServer
from deploy_helpers import TINY

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")

API_SERVER = r"""
import argparse, os, sys
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ap = argparse.ArgumentParser()
ap.add_argument("--host"); ap.add_argument("--port", type=int)
ap.add_argument("--served-model-name"); ap.add_argument("--api-key")
args, _ = ap.parse_known_args()
token = args.api_key or os.environ.get("VLLM_API_KEY")
adapters = set()

app = FastAPI()

@app.get("/health")
async def health():
    return {}

@app.post("/v1/load_lora_adapter")
async def load(request: Request):
    adapters.add((await request.json())["lora_name"])
    return {"ok": True}

@app.get("/v1/models")
async def models():
    names = [args.served_model_name, *sorted(adapters)]
    return {"data": [{"id": n} for n in names]}

@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    return JSONResponse({
        "id": "c", "object": "chat.completion", "model": body["model"], "created": 0,
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [1],
                     "message": {"role": "assistant", "content": "ok"}, "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })

if token:  # as vLLM's api_server: every path under /v1 needs "Bearer <token>"
    @app.middleware("http")
    async def authentication(request, call_next):
        if request.url.path.startswith("/v1") and (
            request.headers.get("Authorization") != "Bearer " + token
        ):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
"""


def stand_in(root: Path) -> Path:
    """A Python that finds the stand-in `vllm` package (the supervisor drops PYTHONPATH
    from vLLM's environment, so the interpreter is a script that sets it)."""
    pkg = root / "site" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(API_SERVER)
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root / "site"}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


async def test_vllm_gets_a_random_key_only_the_backend_sends(
    tmp_path: Path, checkpoints: list[str]
) -> None:
    python = stand_in(tmp_path)
    server = VllmServer(python, "base-model", log_path=tmp_path / "vllm.log", startup_timeout_s=60)
    other = VllmServer(python, "base-model")
    assert len(server.api_key) >= 40 and server.api_key != other.api_key  # random, per server
    backend = VllmBackend(server, {"name": "tiny", "seed": 0, "tiny_kwargs": TINY}, tmp_path)
    server.start()
    try:
        await server.wait_ready(60, through_restarts=True)  # the warm-up went through, keyed
        pid = server.pid
        assert pid is not None
        # in the environment (owner-readable), never on the command line (world-readable)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert server.api_key.encode() not in cmdline
        assert f"VLLM_API_KEY={server.api_key}".encode() in environ
        assert oct(os.stat(f"/proc/{pid}/environ").st_mode & 0o777) == "0o400"

        # any other local process: refused on adapter loading, models and completions
        async with httpx.AsyncClient(base_url=server.base_url) as c:
            anon = await c.post(
                "/load_lora_adapter", json={"lora_name": "evil", "lora_path": str(tmp_path)}
            )
            guess = await c.get("/models", headers={"Authorization": "Bearer guess"})
            assert anon.status_code == 401 and guess.status_code == 401
            assert (await c.get(f"http://{server.host}:{server.port}/health")).status_code == 200

        # the backend sends the key: adapters load, requests answer
        record = ModelRecord(
            model_id="v1",
            version=1,
            public_name="p",
            base_model="tiny",
            checkpoint_path=checkpoints[0],
        )
        await backend.prepare(record)
        assert await backend.loaded() == ["v1"]
        gen = await backend.generate(
            "v1", ChatRequest(model="v1", messages=[{"role": "user", "content": "hi"}])
        )
        assert gen.content == "ok"
    finally:
        await backend.close()


def test_an_operators_own_key_is_the_one_sent(tmp_path: Path) -> None:
    """`--api-key` in extra_args takes precedence in vLLM: the backend must send that one."""
    server = VllmServer(tmp_path / "python", "m", extra_args=["--api-key", "mine"])
    assert server.api_key == "mine"
    server = VllmServer(tmp_path / "python", "m", extra_args=["--api-key=also-mine"])
    assert server.api_key == "also-mine"
