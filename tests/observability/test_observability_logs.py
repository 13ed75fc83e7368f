"""JSON logs for Loki (python-json-logger) with ids in every record, and the audit log."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

from agentrl.core.logs import (
    ContextFilter,
    JsonFormatter,
    audit,
    disable_audit_file,
    enable_audit_file,
    log_context,
)


def capture() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"agentrl.test.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_records_carry_ids_from_extra_and_context() -> None:
    logger, stream = capture()
    logger.info("scored %s", "t1", extra={"trajectory_id": "t1", "reward_id": "r1"})
    with log_context(job_id="job-7", model_id="m-3"):
        logger.warning("step done", extra={"deployment_id": "d-1"})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    logger.info("outside")
    first, second, third, fourth = lines(stream)
    assert first["msg"] == "scored t1" and first["level"] == "INFO"
    assert first["trajectory_id"] == "t1" and first["reward_id"] == "r1" and "ts" in first
    assert second["job_id"] == "job-7" and second["model_id"] == "m-3"
    assert second["deployment_id"] == "d-1" and second["logger"].startswith("agentrl.test")
    assert third["job_id"] == "job-7" and "ValueError: boom" in third["exc_info"]
    assert "job_id" not in fourth


async def test_concurrent_tasks_keep_their_own_ids() -> None:
    logger, stream = capture()

    async def job(name: str) -> None:
        with log_context(job_id=name):
            for _ in range(3):
                await asyncio.sleep(0)
                logger.info("tick", extra={"tick_of": name})

    await asyncio.gather(job("a"), job("b"))
    recs = lines(stream)
    assert len(recs) == 6 and all(r["job_id"] == r["tick_of"] for r in recs)


def test_audit_log_is_json_lines_with_ids(tmp_path: Path) -> None:
    path = enable_audit_file(tmp_path / "audit" / "audit.jsonl")
    try:
        audit("deployment.promote", model_id="m-2", deployment_id="d-9", actor="controller")
        with log_context(job_id="j-1"):
            audit("data.export", rows=120, destination="s3://x/y.parquet")
    finally:
        disable_audit_file(path)
    audit("after.disable")  # not in the file
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["action"] for r in records] == ["deployment.promote", "data.export"]
    promote, export = records
    assert promote["model_id"] == "m-2" and promote["deployment_id"] == "d-9"
    assert promote["actor"] == "controller" and promote["audit"] is True
    assert export["rows"] == 120 and export["job_id"] == "j-1" and export["actor"]


def test_bind_and_configure_handler(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import contextvars

    from agentrl.core.logs import bind, configure_handler
    from agentrl.core.settings import get_settings

    monkeypatch.setenv("AGENTRL_LOG_JSON", "1")
    get_settings.cache_clear()
    try:
        stream = io.StringIO()
        handler = configure_handler(logging.StreamHandler(stream))
        logger = logging.getLogger("agentrl.test.bind")
        logger.handlers[:] = [handler]
        logger.propagate = False

        def job() -> None:
            bind(job_id="job-42")
            logger.warning("in the job")

        contextvars.copy_context().run(job)  # like a job process: bound for its whole life
        logger.warning("outside")
    finally:
        get_settings.cache_clear()
    first, second = lines(stream)
    assert first["job_id"] == "job-42" and first["msg"] == "in the job"
    assert "job_id" not in second
