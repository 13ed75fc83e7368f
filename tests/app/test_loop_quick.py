"""`agentrl loop --quick --bad-candidate` walks the whole chain on the real stack with the
tiny model: agents act through the gateway -> trajectories -> rewards -> threshold trigger ->
training job -> validation -> canary -> promotion; then a deliberately broken version is
deployed by hand and rolled back automatically. The last line is the issue's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loop_helpers import run_loop_cli


def test_quick_loop_promotes_a_trained_version_and_rolls_back_a_broken_one(
    tmp_path: Path,
    no_launcher: None,  # the loop forks its own (in a suite, one is named to every test)
) -> None:
    # one agent (the profile gives 2): the chain is the same, and the agents act at full
    # speed while a canary holds, so a second one only adds sessions past the verdict's need
    # (trajectories 94 -> 56-64, 27.4 -> 26.3 CPU-s, mean of two runs at load 9-11)
    proc = run_loop_cli(
        "--quick", "--bad-candidate", "--set", "agents=1", "--data-dir", str(tmp_path / "loop")
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    last = json.loads(out.strip().splitlines()[-1])
    keys = {
        "versions",
        "promoted",
        "rolled_back",
        "base_heldout_success",
        "best_heldout_success",
        "trained_heldout_success",
        "heldout_seeds",
        "trajectories",
        "rewards",
        "lost",
        "wall_s",
    }
    assert keys <= set(last)
    # base + at least one trained version + the broken one
    assert last["versions"] >= 3 and last["promoted"] >= 1 and last["rolled_back"] >= 1, out
    assert last["trajectories"] > 0 and last["rewards"] == last["trajectories"] - last["lost"]
    assert last["lost"] == 0, out
    assert last["heldout_seeds"] > 0 and last["base_heldout_success"] is not None
    # every stage of the chain shows up in the progress lines
    for stage in (
        "acting:",
        "training job",
        "completed",
        "validate",
        "-> canary",
        "promote -> live",
        "bad candidate",
        "rollback -> rolled_back",
        "held-out:",
    ):
        assert stage in out, f"no {stage!r} in the progress:\n{out[-3000:]}"
    assert (tmp_path / "loop" / "report" / "index.html").exists()
    # the console tells the loop's story: library warnings, audit records and progress bars
    # go to the log file, whose path is printed once
    console = out + proc.stderr
    for noise in ("FutureWarning", "agentrl.audit", "Loading checkpoint shards", "%|"):
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    log = tmp_path / "loop" / "loop.log"
    assert console.count(str(log)) == 1, console[:2000]
    assert out.splitlines()[0] == f"log: {log}"
    records = log.read_text()
    for action in ("deployment.promote", "deployment.rollback"):
        assert f"agentrl.audit: audit {action}" in records, records[-3000:]
    assert "INFO agentrl.bus.server: nats-server listening" in records
    # the job forked from the launcher the loop forked from itself (its imports done once):
    # the training service started none of its own, and the socket is gone at the end
    assert "job launcher: pid" in records and "forked from the loop" in records
    launched = (tmp_path / "loop" / "training" / "launcher.log").read_text()
    assert launched.count("launcher: pid") == 1, launched
    socket_path = Path(launched.split(" ready on ")[1].split()[0])
    assert not socket_path.exists()
    # one line per record on the console: a traceback, if any, is in the file only
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_the_loop_forks_a_launcher_only_where_the_service_would_start_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrl.app.loop_launcher import LAUNCHER_ENV, WARM_ENV, wanted

    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    monkeypatch.delenv(WARM_ENV, raising=False)
    assert wanted()  # the loop's default: a warm worker
    monkeypatch.setenv(WARM_ENV, "false")
    assert not wanted()  # the user turned the launcher off: jobs start processes of their own
    monkeypatch.setenv(WARM_ENV, "true")
    monkeypatch.setenv(LAUNCHER_ENV, "/run/theirs.sock")
    assert not wanted()  # the user's launcher is the one the service uses


def test_a_fresh_run_empties_its_folder_but_keeps_the_converted_model(tmp_path: Path) -> None:
    from agentrl.app.loop import prepare_data_dir

    run = prepare_data_dir(tmp_path / "run")
    (run / "models" / "SmolLM2").mkdir(parents=True)
    (run / "models" / "SmolLM2" / "config.json").write_text("{}")
    (run / "training" / "jobs").mkdir(parents=True)
    (run / "nats-server.log").write_text("old")
    prepare_data_dir(run)
    assert sorted(p.name for p in run.iterdir()) == [".agentrl-loop", "models"]
    assert (run / "models" / "SmolLM2" / "config.json").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds other data"):
        prepare_data_dir(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


# What a main job's process does with its records once `log_to_file` ran: the same calls as
# `agentrl loop` (setup_logging from the root callback, then log_to_file), in a process of
# its own (the test process keeps its logging).
_JOB = """
import logging, logging.config, sys, warnings
from pathlib import Path
from agentrl.core.logs import audit, log_to_file, setup_logging
setup_logging(verbose=sys.argv[2] == "verbose")
print(f"log: {log_to_file(Path(sys.argv[1]))}", flush=True)
warnings.warn("an old api", FutureWarning)
from transformers.utils import logging as transformers_logging
transformers_logging.get_logger("transformers.modeling_utils").warning("a deprecated argument")
for _ in transformers_logging.tqdm(range(3), desc="Loading weights"):
    pass
logging.getLogger("agentrl.release.service").info("an info of agentrl")
audit("deployment.promote", model_id="m-1")
try:
    raise RuntimeError("boom\\nsecond line")
except RuntimeError:
    logging.getLogger("agentrl.app.stack").exception("training service died; restarting")
logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})  # uvicorn's start
logging.getLogger("agentrl.app.loop").warning("after a dictConfig")
"""


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_the_console_keeps_the_story_and_the_file_takes_the_rest(tmp_path: Path, mode: str) -> None:
    import os
    import subprocess
    import sys

    log = tmp_path / "run" / "loop.log"
    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp_path / "data"), "AGENTRL_LOG_JSON": "0"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    env.pop("TQDM_DISABLE", None)
    proc = subprocess.run(
        [sys.executable, "-c", _JOB, str(log), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"log: {log.resolve()}\n"
    records = log.read_text()
    for line in (
        "FutureWarning: an old api",
        "WARNING transformers.modeling_utils: a deprecated argument",
        "INFO agentrl.release.service: an info of agentrl",
        "INFO agentrl.audit: audit deployment.promote ok",
        "ERROR agentrl.app.stack: training service died; restarting",
        "RuntimeError: boom",  # the traceback
        "WARNING agentrl.app.loop: after a dictConfig",  # the file outlives uvicorn's dictConfig
    ):
        assert line in records, f"{line!r} not in the log file:\n{records}"
    console = proc.stderr
    if mode == "verbose":  # -v: every record on the console as well
        for line in ("an old api", "a deprecated argument", "audit deployment.promote"):
            assert line in console, console
        return
    assert console.splitlines() == [
        "ERROR agentrl.app.stack: training service died; restarting "
        f"(RuntimeError: boom; traceback in {log.resolve()})",
        "WARNING agentrl.app.loop: after a dictConfig",
    ], console
