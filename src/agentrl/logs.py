"""Logging setup: stdlib logging, JSON lines for Loki, ids in every record, an audit log.

- `AGENTRL_LOG_JSON=1`: one JSON object per line (python-json-logger), with `ts`, `level`,
  `logger`, `msg` and every id the record carries (`trajectory_id`, `job_id`, `model_id`,
  `deployment_id`, ...), whether passed through `extra=` or set for a block of code with
  `log_context(job_id=...)` (a contextvar, so concurrent asyncio tasks keep their own ids).
- The audit log (`audit(action, ...)`, the seed's "model deployment audit trail" and "audit
  logging for data access") goes to the `agentrl.audit` logger and, once `setup_logging` or
  `enable_audit_file` ran, to an append-only JSON-lines file (`<data_dir>/audit/audit.jsonl`),
  whatever the console format.
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

ID_KEYS = (
    "trajectory_id",
    "job_id",
    "model_id",
    "model_version",
    "deployment_id",
    "reward_id",
    "event_id",
    "session_id",
    "subject",
    "service",
)
_ID_KEYS = ID_KEYS  # the former name

AUDIT_LOGGER = "agentrl.audit"
logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)  # audit records pass a WARNING root

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "agentrl_log_context", default=None
)


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Attach `ids` (job_id=..., model_id=...) to every record logged inside the block."""
    current = _context.get() or {}
    token = _context.set({**current, **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**ids: Any) -> None:
    """Attach `ids` to every later record of the current context (a job process's life)."""
    current = _context.get() or {}
    _context.set({**current, **{k: v for k, v in ids.items() if v is not None}})


def configure_handler(handler: logging.Handler) -> logging.Handler:
    """The JSON formatter when `AGENTRL_LOG_JSON=1`, and the context ids, on `handler`
    (for processes that set up their own handlers, like training jobs)."""
    from agentrl.settings import get_settings

    if get_settings().log_json:
        handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    return handler


class ContextFilter(logging.Filter):
    """Copies the ids of the enclosing `log_context` onto each record (extra= wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(_BaseJsonFormatter):
    """One JSON object per record: ts, level, logger, msg, the ids, audit fields, exc."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "message": "msg"},
            timestamp="ts",
            json_ensure_ascii=False,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        for key, value in (_context.get() or {}).items():
            log_data.setdefault(key, value)


def setup_logging(level: int | None = None) -> None:
    from agentrl.settings import get_settings

    settings = get_settings()
    handler = logging.StreamHandler()
    if settings.log_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if level is not None else settings.log_level.upper())
    with contextlib.suppress(OSError):
        enable_audit_file(Path(settings.data_dir) / "audit" / "audit.jsonl")


_audit_files: dict[Path, logging.Handler] = {}


def enable_audit_file(path: Path) -> Path:
    """Append audit records to `path` as JSON lines (idempotent per path)."""
    path = Path(path).resolve()
    if path in _audit_files:
        return path
    handler = _LazyFileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _audit_files[path] = handler
    return path


class _LazyFileHandler(logging.FileHandler):
    """Creates the folder and the file at the first record, not when logging is set up."""

    def _open(self):  # type: ignore[no-untyped-def]
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def disable_audit_file(path: Path) -> None:
    handler = _audit_files.pop(Path(path).resolve(), None)
    if handler is not None:
        logging.getLogger(AUDIT_LOGGER).removeHandler(handler)
        handler.close()


def audit(action: str, outcome: str = "ok", actor: str | None = None, **fields: Any) -> None:
    """Record an auditable action: `deployment.promote`, `deployment.rollback`,
    `data.export`, `data.read`, ... with the ids it concerns (model_id, deployment_id, job_id,
    rows, destination). Never raises: an audit failure is logged, not propagated."""
    try:
        extra = {
            "audit": True,
            "action": action,
            "outcome": outcome,
            "actor": actor or os.environ.get("AGENTRL_ACTOR") or _user(),
            "audit_ts": time.time(),
            **fields,
        }
        logging.getLogger(AUDIT_LOGGER).info("audit %s %s", action, outcome, extra=extra)
    except Exception:  # an audit record must never break the action it records
        logging.getLogger(__name__).exception("could not write the audit record for %s", action)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return f"uid:{os.getuid()}"
