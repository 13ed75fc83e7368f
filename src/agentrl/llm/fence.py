"""Fencing tokens: a stale owner of a job cannot write its checkpoints or its status.

A job is owned through its lease (`agentrl.bus.lease`); the lease's revision when a runner
took it is that owner's token. Revisions of the lease bucket only grow, so whoever took the
job last holds the largest token. A runner writes its token into the job's checkpoint folder
(`.lease.json`) before it starts the job there, and the job process checks it before each
commit point (a checkpoint's manifest, a swap of best/ or final/, a rotation): a token larger
than its own means another runner owns the job now, and the write is refused (the job fails
with INFRA; its runner, stale too, publishes nothing the status fence lets through).

The job process learns its token from `AGENTRL_LEASE_FENCE` (set by the worker from its
spec; inherited by torchrun's children). Without it nothing is checked (a checkpoint written
outside the training service). Object stores have no compare-and-set: the check narrows the
window to one read before each commit, and the runner's own watchdog (it kills its job once
its lease's TTL passed unrenewed) closes it in practice.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentrl.core.errors import TrainingError

FENCE_FILE = ".lease.json"
FENCE_ENV = "AGENTRL_LEASE_FENCE"


def read_fence(fs: Any, root: str) -> dict[str, Any] | None:
    """The fence in checkpoint folder `root` ({owner, token}); None when there is none."""
    path = f"{root.rstrip('/')}/{FENCE_FILE}"
    try:
        with fs.open(path, "rb") as fh:
            data = json.loads(fh.read() or b"{}")
    except FileNotFoundError:
        return None
    except ValueError:  # torn or foreign: no token to compare with
        return None
    return data if isinstance(data, dict) and "token" in data else None


def stale(fence: dict[str, Any] | None, token: int) -> bool:
    """Whether `token` is older than the fence's (another owner took the job since)."""
    if fence is None:
        return False
    try:
        return int(fence["token"]) > int(token)
    except (TypeError, ValueError):
        return False


def raise_fence(storage_path: str, owner: str, token: int) -> dict[str, Any] | None:
    """Write our token into the job's checkpoint folder unless a newer one is there.
    Returns None when the fence is ours now, else the newer fence (we are stale)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(storage_path)
    current = read_fence(fs, root)
    if stale(current, token):
        return current
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root.rstrip('/')}/{FENCE_FILE}", "wb") as fh:
        fh.write(json.dumps({"owner": owner, "token": int(token)}).encode())
    return None


def own_token() -> dict[str, Any] | None:
    """This job process's {owner, token} (from the environment), or None."""
    raw = os.environ.get(FENCE_ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return {"owner": str(data["owner"]), "token": int(data["token"])}
    except (ValueError, KeyError, TypeError):
        return None


def check_fence(fs: Any, root: str, what: str) -> None:
    """Raise (INFRA) when another runner took this job since ours started: `what` (a
    checkpoint write) is refused."""
    mine = own_token()
    if mine is None:
        return
    fence = read_fence(fs, root)
    if stale(fence, mine["token"]):
        assert fence is not None
        raise TrainingError(
            f"{what} refused: runner {fence.get('owner')} owns this job now (lease revision "
            f"{fence['token']} > ours, {mine['token']}); this runner lost its lease",
            "INFRA",
        )
