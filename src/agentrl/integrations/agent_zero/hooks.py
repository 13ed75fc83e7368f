"""The adapter between Agent Zero's extension points and the recorder.

The plugin's extension files (`plugin/extensions/python/<point>/_80_agentrl_*.py`) are thin
`Extension` subclasses that call these functions with what Agent Zero passes them; all the
logic lives here, in the installed agentrl package. Read from Agent Zero's source
(agent0ai/agent-zero 2d95cd9, 2026-04-03; POWERFULMOVES/PMOVES-Agent-Zero 0ff6097, 2026-02-07):

  monologue_start(loop_data)           a user (or superior's) message starts a monologue
  message_loop_start(loop_data)        one LLM call + tool run begins
  chat_model_call_before(call_data)    tag the main chat call (capture: serving version)
  chat_model_call_after(call_data, response, reasoning)   the LLM's full answer (upstream)
  tool_execute_before(tool_args, tool_name), tool_execute_after(response, tool_name)
  message_loop_end(loop_data)          loop_data.last_response: the answer (fork fallback)
  monologue_end(loop_data)             publish the trajectory

`Agent` gives `number`, `config.profile`, `context.id` (the session), `data` (the superior
under "_superior", the subordinate under "_subordinate"); `LoopData` gives `user_message`
(a history message) and `last_response`. Every function here catches its own errors and
logs them: an extension error must never break Agent Zero's loop.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agentrl.contracts.base import new_id
from agentrl.integrations.agent_zero import capture
from agentrl.integrations.agent_zero.config import AgentZeroConfig, load_config, plugin_dir_for
from agentrl.integrations.agent_zero.publisher import Outbox
from agentrl.integrations.agent_zero.recorder import (
    SUBORDINATE_TOOL,
    Identity,
    TrajectoryRecorder,
)

log = logging.getLogger("agentrl.agent_zero")

RECORDER_KEY = "_agentrl_recorder"
LAST_TRAJECTORY_KEY = "_agentrl_last_trajectory_id"
SUPERIOR_KEY = "_superior"  # Agent.DATA_NAME_SUPERIOR
SUBORDINATE_KEY = "_subordinate"  # Agent.DATA_NAME_SUBORDINATE
OPT_OUT_KEY = "rl_opt_out"  # a context's data flag: this chat is not for training

_configs: dict[str, AgentZeroConfig] = {}
_stamps: dict[str, tuple[float, ...]] = {}
_outboxes: dict[str, Outbox] = {}

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


def _stamp(plugin_dir: str) -> tuple[float, ...]:
    """When the settings files last changed (Agent Zero's settings screen saves config.json)."""
    if not plugin_dir:
        return ()
    out = []
    for name in ("default_config.yaml", "config.json"):
        try:
            out.append((Path(plugin_dir) / name).stat().st_mtime)
        except OSError:
            out.append(0.0)
    return tuple(out)


def config_for(plugin_file: str | Path) -> AgentZeroConfig:
    """The plugin's settings, re-read when a settings file changed."""
    key = str(plugin_dir_for(plugin_file) or "")
    stamp = _stamp(key)
    cached = _configs.get(key)
    if cached is None or _stamps.get(key) != stamp:
        cached = _configs[key] = load_config(Path(key) if key else None)
        _stamps[key] = stamp
    return cached


def outbox_for(config: AgentZeroConfig) -> Outbox:
    key = str(config.spool_path())
    box = _outboxes.get(key)
    if box is None:
        box = _outboxes[key] = Outbox(config)
    elif box.config != config:  # new settings (e.g. another NATS URL): keep the pause state
        box.config = config
        box.streams_ready = False
    return box


def reset_caches() -> None:
    """Forget loaded configs and outboxes (tests)."""
    _configs.clear()
    _stamps.clear()
    _outboxes.clear()


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


def recorder(agent: Any) -> TrajectoryRecorder | None:
    rec = _data(agent).get(RECORDER_KEY)
    return rec if isinstance(rec, TrajectoryRecorder) else None


# ---- the extension points ----------------------------------------------------------------


@guarded
async def monologue_start(agent: Any, loop_data: Any, plugin_file: str | Path) -> None:
    config = config_for(plugin_file)
    if opted_out(config, agent):
        return
    message = getattr(loop_data, "user_message", None)
    _data(agent)[RECORDER_KEY] = TrajectoryRecorder(
        identity(agent),
        message_text(message),
        task_id=str(getattr(message, "id", "") or "") or None,
        model=config.model_name,
        domain=config.domain,
    )
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
    rec = recorder(agent)
    if not _main_call(rec, call_data) or rec is None or rec.current is None:
        return
    model = call_data.get("model")
    if not capture.takes_extra_kwargs(model):
        return
    if capture.ensure_litellm_callback():
        rec.current.call_id = new_id()
    ours = capture.points_at(model, config_for(plugin_file).gateway_url)
    headers = {capture.SESSION_HEADER: rec.identity.session_id} if ours else None
    if rec.current.call_id is not None or ours:
        call_data["model"] = capture.TaggedModel(model, rec.current.call_id, headers, usage=ours)


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
    if rec is not None:
        rec.tool_started(str(tool_name), tool_args if isinstance(tool_args, dict) else {})


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
    rec.tool_finished(
        str(tool_name),
        getattr(response, "message", response),
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
    event = rec.finish()
    if event is None:
        return
    _data(agent)[LAST_TRAJECTORY_KEY] = event.trajectory_id
    context = getattr(agent, "context", None)
    setter = getattr(context, "set_data", None)
    if callable(setter):  # the feedback helper links thumbs to the chat's last trajectory
        setter(LAST_TRAJECTORY_KEY, event.trajectory_id)
    await outbox_for(config_for(plugin_file)).send([event])
