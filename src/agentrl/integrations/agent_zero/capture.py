"""The serving model version, completion id and token usage of each chat-model call.

Agent Zero's chat model returns text only (models.py `unified_call` -> (response,
reasoning)), but it passes extra keyword arguments on to LiteLLM, and LiteLLM hands every
finished call (the assembled response: `id`, `model`, `usage`, and the provider's response
headers in `_hidden_params["additional_headers"]`, prefixed `llm_provider-`) to its callbacks.
So the plugin tags the main chat call at `chat_model_call_before` (LiteLLM `metadata`), a
LiteLLM callback files what the gateway answered under that tag, and `chat_model_call_after`
takes it back, waiting at most a fraction of a second.

But Agent Zero closes the stream at the first complete JSON tool request (`aclose()`, the
normal turn), and then LiteLLM reports nothing. So towards agentrl's gateway the call also
goes through an OpenAI client of the plugin's (LiteLLM's `client` argument) whose HTTP
response hook reads the gateway's headers as the stream starts: `x-agentrl-model-version`
(the version that serves) and `x-agentrl-completion-id` (the key of its completion log,
`agent.rl.completion.v1`), filed under the call's `x-agentrl-call-id` header. Every turn
then carries both, whatever Agent Zero does with the stream; token usage comes when LiteLLM
reports the finished call (or from the completion log, by completion id). Without LiteLLM
(or for a model object that takes no extra arguments) nothing is tagged and the trajectory
records the configured public model name.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

CALL_KEY = "agentrl_call_id"
SESSION_HEADER = "x-agentrl-session"  # agentrl's gateway keeps a session on one version
CALL_HEADER = "x-agentrl-call-id"  # our tag on the request, read back by the response hook
VERSION_HEADER = "x-agentrl-model-version"
COMPLETION_HEADER = "x-agentrl-completion-id"
CAPTURE_HEADER = "x-agentrl-capture"  # "off": the gateway assembles no episode of its own
# who asks: the gateway sends an agent / Agent Zero profile to its lineage (a public model
# name of its own, `agentrl.release.lineage`); unmapped ones stay on the asked model
AGENT_HEADER = "x-agentrl-agent"
PROFILE_HEADER = "x-agentrl-profile"
VERSION_HEADERS = ("llm_provider-x-agentrl-model-version", VERSION_HEADER)
USAGE_GRACE_S = 0.05  # after the headers were filed: how long to wait for LiteLLM's usage
KEEP = 1000  # answers nobody took (a call Agent Zero abandoned) are dropped after this many

_results: OrderedDict[str, dict[str, Any]] = OrderedDict()
_lock = threading.Lock()
_callback: Any = None


def _usage(obj: Any) -> dict[str, Any] | None:
    usage = getattr(obj, "usage", None)
    if usage is None:
        return None
    for method in ("model_dump", "dict"):
        fn = getattr(usage, method, None)
        if callable(fn):
            try:
                out = fn()
                break
            except Exception:
                continue
    else:
        out = usage if isinstance(usage, dict) else dict(vars(usage))
    keep = ("prompt_tokens", "completion_tokens", "total_tokens")
    found = {k: out[k] for k in keep if isinstance(out.get(k), int)}
    # a stream without include_usage reports zeros: that is "unknown", not "no tokens"
    return found if any(found.values()) else None


def record(kwargs: dict[str, Any], response_obj: Any) -> None:
    """File one finished LiteLLM call (what a LiteLLM success callback receives)."""
    params = kwargs.get("litellm_params") or {}
    meta = params.get("metadata") or kwargs.get("metadata") or {}
    call_id = meta.get(CALL_KEY) if isinstance(meta, dict) else None
    if not call_id:
        return
    hidden = getattr(response_obj, "_hidden_params", None) or {}
    headers = hidden.get("additional_headers") or {} if isinstance(hidden, dict) else {}
    version = next((str(headers[h]) for h in VERSION_HEADERS if headers.get(h)), None)
    _file(
        str(call_id),
        {
            "completion_id": getattr(response_obj, "id", None),
            "model": version or getattr(response_obj, "model", None),
            "usage": _usage(response_obj),
        },
    )


def _file(call_id: str, answer: dict[str, Any]) -> None:
    """Merge what is known of one call (stream-start headers, then LiteLLM's report)."""
    with _lock:
        known = _results.setdefault(call_id, {})
        known.update({k: v for k, v in answer.items() if v is not None})
        while len(_results) > KEEP:
            _results.popitem(last=False)


def record_headers(call_id: str, headers: Any) -> None:
    """File the gateway's version and completion id from a response's headers."""
    version, completion = headers.get(VERSION_HEADER), headers.get(COMPLETION_HEADER)
    if version or completion:
        _file(call_id, {"model": version, "completion_id": completion, "from_headers": True})


def take(call_id: str) -> dict[str, Any] | None:
    with _lock:
        return _results.pop(call_id, None)


def _peek(call_id: str) -> dict[str, Any] | None:
    with _lock:
        got = _results.get(call_id)
        return dict(got) if got is not None else None


async def wait_for(call_id: str, timeout: float) -> dict[str, Any] | None:
    """The filed answer of `call_id`. LiteLLM may log a streamed call a moment later; when
    the stream-start headers are filed already, only a short grace is given for its usage
    (a stream Agent Zero closed early never gets one)."""
    start = time.monotonic()
    while True:
        got = _peek(call_id)
        now = time.monotonic()
        if got is not None and (
            got.get("usage") or not got.get("from_headers") or now - start >= USAGE_GRACE_S
        ):
            break
        if now - start >= timeout:
            break
        await asyncio.sleep(0.01)
    got = take(call_id)
    if got is not None:
        got.pop("from_headers", None)
    return got


_clients: dict[tuple[str, str, int], Any] = {}


async def _on_response(response: Any) -> None:
    """httpx response hook: the headers arrive before the first chunk of a stream."""
    call_id = response.request.headers.get(CALL_HEADER)
    if call_id:
        record_headers(call_id, response.headers)


def gateway_client(api_base: str, api_key: str | None) -> Any:
    """An OpenAI client for agentrl's gateway whose response hook files the stream-start
    headers (one per base, key and event loop); None without the openai SDK."""
    try:  # the SDK's own httpx flavour (openai 1.x: httpx; later: httpx2)
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient
    except ImportError:
        return None
    key = (api_base, api_key or "", id(asyncio.get_running_loop()))
    client = _clients.get(key)
    if client is None:
        http = DefaultAsyncHttpxClient(event_hooks={"response": [_on_response]}, timeout=600.0)
        client = AsyncOpenAI(
            base_url=api_base, api_key=api_key or "agentrl", http_client=http, max_retries=0
        )
        _clients[key] = client
    return client


def ensure_litellm_callback() -> bool:
    """Register the capturing callback with LiteLLM once; False when LiteLLM is not loaded
    (Agent Zero's models.py imports it; the plugin never pays for that import itself)."""
    global _callback
    if _callback is not None:
        return True
    if "litellm" not in sys.modules:
        return False
    try:
        import litellm
        from litellm.integrations.custom_logger import CustomLogger
    except ImportError:
        return False

    class AgentRLCapture(CustomLogger):  # type: ignore[misc]
        # LiteLLM calls these with keyword arguments: the names are part of its interface
        def log_success_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            record(kwargs, response_obj)

        async def async_log_success_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            record(kwargs, response_obj)

    _callback = AgentRLCapture()
    litellm.callbacks = [*(getattr(litellm, "callbacks", None) or []), _callback]
    return True


def api_base_of(model: Any) -> str | None:
    """Agent Zero's chat model's LiteLLM `api_base`."""
    kwargs = getattr(model, "kwargs", None)
    api_base = None
    if isinstance(kwargs, dict):
        api_base = kwargs.get("api_base") or kwargs.get("base_url")
    api_base = api_base or getattr(model, "api_base", None)
    return str(api_base) if api_base else None


def points_at(model: Any, base_url: str) -> bool:
    """Whether Agent Zero's chat model calls `base_url` (its LiteLLM `api_base`)."""
    api_base = api_base_of(model)
    return bool(api_base) and str(api_base).rstrip("/") == base_url.rstrip("/")


def model_name_of(model: Any) -> str | None:
    """The model Agent Zero's chat model calls, as the endpoint knows it: LiteLLM's
    `<provider>/<name>` (LiteLLMChatWrapper.model_name) without the provider."""
    name = getattr(model, "model_name", None)
    if not isinstance(name, str) or not name:
        return None
    provider = getattr(model, "provider", None)
    if isinstance(provider, str) and provider and name.startswith(provider + "/"):
        name = name[len(provider) + 1 :]
    return name or None


def api_key_of(model: Any) -> str | None:
    kwargs = getattr(model, "kwargs", None)
    key = kwargs.get("api_key") if isinstance(kwargs, dict) else None
    return str(key) if key else None


def takes_extra_kwargs(model: Any) -> bool:
    fn = getattr(model, "unified_call", None)
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class TaggedModel:
    """Agent Zero's chat model for one call: `unified_call` passes LiteLLM `metadata` (the
    capture tag) and, towards agentrl's gateway, `extra_headers` (its sticky-session key, so
    one chat stays on one model version), `stream_options.include_usage` on and, with the
    structured-outputs setting, `response_format`; everything else is the wrapped model's."""

    def __init__(
        self,
        inner: Any,
        call_id: str | None,
        headers: dict[str, str] | None = None,
        usage: bool = False,
        client: Any = None,
        response_format: dict[str, Any] | None = None,
    ) -> None:
        self._inner = inner
        self._call_id = call_id
        self._headers = dict(headers or {})
        self._usage = usage  # ask a stream for its token usage (agentrl's gateway sends it)
        self._client = client  # reads the gateway's headers at stream start
        self._response_format = response_format  # structured outputs (the plugin's setting)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def unified_call(self, *args: Any, **kwargs: Any) -> Any:
        if self._call_id is not None:
            meta = dict(kwargs.pop("metadata", None) or {})
            meta[CALL_KEY] = self._call_id
            kwargs["metadata"] = meta
        if self._headers:
            kwargs["extra_headers"] = {**self._headers, **(kwargs.get("extra_headers") or {})}
        if self._usage and "stream_options" not in kwargs:
            kwargs["stream_options"] = {"include_usage": True}
        if self._client is not None and "client" not in kwargs:
            kwargs["client"] = self._client
        if self._response_format is not None and "response_format" not in kwargs:
            kwargs["response_format"] = self._response_format
        return await self._inner.unified_call(*args, **kwargs)
