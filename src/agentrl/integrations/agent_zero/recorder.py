"""Pure core: Agent Zero's message loop, step by step, into one `agent.rl.trajectory.v1`.

One monologue (a user message, or a superior's message to a subordinate) is one trajectory;
each message-loop iteration is one turn. Agent Zero's LLM answers a JSON object
(`thoughts`, `headline`, `tool_name`, `tool_args`); the tool it names runs and its result is
the next turn's observation. Nothing here imports Agent Zero: the adapter (`hooks`) feeds
plain values in, so this module is tested without it.

Mapping (seed 000, trajectory payload):
  observation   turn 1: the user (or superior's) message; then what Agent Zero put into the
                history for the model after the previous answer (`observed`: the tool's
                result, `subordinate_response` after call_subordinate, a repeat or misformat
                warning or an error as `system_message`); without that hook, the previous
                tool's result, or a `system_message` saying why there is none
  thought_process  the response's `thoughts`
  action        `tool_name` / `tool_args`; type response (the `response` tool),
                subordinate_call (call_subordinate), memory_update (memory_* tools) or
                tool_call; extras `headline`, `tool_method`, `completion_id`, `parse_error`
  result        the tool's answer; success False when the response was not JSON, the tool
                never returned (it raised or was interrupted) or its answer was malformed
  metadata      the serving model version, token usage when known, the agent's number,
                profile and parent (subordinates), `outcome` (`task_abandoned` when the chat
                was stopped, reset or removed mid-monologue)

Sizes: every tool answer, observation and the instructions are cut to `max_text_bytes`
(head and tail kept), and a tool's answer that is also the next observation is stored in
full only there (the result keeps an excerpt), so one trajectory stays far below NATS's
max_payload.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrl.contracts.base import new_id
from agentrl.contracts.trajectory import SUBORDINATE_PROFILES, TrajectoryEvent

RESPONSE_TOOL = "response"
SUBORDINATE_TOOL = "call_subordinate"
MEMORY_TOOLS = ("memory_save", "memory_delete", "memory_forget")
NOT_JSON = "the response is not a JSON tool request"
MAX_TEXT_BYTES = 32_768  # default cut of one tool answer / observation
EXCERPT_BYTES = 1_024  # a result whose answer is the next observation keeps this much
# a comma before a closing bracket, outside strings (Agent Zero's dirty-JSON parser takes it)
_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*")|,(\s*[}\]])')


def _lenient_loads(text: str) -> Any:
    """Strict JSON, else the same text without trailing commas, else YAML's flow syntax
    (single quotes, unquoted keys): the dirty JSON Agent Zero's parser accepts."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fixed = _TRAILING_COMMA.sub(lambda m: m.group(1) or m.group(2), text)
        try:
            return json.loads(fixed)
        except json.JSONDecodeError:
            pass
        try:
            import yaml

            value = yaml.safe_load(fixed)
        except Exception:
            raise exc from None
        if not isinstance(value, dict):
            raise exc from None
        return value


def truncate(text: str, budget: int) -> str:
    """`text` cut to about `budget` UTF-8 bytes, head and tail kept, the cut said in it."""
    data = text.encode("utf-8", "replace")
    if budget <= 0 or len(data) <= budget:
        return text
    keep = max(0, budget - 80) // 2
    head = data[:keep].decode("utf-8", "ignore")
    tail = data[len(data) - keep :].decode("utf-8", "ignore")
    return f"{head}\n...[agentrl: {len(data) - 2 * keep:,} bytes cut]...\n{tail}"


def parse_response(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Agent Zero's JSON answer (the outermost {...}, as its own parser finds it, trailing
    commas allowed), or the reason it is not one."""
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end <= start:
        return None, NOT_JSON
    try:
        value = _lenient_loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        return None, f"{NOT_JSON} ({exc.msg})"
    if not isinstance(value, dict):
        return None, NOT_JSON
    name = value.get("tool_name", value.get("tool"))
    if not isinstance(name, str) or not name:
        return None, "the response has no tool_name"
    return value, None


def action_type(tool_name: str | None) -> str:
    if tool_name == RESPONSE_TOOL or not tool_name:
        return "response"
    if tool_name == SUBORDINATE_TOOL:
        return "subordinate_call"
    if tool_name in MEMORY_TOOLS:
        return "memory_update"
    return "tool_call"


def as_text(value: Any) -> tuple[str, bool]:
    """A tool's answer as text, and whether it was malformed (not a string)."""
    if isinstance(value, str):
        return value, False
    if value is None:
        return "", True
    try:
        return json.dumps(value, default=str), True
    except (TypeError, ValueError):
        return repr(value), True


@dataclass
class ToolRun:
    name: str
    args: dict[str, Any]
    started: float
    answer: str | None = None
    malformed: bool = False
    break_loop: bool = False
    duration_ms: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnRecord:
    turn_id: int
    at: datetime
    observation_type: str
    observation: Any
    raw_response: str | None = None
    tool: ToolRun | None = None
    llm: dict[str, Any] = field(default_factory=dict)  # completion id, model, usage
    started: float = field(default_factory=time.perf_counter)
    call_id: str | None = None  # the tag of this turn's chat-model call (capture)
    asked_model: str | None = None  # the model Agent Zero's chat model is set to call
    via_gateway: bool = False  # the call went to agentrl's gateway (its completion log)


@dataclass
class Identity:
    """Who is talking: Agent Zero's context (the session) and the agent in it."""

    session_id: str
    number: int = 0
    profile: str = ""
    parent_agent_id: str | None = None
    parent_trajectory_id: str | None = None

    @property
    def agent_id(self) -> str:
        if self.number == 0:
            return "agent-zero-main"
        return f"subordinate-{self.profile or 'default'}-{self.number}"


class TrajectoryRecorder:
    """Collects one monologue's turns; `finish()` returns the trajectory (None: no turns)."""

    def __init__(
        self,
        identity: Identity,
        instructions: str,
        *,
        task_id: str | None = None,
        model: str = "unknown",
        domain: str = "general",
        now: datetime | None = None,
        max_text_bytes: int = MAX_TEXT_BYTES,
    ) -> None:
        self.identity = identity
        self.max_text_bytes = max_text_bytes
        self.instructions = truncate(instructions, max_text_bytes)
        self.task_id = task_id or new_id()
        self.trajectory_id = new_id()
        self.model = model
        self.domain = domain
        self.started_at = now or datetime.now(UTC)
        self.turns: list[TurnRecord] = []
        self.current: TurnRecord | None = None
        self.pending: list[tuple[str, str]] = []  # what the history got for the next turn
        self.hooked_history = False  # `observed` is called: observations come from it

    def observed(self, kind: str, text: str) -> None:
        """Agent Zero put a message for the model into the history (a tool's result, a
        warning, an error, an intervention): part of the next turn's observation."""
        self.hooked_history = True
        self.pending.append((kind, truncate(text, self.max_text_bytes)))

    # ---- the loop, step by step ----------------------------------------------------------
    def begin_turn(self, now: datetime | None = None) -> None:
        if self.current is not None:  # a turn that never ended (interrupted): close it
            self.end_turn()
        obs_type, obs = self._next_observation()
        self.current = TurnRecord(len(self.turns) + 1, now or datetime.now(UTC), obs_type, obs)

    def llm_asked(self, model: str | None) -> None:
        """The model this turn's call was sent to (Agent Zero's chat model setting): what
        the turn records when the endpoint does not name the model that answered."""
        if model:
            self._turn().asked_model = model

    def llm_answered(
        self, completion_id: str | None, model: str | None, usage: dict[str, Any] | None
    ) -> None:
        """What the endpoint said about the completion (the serving version, token usage)."""
        turn = self._turn()
        if completion_id:
            turn.llm["completion_id"] = completion_id
        if model:
            turn.llm["model"] = model
        if usage:
            self.set_usage(turn, usage)

    def set_usage(self, turn: TurnRecord, usage: dict[str, Any]) -> None:
        """A turn's token usage (prompt, completion, total), from the call's report or the
        gateway's completion log."""
        clean = {k: v for k, v in usage.items() if isinstance(v, int) and v >= 0}
        if "total_tokens" not in clean and {"prompt_tokens", "completion_tokens"} <= set(clean):
            clean["total_tokens"] = clean["prompt_tokens"] + clean["completion_tokens"]
        if clean:
            turn.llm["usage"] = clean

    def completion_ids_without_usage(self) -> list[str]:
        """The completion ids of the turns whose token usage is not known yet."""
        turns = [*self.turns, *([self.current] if self.current is not None else [])]
        return [
            str(t.llm["completion_id"])
            for t in turns
            if t.via_gateway and t.llm.get("completion_id") and "usage" not in t.llm
        ]

    def usage_found(self, usage_by_id: dict[str, dict[str, Any]]) -> None:
        """Token usage looked up by completion id (the gateway's completion log)."""
        turns = [*self.turns, *([self.current] if self.current is not None else [])]
        for turn in turns:
            got = usage_by_id.get(str(turn.llm.get("completion_id") or ""))
            if got and "usage" not in turn.llm:
                self.set_usage(turn, got)

    def tool_started(self, name: str, args: dict[str, Any] | None) -> None:
        self._turn().tool = ToolRun(name, dict(args or {}), time.perf_counter())

    def tool_finished(
        self, name: str, answer: Any, break_loop: bool = False, **extras: Any
    ) -> None:
        turn = self._turn()
        run = turn.tool if turn.tool is not None and turn.tool.name == name else None
        if run is None:
            run = turn.tool = ToolRun(name, {}, time.perf_counter())
        text, run.malformed = as_text(answer)
        run.answer = truncate(text, self.max_text_bytes)
        run.break_loop = bool(break_loop)
        run.duration_ms = max(0.0, (time.perf_counter() - run.started) * 1000.0)
        run.extras.update({k: v for k, v in extras.items() if v is not None})

    def response_text(self, text: str) -> None:
        """The LLM's full answer of this turn (as Agent Zero's chat model returned it)."""
        turn = self._turn()
        turn.raw_response = text
        turn.llm["llm_time_ms"] = round((time.perf_counter() - turn.started) * 1000.0, 3)

    def end_turn(self, raw_response: str | None = None) -> None:
        """Close the turn; `raw_response` is used when no answer was recorded for it."""
        if self.current is None:
            return
        if self.current.raw_response is None:
            self.current.raw_response = raw_response
        self.turns.append(self.current)
        self.current = None

    # ---- the trajectory --------------------------------------------------------------------
    def finish(
        self, now: datetime | None = None, abandoned: str | None = None
    ) -> TrajectoryEvent | None:
        """The trajectory; `abandoned` says why it ended early (killed, reset, removed)."""
        if self.current is not None:
            self.end_turn()
        if not self.turns:
            return None
        end = max(now or datetime.now(UTC), self.started_at)
        turns = [self._turn_payload(t) for t in self.turns]
        for turn, nxt in itertools.pairwise(turns):
            _store_once(turn["result"], nxt["observation"])
        models = [m for t in self.turns if (m := t.llm.get("model") or t.asked_model)]
        usage = _usage_sum(t.llm.get("usage") for t in self.turns)
        last = self.turns[-1].tool
        done = not abandoned and last is not None and last.answer is not None and last.break_loop
        ident = self.identity
        outcome: dict[str, Any] = {
            "task_status": "completed_successfully" if done else "failed",
            "completion_percentage": 1.0 if done else 0.0,
        }
        if abandoned:
            outcome["task_abandoned"] = True
        metadata: dict[str, Any] = {
            "model": models[-1] if models else self.model,
            "agent_number": ident.number,
            "source": "agent-zero",
            "outcome": outcome,
        }
        if abandoned:
            metadata["abandoned"] = abandoned
        if usage.get("total_tokens"):
            metadata["total_tokens"] = usage["total_tokens"]
            metadata["usage"] = usage
        if len(set(models)) > 1:
            metadata["models"] = sorted(set(models))
        if ident.profile:
            metadata["agent_profile"] = ident.profile
        if ident.parent_agent_id:
            metadata["parent_agent_id"] = ident.parent_agent_id
        if ident.parent_trajectory_id:
            metadata["parent_trajectory_id"] = ident.parent_trajectory_id
        payload: dict[str, Any] = {
            "trajectory_id": self.trajectory_id,
            "session_id": ident.session_id,
            "agent_id": ident.agent_id,
            "start_timestamp": self.started_at,
            "end_timestamp": end,
            "turns": turns,
            "task_context": {
                "task_id": self.task_id,
                "instructions": self.instructions,
                "domain": self.domain,
            },
            "metadata": metadata,
        }
        if ident.profile in SUBORDINATE_PROFILES:  # other profiles: metadata.agent_profile
            payload["subordinate_profile"] = ident.profile
        return TrajectoryEvent.model_validate(payload)

    # ---- internals -----------------------------------------------------------------------
    def _turn(self) -> TurnRecord:
        if self.current is None:
            self.begin_turn()
        assert self.current is not None
        return self.current

    def _next_observation(self) -> tuple[str, Any]:
        if not self.turns:
            self.pending.clear()
            return "user_message", self.instructions
        if self.hooked_history:  # exactly what Agent Zero showed the model
            shown, self.pending = self.pending, []
            if not shown:
                return "system_message", ""
            kinds = {k for k, _ in shown}
            kind = shown[0][0] if len(kinds) == 1 else "system_message"
            return kind, "\n\n".join(text for _, text in shown)
        prev = self.turns[-1]
        if prev.tool is None:
            return "system_message", "the previous response was not a valid tool request"
        if prev.tool.answer is None:
            return "system_message", f"tool '{prev.tool.name}' did not return"
        if prev.tool.name == SUBORDINATE_TOOL:
            return "subordinate_response", prev.tool.answer
        return "tool_result", prev.tool.answer

    def _turn_payload(self, turn: TurnRecord) -> dict[str, Any]:
        raw = turn.raw_response
        parsed, parse_error = parse_response(raw) if raw is not None else (None, None)
        run = turn.tool
        if parsed is None and run is not None:
            parse_error = None  # Agent Zero's lenient parser read it: a tool ran
        name: str | None
        if parsed is not None:
            name = str(parsed.get("tool_name", parsed.get("tool")))
            args = parsed.get("tool_args", parsed.get("args", {}))
        else:
            name = run.name if run is not None else None
            args = run.args if run is not None else {}
        thoughts = parsed.get("thoughts", []) if parsed is not None else []
        if isinstance(thoughts, str):
            thoughts = [thoughts]
        base, _, method = (name or "").partition(":")
        action: dict[str, Any] = {
            "type": action_type(base or None),
            "tool_args": args if isinstance(args, dict) else {"value": args},
        }
        if base:
            action["tool_name"] = base
        if method:
            action["tool_method"] = method
        if raw is not None:
            action["raw_response"] = raw
        if parsed is not None and isinstance(parsed.get("headline"), str):
            action["headline"] = parsed["headline"]
        if parse_error is not None:
            action["parse_error"] = parse_error
        action.update(turn.llm)
        if "model" not in action and turn.asked_model:
            action["model"] = turn.asked_model
        result: dict[str, Any]
        if run is None:
            result = {"success": False, "error": parse_error or "no tool ran"}
        elif run.answer is None:
            result = {
                "success": False,
                "error": f"tool '{run.name}' did not return (it raised or was interrupted)",
            }
        else:
            result = {
                "success": parse_error is None and not run.malformed,
                "output": run.answer,
                "execution_time_ms": run.duration_ms,
            }
            if run.malformed:
                result["error"] = "the tool's answer was not text"
                result["malformed"] = True
            elif parse_error is not None:
                result["error"] = parse_error
            result.update(run.extras)
        return {
            "turn_id": turn.turn_id,
            "timestamp": turn.at,
            "observation": {"type": turn.observation_type, "content": turn.observation},
            "thought_process": [str(t) for t in thoughts] if isinstance(thoughts, list) else [],
            "action": action,
            "result": result,
        }


def _usage_sum(usages: Any) -> dict[str, int]:
    """The monologue's token usage: the sum over its turns that know theirs."""
    out: dict[str, int] = {}
    for usage in usages:
        for key, value in (usage or {}).items():
            out[key] = out.get(key, 0) + int(value)
    return out


def _store_once(result: dict[str, Any], next_observation: dict[str, Any]) -> None:
    """A tool's answer that is the next observation too (the tool's result as Agent Zero
    showed it) is stored in full only there; the result keeps an excerpt."""
    output = result.get("output")
    if next_observation.get("type") not in ("tool_result", "subordinate_response"):
        return
    if not isinstance(output, str) or len(output.encode()) <= EXCERPT_BYTES:
        return
    result["output"] = truncate(output, EXCERPT_BYTES)
    result["output_in_next_observation"] = True
