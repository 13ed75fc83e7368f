"""Logging setup: stdlib logging, JSON lines for Loki, ids in every record, an audit log.

- `AGENTRL_LOG_JSON=1`: one JSON object per line (python-json-logger), with `ts`, `level`,
  `logger`, `msg` and every id the record carries (`trajectory_id`, `job_id`, `model_id`,
  `deployment_id`, ...), whether passed through `extra=` or set for a block of code with
  `log_context(job_id=...)` (a contextvar, so concurrent asyncio tasks keep their own ids).
- The audit log (`audit(action, ...)`, the seed's "model deployment audit trail" and "audit
  logging for data access") goes to the `agentrl.audit` logger and, once `setup_logging` or
  `enable_audit_file` ran, to an append-only JSON-lines file (`<data_dir>/audit/audit.jsonl`),
  whatever the console format.
- `log_to_file(path)` (`agentrl loop`, `learn`, `soak`): the console tells the job's own story;
  every record, Python warnings and library progress bars go to `path` instead (`-v` keeps
  everything on the console as well).
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import logging
import os
import sys
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
    from agentrl.core.settings import get_settings

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


_verbose = False  # `agentrl -v`: every record on the console, whatever `log_to_file` does


def setup_logging(level: int | None = None, *, verbose: bool = False) -> None:
    from agentrl.core.settings import get_settings

    global _verbose
    _verbose = verbose
    settings = get_settings()
    handler: logging.Handler = _Stderr()  # not the stderr of set-up time (a test runner closes it)
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


def log_to_file(path: Path, *, verbose: bool | None = None) -> Path:
    """A long command's console (loop, learn, soak): its own lines (printed by it), and of
    the records only agentrl's own warnings and errors, one line each. Every record
    (agentrl's INFO, the audit records, the libraries'), Python warnings and the libraries'
    progress bars go to `path` (truncated: one run's log), whose resolved path is returned
    for the job to print once.

    `verbose` (default: `agentrl -v`) keeps the console as it was (every record) and writes
    the file as well. Child processes inherit `HF_HUB_DISABLE_PROGRESS_BARS` and
    `TQDM_DISABLE`; their own output goes to their own log files."""
    from agentrl.core.settings import get_settings

    verbose = _verbose if verbose is None else verbose
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")  # one run's log; appended to below: a handler in mode "w" that
    # `logging.config.dictConfig` closed (uvicorn calls it at each start) never reopens
    to_file = logging.FileHandler(path, mode="a", encoding="utf-8")
    if get_settings().log_json:
        to_file.setFormatter(JsonFormatter())
    else:
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_file.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_agentrl_log_file", False)]:
        root.removeHandler(old)  # a second call moves the file, it does not add one
        old.close()
    to_file._agentrl_log_file = True  # type: ignore[attr-defined]
    if verbose:
        root.addHandler(to_file)
    else:
        console = _Stderr()  # stderr, as the records went before
        console.setLevel(logging.WARNING)
        console.addFilter(_own_records)
        console.setFormatter(OneLineFormatter(path))
        root.handlers[:] = [to_file, console]
    logging.captureWarnings(True)  # FutureWarnings and the like: records of `py.warnings`
    if not verbose:
        quiet_progress_bars()
    _libraries_propagate()
    return path


class _Stderr(logging.StreamHandler):
    """The `sys.stderr` of the moment (a test runner swaps it), as `logging.lastResort`."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def _own_records(record: logging.LogRecord) -> bool:
    """agentrl's own records, less the audit trail (it has its own file)."""
    name = record.name
    return (name == "agentrl" or name.startswith("agentrl.")) and not (
        name == AUDIT_LOGGER or name.startswith(AUDIT_LOGGER + ".")
    )


class OneLineFormatter(logging.Formatter):
    """`WARNING agentrl.x: message`, on one line: a traceback is named, and left to the file."""

    def __init__(self, log_file: Path) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().splitlines() or [""]
        text = f"{record.levelname} {record.name}: {lines[0]}" + (" ..." if len(lines) > 1 else "")
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            first = (str(exc).splitlines() or [""])[0]
            what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            text += f" ({what}; traceback in {self.log_file})"
        return text


def quiet_progress_bars() -> None:
    """No tqdm bar of transformers, huggingface_hub (weight loading, downloads) or anything
    else on the console, in this process and the processes it starts."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TQDM_DISABLE"] = "1"  # tqdm reads TQDM_* as its defaults (tqdm >= 4.66)
    # a library imported later reads the variable at its import (transformers through
    # huggingface_hub); importing them here cost `agentrl soak` ~1.7 CPU-s it never needed
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers.utils.logging" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def _libraries_propagate() -> None:
    """transformers writes to stderr through a handler of its own and does not propagate:
    send its records (deprecations, load reports) to the root's handlers instead (now, or
    once it is imported: not imported for this)."""

    def propagate(transformers_logging: Any) -> None:
        transformers_logging.disable_default_handler()
        transformers_logging.enable_propagation()

    after_import("transformers.utils.logging", propagate)


def after_import(name: str, then: Any) -> None:
    """`then(module)` once module `name` is imported: now if it is, else right after its
    import (one finder on `sys.meta_path`, gone at its first use)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport:
    """Finds nothing itself: for its one module, it wraps the spec the other finders give
    so `then` runs on the module once it has executed."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader, then = spec.loader, self.then
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:  # a loader of the old protocol: left as it is
            return spec

        def exec_then(module: Any) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then
        return spec


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
