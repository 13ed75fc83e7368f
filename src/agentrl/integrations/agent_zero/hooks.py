"""The adapter between Agent Zero's extension points and the recorder.

The plugin's extension files (`plugin/extensions/python/<point>/_80_agentrl_*.py`) are thin
`Extension` subclasses that call these functions with what Agent Zero passes them; all the
logic lives here, in the installed agentrl package. Read from Agent Zero's source
(agent0ai/agent-zero 2d95cd9, 2026-04-03; POWERFULMOVES/PMOVES-Agent-Zero 0ff6097, 2026-02-07):

  monologue_start(loop_data)           a user (or superior's) message starts a monologue
  message_loop_start(loop_data)        one LLM call + tool run begins
  chat_model_call_before(call_data)    tag the main chat call (capture: serving version);
                                       with `structured_outputs`, ask for Agent Zero's schema
  chat_model_call_after(call_data, response, reasoning)   the LLM's full answer (upstream)
  tool_execute_before(tool_args, tool_name)   at _05_: the arguments as the model wrote
                                       them, before _10_unmask_secrets puts secrets in
  tool_execute_after(response, tool_name)     after _10_mask_secrets
  hist_add_before(content_data, ai)    (sync) what goes into the history for the model:
                                       the next turn's observation (after _10_mask_content)
  message_loop_end(loop_data)          loop_data.last_response: the answer (fork fallback)
  monologue_end(loop_data)             publish the trajectory
  _functions/agent/AgentContext/{kill_process,remove}/start(data)   (sync) a chat stopped,
                                       reset or removed mid-monologue: Agent Zero skips the
                                       end hooks, so the monologue is published as abandoned

What is published is masked against Agent Zero's secrets store last (`masking`), whatever
order the extensions ran in; a monologue's turns get their token usage from the gateway's
completion log when LiteLLM did not report it (`usage`); a killed chat's events are
published on the plugin's own loop (`background`).

`Agent` gives `number`, `config.profile`, `context.id` (the session), `data` (the superior
under "_superior", the subordinate under "_subordinate"); `LoopData` gives `user_message`
(a history message) and `last_response`. Every function here catches its own errors and
logs them: an extension error must never break Agent Zero's loop.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agentrl.contracts.base import new_id
from agentrl.integrations.agent_zero import background, capture, masking, structured, usage
from agentrl.integrations.agent_zero.config import (
    AgentZeroConfig,
)
from agentrl.integrations.agent_zero.recorder import (
    SUBORDINATE_TOOL,
    Identity,
    TrajectoryRecorder,
)
from agentrl.integrations.agent_zero.state import (
    LAST_TRAJECTORY_KEY,
    SPANS_KEY,
    config_for,
    outbox_for,
)

log = logging.getLogger("agentrl.agent_zero")

RECORDER_KEY = "_agentrl_recorder"
SUPERIOR_KEY = "_superior"  # Agent.DATA_NAME_SUPERIOR
SUBORDINATE_KEY = "_subordinate"  # Agent.DATA_NAME_SUBORDINATE
OPT_OUT_KEY = "rl_opt_out"  # a context's data flag: this chat is not for training
LAST_ASK_KEY = "_agentrl_last_ask"  # (the last user message, its trajectory id): retries
KEEP_SPANS = 200
RETRY_SIMILARITY = 0.85  # a new message this close to the last one is a retry (a correction)


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except Exception:  # never into Agent Zero's loop
            log.exception("agentrl: %s failed (Agent Zero goes on)", fn.__name__)
            return None

    return wrapper  # type: ignore[return-value]


def guarded_sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:  # never into Agent Zero's loop
            log.exception("agentrl: %s failed (Agent Zero goes on)", fn.__name__)
            return None

    return wrapper


# ---- reading Agent Zero's objects --------------------------------------------------------


def _data(agent: Any) -> dict[str, Any]:
    data = getattr(agent, "data", None)
    if not isinstance(data, dict):
        data = {}
        agent.data = data
    return data


def identity(agent: Any) -> Identity:
    context = getattr(agent, "context", None)
    session = str(getattr(context, "id", None) or "agent-zero")
    config = getattr(agent, "config", None)
    ident = Identity(
        session_id=session,
        number=int(getattr(agent, "number", 0) or 0),
        profile=str(getattr(config, "profile", "") or ""),
    )
    superior = _data(agent).get(SUPERIOR_KEY)
    if superior is not None:
        ident.parent_agent_id = identity(superior).agent_id
        parent = _data(superior).get(RECORDER_KEY)
        if isinstance(parent, TrajectoryRecorder):
            ident.parent_trajectory_id = parent.trajectory_id
    return ident


def message_text(message: Any) -> str:
    """The text of a history message (Agent Zero keeps the user message as a template dict)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        for key in ("user_message", "message", "text"):
            if isinstance(content.get(key), str):
                return str(content[key])
        return json.dumps(content, default=str)
    if isinstance(content, list):
        return "\n".join(message_text(c) for c in content)
    return "" if content is None else str(content)


def opted_out(config: AgentZeroConfig, agent: Any) -> bool:
    if not config.enabled or config.opt_out:
        return True
    context = getattr(agent, "context", None)
    get = getattr(context, "get_data", None)
    try:
        return bool(get(OPT_OUT_KEY)) if callable(get) else False
    except Exception:
        return False


def _masked(agent: Any, text: str) -> str:
    """`text` masked against the chat's secrets before the recorder may cut it (a value cut
    in half would escape the final masking of the event)."""
    secrets = masking.secrets_of(getattr(agent, "context", None))
    return masking.Masker(secrets).text(text) if secrets else text


def recorder(agent: Any) -> TrajectoryRecorder | None:
    rec = _data(agent).get(RECORDER_KEY)
    return rec if isinstance(rec, TrajectoryRecorder) else None


# ---- the extension points ----------------------------------------------------------------


@guarded
async def monologue_start(agent: Any, loop_data: Any, plugin_file: str | Path) -> None:
    config = config_for(plugin_file, agent)
    if opted_out(config, agent):
        return
    message = getattr(loop_data, "user_message", None)
    if int(getattr(agent, "number", 0) or 0) == 0:
        await _retry_signal(agent, message_text(message), config)
    _data(agent)[RECORDER_KEY] = TrajectoryRecorder(
        identity(agent),
        _masked(agent, message_text(message)),
        task_id=str(getattr(message, "id", "") or "") or None,
        model=config.model_name,
        domain=config.domain,
        max_text_bytes=config.max_text_bytes,
    )
    _data(agent)[LOG_START_KEY] = _log_length(agent)
    await outbox_for(config).flush()  # the fallback flush: whatever an earlier end left


@guarded
async def message_loop_start(agent: Any, loop_data: Any, plugin_file: str | Path) -> None:
    rec = recorder(agent)
    if rec is not None:
        rec.begin_turn()


def _main_call(rec: TrajectoryRecorder | None, call_data: Any) -> bool:
    """This turn's main chat call (not a background call such as chat compaction)."""
    return (
        rec is not None
        and rec.current is not None
        and isinstance(call_data, dict)
        and not call_data.get("background")
    )


@guarded
async def chat_model_call_before(agent: Any, call_data: Any, plugin_file: str | Path) -> None:
    if not isinstance(call_data, dict) or call_data.get("background"):
        return
    model = call_data.get("model")
    config = config_for(plugin_file, agent)
    ours = capture.points_at(model, config.gateway_url)
    rec = recorder(agent)
    if _main_call(rec, call_data) and rec is not None and rec.current is not None:
        rec.llm_asked(capture.model_name_of(model))  # what answers unless the endpoint says
        rec.current.via_gateway = ours
    if not capture.takes_extra_kwargs(model):
        return
    fmt = None  # structured outputs: asked of agentrl's gateway only (it enforces them)
    if ours and config.structured_outputs:
        fmt = structured.response_format(structured.tool_names_of(agent))
    if not _main_call(rec, call_data) or rec is None or rec.current is None:
        if fmt is not None:  # not recorded (opted out): the answers are still well-formed
            call_data["model"] = capture.TaggedModel(model, None, response_format=fmt)
        return
    if capture.ensure_litellm_callback() or ours:
        rec.current.call_id = new_id()
    headers: dict[str, str] | None = None
    client = None
    if ours and rec.current.call_id is not None:
        headers = {
            capture.SESSION_HEADER: rec.identity.session_id,
            capture.CALL_HEADER: rec.current.call_id,
            # the plugin publishes the monologue itself: the gateway must not capture a copy
            capture.CAPTURE_HEADER: "off",
            # each profile and subordinate reaches its own lineage (the gateway's mapping)
            capture.AGENT_HEADER: rec.identity.agent_id,
        }
        if rec.identity.profile:
            headers[capture.PROFILE_HEADER] = rec.identity.profile
        client = capture.gateway_client(capture.api_base_of(model) or "", capture.api_key_of(model))
    if rec.current.call_id is not None or fmt is not None:
        call_data["model"] = capture.TaggedModel(
            model, rec.current.call_id, headers, usage=ours, client=client, response_format=fmt
        )


@guarded
async def chat_model_call_after(
    agent: Any, call_data: Any, response: Any, plugin_file: str | Path
) -> None:
    rec = recorder(agent)
    if not _main_call(rec, call_data) or rec is None or rec.current is None:
        return
    rec.response_text(response if isinstance(response, str) else str(response))
    if rec.current.call_id is not None:
        wait = config_for(plugin_file).capture_wait_s
        got = await capture.wait_for(rec.current.call_id, wait)
        if got is not None:
            rec.llm_answered(got.get("completion_id"), got.get("model"), got.get("usage"))


@guarded
async def tool_execute_before(
    agent: Any, tool_name: str, tool_args: Any, plugin_file: str | Path
) -> None:
    rec = recorder(agent)
    if rec is not None:  # a copy: _10_unmask_secrets replaces placeholders in place next
        args = copy.deepcopy(tool_args) if isinstance(tool_args, dict) else {}
        rec.tool_started(str(tool_name), args)


def _shown(content: Any) -> tuple[str, str]:
    """The observation type and text of a history message Agent Zero adds for the model."""
    if isinstance(content, dict):
        if "tool_result" in content:
            kind = (
                "subordinate_response"
                if content.get("tool_name") == SUBORDINATE_TOOL
                else "tool_result"
            )
            return kind, message_text(content["tool_result"])
        for key in ("system_warning", "error", "warning"):
            if key in content:
                return "system_message", message_text(content[key])
        if "user_intervention" in content or "user_message" in content:
            return "user_message", message_text(
                content.get("user_intervention", content.get("user_message"))
            )
    return "system_message", message_text(content)


@guarded_sync
def hist_add_before(agent: Any, content_data: Any, ai: Any, plugin_file: str | Path) -> None:
    rec = recorder(agent)
    if rec is None or ai or not isinstance(content_data, dict):
        return
    kind, text = _shown(content_data.get("content"))
    rec.observed(kind, _masked(agent, text))  # before any cut: no half secret survives it


@guarded
async def tool_execute_after(
    agent: Any, tool_name: str, response: Any, plugin_file: str | Path
) -> None:
    rec = recorder(agent)
    if rec is None:
        return
    extras: dict[str, Any] = {}
    if tool_name == SUBORDINATE_TOOL:
        sub = _data(agent).get(SUBORDINATE_KEY)
        if sub is not None:
            extras["subordinate_trajectory_id"] = _data(sub).get(LAST_TRAJECTORY_KEY)
            extras["subordinate_agent_id"] = identity(sub).agent_id
    answer = getattr(response, "message", response)
    rec.tool_finished(
        str(tool_name),
        _masked(agent, answer) if isinstance(answer, str) else answer,
        bool(getattr(response, "break_loop", False)),
        **extras,
    )


@guarded
async def message_loop_end(agent: Any, loop_data: Any, plugin_file: str | Path) -> None:
    rec = recorder(agent)
    if rec is not None and rec.current is not None:
        last = getattr(loop_data, "last_response", None)
        rec.end_turn(last if isinstance(last, str) and last else None)


@guarded
async def monologue_end(agent: Any, loop_data: Any, plugin_file: str | Path) -> None:
    rec = _data(agent).pop(RECORDER_KEY, None)
    if not isinstance(rec, TrajectoryRecorder):
        return
    config = config_for(plugin_file)
    missing = rec.completion_ids_without_usage()
    if missing:  # the turns' token usage, from the gateway's completion log
        rec.usage_found(await usage.lookup(config, missing, rec.started_at, config.usage_wait_s))
    event = rec.finish()
    if event is None:
        return
    event = masking.mask_event(event, masking.secrets_of(getattr(agent, "context", None)))
    _data(agent)[LAST_TRAJECTORY_KEY] = event.trajectory_id
    context = getattr(agent, "context", None)
    setter = getattr(context, "set_data", None)
    if callable(setter) and rec.identity.number == 0:  # thumbs find their trajectory here
        setter(LAST_TRAJECTORY_KEY, event.trajectory_id)
        spans = list(context.get_data(SPANS_KEY) or [])  # type: ignore[union-attr]
        start = _data(agent).pop(LOG_START_KEY, 0)
        spans.append([start, max(start, _log_length(agent) - 1), event.trajectory_id])
        setter(SPANS_KEY, spans[-KEEP_SPANS:])
        setter(LAST_ASK_KEY, [rec.instructions, event.trajectory_id])
    await outbox_for(config).send([event])


LOG_START_KEY = "_agentrl_log_start"


def _log_length(agent: Any) -> int:
    """How many items the chat's log (what the web UI shows, numbered `no`) holds."""
    logs = getattr(getattr(getattr(agent, "context", None), "log", None), "logs", None)
    return len(logs) if isinstance(logs, list) else 0


async def _retry_signal(agent: Any, text: str, config: AgentZeroConfig) -> None:
    """The user asks (nearly) the same again right after an answer: a retry, which says the
    last answer was not what they wanted; sent as a `correction` feedback on its trajectory."""
    import difflib

    context = getattr(agent, "context", None)
    get = getattr(context, "get_data", None)
    last = get(LAST_ASK_KEY) if callable(get) else None
    if not (isinstance(last, list) and len(last) == 2 and text.strip()):
        return
    previous, trajectory_id = last
    ratio = difflib.SequenceMatcher(None, str(previous).strip(), text.strip()).ratio()
    if ratio < RETRY_SIMILARITY:
        return
    from agentrl.integrations.agent_zero.feedback import feedback_event

    event = feedback_event(
        str(trajectory_id),
        "correction",
        comment=f"the user asked again (similarity {ratio:.2f}): an implicit correction",
        correction=text,
        session_id=str(getattr(context, "id", "") or "") or None,
    )
    outbox_for(config).spool_events([masking.mask_event(event, masking.secrets_of(context))])


# ---- a chat stopped, reset or removed mid-monologue ---------------------------------------


def _context_of(data: Any) -> Any:
    """The AgentContext of a kill_process (self) or remove (the context id) call."""
    if not isinstance(data, dict):
        return None
    args = data.get("args") or ()
    kwargs = data.get("kwargs") or {}
    first = args[0] if args else kwargs.get("id", kwargs.get("self"))
    if isinstance(first, str):
        contexts = getattr(importlib.import_module("agent").AgentContext, "_contexts", {})
        return contexts.get(first)
    return first


def _agents_of(context: Any) -> list[Any]:
    """The chat's agents: agent0, the streaming agent and their subordinates."""
    found: list[Any] = []
    todo = [getattr(context, "agent0", None), getattr(context, "streaming_agent", None)]
    while todo:
        agent = todo.pop()
        if agent is None or any(agent is a for a in found):
            continue
        found.append(agent)
        data = getattr(agent, "data", None)
        if isinstance(data, dict):
            todo += [data.get(SUBORDINATE_KEY), data.get(SUPERIOR_KEY)]
    return found


@guarded_sync
def context_killed(data: Any, why: str, plugin_file: str | Path) -> int:
    """Publish every monologue still running in the chat as abandoned (the trajectory with
    `outcome.task_abandoned`, and an `abandoned` feedback event); spooled now and published
    on the plugin's own background loop within seconds (whatever loop, if any, this runs
    on). Returns how many."""
    from agentrl.integrations.agent_zero.feedback import feedback_event

    context = _context_of(data)
    if context is None:
        return 0
    config = config_for(plugin_file)
    secrets = masking.secrets_of(context)
    events: list[Any] = []
    # subordinates first: their trajectories are the parents' children
    for agent in sorted(_agents_of(context), key=lambda a: -int(getattr(a, "number", 0) or 0)):
        rec = _data(agent).pop(RECORDER_KEY, None)
        if not isinstance(rec, TrajectoryRecorder):
            continue
        event = rec.finish(abandoned=why)
        if event is None:
            continue
        _data(agent)[LAST_TRAJECTORY_KEY] = event.trajectory_id
        events.append(masking.mask_event(event, secrets))
        events.append(
            feedback_event(
                event.trajectory_id,
                "abandoned",
                comment=f"the chat was {why} mid-monologue",
                session_id=rec.identity.session_id,
            )
        )
    if not events:
        return 0
    box = outbox_for(config)
    box.spool_events(events)
    background.kick(box)
    return len(events) // 2
