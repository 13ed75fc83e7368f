"""The local engine's speed-ups change nothing the trainers read: the same requests (Agent
Zero's reply schema, greedy and sampled, a LoRA adapter and the base in one batch) decode to
the same tokens with the same log-probs, bit for bit, with and without them (tiny random
models, real forward passes, real llguidance masks)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.serving.cores import CoreGovernor, threads_for
from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.packed import is_packed, pack_linears, unpack_linears
from deploy_helpers import TINY


def _reply_format() -> dict[str, Any]:
    from agentrl.app.loop_tooluse import response_format

    return response_format()


def _requests(n: int, temperature: float) -> list[ChatRequest]:
    from agentrl.envs.tooluse.agent_prompt import messages_for

    return [
        ChatRequest(
            model="m",
            messages=messages_for(f"What is {17 * i + 3} times {i + 2}?"),
            temperature=temperature,
            max_tokens=24,
            response_format=_reply_format(),
        )
        for i in range(n)
    ]


def _engine(**kw: Any) -> Any:
    from agentrl.serving.local import LocalEngine

    kw.setdefault("threads", 1)  # one thread: the exact reference (two: see below)
    return LocalEngine("tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, **kw)


async def _decode(engine: Any, model_ids: list[str | None], temperature: float) -> list[Any]:
    engine._rng.manual_seed(11)
    engine.prefixes.clear()
    reqs = _requests(len(model_ids), temperature)
    return list(
        await asyncio.gather(*(engine.generate(m, r) for m, r in zip(model_ids, reqs, strict=True)))
    )


def test_packed_weights_equal_plain_linear_bit_for_bit() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(96, 256), torch.nn.Linear(256, 96, bias=False))
    x = torch.randn(3, 5, 96)
    with torch.no_grad():
        plain = model(x)
        assert pack_linears(model) == 2 and is_packed(model[0])
        packed = model(x)
        for rows in (1, 2, 16, 40):  # decode batches and a prefill
            y = torch.randn(rows, 96)
            z = model(y)
            unpack_linears(model)
            assert torch.equal(z, model(y))
            pack_linears(model)
    assert torch.equal(plain, packed)
    y = model(x)  # with gradients on: plain F.linear, gradients flow
    y.sum().backward()
    assert model[0].weight.grad is not None


@pytest.fixture(scope="module")
def engines(checkpoints: list[str]) -> tuple[Any, Any]:
    """The engine as served (every speed-up on) and the plain path, same base and adapter."""
    fast, plain = _engine(), _engine(packed_weights=False)
    assert fast.packed_layers > 0 and plain.packed_layers == 0
    for e in (fast, plain):
        e.load_adapter("a", Path(checkpoints[0]))
    return fast, plain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_fast_engine_logs_what_the_plain_engine_logs(
    engines: tuple[Any, Any], temperature: float
) -> None:
    """A batch mixing the adapter and the base, under the reply schema: equal tokens, equal
    log-probs (greedy; sampled from the same seed)."""
    ids: list[str | None] = ["a", None, "a", "a", None, "a"]
    fast, plain = (asyncio.run(_decode(e, ids, temperature)) for e in engines)
    for f, p in zip(fast, plain, strict=True):
        assert f.constrained and f.completion_token_ids
        assert f.completion_token_ids == p.completion_token_ids
        assert f.token_logprobs == p.token_logprobs


def test_two_threads_log_the_same_tokens_within_1e5(engines: tuple[Any, Any]) -> None:
    """What the core governor gives forward passes on an idle host: two threads (the last
    bits of some sums may differ; tokens equal, log-probs within 1e-5)."""
    fast = engines[0]
    fast.cores = CoreGovernor(2, 2)
    try:
        ids: list[str | None] = ["a", None, "a", None]
        two, one = (asyncio.run(_decode(e, ids, 0.0)) for e in engines)
    finally:
        fast.cores = CoreGovernor(1, 1)
    assert torch.get_num_threads() >= 1
    for t, o in zip(two, one, strict=True):
        assert t.completion_token_ids == o.completion_token_ids
        assert (
            max(abs(a - b) for a, b in zip(t.token_logprobs, o.token_logprobs, strict=True)) <= 1e-5
        )


def test_the_governor_gives_the_cores_the_other_processes_leave() -> None:
    assert threads_for(0.1, 2, 1, 2) == 2  # 2 idle cores: both
    assert threads_for(0.5, 2, 1, 2) == 1  # another process uses half a core: one
    assert threads_for(1.9, 2, 1, 2) == 1  # never below the least
    assert threads_for(3.2, 16, 8, 16) == 13
    assert threads_for(0.0, 16, 8, 12) == 12  # never above the most
    fixed = CoreGovernor(1, 1, interval_s=0.0)
    assert fixed.threads() == 1 and fixed.switches == 0
    live = CoreGovernor(1, 2, cores=2, interval_s=0.0)  # reads this host's /proc/stat
    time.sleep(0.05)
    assert live.threads() in (1, 2) and live.others >= 0.0
