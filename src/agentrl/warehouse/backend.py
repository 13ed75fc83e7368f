"""Two backends behind one small interface: embedded chdb and a ClickHouse server.

Both run the same SQL text and take/return pyarrow tables. Errors are sorted into two
kinds the ingester acts on differently: `WarehouseDown` (retry later, nothing acked) and
`WarehouseDataError` (this data can never go in: find the bad rows, dead-letter them).

chdb runs ClickHouse inside this process. One process may open one data path (the engine
locks `<path>/status`; a second process gets "Another server instance in same directory is
already running"), and one process may hold one path at a time. So the ingester's process
owns the embedded warehouse, and other processes query it through the control API.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from agentrl.core.errors import AgentRLError

log = logging.getLogger(__name__)


class WarehouseError(AgentRLError):
    """Base of the warehouse's errors."""


class WarehouseDown(WarehouseError):
    """The warehouse cannot be reached or cannot write now; try again later."""


class WarehouseDataError(WarehouseError):
    """The engine refused the data itself (type, range, parse): retrying cannot help."""


class WarehouseLocked(WarehouseDown):
    """The embedded chdb data path is owned by another process."""


class SchemaTooNew(WarehouseError):
    """The stored schema version is newer than this code knows."""


# ClickHouse error codes that mean "the data is bad", not "the server is unwell".
DATA_ERROR_CODES = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        32,  # ATTEMPT_TO_READ_AFTER_EOF
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        252,  # TOO_MANY_PARTS
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        407,  # DECIMAL_OVERFLOW
        1001,  # STD_EXCEPTION (e.g. arrow conversion)
    }
)


def error_code(message: str) -> int | None:
    """The `Code: N.` of a ClickHouse error message, if it has one."""
    marker = "Code: "
    at = message.find(marker)
    if at < 0:
        return None
    digits = ""
    for ch in message[at + len(marker) :]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


class Backend(Protocol):
    """What the warehouse needs from ClickHouse; both backends implement it."""

    name: str

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None: ...

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table: ...

    def insert(self, table: str, data: pa.Table) -> None: ...

    def close(self) -> None: ...


class ChdbBackend:
    """Embedded ClickHouse (chdb) with its data under `path`; thread-safe, one per process."""

    name = "chdb"

    def __init__(self, path: Path) -> None:
        from chdb import session

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._session = session.Session(str(self.path))
        except Exception as exc:  # chdb raises RuntimeError for both cases
            text = str(exc)
            if "already initialized with path" in text:
                raise WarehouseError(
                    f"this process already opened another chdb path; chdb allows one data path "
                    f"per process ({text})"
                ) from exc
            raise WarehouseLocked(
                f"cannot open the embedded warehouse at {self.path}: another process (the "
                "ingester of `agentrl up`?) owns it. Query it through the control API "
                "(`agentrl stats --api URL`, GET /stats/...) or stop that process. "
                f"({text.strip()})"
            ) from exc
        self._lock = threading.Lock()

    def _run(self, sql: str, fmt: str, params: dict[str, Any] | None) -> Any:
        with self._lock:
            try:
                if params:
                    return self._session.query(sql, fmt, params=_chdb_params(params))
                return self._session.query(sql, fmt)
            except Exception as exc:
                raise _classify(exc) from exc

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._run(sql, "CSV", params)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        result = self._run(sql, "ArrowTable", params)
        return result if isinstance(result, pa.Table) else pa.table({})

    def insert(self, table: str, data: pa.Table) -> None:
        """Columnar insert: chdb's Python() table function reads the arrow table in place."""
        if data.num_rows == 0:
            return
        cols = ", ".join(f"`{c}`" for c in data.column_names)
        _arrow_batch = data  # read by name by the Python() table function
        sql = f"INSERT INTO {table} ({cols}) SELECT {cols} FROM Python(_arrow_batch)"
        with self._lock:
            try:
                self._session.query(sql)
            except Exception as exc:
                raise _classify(exc) from exc
        del _arrow_batch

    def close(self) -> None:
        with self._lock:
            self._session.close()


def _chdb_params(params: dict[str, Any]) -> dict[str, str]:
    """chdb takes parameters as text: arrays as ClickHouse literals (clickhouse-connect
    formats Python lists itself)."""
    out = {}
    for key, value in params.items():
        if isinstance(value, list | tuple):
            out[key] = "[" + ",".join(_literal(v) for v in value) + "]"
        elif isinstance(value, str):
            out[key] = value.translate(_ESCAPED)  # parameters are parsed as escaped text
        else:
            out[key] = str(value)
    return out


_ESCAPED = str.maketrans(
    {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0", "\b": "\\b", "\f": "\\f"}
)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


class ServerBackend:
    """A ClickHouse server through clickhouse-connect (HTTP); reconnects after failures."""

    name = "clickhouse"

    def __init__(self, url: str, user: str = "default", password: str = "") -> None:
        self.url, self.user, self.password = url, user, password
        self._client: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._client is None:
            import clickhouse_connect

            try:
                self._client = clickhouse_connect.get_client(
                    dsn=self.url,
                    username=self.user,
                    password=self.password,
                    connect_timeout=3,
                    send_receive_timeout=60,
                    autogenerate_session_id=False,
                )
            except Exception as exc:
                raise _classify(exc) from exc
        return self._client

    def _call(self, fn: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            client = self._get()
            try:
                return getattr(client, fn)(*args, **kwargs)
            except Exception as exc:
                err = _classify(exc)
                if isinstance(err, WarehouseDown):
                    self._client = None  # reconnect next time
                raise err from exc

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._call("command", sql, parameters=params or None)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        table: pa.Table = self._call(
            "query_arrow", sql, parameters=params or None, use_strings=True
        )
        return table

    def insert(self, table: str, data: pa.Table) -> None:
        if data.num_rows == 0:
            return
        database, _, name = table.rpartition(".")
        self._call("insert_arrow", name, data, database=database or None)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def _classify(exc: BaseException) -> WarehouseError:
    """Sort an engine/driver exception into down (retry) or data (dead-letter)."""
    if isinstance(exc, WarehouseError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    code = error_code(str(exc))
    if code in DATA_ERROR_CODES:
        return WarehouseDataError(text.strip())
    # pyarrow conversion failures inside an insert are data errors too
    if isinstance(exc, pa.ArrowException | OverflowError | ValueError | TypeError):
        return WarehouseDataError(text.strip())
    return WarehouseDown(text.strip())


_shared: dict[str, Backend] = {}
_shared_lock = threading.Lock()
_atexit_registered = False


def open_backend(settings: Any, data_dir: Path) -> Backend:
    """The process-wide backend for these settings (chdb: one per process, shared by the
    ingester, the control API and the dataset source running in it)."""
    key = settings.clickhouse_url or str(settings.chdb_path(data_dir).resolve())
    with _shared_lock:
        backend = _shared.get(key)
        if backend is None:
            if settings.clickhouse_url:
                backend = ServerBackend(
                    settings.clickhouse_url, settings.clickhouse_user, settings.clickhouse_password
                )
            else:
                for other_key, other in list(_shared.items()):
                    if isinstance(other, ChdbBackend):  # one chdb path per process
                        other.close()
                        del _shared[other_key]
                backend = ChdbBackend(settings.chdb_path(data_dir))
                global _atexit_registered
                if not _atexit_registered:  # close chdb cleanly before the interpreter goes
                    atexit.register(close_backends)
                    _atexit_registered = True
            _shared[key] = backend
        return backend


def close_backends() -> None:
    with _shared_lock:
        for backend in _shared.values():
            with contextlib.suppress(Exception):
                backend.close()
        _shared.clear()
