"""Episodes from the chat histories the gateway serves (pure: no I/O, no clock of its own).

An OpenAI-style agent resends its whole history on every request. The book keeps, per
session key, only what is new since the previous answer (the messages beyond the ones it
has already seen) plus the answer itself, so memory grows with the episode, not with its
square. `to_trajectory` reads the exchanges as turns: each assistant answer (text or tool
calls) is an action with its `completion_id`; the tool messages of the next request are that
turn's result and the next observation; the first user message is the task.

Bounded: at most `max_open` episodes and `max_bytes` of kept messages; past either, the
least recently active episodes are closed first (and published, counted as
`closed_memory`). An episode longer than `max_turns` keeps its first turns and is marked
truncated.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from agentrl.contracts.trajectory import (
    Action,
    Observation,
    Outcome,
    TaskContext,
    TaskStatus,
    TrajectoryEvent,
    TrajectoryMetadata,
    Turn,
    TurnResult,
)

# trajectory ids derive from (session key, first completion id): a republish is a duplicate
NAMESPACE = uuid.UUID("6f1c1f8e-7d0a-4c36-9d55-1c2a7a3e0c11")
MIXED = "unknown"  # metadata.model of an episode served by several versions (see guide)


@dataclass
class Exchange:
    """One request/answer pair of an episode: only the messages new since the last answer."""

    at: datetime
    new_messages: list[dict[str, Any]]
    answer: dict[str, Any]  # {"content": str | None, "tool_calls": [...] | None}
    completion_id: str
    model: str
    tokens: int = 0


@dataclass
class OpenEpisode:
    key: str
    agent_id: str
    started_at: datetime
    last_seen: float  # the caller's monotonic clock
    seen: int = 0  # messages of the last request + its answer
    system: str | None = None
    task: str | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    size: int = 0  # bytes of kept messages (estimate: their JSON)
    truncated: bool = False


@dataclass
class Closed:
    """An episode that left the book, and why (`ended`, `idle`, `memory`)."""

    episode: OpenEpisode
    reason: str


@dataclass
class BookCounts:
    opened: int = 0
    observed: int = 0
    closed_ended: int = 0
    closed_idle: int = 0
    closed_memory: int = 0
    closed_new_task: int = 0  # the key started another conversation
    turns_dropped: int = 0  # past max_turns

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def text_of(content: Any) -> str:
    """An OpenAI message content (string, parts list or None) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, default=str)


class EpisodeBook:
    """The open episodes, keyed by session key, least recently active first."""

    def __init__(
        self,
        max_open: int = 10_000,
        max_bytes: int = 256 * 2**20,
        max_turns: int = 512,
        split_tasks: bool = True,
    ) -> None:
        self.split_tasks = split_tasks  # a new conversation under a key starts a new episode
        self.max_open = max_open
        self.max_bytes = max_bytes
        self.max_turns = max_turns
        self.open: OrderedDict[str, OpenEpisode] = OrderedDict()
        self.bytes = 0
        self.counts = BookCounts()

    def observe(
        self,
        key: str,
        messages: list[Any],
        answer: dict[str, Any],
        completion_id: str,
        model: str,
        *,
        now: float,
        at: datetime,
        tokens: int = 0,
        agent_id: str = "openai-client",
    ) -> list[Closed]:
        """Add one served request to its episode; returns the episodes closed for memory."""
        msgs = [m for m in messages if isinstance(m, dict)]
        closed: list[Closed] = []
        ep = self.open.get(key)
        if ep is not None and self.split_tasks and ep.exchanges and _starts_another_task(msgs, ep):
            closed.append(Closed(self._pop(key), "new_task"))
            self.counts.closed_new_task += 1
            ep = None
        if ep is None:
            ep = self.open[key] = OpenEpisode(key, agent_id, at, now)
            self.counts.opened += 1
        else:
            self.open.move_to_end(key)
        ep.last_seen = now
        self.counts.observed += 1
        if len(msgs) >= ep.seen:
            new = msgs[ep.seen :] if ep.seen else msgs
        else:  # another branch of the conversation: what follows its last assistant message
            last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=-1)
            new = msgs[last + 1 :]
        if ep.task is None:
            for m in msgs:
                role = m.get("role")
                if role in ("system", "developer") and ep.system is None:
                    ep.system = text_of(m.get("content"))
                elif role == "user":
                    ep.task = text_of(m.get("content"))
                    break
        ep.seen = len(msgs) + 1
        if len(ep.exchanges) >= self.max_turns:
            ep.truncated = True
            self.counts.turns_dropped += 1
            return closed
        ex = Exchange(at, new, answer, completion_id, model, tokens)
        size = len(orjson.dumps([new, answer], default=str))
        ep.exchanges.append(ex)
        ep.size += size
        self.bytes += size
        while self.open and (len(self.open) > self.max_open or self.bytes > self.max_bytes):
            oldest = next(iter(self.open))
            if oldest == key and len(self.open) == 1:
                break  # one episode alone over the byte cap: keep it, it is the newest data
            closed.append(Closed(self._pop(oldest), "memory"))
            self.counts.closed_memory += 1
        return closed

    def _pop(self, key: str) -> OpenEpisode:
        ep = self.open.pop(key)
        self.bytes -= ep.size
        return ep

    def end(self, key: str) -> OpenEpisode | None:
        """Close `key` on request (None when no such episode is open)."""
        if key not in self.open:
            return None
        self.counts.closed_ended += 1
        return self._pop(key)

    def expire(self, now: float, idle_s: float) -> list[Closed]:
        """Close the episodes idle for `idle_s` or longer (least recently active first)."""
        out: list[Closed] = []
        while self.open:
            key, ep = next(iter(self.open.items()))
            if now - ep.last_seen < idle_s:
                break
            out.append(Closed(self._pop(key), "idle"))
            self.counts.closed_idle += 1
        return out

    def close_all(self) -> list[Closed]:
        out = [Closed(self._pop(k), "shutdown") for k in list(self.open)]
        return out


def _starts_another_task(msgs: list[dict[str, Any]], ep: OpenEpisode) -> bool:
    """A fresh conversation under a key in use (OpenAI's `user` names a person, not a
    conversation): no assistant message yet and another first user message."""
    if len(msgs) >= ep.seen or any(m.get("role") == "assistant" for m in msgs):
        return False
    first = next((m for m in msgs if m.get("role") == "user"), None)
    return first is not None and text_of(first.get("content")) != ep.task


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}
    return {} if raw is None else {"_value": raw}


def action_of(answer: dict[str, Any], completion_id: str | None, model: str | None) -> Action:
    """An assistant answer as the turn's action (the first tool call names the tool; all of
    them travel in `tool_calls`)."""
    calls = [c for c in answer.get("tool_calls") or [] if isinstance(c, dict)]
    content = answer.get("content")
    extra: dict[str, Any] = {}
    if completion_id:
        extra["completion_id"] = completion_id
    if model:
        extra["model"] = model
    if calls:
        fn = calls[0].get("function") or {}
        if len(calls) > 1:
            extra["tool_calls"] = calls
        raw = text_of(content) if content else json.dumps([c.get("function") for c in calls])
        return Action(
            type="tool_call",
            tool_name=str(fn.get("name") or "unknown"),
            tool_args=_args(fn.get("arguments")),
            raw_response=raw,
            **extra,
        )
    return Action(type="response", raw_response=text_of(content), **extra)


def _failed(text: str) -> bool:
    head = text.lstrip()[:64].lower()
    return head.startswith(("error", "traceback", "exception"))


def observation_of(new: list[dict[str, Any]], first: bool) -> Observation:
    """What the agent saw before answering: the task (first turn), tool results or a user's
    follow-up."""
    tools = [m for m in new if m.get("role") == "tool"]
    users = [m for m in new if m.get("role") == "user"]
    if tools:
        if len(tools) == 1 and not users:
            return Observation(type="tool_result", content=text_of(tools[0].get("content")))
        items = [
            {k: v for k, v in m.items() if k in ("role", "tool_call_id", "name", "content")}
            for m in tools + users
        ]
        return Observation(type="tool_result", content=items)
    if users:
        return Observation(type="user_message", content=text_of(users[-1].get("content")))
    if first and new:
        return Observation(type="system_message", content=text_of(new[-1].get("content")))
    return Observation(type="user_message", content="")


def result_of(action: Action, following: list[dict[str, Any]] | None) -> TurnResult | None:
    """A tool call's result: the tool messages that came back in the next request (or, from
    agents that send tool output as a user message, that message)."""
    if action.type != "tool_call":
        return None
    if following is None:
        return None
    tools = [text_of(m.get("content")) for m in following if m.get("role") == "tool"]
    if not tools:  # agents that send tool output back as a user message (smolagents)
        tools = [text_of(m.get("content")) for m in following if m.get("role") == "user"]
    if not tools:
        return None
    out: Any = tools[0] if len(tools) == 1 else tools
    bad = [t for t in tools if _failed(t)]
    return TurnResult(success=not bad, output=out, error=bad[0][:2000] if bad else None)


def outcome_of(
    success: bool | None, score: float | None, comment: str | None = None
) -> Outcome | None:
    """The outcome block from `POST /v1/episodes/{id}/end` (None when nothing was said)."""
    if success is None and score is None and not comment:
        return None
    if success is None and score is None:
        return None
    status: TaskStatus
    if success is True or (success is None and score is not None and score >= 1.0):
        status = "completed_successfully"
    elif success is False or not score:
        status = "failed"
    else:
        status = "partial_completion"
    pct = score if score is not None else (1.0 if success else 0.0)
    return Outcome(task_status=status, completion_percentage=pct)


def trajectory_id_of(ep: OpenEpisode) -> str:
    first = ep.exchanges[0].completion_id if ep.exchanges else ""
    return str(uuid.uuid5(NAMESPACE, f"{ep.key}\x00{first}"))


def task_id_of(task: str) -> str:
    """Episodes of the same task text share a task id (a GRPO/RLOO group)."""
    return str(uuid.uuid5(NAMESPACE, f"task\x00{task}"))


def to_trajectory(
    ep: OpenEpisode,
    *,
    ended_at: datetime,
    reason: str,
    outcome: Outcome | None = None,
    comment: str | None = None,
) -> TrajectoryEvent | None:
    """The episode as `agent.rl.trajectory.v1` (None when it has no exchange)."""
    if not ep.exchanges:
        return None
    turns: list[Turn] = []
    for i, ex in enumerate(ep.exchanges):
        following = ep.exchanges[i + 1].new_messages if i + 1 < len(ep.exchanges) else None
        action = action_of(ex.answer, ex.completion_id, ex.model)
        turns.append(
            Turn(
                turn_id=i + 1,
                timestamp=ex.at,
                observation=observation_of(ex.new_messages, i == 0),
                action=action,
                result=result_of(action, following),
            )
        )
    versions = list(dict.fromkeys(ex.model for ex in ep.exchanges))
    capture: dict[str, Any] = {
        "source": "gateway",
        "episode_id": ep.key,
        "closed_by": reason,
        "completion_ids": [ex.completion_id for ex in ep.exchanges],
    }
    if ep.truncated:
        capture["truncated"] = True
    if comment:
        capture["comment"] = comment
    if ep.system:
        capture["system_prompt"] = ep.system
    tokens = sum(ex.tokens for ex in ep.exchanges)
    meta = TrajectoryMetadata(
        model=versions[0] if len(versions) == 1 else MIXED,
        total_tokens=tokens or None,
        outcome=outcome,
        serving_versions=versions,
        served_by=versions,  # the name the loop and the canary monitor read
        capture=capture,
    )
    tid = trajectory_id_of(ep)
    return TrajectoryEvent(
        trajectory_id=tid,
        session_id=ep.key,
        agent_id=ep.agent_id,
        start_timestamp=ep.started_at,
        end_timestamp=max(ended_at, ep.exchanges[-1].at),
        turns=turns,
        task_context=TaskContext(task_id=task_id_of(ep.task or ""), instructions=ep.task or ""),
        metadata=meta,
    )
