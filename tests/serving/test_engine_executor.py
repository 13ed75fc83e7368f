"""Issue 49.3 (the engine's part): the local engine decodes, scores guided_choice prompts and
loads adapters on threads of its own, so a loop whose default executor is full (grammar
compiles that ran past their timeout, other services' `asyncio.to_thread` work) still gets
its answers. Real tiny model, real adapter checkpoint."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.serving.backends import LocalBackend
from agentrl.serving.openai_types import ChatRequest

MSG = [{"role": "user", "content": "Say something."}]


async def test_engine_answers_while_the_default_executor_is_full(
    engine: Any, checkpoints: list[str], tmp_path: Path
) -> None:
    loop = asyncio.get_running_loop()
    busy = ThreadPoolExecutor(1, thread_name_prefix="busy-default")
    loop.set_default_executor(busy)
    release = threading.Event()
    # the loop's only default worker is taken, as by compiles that never return
    blocker = loop.run_in_executor(None, release.wait, 120)
    try:
        text = ChatRequest(model="m", messages=MSG, max_tokens=4, temperature=0.0)
        gen = await asyncio.wait_for(engine.generate(None, text), 60)
        assert gen.completion_tokens == 4
        choice = ChatRequest(
            model="m", messages=MSG, guided_choice=["yes", "no", "maybe"], temperature=0.0
        )
        gen = await asyncio.wait_for(engine.generate(None, choice), 60)
        assert gen.content in ("yes", "no", "maybe")
        folder = Path(checkpoints[2])
        await asyncio.wait_for(engine.run(engine.load_adapter, "exec-v1", folder), 60)
        assert "exec-v1" in engine.adapters
        await asyncio.wait_for(LocalBackend(engine, tmp_path).release("exec-v1"), 60)
        assert "exec-v1" not in engine.adapters
        assert not blocker.done()  # all of it while the default executor was still full
    finally:
        release.set()
        await blocker
        # the suite's event loop is shared by every test: give it back a live default pool
        # (a shut-down one failed later tests' asyncio.to_thread)
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))
        busy.shutdown()
