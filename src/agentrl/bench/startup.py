"""`agentrl bench startup`: how long `agentrl up` takes to serve, and to stop.

Two real `agentrl up` processes, each on a fresh data dir and its own ports: the first with
an empty model cache (the bundled SmolLM2 is converted), the second with the cache the
first filled. For each: seconds from the process's start to the first token streamed back
through the gateway, when each service reported ready in `/health`, when "agentrl is up"
was printed; then SIGINT and the seconds to the process's exit, and whether any process it
started outlived it. The last line is one JSON object: `cold_to_first_token_s`,
`warm_to_first_token_s`, `sigint_to_exit_s` (the warm run's; the cold one's beside it).
Targets on 2 cores: warm <= 30 s, cold <= 3 min, exit <= 5 s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.bench.options import StartupBench
from agentrl.bus.server import free_port
from agentrl.core.deathsig import terminate_with_parent

TARGETS = {"warm_to_first_token_s": 30.0, "cold_to_first_token_s": 180.0, "sigint_to_exit_s": 5.0}


def _first_token(gateway: str, model: str = "agentrl-policy") -> bool:
    """One streamed chat completion; True once a chunk with content (a token) arrives."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "stream": True,
    }
    with (
        httpx.Client(timeout=httpx.Timeout(120, connect=2)) as c,
        c.stream("POST", f"{gateway}/chat/completions", json=body) as r,
    ):
        if r.status_code != 200:
            return False
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    return True
    return False


def one_start(cache: Path, work: Path, label: str, timeout_s: float = 900.0) -> dict[str, Any]:
    """Start `agentrl up`, wait for its first served token, SIGINT it; the timings."""
    api, gw = free_port(), free_port()
    data = work / f"data-{label}"
    env = {
        **os.environ,
        "AGENTRL_MODELS_DIR": str(cache),
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_TRAINING_SCHEDULE": "",  # no training job in the way of the first token
        "COLUMNS": "200",
    }
    for k in ("NATS_URL", "AGENTRL_NATS_URL", "AGENTRL_DATA_DIR"):
        env.pop(k, None)
    log = work / f"up-{label}.log"
    agentrl = str(Path(sys.executable).parent / "agentrl")
    out: dict[str, Any] = {"ready_s": {}}
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    proc = subprocess.Popen(
        [agentrl, "up", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=work,  # a cwd of its own: nothing may land in the caller's ./.agentrl
        start_new_session=True,
        # the bench ended (SIGTERM's watchdog ends it 10 s later, whatever `up` is doing):
        # `up` ends with it, and its nats-server with `up`
        preexec_fn=terminate_with_parent,
    )

    def pump() -> None:
        assert proc.stdout is not None
        with open(log, "w") as fh:
            for line in proc.stdout:
                lines.append((time.monotonic() - start, line))
                fh.write(line)
                fh.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    gateway = f"http://127.0.0.1:{gw}/v1"
    children: list[int] = []
    try:
        while time.monotonic() - start < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"agentrl up exited with {proc.returncode}; see {log}")
            _note_ready(api, start, out["ready_s"])
            try:
                if _first_token(gateway):
                    out["to_first_token_s"] = round(time.monotonic() - start, 2)
                    out["cpu_to_first_token_s"] = round(_tree_cpu_s(proc.pid), 2)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"no token through the gateway within {timeout_s:.0f} s; see {log}")
        _note_ready(api, start, out["ready_s"])
        children = _descendants(proc.pid)
    finally:
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out["sigint_to_exit_s"] = round(time.monotonic() - t, 2)
        reader.join(5)
    out["exit_code"] = proc.returncode
    out["left_running"] = [p for p in children if _alive(p)]
    out["timeline_s"] = timeline(lines)
    for at, line in lines:
        if "agentrl is up" in line and "up_printed_s" not in out:
            out["up_printed_s"] = round(at, 2)
        if "stopped cleanly" in line:
            out["stopped_cleanly_s_after_start"] = round(at, 2)
    out["log"] = str(log)
    return out


# What `agentrl up` says on its way to serving, in order: (key, a piece of the line).
MILESTONES = (
    ("nats_listening", "nats-server listening"),
    ("services_started", "started control API"),
    ("control_api_serving", "control API on http"),
    ("reward_service_started", "reward service started"),
    ("training_service_started", "training service started"),
    ("model_loaded_gateway_starting", "agentrl.release.service: gateway on"),
    ("deployment_controller_ready", "deployment controller ready after"),
    ("agentrl_is_up", "agentrl is up"),
)


def timeline(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds from the process's start to each milestone of start-up it printed (the
    first line containing each piece), in start-up order."""
    seen: dict[str, float] = {}
    for at, line in lines:
        for key, piece in MILESTONES:
            if key not in seen and piece in line:
                seen[key] = round(at, 2)
    return dict(sorted(seen.items(), key=lambda kv: kv[1]))


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children so far: what start-up
    costs, which machine load moves far less than the wall time."""
    try:
        import psutil

        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except Exception:  # psutil missing or the process gone
        return float("nan")
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # it ended meanwhile
            continue
    return total


def _note_ready(api: int, start: float, seen: dict[str, float]) -> None:
    """The first time each service reports `running` in /health (seconds since start)."""
    try:
        body = httpx.get(f"http://127.0.0.1:{api}/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return
    now = round(time.monotonic() - start, 2)
    for name, h in (body.get("services") or {}).items():
        if h.get("state") == "running" and name not in seen:
            seen[name] = now
    if body.get("ok") and "/health ok" not in seen:
        seen["/health ok"] = now


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing or the process gone
        return []


def _alive(pid: int) -> bool:
    try:
        import psutil

        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def run(keep: bool = False) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    work = Path(tempfile.mkdtemp(prefix="agentrl-bench-startup-"))
    cache = work / "model-cache"  # empty: the first start converts
    load = os.getloadavg()
    print(f"cold start (empty model cache {cache}) ...", file=sys.stderr, flush=True)
    cold = one_start(cache, work, "cold")
    print(f"cold: {cold}", file=sys.stderr, flush=True)
    print("warm start (the same cache, a new data dir) ...", file=sys.stderr, flush=True)
    warm = one_start(cache, work, "warm")
    print(f"warm: {warm}", file=sys.stderr, flush=True)
    line = {
        "cold_to_first_token_s": cold["to_first_token_s"],
        "warm_to_first_token_s": warm["to_first_token_s"],
        "cold_cpu_to_first_token_s": cold.get("cpu_to_first_token_s"),
        "warm_cpu_to_first_token_s": warm.get("cpu_to_first_token_s"),
        "cold_timeline_s": cold.get("timeline_s"),
        "warm_timeline_s": warm.get("timeline_s"),
        "sigint_to_exit_s": warm["sigint_to_exit_s"],
        "sigint_to_exit_s_cold": cold["sigint_to_exit_s"],
        "cold_ready_s": cold["ready_s"],
        "warm_ready_s": warm["ready_s"],
        "cold_up_printed_s": cold.get("up_printed_s"),
        "warm_up_printed_s": warm.get("up_printed_s"),
        "exit_codes": [cold["exit_code"], warm["exit_code"]],
        "left_running": cold["left_running"] + warm["left_running"],
        "targets": TARGETS,
        "cores": os.cpu_count(),
        "load_at_start": [round(x, 2) for x in load],
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(line))
    return line


def command(cfg: StartupBench) -> None:
    """`agentrl bench startup`."""
    run(keep=cfg.keep)
