"""The job process: `python -m agentrl.training.worker JOB_DIR` runs one training job
(`... worker --launcher SOCKET`: a launcher that forks each job from one process that
imported torch once, see agentrl.training.launcher).

The service starts it as a child process, so a crash, an OOM kill or a hang ends this
process and never the service. It reads `JOB_DIR/spec.json` (the request and where to find
NATS and the checkpoint store), appends its events as JSON lines to `JOB_DIR/events.jsonl`
(the service tails that file and publishes status events), and writes its log to
`JOB_DIR/job.log`. SIGTERM asks it to cancel: it stops after the current optimiser step
(the service kills it if that takes longer than the grace period); checkpoints already
written stay where they are. It dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from agentrl.core.deathsig import die_with_parent
from agentrl.core.errors import TrainingError
from agentrl.core.logs import bind, configure_handler
from agentrl.llm.fence import FENCE_ENV
from agentrl.training.launcher import LAUNCHER_FLAG, serve
from agentrl.training.progress import Cancelled, Emitter

log = logging.getLogger("agentrl.training.worker")


def run(job_dir: Path) -> int:
    spec = json.loads((job_dir / "spec.json").read_text())
    bind(job_id=(spec.get("request") or {}).get("training_job_id"))  # in every log record
    if spec.get("lease"):  # the fencing token: checkpoint writes check it (and children)
        os.environ[FENCE_ENV] = json.dumps(spec["lease"])
    emitter = Emitter(job_dir / "events.jsonl")
    signal.signal(signal.SIGTERM, lambda *_: emitter.cancel.set())
    stop_beat = emitter.heartbeat(float(spec.get("heartbeat_s", 2.0)))
    try:
        emitter.emit("running", phase="starting", pid=os.getpid())
        if spec.get("kind") == "environment":
            from agentrl.training.jobs import run_environment_job

            run_environment_job(spec, emitter)
        else:
            from agentrl.training.jobs import run_dataset_job

            run_dataset_job(spec, emitter)
        return 0
    except Cancelled:
        emitter.emit("cancelled", message="cancelled on request")
        os._exit(0)  # no interpreter teardown: the service waits for this exit
    except TrainingError as exc:
        emitter.emit("failed", code=exc.code, message=str(exc), traceback=traceback.format_exc())
        return 1
    except MemoryError as exc:
        emitter.emit(
            "failed", code="OOM", message=f"out of memory: {exc}", traceback=traceback.format_exc()
        )
        return 1
    except Exception as exc:
        code = "OOM" if "out of memory" in str(exc).lower() else "INFRA"
        emitter.emit(
            "failed",
            code=code,
            message=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
        return 1
    finally:
        stop_beat.set()


def main(argv: list[str] | None = None) -> None:
    from agentrl.core.gcstart import raise_young_generation

    raise_young_generation()  # before torch's imports (the launcher's, a job's)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == LAUNCHER_FLAG:  # forks each job, see agentrl.training.launcher
        die_with_parent()
        sys.exit(serve(Path(argv[1]), run_job))
    sys.exit(run_job(Path(argv[0])))


def run_job(job_dir: Path) -> int:
    """The job in `job_dir`, in this process (a fresh one, or a launcher's fork)."""
    die_with_parent()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[configure_handler(logging.FileHandler(job_dir / "job.log"))],  # JSON if set
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run(job_dir)


Callback = Callable[[dict[str, float]], None]

if __name__ == "__main__":
    main()
