"""A request naming a version the gateway does not serve gets a clear 404 (the name, what is
served), never the base model's answer labelled as that version, nor a retired lineage's
version: through the real gateway (uvicorn) and the official openai SDK, the local engine
(an adapter unloaded while the gateway still routed to it) and an upstream server (a version
released). Asked by lineage name, by version id and by the base's own id."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply
from agentrl.serving.backends import LocalBackend, UpstreamBackend
from agentrl.serving.errors import VersionNotServed
from agentrl.serving.gateway import VERSION_HEADER, GatewayState, create_gateway_app
from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.registry import ModelRecord
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Say something."}]
LINEAGE = "t53/dev"


def _record(model_id: str, checkpoint: str | None, **serving: Any) -> ModelRecord:
    return ModelRecord(
        model_id=model_id,
        version=1,
        public_name=model_id.rsplit("-", 1)[0],
        base_model="tiny",
        checkpoint_path=checkpoint,
        serving=serving,
    )


@pytest.fixture()
async def served(engine: Any, checkpoints: list[str], tmp_path: Path):
    """The default lineage `p53` (its base) and lineage `t53/dev` (one adapter version,
    `t53/dev-v1`) on the shared engine, one backend per version as the serving manager
    builds them; an upstream version `u53-v1` whose server's own model is the base."""
    import uvicorn

    state = GatewayState("p53", timeout_s=30.0)
    for model_id, ckpt in (("p53-base", None), (f"{LINEAGE}-v1", checkpoints[0])):
        backend = LocalBackend(engine, tmp_path)
        await backend.prepare(_record(model_id, ckpt))
        state.backends[model_id] = backend
    with ScriptedOpenAIServer([ScriptedReply(content="from the base")], model="base-model") as up:
        upstream = UpstreamBackend(up.base_url, timeout_s=10, default_model="base-model")
        await upstream.prepare(_record("u53-v1", "s3://nowhere/u53-v1"))
        state.backends["u53-v1"] = upstream
        state.set_split({"p53-base": 100.0}, ["p53-base"])
        state.set_lineages([LINEAGE], {}, {}, set())
        state.set_split({f"{LINEAGE}-v1": 100.0}, [f"{LINEAGE}-v1"], LINEAGE)
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
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            yield state, client, upstream, up
        finally:
            await client.close()
            server.should_exit = True
            await task
            if f"{LINEAGE}-v1" in engine.adapters:
                engine.unload_adapter(f"{LINEAGE}-v1")


async def _version(client: AsyncOpenAI, model: str) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=MSG, max_tokens=2, temperature=0
    )
    assert raw.parse().model == raw.headers[VERSION_HEADER]
    return str(raw.headers[VERSION_HEADER])


async def _not_found(client: AsyncOpenAI, model: str, stream: bool = False) -> str:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model=model, messages=MSG, max_tokens=2, stream=stream)
    body = caught.value.body
    assert isinstance(body, dict) and body.get("code") == "model_not_found", body
    return str(body["message"])


async def test_a_version_not_served_is_a_404_never_the_base(served: Any, engine: Any) -> None:
    state, client, upstream, up = served
    # served: the lineage by name, its version by id, the base by its own id
    assert await _version(client, LINEAGE) == f"{LINEAGE}-v1"
    assert await _version(client, f"{LINEAGE}-v1") == f"{LINEAGE}-v1"
    assert await _version(client, "p53") == "p53-base"
    assert await _version(client, "p53-base") == "p53-base"
    # a typo of a version id: a 404 that names it and what is served
    message = await _not_found(client, f"{LINEAGE}-v9")
    assert f"{LINEAGE}-v9" in message and LINEAGE in message and "p53-base" in message

    # the lineage retired (its version still loaded, as a spare is): by name and by its
    # version's id, a 404 that says so
    state.set_lineages([], {}, {}, {LINEAGE})
    for model in (LINEAGE, f"{LINEAGE}-v1"):
        message = await _not_found(client, model)
        assert "retired" in message and LINEAGE in message, message
    state.set_lineages([LINEAGE], {}, {}, set())  # and back
    state.set_split({f"{LINEAGE}-v1": 100.0}, [f"{LINEAGE}-v1"], LINEAGE)
    assert await _version(client, LINEAGE) == f"{LINEAGE}-v1"

    # the adapter goes while the gateway still routes to it (unloaded meanwhile): by id,
    # by lineage name and streamed, a 404 naming the version, not the base's answer
    engine.unload_adapter(f"{LINEAGE}-v1")
    for model, stream in ((f"{LINEAGE}-v1", False), (LINEAGE, False), (LINEAGE, True)):
        message = await _not_found(client, model, stream)
        assert f"{LINEAGE}-v1" in message and "not loaded" in message, message
        assert "p53-base" in message  # what is served
    assert await _version(client, "p53-base") == "p53-base"  # the base still answers
    # nothing of the refused requests counts as the version's evidence
    assert state.stats[f"{LINEAGE}-v1"].errors == 0
    assert state.refused == 3  # the three above, as input problems

    # upstream: a released version is a 404, never sent to the server as its own model
    assert await _version(client, "u53-v1") == "u53-v1"
    asked = len(up.requests)
    await upstream.release("u53-v1")
    message = await _not_found(client, "u53-v1")
    assert "u53-v1" in message and "released" in message
    assert len(up.requests) == asked  # the base's answer was never asked for


async def test_the_engine_refuses_a_version_it_has_not_loaded(
    engine: Any, checkpoints: list[str]
) -> None:
    """The last guard (an unload between the backend's check and the row's queueing): the
    engine resolves the adapter under its lock and refuses an id it does not hold."""
    request = ChatRequest(model="x", messages=MSG, max_tokens=2, temperature=0.0)
    with pytest.raises(VersionNotServed, match="t53-gone"):
        await engine.generate("t53-gone", request)
    with pytest.raises(VersionNotServed, match="t53-gone"):  # guided choices: another path
        await engine.generate(
            "t53-gone", ChatRequest(model="x", messages=MSG, guided_choice=["a", "b"])
        )
    assert (await engine.generate(None, request)).completion_tokens == 2  # the base: None
