"""Serving backends behind one small protocol (as vLLM's server puts its engine behind one):
`LocalBackend` (the embedded Hugging Face base + LoRA adapters) and `UpstreamBackend` (any
OpenAI-compatible server: vLLM with runtime LoRA loading, llama.cpp's server, ...).

A backend failure is a `BackendError` with the status the gateway answers: 502 when the
backend failed, 504 when it did not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

from agentrl.serving.errors import BackendError, ChecksumError, DeployError, VersionNotServed
from agentrl.serving.httppool import HTTPError, JsonPool
from agentrl.serving.openai_types import ChatRequest, Generation
from agentrl.serving.registry import ModelRecord

log = logging.getLogger(__name__)


class Backend(Protocol):
    """Serves the versions prepared on it."""

    async def prepare(self, record: ModelRecord) -> None: ...

    async def release(self, model_id: str) -> None: ...

    async def generate(self, model_id: str, request: ChatRequest) -> Generation: ...

    def stream(self, model_id: str, request: ChatRequest) -> AsyncIterator[tuple[str, Any]]: ...

    async def close(self) -> None: ...


# ---- checkpoints ----------------------------------------------------------------------
def manifest_sha256(folder: Path) -> str:
    """The version's fingerprint: sha256 of its manifest.json (which lists every file's)."""
    return hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()


def fetch_checkpoint(path: str, cache_dir: Path) -> Path:
    """A local folder for `path` (local paths as they are; s3://... copied into the cache)."""
    if "://" not in path or path.startswith("file://"):
        return Path(path.removeprefix("file://"))
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    target = cache_dir / hashlib.sha256(path.encode()).hexdigest()[:16]
    if not (target / "manifest.json").exists():
        tmp = target.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        fs.get(root.rstrip("/") + "/", str(tmp), recursive=True)
        tmp.rename(target)
    return target


def verify_checkpoint(record: ModelRecord, cache_dir: Path) -> Path:
    """The checkpoint's local folder, after checking every file against its manifest and
    the manifest against the sha256 in the registry. Raises ChecksumError otherwise."""
    from agentrl.llm.checkpoint import verify_local

    if record.checkpoint_path is None:
        raise DeployError(f"{record.model_id} has no checkpoint")
    folder = fetch_checkpoint(record.checkpoint_path, cache_dir)
    if not (folder / "manifest.json").exists():
        raise ChecksumError(
            f"{record.checkpoint_path} has no manifest.json: not a complete checkpoint"
        )
    actual = manifest_sha256(folder)
    if record.sha256 and actual != record.sha256:
        raise ChecksumError(
            f"{record.model_id}: manifest sha256 {actual[:12]}… differs from the registry's "
            f"{record.sha256[:12]}…; the checkpoint changed after registration"
        )
    if not verify_local(folder):
        raise ChecksumError(
            f"{record.model_id}: a file of {record.checkpoint_path} fails its sha256"
        )
    return folder


# ---- local ----------------------------------------------------------------------------
class LocalBackend:
    """Versions as LoRA adapters over one in-memory base (see `agentrl.serving.local`).

    Once a version was prepared here, only what was prepared is served: an adapter the
    engine holds, or a version that is the base itself (no checkpoint). Any other id (an
    adapter unloaded meanwhile, a version released, one never prepared) is a
    `VersionNotServed` (404), never the base's answer under that version's name. A backend
    never asked to prepare anything (built over the base by a bench or a test) serves the
    base under the names it is given, as before."""

    def __init__(self, engine: Any, cache_dir: Path) -> None:
        self.engine = engine
        self.cache_dir = cache_dir
        self.bases: set[str] = set()  # prepared versions that are the base model itself
        self.managed = False  # a version was prepared (or released) here

    async def prepare(self, record: ModelRecord) -> None:
        self.managed = True
        if record.checkpoint_path is None:
            self.bases.add(record.model_id)  # the base model itself
            return
        folder = await asyncio.to_thread(verify_checkpoint, record, self.cache_dir)
        await self.engine.run(self.engine.load_adapter, record.model_id, folder)

    async def release(self, model_id: str) -> None:
        self.managed = True
        self.bases.discard(model_id)
        await self.engine.run(self.engine.unload_adapter, model_id)

    async def generate(self, model_id: str, request: ChatRequest) -> Generation:
        return await self.engine.generate(self._version(model_id), request)  # type: ignore[no-any-return]

    async def stream(self, model_id: str, request: ChatRequest) -> AsyncIterator[tuple[str, Any]]:
        # closed with this generator (a client gone): the engine cancels the row's decode now
        async with contextlib.aclosing(
            self.engine.stream(self._version(model_id), request)
        ) as items:
            async for item in items:
                yield item

    def _version(self, model_id: str) -> str | None:
        """The engine's adapter id of `model_id` (None: the base). The engine checks again
        as it queues the row (an unload between here and there is a 404 there too)."""
        if model_id in self.engine.adapters:
            return model_id
        if model_id in self.bases or not self.managed:
            return None
        raise VersionNotServed(
            f"model version {model_id!r} is not loaded on this gateway (unloaded, retired or "
            "never prepared here)"
        )

    async def close(self) -> None:
        return None


# ---- upstream -------------------------------------------------------------------------
class UpstreamBackend:
    """An OpenAI-compatible server. Version -> the server's model name (record.serving
    ["upstream_model"], else the model_id when adapters are loaded at run time, else the
    server's own model name). With `load_lora`, `prepare` calls vLLM's
    `/v1/load_lora_adapter` so a new version is an adapter in the running server."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        load_lora: bool = False,
        default_model: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # TCP_NODELAY: httpx writes headers and body separately; with Nagle + delayed ACK
        # every call waited for the peer's ACK timer (measured: 7 ms -> 0.8 ms per call).
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
        )
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
        )
        self.pool = (
            JsonPool(self.base_url, headers) if self.base_url.startswith("http://") else None
        )
        # `generate` answers or raises within this many seconds (over the pool: one deadline
        # for the whole call; httpx's timeouts are per phase): a gateway whose own timeout is
        # no shorter sets no second timer per request (timers were ~10 % of its CPU, py-spy)
        self.deadline_s = timeout_s if self.pool is not None else None
        self.timeout_s = timeout_s
        self._errors = UpstreamErrors(self.base_url, timeout_s)
        self.load_lora = load_lora
        self.default_model = default_model
        self.names: dict[str, str] = {}
        # versions released here (and not prepared again): asked for one (a request that
        # resolved it before it left), `_body` says 404 instead of sending the server's
        # default model (the base) under that version's name
        self.released: set[str] = set()

    async def prepare(self, record: ModelRecord) -> None:
        name = record.serving.get("upstream_model")
        if name is None and self.load_lora and record.checkpoint_path:
            resp = await self.client.post(
                "/load_lora_adapter",
                json={"lora_name": record.model_id, "lora_path": record.checkpoint_path},
            )
            if resp.status_code >= 400 and "already" not in resp.text:
                raise DeployError(f"upstream refused adapter {record.model_id}: {resp.text[:300]}")
            name = record.model_id
        self.names[record.model_id] = name or self.default_model or record.model_id
        self.released.discard(record.model_id)

    async def release(self, model_id: str) -> None:
        if self.load_lora and model_id in self.names:
            try:
                await self.client.post("/unload_lora_adapter", json={"lora_name": model_id})
            except httpx.HTTPError:
                log.warning("could not unload adapter %s upstream", model_id)
        if self.names.pop(model_id, None) is not None:
            self.released.add(model_id)

    def _body(self, model_id: str, request: ChatRequest) -> dict[str, Any]:
        name = self.names.get(model_id)
        if name is None and model_id in self.released:
            raise VersionNotServed(
                f"model version {model_id!r} is no longer served by {self.base_url} (released)"
            )
        body = _wire(request)
        body["model"] = name or self.default_model or model_id
        if request.logprobs:
            body.setdefault("return_tokens_as_token_ids", True)  # vLLM: ids in the log
        return body

    async def generate(self, model_id: str, request: ChatRequest) -> Generation:
        if self.pool is not None:
            return await self._generate_fast(model_id, request)
        with self._errors:
            resp = await self.client.post("/chat/completions", json=self._body(model_id, request))
        if resp.status_code >= 500:
            raise BackendError(f"upstream answered {resp.status_code}: {resp.text[:300]}", 502)
        if resp.status_code >= 400:
            raise BackendError(f"upstream refused the request: {resp.text[:500]}", resp.status_code)
        try:
            data = resp.json()
            return from_openai(data)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"upstream answer is not a chat completion: {exc!r}", 502) from exc

    async def _generate_fast(self, model_id: str, request: ChatRequest) -> Generation:
        assert self.pool is not None
        body = orjson.dumps(self._body(model_id, request))
        with self._errors:
            async with asyncio.timeout(self.timeout_s):  # (no extra task, unlike wait_for)
                status, data = await self.pool.post("/chat/completions", body)
        if status >= 500:
            raise BackendError(
                f"upstream answered {status}: {data[:300].decode(errors='replace')}", 502
            )
        if status >= 400:
            raise BackendError(
                f"upstream refused the request: {data[:500].decode(errors='replace')}", status
            )
        try:
            return from_openai(orjson.loads(data))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"upstream answer is not a chat completion: {exc!r}", 502) from exc

    async def stream(self, model_id: str, request: ChatRequest) -> AsyncIterator[tuple[str, Any]]:
        """("chunks", [chunk, ...]) per read from the upstream (the events that arrived
        together, passed on together), then ("done", the accumulated Generation)."""
        body = self._body(model_id, request)
        body["stream"] = True
        if self.pool is None:
            async for item in self._stream_httpx(body):
                yield item
            return
        gen = Generation(content="")
        with self._errors:
            async with self.pool.stream(
                "/chat/completions", orjson.dumps(body), self.timeout_s
            ) as resp:
                if resp.status >= 400:
                    text = (await resp.read()).decode(errors="replace")
                    status = 502 if resp.status >= 500 else resp.status
                    raise BackendError(f"upstream answered {resp.status}: {text[:300]}", status)
                async for batch in resp.batches():
                    chunks: list[dict[str, Any]] = []
                    try:
                        for payload in batch:
                            if payload != b"[DONE]":
                                chunks.append(_chunk(payload))
                                _accumulate(gen, chunks[-1])
                    finally:  # a bad chunk: the good ones before it still go out
                        if chunks:
                            yield "chunks", chunks
        yield "done", gen

    async def _stream_httpx(self, body: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """The stream over httpx (https upstreams)."""
        gen = Generation(content="")
        with self._errors:
            async with self.client.stream("POST", "/chat/completions", json=body) as resp:
                if resp.status_code >= 400:
                    text = (await resp.aread()).decode(errors="replace")
                    status = 502 if resp.status_code >= 500 else resp.status_code
                    raise BackendError(
                        f"upstream answered {resp.status_code}: {text[:300]}", status
                    )
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        # read on to the end of the body: one left unread makes httpx close
                        # the connection, and every stream paid a new TCP connect
                        continue
                    chunk = _chunk(payload.encode())
                    _accumulate(gen, chunk)
                    yield "chunks", [chunk]
        yield "done", gen

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        await self.client.aclose()


def _wire(request: ChatRequest) -> dict[str, Any]:
    """The request as `model_dump(exclude_none=True, exclude={"episode_id"})` gives it (its
    fields, then the extra ones, None left out at the top level; tests/serving/
    test_gateway_hotpath.py holds them equal), from the validated values directly: dumping was
    ~4 % of the gateway's CPU per request (py-spy). Nested values are shared, not copied:
    the body is only serialised."""
    body = {k: v for k, v in request.__dict__.items() if v is not None}
    extra = request.__pydantic_extra__
    if extra:
        body.update((k, v) for k, v in extra.items() if v is not None)
    body.pop("episode_id", None)
    return body


class UpstreamErrors:
    """A failure of a call to an upstream as the `BackendError` the gateway answers: no answer
    in time (our own deadline, the pool's or httpx's) 504, a connection or protocol failure
    502; a `BackendError` raised inside (the upstream's own status) passes as it is. One
    mapping for every call (plain, streamed, over the pool or httpx). A class, not a
    generator-based context manager: it wraps every request, and one instance per backend,
    reentrant, costs no allocation per use (contextlib's was ~2.5 % of the gateway's CPU)."""

    __slots__ = ("base_url", "timeout_s")

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url, self.timeout_s = base_url, timeout_s

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            raise BackendError(
                f"upstream {self.base_url} timed out after {self.timeout_s}s: {exc!r}", 504
            ) from exc
        if isinstance(exc, HTTPError | httpx.HTTPError):
            raise BackendError(f"upstream {self.base_url} failed: {exc!r}", 502) from exc


def _chunk(payload: bytes) -> dict[str, Any]:
    """One streamed chunk of the upstream's (a JSON object), else a 502."""
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise BackendError(
            f"upstream sent a chunk that is not JSON: {payload[:200]!r}", 502
        ) from exc
    if not isinstance(chunk, dict):
        raise BackendError(f"upstream sent a chunk that is not an object: {payload[:200]!r}", 502)
    return chunk


def _token_id(token: str) -> int | None:
    if token.startswith("token_id:"):
        try:
            return int(token.split(":", 1)[1])
        except ValueError:
            return None
    return None


def from_openai(data: dict[str, Any]) -> Generation:
    choice = data["choices"][0]
    message = choice.get("message") or {}
    lp = ((choice.get("logprobs") or {}).get("content")) or []
    tokens = [e.get("token", "") for e in lp]
    ids = [t for t in (_token_id(x) for x in tokens) if t is not None]
    usage = data.get("usage") or {}
    return Generation(
        content=message.get("content"),
        finish_reason=choice.get("finish_reason") or "stop",
        tool_calls=message.get("tool_calls"),
        prompt_token_ids=list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []),
        completion_token_ids=list(choice.get("token_ids") or ids),
        token_logprobs=[float(e.get("logprob", 0.0)) for e in lp],
        tokens=tokens,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or len(tokens)),
        raw=data,
    )


def _accumulate(gen: Generation, chunk: dict[str, Any]) -> None:
    if chunk.get("prompt_token_ids"):  # vLLM's return_token_ids: in the first chunk
        gen.prompt_token_ids = [int(t) for t in chunk["prompt_token_ids"]]
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            gen.content = (gen.content or "") + delta["content"]
        ids = choice.get("token_ids")  # vLLM's return_token_ids: the sampled ids
        if ids:
            gen.completion_token_ids.extend(int(t) for t in ids)
        for e in ((choice.get("logprobs") or {}).get("content")) or []:
            gen.tokens.append(e.get("token", ""))
            gen.token_logprobs.append(float(e.get("logprob", 0.0)))
            tid = _token_id(e.get("token", ""))
            if tid is not None and not ids:
                gen.completion_token_ids.append(tid)
        if choice.get("finish_reason"):
            gen.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        gen.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        gen.completion_tokens = int(usage.get("completion_tokens") or 0)
