"""OTLP trace export requests (protobuf or JSON) -> GenAI spans -> trajectories (pure).

Two vocabularies are read: OpenTelemetry's GenAI semantic conventions (`gen_ai.operation.name`
chat / execute_tool / invoke_agent, `gen_ai.input.messages` and `gen_ai.output.messages` as
JSON parts, `gen_ai.response.id`, `gen_ai.tool.call.*`; the older indexed
`gen_ai.prompt.N.*` / `gen_ai.completion.N.*` attributes too) and OpenInference
(`openinference.span.kind` LLM / TOOL / AGENT, `llm.input_messages.N.message.*`,
`llm.output_messages.N.message.*`), which smolagents emits.

The spans of one trace are one episode: each chat (LLM) span, in start order, is one
request/answer exchange and goes through the same `EpisodeBook` as the gateway's traffic, so
turns, tool calls, results and the task are read the same way. A span's
`gen_ai.response.id` is the action's `completion_id` only when this gateway served that
call (`owns`: its completion log holds the exact tokens, `token_exact`); any other
server's id (vLLM, OpenAI: every one says `chatcmpl-...`) is kept as `response_id` and the
trajectory has no token data (fine for rejection sampling and preference data, not for
token-exact RL). A trace whose calls the gateway served inside an episode is not made into
a trajectory at all: it enriches that episode (`enrichment_of`; see `agentrl.capture.api`).
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrl.capture.episodes import NAMESPACE, EpisodeBook, OpenEpisode, to_trajectory
from agentrl.capture.fit import cut
from agentrl.contracts.trajectory import TrajectoryEvent, TurnResult

LLM_OPS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPS = frozenset({"execute_tool"})
AGENT_OPS = frozenset({"invoke_agent", "create_agent"})


class OtlpError(ValueError):
    """The body is not an OTLP trace export request (the message says why)."""


class OtlpTooLarge(OtlpError):
    """The body (or what it inflates to) is over the receiver's limit."""


def gunzip(body: bytes, max_out: int) -> bytes:
    """`body` decompressed, never more than `max_out` bytes held (a 1000:1 bomb stops at
    the limit instead of filling memory)."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(body, max_out + 1)
    except zlib.error as exc:
        raise OtlpError(f"body is not valid gzip: {exc}") from exc
    if len(out) > max_out or d.unconsumed_tail:
        raise OtlpTooLarge(
            f"gzip body inflates to over {max_out:,} bytes: export in smaller batches"
        )
    if not d.eof:
        raise OtlpError("body is not valid gzip: truncated stream")
    return out


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    service: str | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        """llm | tool | agent | other."""
        op = str(self.attrs.get("gen_ai.operation.name") or "")
        oi = str(self.attrs.get("openinference.span.kind") or "").upper()
        if op in LLM_OPS or oi == "LLM":
            return "llm"
        if op in TOOL_OPS or oi == "TOOL":
            return "tool"
        if op in AGENT_OPS or oi == "AGENT":
            return "agent"
        return "other"


# ---- decoding ------------------------------------------------------------------------------
def _any_pb(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_pb(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_pb(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _any_json(v: Any) -> Any:
    if not isinstance(v, dict) or not v:
        return None
    (key, val), *_ = v.items()
    if key == "intValue":
        return int(val)
    if key == "doubleValue":
        return float(val)
    if key == "arrayValue":
        return [_any_json(x) for x in (val or {}).get("values", [])]
    if key == "kvlistValue":
        return {kv["key"]: _any_json(kv.get("value")) for kv in (val or {}).get("values", [])}
    return val


def _json_id(value: Any) -> str:
    """OTLP/JSON ids are hex; some exporters send protobuf-JSON base64 instead."""
    s = str(value or "")
    if not s:
        return ""
    try:
        int(s, 16)
        return s.lower()
    except ValueError:
        import base64

        try:
            return base64.b64decode(s).hex()
        except ValueError as exc:
            raise OtlpError(f"span id {s!r} is neither hex nor base64") from exc


def decode(
    body: bytes, content_type: str, encoding: str | None = None, max_decoded: int = 64 * 2**20
) -> list[Span]:
    """The spans of one OTLP/HTTP trace export request."""
    if (encoding or "").lower() == "gzip":
        body = gunzip(body, max_decoded)
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise OtlpError(f"body is not JSON: {exc}") from exc
        return _from_json(doc)
    if ctype in ("application/x-protobuf", "application/protobuf", ""):
        return _from_protobuf(body)
    raise OtlpError(
        f"unsupported content type {content_type!r}: send application/x-protobuf or "
        "application/json"
    )


def _from_protobuf(body: bytes) -> list[Span]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except DecodeError as exc:
        raise OtlpError(f"body is not an ExportTraceServiceRequest: {exc}") from exc
    out: list[Span] = []
    for rs in req.resource_spans:
        res = {kv.key: _any_pb(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                if len(s.trace_id) != 16 or len(s.span_id) != 8:
                    raise OtlpError("a span without a 16-byte trace id and 8-byte span id")
                out.append(
                    Span(
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.name,
                        int(s.start_time_unix_nano),
                        int(s.end_time_unix_nano),
                        {kv.key: _any_pb(kv.value) for kv in s.attributes},
                        res.get("service.name"),
                        (s.status.message or "error") if s.status.code == 2 else None,
                    )
                )
    return out


def _from_json(doc: Any) -> list[Span]:
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
        raise OtlpError("expected an object with a 'resourceSpans' list")
    out: list[Span] = []
    try:
        for rs in doc.get("resourceSpans") or []:
            res_attrs = (rs.get("resource") or {}).get("attributes") or []
            res = {kv["key"]: _any_json(kv.get("value")) for kv in res_attrs}
            for ss in rs.get("scopeSpans") or []:
                for s in ss.get("spans") or []:
                    trace, span = _json_id(s.get("traceId")), _json_id(s.get("spanId"))
                    if len(trace) != 32 or len(span) != 16:
                        raise OtlpError("a span without a 16-byte traceId and 8-byte spanId")
                    status = s.get("status") or {}
                    failed = status.get("code") in (2, "STATUS_CODE_ERROR")
                    out.append(
                        Span(
                            trace,
                            span,
                            _json_id(s.get("parentSpanId")),
                            str(s.get("name") or ""),
                            int(s.get("startTimeUnixNano") or 0),
                            int(s.get("endTimeUnixNano") or 0),
                            {
                                kv["key"]: _any_json(kv.get("value"))
                                for kv in s.get("attributes") or []
                            },
                            res.get("service.name"),
                            (status.get("message") or "error") if failed else None,
                        )
                    )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, OtlpError):
            raise
        raise OtlpError(f"malformed span: {type(exc).__name__}: {exc}") from exc
    return out


# ---- reading GenAI spans -------------------------------------------------------------------
def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """`prefix.0.a.b = x` attributes -> [{"a": {"b": x}}] (flattened lists, as emitted)."""
    rows: dict[int, dict[str, Any]] = {}
    for k, v in attrs.items():
        if not k.startswith(prefix + "."):
            continue
        head, _, rest = k[len(prefix) + 1 :].partition(".")
        if not head.isdigit() or not rest:
            continue
        node = rows.setdefault(int(head), {})
        parts = rest.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return [rows[i] for i in sorted(rows)]


def _listed(node: Any) -> list[Any]:
    """A `{"0": {...}, "1": {...}}` node (from `_indexed`) as a list."""
    if isinstance(node, dict):
        return [node[k] for k in sorted(node, key=lambda k: int(k) if k.isdigit() else 0)]
    return list(node or [])


def _oi_message(m: dict[str, Any]) -> dict[str, Any]:
    msg = m.get("message") or {}
    out: dict[str, Any] = {"role": msg.get("role") or "user", "content": msg.get("content")}
    if msg.get("content") is None and msg.get("contents"):
        out["content"] = "".join(
            str((c.get("message_content") or {}).get("text") or "")
            for c in _listed(msg["contents"])
        )
    calls = []
    for c in _listed(msg.get("tool_calls")):
        tc = c.get("tool_call") or {}
        fn = tc.get("function") or {}
        calls.append(
            {
                "id": tc.get("id") or "",
                "type": "function",
                "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""},
            }
        )
    if calls:
        out["tool_calls"] = calls
    if msg.get("tool_call_id"):
        out["tool_call_id"] = msg["tool_call_id"]
    return out


def _semconv_message(m: Any) -> dict[str, Any]:
    """A `gen_ai.*.messages` entry ({role, parts: [...]}) as an OpenAI chat message."""
    if not isinstance(m, dict):
        return {"role": "user", "content": str(m)}
    if "parts" not in m:  # already OpenAI-shaped (older instrumentations)
        return dict(m)
    texts, calls, tool_id = [], [], None
    for p in m.get("parts") or []:
        if not isinstance(p, dict):
            continue
        t = p.get("type")
        if t == "text":
            texts.append(str(p.get("content") or ""))
        elif t == "tool_call":
            args = p.get("arguments")
            calls.append(
                {
                    "id": p.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": p.get("name") or "",
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        elif t == "tool_call_response":
            tool_id = p.get("id")
            r = p.get("response")
            texts.append(r if isinstance(r, str) else json.dumps(r))
    out: dict[str, Any] = {"role": m.get("role") or "user", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    if tool_id:
        out["tool_call_id"] = tool_id
    return out


def messages_of(span: Span) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(input messages, output message) of an LLM span, in OpenAI's chat shape."""
    a = span.attrs
    inputs: list[dict[str, Any]] = []
    output: dict[str, Any] | None = None
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        system = _loads(a.get("gen_ai.system_instructions"))
        if system:
            parts = system if isinstance(system, list) else [{"content": system}]
            text = "".join(str(p.get("content") or "") for p in parts if isinstance(p, dict))
            inputs.append({"role": "system", "content": text})
        inputs += [_semconv_message(m) for m in _loads(a.get("gen_ai.input.messages")) or []]
        outs = _loads(a.get("gen_ai.output.messages")) or []
        output = _semconv_message(outs[0]) if outs else None
    elif any(k.startswith("llm.input_messages.") for k in a) or any(
        k.startswith("llm.output_messages.") for k in a
    ):
        inputs = [_oi_message(m) for m in _indexed(a, "llm.input_messages")]
        outs = _indexed(a, "llm.output_messages")
        output = _oi_message(outs[0]) if outs else None
    elif any(k.startswith("gen_ai.prompt.") for k in a):  # the older indexed convention
        inputs = [
            {k: v for k, v in m.items() if k in ("role", "content", "tool_call_id")}
            for m in _indexed(a, "gen_ai.prompt")
        ]
        outs = _indexed(a, "gen_ai.completion")
        if outs:
            o = outs[0]
            output = {"role": "assistant", "content": o.get("content")}
            calls = [
                {
                    "id": c.get("id") or "",
                    "type": "function",
                    "function": {"name": c.get("name"), "arguments": c.get("arguments") or ""},
                }
                for c in _listed(o.get("tool_calls"))
            ]
            if calls:
                output["tool_calls"] = calls
    return inputs, output


def response_id_of(span: Span) -> str | None:
    a = span.attrs
    for k in ("gen_ai.response.id", "llm.response.id"):
        if a.get(k):
            return str(a[k])
    out = _loads(a.get("output.value"))
    if isinstance(out, dict):
        for node in (out, out.get("raw") or {}):
            rid = node.get("id") if isinstance(node, dict) else None
            if isinstance(rid, str) and rid.startswith("chatcmpl-"):
                return rid
    return None


def model_of(span: Span) -> str:
    a = span.attrs
    for k in ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name"):
        if a.get(k):
            return str(a[k])
    return "unknown"


def tokens_of(span: Span) -> int:
    a = span.attrs
    if a.get("llm.token_count.total") is not None:
        return int(a["llm.token_count.total"])
    return int(a.get("gen_ai.usage.input_tokens") or 0) + int(
        a.get("gen_ai.usage.output_tokens") or 0
    )


def _tool_result(span: Span) -> tuple[str | None, str, Any]:
    a = span.attrs
    call_id = a.get("gen_ai.tool.call.id") or a.get("tool_call.id")
    name = str(a.get("gen_ai.tool.name") or a.get("tool.name") or span.name)
    out = a.get("gen_ai.tool.call.result", a.get("output.value"))
    return (str(call_id) if call_id else None), name, out


@dataclass
class TraceEpisode:
    """The spans of one trace received so far."""

    trace_id: str
    spans: list[Span] = field(default_factory=list)
    dropped: int = 0
    last_seen: float = 0.0
    root_seen: bool = False
    bytes: int = 0  # estimated size of the spans kept


def span_bytes(span: Span) -> int:
    """An estimate of what a span holds in memory (its attributes' text)."""
    n = 160 + len(span.name)
    for k, v in span.attrs.items():
        n += len(k) + (len(v) if isinstance(v, str | bytes) else 24)
    return n


def capped(span: Span, max_attrs: int, max_value: int) -> tuple[Span, int]:
    """The span with at most `max_attrs` attributes and string values cut to `max_value`
    bytes (head and tail kept, marked); and how many attributes were dropped or cut."""
    hit = 0
    attrs = span.attrs
    if len(attrs) > max_attrs:
        hit += len(attrs) - max_attrs
        attrs = dict(list(attrs.items())[:max_attrs])
    for k, v in attrs.items():
        if isinstance(v, str) and len(v) > max_value:
            if attrs is span.attrs:
                attrs = dict(attrs)
            attrs[k] = cut(v, max_value)
            hit += 1
    if attrs is not span.attrs:
        span.attrs = attrs
    return span, hit


def name_completions(trace: TraceEpisode, completion_of_call: Callable[[str], str | None]) -> None:
    """Give a chat span without a response id the completion id of the tool calls it
    answered with, where the gateway minted those calls (OpenInference's smolagents spans
    carry no response id, but the calls' ids are the gateway's own)."""
    for s in trace.spans:
        if s.kind != "llm" or response_id_of(s):
            continue
        _, output = messages_of(s)
        for call in (output or {}).get("tool_calls") or []:
            cid = completion_of_call(str(call.get("id") or ""))
            if cid:
                s.attrs["gen_ai.response.id"] = cid
                break


def unnamed_call_ids(trace: TraceEpisode) -> list[str]:
    """The tool call ids answered by chat spans that still have no response id (a gateway
    in another process names them through the capture index)."""
    out = []
    for s in trace.spans:
        if s.kind != "llm" or response_id_of(s):
            continue
        _, output = messages_of(s)
        calls = (output or {}).get("tool_calls") or []
        out += [str(c["id"]) for c in calls if isinstance(c, dict) and c.get("id")]
    return out


def llm_response_ids(trace: TraceEpisode) -> list[str]:
    return [rid for s in trace.spans if s.kind == "llm" and (rid := response_id_of(s))]


def enrichment_of(trace: TraceEpisode) -> dict[str, Any]:
    """What a trace adds to the gateway episode that served its calls: each chat span's
    duration (by completion id), each tool span's output, error and duration."""
    llm: dict[str, float] = {}
    tools: list[dict[str, Any]] = []
    for s in trace.spans:
        ms = max(0.0, (s.end_ns - s.start_ns) / 1e6)
        if s.kind == "llm" and (rid := response_id_of(s)):
            llm[rid] = ms
        elif s.kind == "tool":
            call_id, name, out = _tool_result(s)
            tools.append(
                {
                    "call_id": call_id,
                    "name": name,
                    "output": out,
                    "error": s.error,
                    "duration_ms": ms,
                }
            )
    return {"trace_id": trace.trace_id, "spans": len(trace.spans), "llm": llm, "tools": tools}


def to_trajectory_from_spans(
    trace: TraceEpisode, max_turns: int = 512, owns: Callable[[str], bool] | None = None
) -> TrajectoryEvent | None:
    """One trace as a trajectory (None: no LLM span in it). `owns(response_id)`: whether
    this gateway served that call (its completion log has the tokens)."""
    spans = sorted(trace.spans, key=lambda s: (s.start_ns, s.end_ns))
    llm = [s for s in spans if s.kind == "llm"]
    if not llm:
        return None
    conversation = next(
        (
            s.attrs.get("gen_ai.conversation.id") or s.attrs.get("session.id")
            for s in spans
            if s.attrs.get("gen_ai.conversation.id") or s.attrs.get("session.id")
        ),
        None,
    )
    named = [str(s.attrs["gen_ai.agent.name"]) for s in spans if s.attrs.get("gen_ai.agent.name")]
    agent_spans = [s.name.removeprefix("invoke_agent ") for s in spans if s.kind == "agent"]
    agent = next(iter(named + agent_spans), None)
    agent = agent or (llm[0].service or "otel-agent")
    book = EpisodeBook(max_open=1, max_bytes=2**62, max_turns=max_turns)
    joined, foreign = [], []
    for s in llm:
        inputs, output = messages_of(s)
        rid = response_id_of(s)
        if rid and owns is not None and owns(rid):
            joined.append(rid)
        elif rid:
            foreign.append(rid)
        answer = {
            "content": (output or {}).get("content"),
            "tool_calls": (output or {}).get("tool_calls"),
        }
        book.observe(
            trace.trace_id,
            inputs,
            answer,
            rid or f"{trace.trace_id}:{s.span_id}",
            model_of(s),
            now=0.0,
            at=datetime.fromtimestamp(s.start_ns / 1e9, UTC),
            tokens=tokens_of(s),
            agent_id=str(agent),
        )
    ep: OpenEpisode = next(iter(book.open.values()))
    end_ns = max(s.end_ns for s in spans)
    traj = to_trajectory(ep, ended_at=datetime.fromtimestamp(end_ns / 1e9, UTC), reason="trace")
    if traj is None:
        return None
    # tool spans fill results the next chat span did not echo back
    tools = [(*_tool_result(s), s) for s in spans if s.kind == "tool"]
    for turn in traj.turns:
        if turn.action.type != "tool_call" or turn.result is not None:
            continue
        ids = {c.get("id") for c in (turn.action.model_extra or {}).get("tool_calls") or []}
        for call_id, name, out, s in tools:
            if (call_id and call_id in ids) or name == turn.action.tool_name:
                turn.result = TurnResult(success=s.error is None, output=out, error=s.error)
                tools.remove((call_id, name, out, s))
                break
    meta_extra = traj.metadata.model_extra or {}
    capture = dict(meta_extra.get("capture") or {})
    capture.update(
        source="otlp",
        episode_id=trace.trace_id,
        trace_id=trace.trace_id,
        completion_ids=joined,
        token_exact=bool(joined) and len(joined) == len(llm),
        spans=len(trace.spans),
    )
    if foreign:
        capture["response_ids"] = foreign  # another server's ids: no tokens here
    if trace.dropped:
        capture.update(truncated=True, spans_dropped=trace.dropped)
    if not trace.root_seen:
        capture["root_span_missing"] = True
    ours = set(joined)
    for turn in traj.turns:  # only this gateway's ids name a completion (exact tokens)
        extra = turn.action.model_extra or {}
        cid = extra.pop("completion_id", None)
        if cid in ours:
            extra["completion_id"] = cid
        elif cid in foreign:
            extra["response_id"] = cid
    traj.metadata.__pydantic_extra__ = {**meta_extra, "capture": capture}
    traj.trajectory_id = str(uuid.uuid5(NAMESPACE, f"otlp\x00{trace.trace_id}"))
    traj.session_id = str(conversation or trace.trace_id)
    return traj
