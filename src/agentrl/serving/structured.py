"""Structured outputs: a request's constraint (OpenAI's `response_format` and `tools` /
`tool_choice`, vLLM's `guided_json` / `guided_regex` / `guided_grammar` and its
`structured_outputs` object) turned into a grammar that llguidance enforces token by token
against the model's own vocabulary.

Why llguidance: vLLM's and SGLang's grammar backends are xgrammar and llguidance; xgrammar
0.2.8 pulls triton into a CPU-only install, llguidance is one self-contained wheel. Its
"compilation" builds a matcher from the grammar (milliseconds for ordinary schemas, bounded
by parser limits); a compiled matcher is cached per schema hash and each request gets a
copy. Bad input is a `StructuredOutputError` (the gateway answers 400): an invalid JSON
Schema, a keyword the engine does not support, a grammar that does not compile within
`compile_timeout_s`, a constraint nested or sized beyond the bounds below (checked by an
iterative walk before any other work: a schema 500 levels deep raised RecursionError in the
hashing, which the gateway counted as the version's server error).

Compiles run in a small pool of their own (`agentrl-grammar` threads), never the default
executor that decodes and other services use, and at most `MAX_COMPILES` at once in the
process and `MAX_COMPILES_PER_CALLER` per caller (the gateway names the caller in
`CALLER`); a timed-out compile keeps its slot until its thread really ends, so distinct
slow schemas cannot pile threads up. Beyond the bounds a request gets `CompileBusy` (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from agentrl.serving.errors import DeployError

if TYPE_CHECKING:  # (imported where logits are masked: a gateway process needs no torch)
    import torch

# Compact, fixed separators (json.dumps's): a constrained model cannot spin on whitespace.
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 512
COMPILE_TIMEOUT_S = 5.0
DRAFTS = {
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "http://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft/2020-12/schema",
}
GRAMMAR_SECONDS = [0.0]  # decode time spent on masks and matcher steps, process-wide
UNSUPPORTED_MARKERS = ("Unimplemented", "Unknown format", "not supported", "unsupported")
# Bounds of a request's constraint fields (response_format, tools, guided_*,
# structured_outputs), all together. OpenAI allows 5,000 properties and 10 levels of schema
# nesting; a compile of 15,000 required properties took 2.7 s on one core, 2,000 ~0.1 s.
MAX_DEPTH = 64  # JSON nesting levels (a schema level is about two)
MAX_NODES = 20_000  # JSON values
MAX_PROPERTIES = 2_000  # entries of "properties" objects
MAX_TEXT = 256 * 1024  # characters of keys and strings (regexes, grammars, enums)
CONSTRAINT_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "structured_outputs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
)
COMPILE_THREADS = max(1, min(2, (os.cpu_count() or 1) // 2))
MAX_COMPILES = 8  # compiles started and not yet ended (queued or running), process-wide
MAX_COMPILES_PER_CALLER = 2
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentrl_caller", default=None)


class StructuredOutputError(DeployError):
    """The request's schema, regex or grammar cannot be enforced (the gateway answers 400)."""

    status = 400


class CompileBusy(StructuredOutputError):
    """Too many new constraints compiling at once (the gateway answers 429, retry soon)."""

    status = 429


def constraint_fields(request: Any) -> dict[str, Any]:
    """The raw fields a request's constraint is made of (None ones left out)."""
    out = {f: getattr(request, f, None) for f in CONSTRAINT_FIELDS}
    return {k: v for k, v in out.items() if v is not None}


def check_bounds(value: Any, where: str = "the request's constraint") -> None:
    """Refuse a constraint nested or sized beyond the bounds, walking it iteratively (no
    recursion, and it stops at the first bound passed: bounded work whatever the input)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = props = text = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise StructuredOutputError(
                f"{where} is nested deeper than {MAX_DEPTH} levels; flatten the schema"
            )
        if nodes > MAX_NODES:
            raise StructuredOutputError(
                f"{where} has more than {MAX_NODES} JSON values; simplify the schema"
            )
        if isinstance(item, dict):
            inner = item.get("properties")
            if isinstance(inner, dict):
                props += len(inner)
                if props > MAX_PROPERTIES:
                    raise StructuredOutputError(
                        f"{where} has more than {MAX_PROPERTIES} properties; simplify the schema"
                    )
            for k, v in item.items():
                text += len(k) if isinstance(k, str) else 0
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            text += len(item)
        if text > MAX_TEXT:
            raise StructuredOutputError(
                f"{where} holds more than {MAX_TEXT} characters; simplify it"
            )


_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _pool(name: str, threads: int) -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(threads, thread_name_prefix=f"agentrl-{name}")
        return _POOLS[name]


def shutdown_pools() -> None:
    """Let the pools' idle threads end (for a process on its way out: they are not daemon
    threads, so the interpreter would wait on them); work already queued still runs, a
    later use starts new pools."""
    with _POOL_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=False)


def grammar_pool() -> ThreadPoolExecutor:
    """The threads grammars compile in (their own: a slow compile never holds a thread
    that decoding or another service waits for)."""
    return _pool("grammar", COMPILE_THREADS)


def constraint_pool() -> ThreadPoolExecutor:
    """The thread constraints are built in (schema check, grammar text: bounded, tens of
    milliseconds at most), apart from compiles so that it never queues behind one."""
    return _pool("constraint", 1)


class CompileSlots:
    """Compiles in flight, in all and per caller. A request beyond either bound waits for a
    slot (a coroutine, no thread) up to its time limit, then gets `CompileBusy`; a slot is
    held until the compile's thread ends, not when its request gave up waiting. Used from
    the event loop only."""

    def __init__(self, total: int = MAX_COMPILES, per_caller: int = MAX_COMPILES_PER_CALLER):
        self.total, self.per_caller = total, per_caller
        self.by_caller: dict[str, int] = {}
        self.busy = 0
        self.refused = 0
        self._waiters: list[asyncio.Future[None]] = []

    def _free(self, who: str) -> bool:
        return self.busy < self.total and self.by_caller.get(who, 0) < self.per_caller

    async def enter(self, caller: str | None, timeout_s: float) -> str:
        who = caller or "-"
        deadline = time.monotonic() + timeout_s
        while not self._free(who):
            left = deadline - time.monotonic()
            if left <= 0:
                self.refused += 1
                raise CompileBusy(
                    f"too many new structured-output constraints compiling ({self.busy} in "
                    f"all, {self.by_caller.get(who, 0)} of yours); retry in a moment or "
                    "reuse a schema"
                )
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, left)
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
        self.busy += 1
        self.by_caller[who] = self.by_caller.get(who, 0) + 1
        return who

    def leave(self, who: str) -> None:
        self.busy -= 1
        left = self.by_caller.get(who, 1) - 1
        if left > 0:
            self.by_caller[who] = left
        else:
            self.by_caller.pop(who, None)
        for waiter in self._waiters:  # each looks again (few: bounded by the gateway)
            if not waiter.done():
                waiter.set_result(None)


SLOTS = CompileSlots()


@dataclass(frozen=True)
class Constraint:
    """What a request's answer must match: a llguidance grammar, the hash that names it in
    caches and in the completion log, and, for tool calls, which tools an answer may call."""

    kind: str  # json_schema | json_object | regex | grammar | tools
    grammar: str
    key: str
    tools: tuple[str, ...] = ()
    tool_mode: str | None = None  # "required" (a call) or "auto" (text or a call)


def spec_hash(spec: Any) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


# ---- request -> constraint ------------------------------------------------------------
def _check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON Schema that is a schema (checked against its draft's meta-schema by
    jsonschema-rs: the Python jsonschema's first import took seconds), else a 400."""
    import jsonschema_rs

    if isinstance(schema, str):
        try:  # orjson: a depth limit of its own, never a RecursionError
            schema = orjson.loads(schema)
        except ValueError as exc:
            raise StructuredOutputError(f"{where}: not JSON: {exc}") from exc
        check_bounds(schema, where)
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"{where}: a JSON Schema must be an object")
    draft = schema.get("$schema")
    if draft is not None and str(draft).rstrip("#").replace("https://", "http://") not in DRAFTS:
        # a meta-schema it does not know would be fetched over the network: never
        raise StructuredOutputError(f"{where}: unknown $schema {draft!r}; use a JSON Schema draft")
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        path = "/".join(str(p) for p in exc.instance_path) or "(root)"
        raise StructuredOutputError(
            f"{where}: invalid JSON Schema at {path}: {exc.message}"
        ) from exc
    except jsonschema_rs.ReferencingError as exc:
        raise StructuredOutputError(f"{where}: invalid JSON Schema: {exc}") from exc
    return schema


def _json_grammar(schema: dict[str, Any]) -> str:
    from llguidance import LLMatcher

    return str(LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def _regex_grammar(regex: Any, where: str) -> str:
    from llguidance import LLMatcher

    if not isinstance(regex, str) or not regex:
        raise StructuredOutputError(f"{where}: a regex must be a non-empty string")
    return str(LLMatcher.grammar_from_regex(regex))


def _ebnf_grammar(text: Any, where: str) -> str:
    """Lark (llguidance's own syntax) or GBNF/EBNF as llama.cpp and vLLM take it."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if not isinstance(text, str) or not text.strip():
        raise StructuredOutputError(f"{where}: a grammar must be a non-empty string")
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # the converter raises plain exceptions on bad GBNF
        raise StructuredOutputError(f"{where}: cannot read the grammar: {exc}") from exc
    return str(LLMatcher.grammar_from_lark(lark))


def _tool_specs(tools: Any) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    if not isinstance(tools, list) or not tools:
        raise StructuredOutputError("tools: a non-empty list of function tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise StructuredOutputError(f"tools[{i}]: a function tool with a name")
        params = fn.get("parameters") if isinstance(fn, dict) else None
        where = f"tools[{i}].function.parameters ({name})"
        specs[name] = _check_schema(params if params is not None else {"type": "object"}, where)
    return specs


def _named_tool(tool_choice: Any, names: list[str]) -> str | None:
    if not isinstance(tool_choice, dict):
        return None
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool_choice.get("name")
    if name not in names:
        raise StructuredOutputError(
            f"tool_choice names the function {name!r}, which is not among the tools "
            f"({', '.join(names)})"
        )
    return str(name)


def call_schema(tools: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """One call of an offered tool, `{"name": ..., "arguments": {...}}` with the arguments
    valid against that tool's parameters (a list of such calls when `parallel`)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, params in tools.items()
    ]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
    return one


def _tools_constraint(request: Any, fmt: dict[str, Any] | None) -> Constraint | None:
    from llguidance import LLMatcher

    choice = request.tool_choice
    if choice == "none" or not request.tools:
        return None
    if choice not in (None, "auto", "required") and not isinstance(choice, dict):
        raise StructuredOutputError(
            "tool_choice: 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        )
    specs = _tool_specs(request.tools)
    named = _named_tool(choice, list(specs))
    if named is not None:
        specs = {named: specs[named]}
    parallel = request.parallel_tool_calls is True and named is None
    schema = call_schema(specs, parallel)
    mode = "required" if (choice == "required" or named) else "auto"
    key = spec_hash({"tools": schema, "mode": mode, "format": fmt})
    if mode == "required":
        grammar = _json_grammar(schema)
    else:  # text (anything not opening a JSON value), a call, or the response format
        call = json.dumps({**schema, "x-guidance": JSON_OPTIONS})
        other = "TEXT\nTEXT: /[^{\\[][\\s\\S]*/"
        if fmt is not None:
            other = "fmt\nfmt: %json " + json.dumps({**fmt, "x-guidance": JSON_OPTIONS})
        grammar = str(LLMatcher.grammar_from_lark(f"start: call | {other}\ncall: %json {call}"))
    return Constraint("tools", grammar, key, tuple(specs), mode)


def _format_schema(response_format: Any) -> tuple[str, dict[str, Any]] | None:
    """OpenAI's response_format -> ("json_object" | "json_schema", schema), None for text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise StructuredOutputError("response_format: an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise StructuredOutputError(
                "response_format.json_schema: an object with 'name' and 'schema'"
            )
        return "json_schema", _check_schema(spec["schema"], "response_format.json_schema.schema")
    raise StructuredOutputError(
        f"response_format.type {kind!r}: one of 'text', 'json_object', 'json_schema'"
    )


_MEMO: OrderedDict[str, Constraint | str | None] = OrderedDict()  # raw hash -> it, or why not
_MEMO_LOCK = threading.Lock()


def raw_key(fields: dict[str, Any]) -> str:
    """The hash of a request's raw constraint fields (bounded before: no deep recursion)."""
    try:
        data = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits, say
        data = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def constraint_for(request: Any) -> Constraint | None:
    """The constraint a request asks for (None when its answer is free text or a
    guided_choice, which the choice-scoring path answers). Raises StructuredOutputError.

    Bounded first (`check_bounds`), then cached by the hash of the raw fields (schema
    checks and grammar building are not redone per request), and remembered on the request
    itself: the gateway builds it off the event loop (`constraint_off_loop`) before the
    engine asks again."""
    memo = getattr(request, "_constraint", None)
    if memo is not None:
        return memo[0]  # type: ignore[no-any-return]
    fields = constraint_fields(request)
    if not fields:
        return None
    check_bounds(fields)
    key = raw_key(fields)
    with _MEMO_LOCK:
        hit = _MEMO.get(key, _MEMO)
        if hit is not _MEMO:
            _MEMO.move_to_end(key)
    if hit is _MEMO:
        try:
            hit = _constraint_for(request)
        except StructuredOutputError as exc:
            hit = str(exc)
        except RecursionError:  # a backstop: the bounds above should make it impossible
            hit = "the request's constraint is nested too deeply; flatten the schema"
        except (ValueError, TypeError, KeyError) as exc:  # from the input alone: a 400
            hit = f"the request's constraint cannot be read: {type(exc).__name__}: {exc}"
        with _MEMO_LOCK:
            _MEMO[key] = hit
            while len(_MEMO) > CACHE_SIZE:
                _MEMO.popitem(last=False)
    if isinstance(hit, str):
        raise StructuredOutputError(hit)
    found: Constraint | None = hit  # type: ignore[assignment]
    _remember(request, found)
    return found


def _remember(request: Any, constraint: Constraint | None) -> None:
    with contextlib.suppress(AttributeError, ValueError, TypeError):  # not a ChatRequest
        request._constraint = (constraint,)


async def constraint_off_loop(request: Any) -> Constraint | None:
    """`constraint_for` in the grammar pool (schema checks and grammar building of a large
    schema took tens of milliseconds: never on the event loop)."""
    if getattr(request, "_constraint", None) is not None or not constraint_fields(request):
        return constraint_for(request)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(constraint_pool(), constraint_for, request)


def _constraint_for(request: Any) -> Constraint | None:
    so = request.structured_outputs or {}
    if not isinstance(so, dict):
        raise StructuredOutputError("structured_outputs: an object")
    given = {
        "guided_json": request.guided_json,
        "guided_regex": request.guided_regex,
        "guided_grammar": request.guided_grammar,
        **{f"structured_outputs.{k}": v for k, v in so.items() if v not in (None, False)},
    }
    given = {k: v for k, v in given.items() if v is not None and k != "structured_outputs.choice"}
    if len(given) > 1:
        raise StructuredOutputError(f"give one constraint, not {len(given)}: {sorted(given)}")
    fmt = _format_schema(request.response_format)
    if given and fmt is not None:
        raise StructuredOutputError(f"{next(iter(given))} and response_format are exclusive")
    tools = _tools_constraint(request, fmt[1] if fmt else None)
    if tools is not None:
        if given:
            raise StructuredOutputError(f"{next(iter(given))} cannot be combined with tools")
        return tools
    if fmt is not None:
        kind, schema = fmt
        return Constraint(kind, _json_grammar(schema), spec_hash({kind: schema}))
    if not given:
        return None
    where, value = next(iter(given.items()))
    leaf = where.rsplit(".", 1)[-1]
    if leaf in ("guided_json", "json"):
        schema = _check_schema(value, where)
        return Constraint("json_schema", _json_grammar(schema), spec_hash({"json": schema}))
    if leaf == "json_object":
        return Constraint("json_object", _json_grammar({"type": "object"}), spec_hash("object"))
    if leaf in ("guided_regex", "regex"):
        return Constraint("regex", _regex_grammar(value, where), spec_hash({"regex": value}))
    if leaf in ("guided_grammar", "grammar"):
        return Constraint("grammar", _ebnf_grammar(value, where), spec_hash({"grammar": value}))
    raise StructuredOutputError(
        f"{where}: unknown; structured_outputs takes json, regex, choice, grammar, json_object"
    )


# ---- compilation ----------------------------------------------------------------------
# id(tokenizer) -> (vocabulary size, tokens in the tokenizer) -> llguidance's view of it
_LLTOKENIZERS: dict[int, dict[tuple[int, int], Any]] = {}
_LLTOKENIZERS_LOCK = threading.Lock()


def shared_lltokenizer(hf_tokenizer: Any, vocab_size: int) -> Any:
    """llguidance's view of `hf_tokenizer` (~0.8 CPU-s to build: llguidance says to cache
    it), one per tokenizer object in the process: every engine, learner and mask builder
    over one shared tokenizer (`load_smollm2_tokenizer`) built its own. Read-only: safe to
    share. The entry goes with the tokenizer object (its id is not reused while cached)."""
    import llguidance.hf

    key = id(hf_tokenizer)
    size = (vocab_size, len(hf_tokenizer))  # a token added since: built again
    with _LLTOKENIZERS_LOCK:
        entry = _LLTOKENIZERS.get(key)
        if entry is None:
            entry = _LLTOKENIZERS[key] = {}
            weakref.finalize(hf_tokenizer, _LLTOKENIZERS.pop, key, None)
        ll = entry.get(size)
        if ll is None:
            ll = entry[size] = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        return ll


class GrammarCompiler:
    """Compiled matchers per schema hash over one tokenizer; `matcher()` hands each request
    its own copy. Compilation runs in a thread under a time limit (a 400, never a hang)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        cache_size: int = CACHE_SIZE,
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
        warm: bool = True,
    ) -> None:
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self.compile_timeout_s = compile_timeout_s
        self._ll: Any = None
        self._ll_lock = threading.Lock()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._failed: OrderedDict[str, str] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self.compile_ms: list[float] = []
        if warm:  # in the grammar pool now, not under the first constrained request
            grammar_pool().submit(self.warm_up)

    def warm_up(self) -> None:
        """Imports and llguidance's view of the vocabulary, built once (about half a second
        holding the GIL, longer on a busy host: paid by the first constrained request, it
        stalled the whole gateway for 1.7 s)."""
        import jsonschema_rs  # noqa: F401
        import llguidance.numpy  # noqa: F401

        self.lltokenizer()

    def lltokenizer(self) -> Any:
        """llguidance's view of the model's vocabulary (built once, about half a second)."""
        with self._ll_lock:
            if self._ll is None:
                self._ll = shared_lltokenizer(self.hf_tokenizer, self.vocab_size)
            return self._ll

    async def _vocabulary(self) -> None:
        """llguidance's view of the vocabulary, before a schema's compile clock starts: it is
        built once per engine and is no schema's cost (under load 14 on 2 cores its build
        took the first constrained request's whole 5 s, and that request was refused)."""
        if self._ll is None:  # being built by `warm_up` (waits on its lock) or not yet
            await asyncio.to_thread(self.lltokenizer)

    def compile(self, constraint: Constraint) -> Any:
        """A fresh matcher for `constraint` (blocking; no cache, no time limit)."""
        from llguidance import LLMatcher

        started = time.perf_counter()
        matcher = LLMatcher(self.lltokenizer(), constraint.grammar, log_level=0)
        if matcher.is_error():
            raise StructuredOutputError(_explain(str(matcher.get_error()), constraint))
        self.compile_ms.append((time.perf_counter() - started) * 1000)
        del self.compile_ms[:-4096]
        return matcher

    async def matcher(self, constraint: Constraint) -> Any:
        """A matcher at its start state, for one request."""
        return (await self.template(constraint)).deep_copy()

    async def template(self, constraint: Constraint) -> Any:
        """The compiled matcher of `constraint` (cached; compiled in the grammar pool under
        the compile slots and the time limit). Raises StructuredOutputError / CompileBusy."""
        key = constraint.key
        if key in self._failed:
            raise StructuredOutputError(self._failed[key])
        template: Any = self._cache.get(key)
        if template is not None:
            self._cache.move_to_end(key)
            return template
        await self._vocabulary()
        loop = asyncio.get_running_loop()
        fut = self._inflight.get(key)
        if fut is None:
            who = await SLOTS.enter(CALLER.get(), self.compile_timeout_s)
            # while it waited, another request may have started, ended or failed it
            fut = self._inflight.get(key)
            done = self._cache.get(key)
            if fut is not None or done is not None or key in self._failed:
                SLOTS.leave(who)
                if done is not None:
                    return done
                if fut is None:
                    raise StructuredOutputError(self._failed[key])
        if fut is None:
            try:
                fut = loop.run_in_executor(grammar_pool(), self._build, constraint)
            except BaseException:
                SLOTS.leave(who)
                raise
            self._inflight[key] = fut

            def ended(_f: Any) -> None:  # the thread ended (not the wait): free the slot
                self._inflight.pop(key, None)
                SLOTS.leave(who)
                if not _f.cancelled() and _f.exception() is None:
                    self._keep(key, _f.result())

            fut.add_done_callback(ended)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.compile_timeout_s)
        except TimeoutError as exc:
            msg = (
                f"the {constraint.kind} constraint did not compile within "
                f"{self.compile_timeout_s:g} s; simplify the schema"
            )
            self._remember_failure(key, msg)
            raise StructuredOutputError(msg) from exc
        except StructuredOutputError as exc:
            self._remember_failure(key, str(exc))
            raise

    def _build(self, constraint: Constraint) -> Any:
        self.lltokenizer()  # once (about half a second), in this pool too
        return self.compile(constraint)

    def _keep(self, key: str, template: Any) -> None:
        if key in self._failed:  # it gave up waiting: a later request may use it after all
            self._failed.pop(key, None)
        self._cache[key] = template
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _remember_failure(self, key: str, msg: str) -> None:
        self._failed[key] = msg
        if len(self._failed) > self.cache_size:
            self._failed.popitem(last=False)


def _explain(error: str, constraint: Constraint) -> str:
    if any(m in error for m in UNSUPPORTED_MARKERS):
        return f"the {constraint.kind} constraint uses what the grammar engine does not support: {error}"
    return f"the {constraint.kind} constraint does not compile: {error}"


# ---- decoding -------------------------------------------------------------------------
def mask_logits(logits: torch.Tensor, rows: list[int], matchers: list[Any]) -> list[int]:
    """Set the logits of tokens each matcher forbids to -inf, in place (rows of `logits`
    named by `rows`; the other rows keep every token). One masked_fill over the batch: a
    fill per row, or a gather and scatter of the constrained rows, cost several times more.
    Returns the rows whose matcher allows no token (an engine error).

    llguidance's numpy helpers, not its torch ones: `llguidance.torch` applies
    `@torch.compile` at import, which imports torch._dynamo: 7-15 s holding the GIL on a
    busy host, paid by the first constrained request in the decode thread (the whole
    gateway stood still)."""
    import torch
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    started = time.perf_counter()
    n, vocab = logits.shape
    bitmask = allocate_token_bitmask(n, vocab)  # all ones: every token allowed
    for r, m in zip(rows, matchers, strict=True):
        fill_next_token_bitmask(m, bitmask, r)
    flipped = (~bitmask).view(np.uint8)
    forbidden = np.unpackbits(flipped, axis=1, bitorder="little")[:, :vocab].view(np.bool_)
    logits.masked_fill_(torch.from_numpy(forbidden), float("-inf"))
    empty = (bitmask == 0).all(axis=1).tolist()
    GRAMMAR_SECONDS[0] += time.perf_counter() - started
    return [r for r in rows if empty[r]]


_ONE_ROW = threading.local()  # per thread: vocabulary size -> a one-row bitmask


def forced_token(matcher: Any, vocab: int) -> int | None:
    """The token the matcher's next mask allows alone (the grammar forces it), else None
    (several tokens, none, or the grammar ended)."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    started = time.perf_counter()
    masks = getattr(_ONE_ROW, "masks", None)
    if masks is None:
        masks = _ONE_ROW.masks = {}
    bitmask = masks.get(vocab)
    if bitmask is None:
        bitmask = masks[vocab] = allocate_token_bitmask(1, vocab)
    fill_next_token_bitmask(matcher, bitmask, 0)
    words = np.flatnonzero(bitmask[0])
    token: int | None = None
    if len(words) == 1:
        word = int(bitmask[0, words[0]]) & 0xFFFFFFFF
        if word & (word - 1) == 0:  # one bit set
            candidate = int(words[0]) * 32 + word.bit_length() - 1
            token = candidate if candidate < vocab else None
    GRAMMAR_SECONDS[0] += time.perf_counter() - started
    return token


def advance(matcher: Any, token: int) -> bool:
    """Move a matcher past the sampled token (False: the token broke the grammar)."""
    started = time.perf_counter()
    ok = bool(matcher.consume_token(token))
    GRAMMAR_SECONDS[0] += time.perf_counter() - started
    return ok


# ---- answers --------------------------------------------------------------------------
def split_tool_answer(
    text: str, constraint: Constraint
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """A constrained tools answer -> (content, tool calls): JSON that is a call of an
    offered tool becomes OpenAI tool calls, anything else stays text."""
    from agentrl.serving.openai_types import tool_call

    if not text.startswith(("{", "[")):  # the grammar's text branch: never parsed as a call
        return text, None
    try:
        value = json.loads(text)
    except ValueError:
        return text, None  # cut off by the token limit
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and item.get("name") in constraint.tools):
            return text, None  # the response format's answer, not a call
        calls.append(tool_call(str(item["name"]), item.get("arguments", {})))
    return (None, calls) if calls else (text, None)


def agent_zero_schema(tools: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Agent Zero's response format (`thoughts`, `headline`, `tool_name`, `tool_args`), from
    the shipped schema; with `tools` (name -> arguments schema) `tool_name` is one of them
    and `tool_args` validate against that tool's schema."""
    text = resources.files("agentrl.serving").joinpath("schemas/agent_zero_response.json")
    base: dict[str, Any] = json.loads(text.read_text())
    if not tools:
        return base
    variants = []
    for name, args in tools.items():
        props = dict(base["properties"])
        props["tool_name"] = {"const": name}
        props["tool_args"] = args
        variants.append({**base, "properties": props})
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


class ToolCallStream:
    """OpenAI's streamed tool calls while a constrained tools answer decodes: the grammar
    fixes a call's text to `{"name": "<tool>", "arguments": <json>}`, so the name goes out
    in the call's first delta as soon as it is complete, and the arguments follow token by
    token (the last character is held back: it may be the brace that closes the call).
    Text answers (tool_choice auto) stream as content; lists of calls wait for the end."""

    HEAD, MID = '{"name": "', '", "arguments": '

    def __init__(self) -> None:
        self.mode: str | None = None  # call | text | buffer
        self.sent = 0  # characters of content or arguments sent
        self.args_at = -1

    @staticmethod
    def wanted(request: Any) -> bool:
        """Whether a request's answer is a constrained tools answer that can stream live."""
        return bool(
            request.tools
            and request.tool_choice != "none"
            and request.response_format is None
            and request.parallel_tool_calls is not True
            and not request.stops()
            and not request.choices()
            and not request.logprobs
        )

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas for the answer decoded so far (`text`, all of it)."""
        if self.mode is None and text:
            self.mode = {"{": "call", "[": "buffer"}.get(text[0], "text")
        if self.mode == "text":
            return self._content(text)
        if self.mode != "call":
            return []
        out: list[dict[str, Any]] = []
        if self.args_at < 0:
            end = text.find(self.MID, len(self.HEAD))
            if not text.startswith(self.HEAD) or end < 0:
                return []
            self.args_at = end + len(self.MID)
            name = text[len(self.HEAD) : end]
            out.append(_head_delta(0, f"call_{uuid.uuid4().hex[:24]}", name))
        return out + self._args(text[self.args_at : -1])

    def finish(self, text: str, calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """The deltas still owed once the answer is complete (`calls`: the parsed calls)."""
        if self.mode == "text":
            return self._content(text)
        if self.mode == "call" and self.args_at >= 0:
            args = text[self.args_at :]
            return self._args(args[:-1] if calls and args.endswith("}") else args)
        if calls:
            return tool_call_deltas(calls)
        return self._content(text)

    def _content(self, text: str) -> list[dict[str, Any]]:
        if len(text) <= self.sent:
            return []
        piece, self.sent = text[self.sent :], len(text)
        return [{"content": piece}]

    def _args(self, args: str) -> list[dict[str, Any]]:
        if len(args) <= self.sent:
            return []
        piece, self.sent = args[self.sent :], len(args)
        return [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}]


def _head_delta(index: int, call_id: str | None, name: str | None) -> dict[str, Any]:
    fn = {"name": name, "arguments": ""}
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": fn}]}


def tool_call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Complete tool calls as OpenAI streams them: per call, a delta with its index, id,
    type and name (arguments ""), then deltas of argument text the client concatenates."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(calls):
        fn = c.get("function") or {}
        out.append(_head_delta(i, c.get("id"), fn.get("name")))
        args = str(fn.get("arguments") or "")
        for start in range(0, len(args), 16):
            piece = {"arguments": args[start : start + 16]}
            out.append({"tool_calls": [{"index": i, "function": piece}]})
    return out
