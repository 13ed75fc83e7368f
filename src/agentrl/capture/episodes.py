"""Episodes from the chat histories the gateway serves (pure: no I/O, no clock of its own).

An episode is everything one caller sends under one session key until it is ended or idles
out. Inside it, each request is routed to the conversation (thread) whose history it
extends: the request's last assistant message is one of the answers the gateway gave (the
same tool call ids, else the same calls, else the same text). A request that extends none
(a crew's next task, a sub-agent, a retry with another prompt) opens another thread of the
same episode, linked to the thread active before it; nothing closes an episode but its end,
its idle timeout or memory. Requests without a session key but with OpenAI's `user` never
share an episode by `user` alone: they join the episode of that user whose history they
extend, else start one named by its first completion id.

The book keeps, per thread, only what is new since the previous answer plus the answer, so
memory grows with the episode, not with its square. A request that failed (a timeout, a
backend error) is a failed turn: it opens or keeps its episode like any other.

Bounded: at most `max_open` episodes and `max_bytes` of kept messages (less the bytes the
caller reserves for closed episodes not yet published); past either, the least recently
active episodes are closed first (counted as `closed_memory`). An episode longer than
`max_turns` keeps its first turns and is marked truncated.
"""

from __future__ import annotations

import contextlib
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
    Thread,
    TrajectoryEvent,
    TrajectoryMetadata,
    Turn,
    TurnResult,
)

# trajectory ids derive from (session key, first completion id): a republish is a duplicate
NAMESPACE = uuid.UUID("6f1c1f8e-7d0a-4c36-9d55-1c2a7a3e0c11")
MIXED = "unknown"  # metadata.model of an episode served by several versions (see guide)
RECENT = 10_000  # closed episodes remembered, so `end` can say what became of one


@dataclass
class Exchange:
    """One request/answer pair of an episode: only the messages new since the last answer.
    A failed request has `error` (and `status`) and an empty answer."""

    at: datetime
    new_messages: list[dict[str, Any]]
    answer: dict[str, Any]  # {"content": str | None, "tool_calls": [...] | None}
    completion_id: str
    model: str
    tokens: int = 0
    thread: int = 1
    error: str | None = None
    status: int | None = None


@dataclass
class Conversation:
    """One thread of an episode."""

    index: int
    parent: int | None
    opened_by: str
    task: str | None = None
    system: str | None = None
    last: tuple[Any, ...] | None = None  # signatures of the last answer
    answered: int = 0  # successful exchanges
    seen: int = 0  # messages of its last request + the answer


@dataclass
class OpenEpisode:
    key: str  # the book's key: owner scope + episode id
    agent_id: str
    started_at: datetime
    last_seen: float  # the caller's monotonic clock
    episode_id: str = ""  # what the caller names it by (session key, or first completion id)
    owner: str | None = None  # a digest of the API key that opened it (None: no keys)
    user: str | None = None  # OpenAI's `user`, when that was all that named the caller
    exchanges: list[Exchange] = field(default_factory=list)
    threads: list[Conversation] = field(default_factory=list)
    answers: dict[Any, int] = field(default_factory=dict)  # answer signature -> thread
    current: int = 0  # the thread of the last request
    size: int = 0  # bytes of kept messages (estimate: their JSON)
    truncated: bool = False
    enrichment: list[dict[str, Any]] = field(default_factory=list)  # OTLP traces joined

    def __post_init__(self) -> None:
        self.episode_id = self.episode_id or self.key

    @property
    def task(self) -> str | None:
        return self.threads[0].task if self.threads else None

    @property
    def system(self) -> str | None:
        return self.threads[0].system if self.threads else None

    @property
    def failed(self) -> int:
        return sum(1 for ex in self.exchanges if ex.error is not None)


@dataclass
class Closed:
    """An episode that left the book, and why (`ended`, `idle`, `memory`, `shutdown`)."""

    episode: OpenEpisode
    reason: str


@dataclass
class BookCounts:
    opened: int = 0
    observed: int = 0
    failed_turns: int = 0  # requests that got no answer, recorded as failed turns
    threads_opened: int = 0  # conversations beyond the first of an episode
    closed_ended: int = 0
    closed_idle: int = 0
    closed_memory: int = 0
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


def _calls_key(calls: list[Any]) -> tuple[Any, ...] | None:
    named = []
    for c in calls:
        if not isinstance(c, dict):
            continue
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args) if args.strip() else {}
        named.append((str(fn.get("name")), json.dumps(args, sort_keys=True, default=str)))
    return ("f", *named) if named else None


def signatures(message: dict[str, Any]) -> tuple[Any, ...]:
    """How an assistant message is recognised when a client sends it back: its tool call
    ids, its calls (name + arguments: a stream's ids can differ), or its text."""
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        ids = tuple(str(c.get("id")) for c in calls if c.get("id"))
        out: list[Any] = [("i", *ids)] if ids else []
        if (named := _calls_key(calls)) is not None:
            out.append(named)
        return tuple(out)
    text = text_of(message.get("content")).strip()
    return (("t", text),) if text else ()


def scope_key(owner: str | None, episode_id: str) -> str:
    """The book's key: episodes of different API keys never share one."""
    return f"{owner}\x1f{episode_id}" if owner else episode_id


def _first_user(msgs: list[dict[str, Any]]) -> str | None:
    for m in msgs:
        if m.get("role") == "user":
            return text_of(m.get("content"))
    return None


class EpisodeBook:
    """The open episodes, keyed by owner scope + episode id, least recently active first."""

    def __init__(
        self,
        max_open: int = 10_000,
        max_bytes: int = 256 * 2**20,
        max_turns: int = 512,
    ) -> None:
        self.max_open = max_open
        self.max_bytes = max_bytes
        self.max_turns = max_turns
        self.reserved = 0  # bytes held elsewhere that count against max_bytes (an outbox)
        self.open: OrderedDict[str, OpenEpisode] = OrderedDict()
        self.by_user: dict[tuple[str | None, str], list[str]] = {}
        self.by_completion: dict[str, str] = {}  # completion id -> book key (open episodes)
        self.recent: OrderedDict[str, dict[str, Any]] = OrderedDict()  # closed: what became
        self.bytes = 0
        self.counts = BookCounts()

    # ---- routing -------------------------------------------------------------------------
    def _by_user(self, owner: str | None, user: str, msgs: list[dict[str, Any]]) -> str | None:
        """The open episode of `user` whose history this request extends."""
        sigs = _last_assistant_sigs(msgs)
        if not sigs:
            return None
        task = _first_user(msgs)
        keys = list(reversed(self.by_user.get((owner, user), [])))
        for sig in sigs:  # the strongest signature first, across all of the user's episodes
            for key in keys:
                ep = self.open.get(key)
                t = ep.answers.get(sig) if ep is not None else None
                # a call id is the gateway's own; equal calls or text must share the task
                if t is not None and (sig[0] == "i" or ep.threads[t - 1].task == task):  # type: ignore[union-attr]
                    return key
        return None

    def observe(
        self,
        key: str | None,
        messages: list[Any],
        answer: dict[str, Any],
        completion_id: str,
        model: str,
        *,
        now: float,
        at: datetime,
        tokens: int = 0,
        agent_id: str = "openai-client",
        owner: str | None = None,
        user: str | None = None,
        error: str | None = None,
        status: int | None = None,
    ) -> list[Closed]:
        """Add one served (or failed) request to its episode; returns the episodes closed
        for memory. `key`: the session key; None with `user`: routed by history."""
        msgs = [m for m in messages if isinstance(m, dict)]
        closed: list[Closed] = []
        if key is not None:
            bkey = scope_key(owner, key)
            episode_id = key
        elif user:
            found = self._by_user(owner, user, msgs)
            bkey = found or scope_key(owner, completion_id)
            episode_id = completion_id
        else:
            return closed
        ep = self.open.get(bkey)
        if ep is None:
            ep = self.open[bkey] = OpenEpisode(
                bkey, agent_id, at, now, episode_id=episode_id, owner=owner, user=user
            )
            if key is None and user:
                self.by_user.setdefault((owner, user), []).append(bkey)
            self.counts.opened += 1
        else:
            self.open.move_to_end(bkey)
        ep.last_seen = now
        self.counts.observed += 1
        if len(ep.exchanges) >= self.max_turns:
            ep.truncated = True
            self.counts.turns_dropped += 1
            return closed
        thread, new = self._thread_of(ep, msgs)
        ep.current = thread.index
        thread.seen = len(msgs) + 1
        if error is None:
            sigs = signatures(answer)
            thread.last = sigs
            thread.answered += 1
            for sig in sigs:
                ep.answers[sig] = thread.index
        else:
            self.counts.failed_turns += 1
        ex = Exchange(at, new, answer, completion_id, model, tokens, thread.index, error, status)
        size = len(orjson.dumps([new, answer], default=str)) + len(completion_id) + 64
        ep.exchanges.append(ex)
        if completion_id:
            self.by_completion[completion_id] = bkey
        ep.size += size
        self.bytes += size
        while self.open and (
            len(self.open) > self.max_open or self.bytes + self.reserved > self.max_bytes
        ):
            oldest = next(iter(self.open))
            if oldest == bkey and len(self.open) == 1:
                break  # one episode alone over the byte cap: keep it, it is the newest data
            closed.append(Closed(self._pop(oldest, "memory"), "memory"))
            self.counts.closed_memory += 1
        return closed

    def _thread_of(
        self, ep: OpenEpisode, msgs: list[dict[str, Any]]
    ) -> tuple[Conversation, list[dict[str, Any]]]:
        """The thread this request continues (or a new one) and its new messages."""
        # the last assistant message, looked for from the end: a request carries the whole
        # history, and a scan from the start made each turn of a long episode cost its length
        last = next(
            (i for i in range(len(msgs) - 1, -1, -1) if msgs[i].get("role") == "assistant"), -1
        )
        if last >= 0:
            for sig in signatures(msgs[last]):
                t = ep.answers.get(sig)
                if t is None:
                    continue
                thread = ep.threads[t - 1]
                if sig in (thread.last or ()):
                    return thread, msgs[last + 1 :]
                return self._open_thread(ep, msgs, "branch", parent=t), msgs[last + 1 :]
            # our answer as the client re-rendered it (smolagents writes tool calls as
            # text): the thread whose last request this one extends, with the same task
            task = _first_user(msgs)
            for thread in sorted(ep.threads, key=lambda t: t.index != ep.current):
                if thread.seen == last + 1 and thread.task == task and thread.answered:
                    return thread, msgs[last + 1 :]
            # an assistant message the gateway never gave (another episode's, a few-shot
            # example): a conversation of its own, read from its last assistant message
            return self._open_thread(ep, msgs, "resumed"), msgs[last + 1 :]
        task = _first_user(msgs)
        for thread in ep.threads:  # a retry of a first request that got no answer
            if thread.answered == 0 and thread.task == task:
                return thread, msgs
        return self._open_thread(ep, msgs, "conversation" if ep.threads else "start"), msgs

    def _open_thread(
        self, ep: OpenEpisode, msgs: list[dict[str, Any]], why: str, parent: int | None = None
    ) -> Conversation:
        thread = Conversation(
            len(ep.threads) + 1, parent or (ep.current or None), why if ep.threads else "start"
        )
        for m in msgs:
            role = m.get("role")
            if role in ("system", "developer") and thread.system is None:
                thread.system = text_of(m.get("content"))
            elif role == "user":
                thread.task = text_of(m.get("content"))
                break
        if ep.threads:
            self.counts.threads_opened += 1
        ep.threads.append(thread)
        return thread

    # ---- lookups -------------------------------------------------------------------------
    def find(self, episode_id: str, owner: str | None) -> str | None:
        """The book key of the open episode named `episode_id` (its session key, or any of
        its completion ids) for this owner."""
        key = scope_key(owner, episode_id)
        if key in self.open:
            return key
        by_cid = self.by_completion.get(episode_id)
        if by_cid is not None and self.open[by_cid].owner == owner:
            return by_cid
        return None

    def what_became(self, episode_id: str, owner: str | None) -> dict[str, Any] | None:
        return self.recent.get(scope_key(owner, episode_id))

    # ---- closing -------------------------------------------------------------------------
    def _pop(self, key: str, reason: str) -> OpenEpisode:
        ep = self.open.pop(key)
        self.bytes -= ep.size
        for ex in ep.exchanges:
            self.by_completion.pop(ex.completion_id, None)
        if ep.user is not None:
            keys = self.by_user.get((ep.owner, ep.user), [])
            if key in keys:
                keys.remove(key)
            if not keys:
                self.by_user.pop((ep.owner, ep.user), None)
        self.recent[scope_key(ep.owner, ep.episode_id)] = {
            "closed_by": reason,
            "trajectory_id": trajectory_id_of(ep),
            "turns": len(ep.exchanges),
            "failed_turns": ep.failed,
        }
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        return ep

    def end(self, key: str) -> OpenEpisode | None:
        """Close book key `key` on request (None when no such episode is open)."""
        if key not in self.open:
            return None
        self.counts.closed_ended += 1
        return self._pop(key, "ended")

    def expire(self, now: float, idle_s: float) -> list[Closed]:
        """Close the episodes idle for `idle_s` or longer (least recently active first)."""
        out: list[Closed] = []
        while self.open:
            key, ep = next(iter(self.open.items()))
            if now - ep.last_seen < idle_s:
                break
            out.append(Closed(self._pop(key, "idle"), "idle"))
            self.counts.closed_idle += 1
        return out

    def close_all(self) -> list[Closed]:
        return [Closed(self._pop(k, "shutdown"), "shutdown") for k in list(self.open)]


def _last_assistant_sigs(msgs: list[dict[str, Any]]) -> tuple[Any, ...]:
    for m in reversed(msgs):
        if m.get("role") == "assistant":
            return signatures(m)
    return ()


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
    scope = f"{ep.owner}\x00" if ep.owner else ""
    return str(uuid.uuid5(NAMESPACE, f"{scope}{ep.episode_id}\x00{first}"))


def task_id_of(task: str) -> str:
    """Episodes of the same task text share a task id (a GRPO/RLOO group)."""
    return str(uuid.uuid5(NAMESPACE, f"task\x00{task}"))


def _failed_turn(ex: Exchange, turn_id: int, first: bool) -> Turn:
    """A request that got no answer: recorded, never dropped (no completion id: the
    completion log has no tokens for it)."""
    why = f"{ex.status or 'error'}: {ex.error}"
    return Turn(
        turn_id=turn_id,
        timestamp=ex.at,
        observation=observation_of(ex.new_messages, first),
        action=Action(type="response", raw_response="", failed=True, error=why, model=ex.model),
        result=TurnResult(success=False, error=why[:2000]),
        thread=ex.thread,
    )


def enrich(turns: list[Turn], enrichment: list[dict[str, Any]]) -> None:
    """Fold OTLP spans joined to this episode into its turns: a chat span's duration on the
    action of its completion, a tool span's output (where the next request did not echo
    it) and duration on the tool call's result."""
    durations: dict[str, float] = {}
    tools: list[dict[str, Any]] = []
    for e in enrichment:
        durations.update(e.get("llm") or {})
        tools += e.get("tools") or []
    for turn in turns:
        extra = turn.action.model_extra or {}
        cid = extra.get("completion_id")
        if cid in durations:
            extra["duration_ms"] = durations[cid]
        if turn.action.type != "tool_call":
            continue
        ids = {c.get("id") for c in extra.get("tool_calls") or []} | {extra.get("tool_call_id")}
        for t in tools:
            if (t.get("call_id") and t["call_id"] in ids) or t.get("name") == turn.action.tool_name:
                if turn.result is None:
                    turn.result = TurnResult(
                        success=t.get("error") is None, output=t.get("output"), error=t.get("error")
                    )
                if t.get("duration_ms") is not None:
                    turn.result.execution_time_ms = float(t["duration_ms"])
                tools.remove(t)
                break


def to_trajectory(
    ep: OpenEpisode,
    *,
    ended_at: datetime,
    reason: str,
    outcome: Outcome | None = None,
    notes: dict[str, str] | None = None,
) -> TrajectoryEvent | None:
    """The episode as `agent.rl.trajectory.v1` (None when it has no exchange): its turns in
    the order they were served, each naming its thread; a tool call's result is read from
    the next request of the same thread."""
    if not ep.exchanges:
        return None
    turns: list[Turn] = []
    nxt: dict[int, int] = {}  # exchange index -> next exchange index of its thread
    last_of: dict[int, int] = {}
    for i, ex in enumerate(ep.exchanges):
        if ex.thread in last_of:
            nxt[last_of[ex.thread]] = i
        last_of[ex.thread] = i
    per_thread: dict[int, int] = {}
    for i, ex in enumerate(ep.exchanges):
        first = ex.thread not in per_thread
        per_thread[ex.thread] = per_thread.get(ex.thread, 0) + 1
        if ex.error is not None:
            turns.append(_failed_turn(ex, i + 1, first))
            continue
        j = nxt.get(i)
        following = ep.exchanges[j].new_messages if j is not None else None
        action = action_of(ex.answer, ex.completion_id, ex.model)
        turns.append(
            Turn(
                turn_id=i + 1,
                timestamp=ex.at,
                observation=observation_of(ex.new_messages, first),
                action=action,
                result=result_of(action, following),
                thread=ex.thread,
            )
        )
    if ep.enrichment:
        enrich(turns, ep.enrichment)
    served = [ex for ex in ep.exchanges if ex.error is None] or ep.exchanges
    versions = list(dict.fromkeys(ex.model for ex in served))
    capture: dict[str, Any] = {
        "source": "gateway",
        "episode_id": ep.episode_id,
        "closed_by": reason,
        "completion_ids": [ex.completion_id for ex in ep.exchanges if ex.error is None],
    }
    if ep.failed:
        capture["failed_turns"] = ep.failed
    if ep.truncated:
        capture["truncated"] = True
    capture.update({k: v for k, v in (notes or {}).items() if v})  # comment, correction
    if ep.system:
        capture["system_prompt"] = ep.system
    if ep.enrichment:
        capture["otlp"] = {
            "trace_ids": [e.get("trace_id") for e in ep.enrichment],
            "spans": sum(int(e.get("spans") or 0) for e in ep.enrichment),
        }
    tokens = sum(ex.tokens for ex in ep.exchanges)
    threads = [
        Thread(
            thread=t.index,
            parent=t.parent,
            opened_by=t.opened_by,
            task=t.task or "",
            turns=per_thread.get(t.index, 0),
        )
        for t in ep.threads
    ]
    meta = TrajectoryMetadata(
        model=versions[0] if len(versions) == 1 else MIXED,
        total_tokens=tokens or None,
        outcome=outcome,
        threads=threads or None,
        serving_versions=versions,
        served_by=versions,  # the name the loop and the canary monitor read
        capture=capture,
    )
    tid = trajectory_id_of(ep)
    return TrajectoryEvent(
        trajectory_id=tid,
        session_id=ep.episode_id,
        agent_id=ep.agent_id,
        start_timestamp=ep.started_at,
        end_timestamp=max(ended_at, ep.exchanges[-1].at),
        turns=turns,
        task_context=TaskContext(task_id=task_id_of(ep.task or ""), instructions=ep.task or ""),
        metadata=meta,
    )
