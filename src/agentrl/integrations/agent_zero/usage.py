"""Token usage of each turn, from agentrl's completion log by completion id.

Agent Zero closes the stream at the first complete JSON tool request, before the usage chunk
of `stream_options.include_usage` comes, so LiteLLM reports no usage for a normal turn. But
agentrl's gateway logs every completion it served (`agent.rl.completion.v1`, keyed by the
completion id each turn already carries): the prompt's token ids and exactly the completion
tokens the client was sent (a stream closed early included). At the monologue's end the
plugin reads that log from the monologue's start on, for at most `usage_wait_s`, and counts
them: prompt and completion tokens per turn. Only a record's header (its `Nats-Msg-Id` is
the completion id) is looked at until it is one of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

log = logging.getLogger("agentrl.agent_zero")

SUBJECT = "agent.rl.completion.v1"
SKEW = timedelta(seconds=5)  # the gateway's clock may be a little behind ours


def usage_of(record: dict[str, Any]) -> dict[str, int] | None:
    """Prompt, completion and total tokens of one completion record (None: it has no
    token ids, e.g. an upstream that sends none)."""
    prompt = record.get("prompt_token_ids")
    completion = record.get("completion_token_ids")
    if not isinstance(prompt, list) or not prompt:
        return None
    done = len(completion) if isinstance(completion, list) else 0
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": done,
        "total_tokens": len(prompt) + done,
    }


async def lookup(
    config: Any, completion_ids: Iterable[str], since: datetime, wait_s: float
) -> dict[str, dict[str, int]]:
    """{completion id: usage} of the ids found in the completion log within `wait_s`."""
    wanted = {str(i) for i in completion_ids if i}
    if not wanted or wait_s <= 0:
        return {}
    seen: dict[str, dict[str, int] | None] = {}  # a record without token ids: None
    with contextlib.suppress(Exception):  # NATS away, no stream yet: the turns go without
        await asyncio.wait_for(_read(config, wanted, since, seen), wait_s)
    found = {k: v for k, v in seen.items() if v is not None}
    if wanted - set(found):
        log.debug("agentrl: no completion-log usage for %d turn(s)", len(wanted - set(found)))
    return found


async def _read(
    config: Any, wanted: set[str], since: datetime, seen: dict[str, dict[str, int] | None]
) -> None:
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    from agentrl.integrations.agent_zero.publisher import probe

    servers = [u.strip() for u in str(config.nats_url).split(",") if u.strip()]
    await probe(servers, config.connect_timeout_s)
    options: dict[str, Any] = {"token": config.nats_token} if config.nats_token else {}

    async def quiet(exc: Exception) -> None:
        log.debug("agentrl: NATS: %s", exc)

    nc = await nats.connect(
        servers=servers,
        name="agentrl-agent-zero-usage",
        connect_timeout=config.connect_timeout_s,
        max_reconnect_attempts=0,
        allow_reconnect=False,
        error_cb=quiet,
        **options,
    )
    try:
        js = nc.jetstream()
        sub = await js.subscribe(
            SUBJECT,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            config=ConsumerConfig(opt_start_time=since - SKEW),
        )
        try:
            while wanted - set(seen):
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue  # the last turn's record may still be on its way
                key = (msg.headers or {}).get("Nats-Msg-Id")
                if key is not None and key not in wanted:
                    continue
                with contextlib.suppress(ValueError):
                    record = json.loads(msg.data)
                    cid = str(record.get("completion_id", ""))
                    if cid in wanted:
                        seen[cid] = usage_of(record)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    finally:
        await nc.close()
