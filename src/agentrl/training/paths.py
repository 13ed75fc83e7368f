"""Where a job may write: its folder under the data dir, its checkpoints under an allowed root.

A training job id and a request's `checkpointing.storage_path` come from whoever can publish a
request (the API, the bus, an agent's code on the same host), and both become file paths. Ids
are therefore UUIDs or `[A-Za-z0-9_-]{1,64}` (the contract checks it; `job_dir` checks again
after resolving), and a requested checkpoint location must lie under the settings' checkpoint
root or one of `AGENTRL_TRAINING_CHECKPOINT_PREFIXES` (local folders or fsspec URLs).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from agentrl.training.settings import TrainingSettings

JOB_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
JOB_ID_RE = re.compile(JOB_ID_PATTERN)
# The contract's default storage_path: "not set" (the service's own root is used).
DEFAULT_STORAGE_PATH = "./.agentrl/checkpoints"


class UnsafePath(ValueError):
    """A job id or a checkpoint location that would write outside the allowed places."""


def job_dir(root: Path, job_id: str) -> Path:
    """`<root>/jobs/<job_id>`, resolved; raises UnsafePath when it would leave `<root>/jobs`."""
    if not JOB_ID_RE.match(job_id):
        raise UnsafePath(f"training_job_id {job_id!r} is not a UUID or [A-Za-z0-9_-]{{1,64}}")
    jobs = (root / "jobs").resolve()
    path = (jobs / job_id).resolve()
    if path.parent != jobs:
        raise UnsafePath(f"training_job_id {job_id!r} leaves the jobs folder {jobs}")
    return path


def _scheme(location: str) -> str:
    head, sep, _ = location.partition("://")
    return head.lower() if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", head) else ""


def _normal(location: str) -> tuple[str, str]:
    """(scheme, normalised path): local paths resolved, URLs with `.` and `..` folded."""
    scheme = _scheme(location)
    if scheme in ("", "file"):
        local = location.split("://", 1)[1] if scheme else location
        return "", str(Path(local).expanduser().resolve())
    rest = location.split("://", 1)[1]
    return scheme, posixpath.normpath("/" + rest).lstrip("/")


def _under(location: tuple[str, str], prefix: tuple[str, str]) -> bool:
    if location[0] != prefix[0]:
        return False
    if not location[0]:
        return Path(location[1]).is_relative_to(Path(prefix[1]))
    base = prefix[1].rstrip("/")
    return location[1] == base or location[1].startswith(base + "/")


def allowed_roots(ts: TrainingSettings, data_dir: Path) -> list[str]:
    return [ts.checkpoint_root(data_dir), *ts.checkpoint_prefixes]


def checkpoint_base(requested: str | None, ts: TrainingSettings, data_dir: Path) -> str:
    """The checkpoint root of a job: the settings' root, or the request's `storage_path` when
    it lies under an allowed root (raises UnsafePath with the reason otherwise)."""
    root = ts.checkpoint_root(data_dir)
    if not requested or requested == DEFAULT_STORAGE_PATH:
        return root
    if "\x00" in requested:
        raise UnsafePath("checkpointing.storage_path contains a NUL byte")
    location = _normal(requested)
    roots = allowed_roots(ts, data_dir)
    if any(_under(location, _normal(r)) for r in roots):
        scheme, path = location
        return f"{scheme}://{path}" if scheme else path
    raise UnsafePath(
        f"checkpointing.storage_path {requested!r} is outside the allowed checkpoint "
        f"locations ({', '.join(roots)}); leave it out to use the service's root, or add a "
        "prefix to AGENTRL_TRAINING_CHECKPOINT_PREFIXES"
    )
