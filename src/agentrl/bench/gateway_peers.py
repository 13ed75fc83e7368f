"""`agentrl bench gateway --peers`: agentrl's gateway beside the gateways people pick.

Each peer that installs here is put in front of the same scripted OpenAI backend as agentrl's
gateway and driven by the same open-loop load generator (`bench.latency_run`: direct and
gateway requests alternate, so both see the same machine), in turn:

- LiteLLM's proxy (Python, `litellm[proxy]`, in its own venv),
- Portkey's gateway (Node, npm `@portkey-ai/gateway`),
- TensorZero's gateway (Rust, the HTTP gateway embedded in the `tensorzero` wheel, in its own
  venv; its OpenAI-compatible route `/openai/v1`).

Peers install into the user cache (`~/.cache/agentrl/bench-peers`), never into agentrl's
environment, once; a peer that will not install or start is reported with the reason. Per
peer: added p50/p99 at 200 and 1,000 requests/s, non-streaming and streaming, the highest
rate with p99 under 50 ms (non-streaming, a ramp), CPU ms per request of the peer's process
tree, errors. The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.bench import gateway as bench
from agentrl.core.cachedirs import cache_home

RATES = (200.0, 1000.0)
RAMP = (200.0, 400.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0)
# A peer that cannot sustain the ramp's first rate is tried lower, down to the last of these:
# its highest sustained rate and a rate agentrl is compared with it at (LiteLLM's proxy kept
# up with 17 requests/s on 2 cores, so at 200 and 1,000 there was no ratio at all).
DOWN = (100.0, 50.0, 25.0, 10.0, 5.0)
P99_LIMIT_MS = 50.0
GIVE_UP_S = 10.0  # a request this late for a connection is dropped: the run ends
INSTALL_TIMEOUT_S = 900


@dataclass
class Peer:
    """A gateway under test: how to reach it, and what it runs as."""

    name: str
    url: str = ""  # its chat-completions URL
    target: dict[str, Any] = field(default_factory=dict)  # model + headers for latency_run
    proc: subprocess.Popen[bytes] | None = None
    version: str | None = None
    error: str | None = None
    log: Path | None = None


def peers_dir() -> Path:
    return cache_home() / "bench-peers"


def _sh(cmd: list[str], timeout: float = INSTALL_TIMEOUT_S, **kw: Any) -> str:
    """Run an install step; its failure (with the tail of its output) is the reason."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({out.returncode}): {' | '.join(tail)}")
    return out.stdout


def _venv(path: Path, requirement: str, probe: str) -> Path:
    """A throwaway venv holding `requirement`, made once; its python."""
    python = path / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return python
    if not python.exists():
        _sh([sys.executable, "-m", "venv", str(path)], timeout=120)
    _sh([str(python), "-m", "pip", "install", "-q", requirement])
    return python


def _version(python: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return _sh([str(python), "-c", code], timeout=60).strip()


def _popen(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    from agentrl.core.deathsig import terminate_with_parent

    with open(log, "ab") as fh:
        return subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            preexec_fn=terminate_with_parent,  # a killed benchmark leaves no peer behind
        )


# ---- peers -------------------------------------------------------------------------------
def start_litellm(backend: str, tmp: Path) -> Peer:
    peer = Peer("litellm", log=tmp / "litellm.log")
    python = _venv(
        peers_dir() / "litellm-venv", "litellm[proxy]", "import litellm.proxy.proxy_server"
    )
    peer.version = _version(python, "litellm")
    key = "sk-bench-" + secrets.token_hex(16)
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        json.dumps(  # (YAML is a superset of JSON)
            {
                "model_list": [
                    {
                        "model_name": "agentrl-policy",
                        "litellm_params": {
                            "model": "openai/bench",
                            "api_base": backend,
                            "api_key": "bench",
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False, "drop_params": True},
                # the proxy refuses to start without a master key; no database
                "general_settings": {"master_key": key},
            }
        )
    )
    port = bench._free_port()
    assert peer.log is not None
    peer.proc = _popen(
        [
            str(python.parent / "litellm"),
            "--config",
            str(cfg),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        peer.log,
        # no fetch of the model price map at start; no telemetry; quiet
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
    )
    peer.url = f"http://127.0.0.1:{port}/v1/chat/completions"
    peer.target = {"model": "agentrl-policy", "headers": {"Authorization": f"Bearer {key}"}}
    return peer


def start_portkey(backend: str, tmp: Path) -> Peer:
    peer = Peer("portkey", log=tmp / "portkey.log")
    node, npm = shutil.which("node"), shutil.which("npm")
    if (node is None or npm is None) and shutil.which("apt-get") and os.geteuid() == 0:
        _sh(["apt-get", "install", "-y", "-q", "nodejs", "npm"])
        node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("node and npm are not installed (apt-get install nodejs npm)")
    where = peers_dir() / "portkey"
    entry = where / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    if not entry.exists():
        where.mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text(
            json.dumps(
                {
                    "private": True,
                    "dependencies": {"@portkey-ai/gateway": "^1.15.2"},
                }
            )
        )
        _sh([npm, "install", "--no-audit", "--no-fund"], cwd=where)
    meta = json.loads((entry.parent.parent / "package.json").read_text())
    peer.version = f"{meta['version']} (node {_sh([node, '--version'], timeout=30).strip()})"
    port = bench._free_port()
    assert peer.log is not None
    peer.proc = _popen([node, str(entry), f"--port={port}", "--headless"], peer.log)
    peer.url = f"http://127.0.0.1:{port}/v1/chat/completions"
    peer.target = {
        "model": "bench",
        "headers": {
            "Authorization": "Bearer bench",
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": backend,
        },
    }
    return peer


TENSORZERO_MAIN = """
import signal, sys, threading
import tensorzero
gw = tensorzero._start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,
    postgres_url=None, valkey_url=None, async_setup=False)
print(gw.base_url, flush=True)
done = threading.Event()
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda *_: done.set())
done.wait()
gw.close()
"""


def start_tensorzero(backend: str, tmp: Path) -> Peer:
    peer = Peer("tensorzero", log=tmp / "tensorzero.log")
    python = _venv(peers_dir() / "tz-venv", "tensorzero", "import tensorzero")
    peer.version = _version(python, "tensorzero")
    cfg = tmp / "tensorzero.toml"
    cfg.write_text(
        "[gateway]\nobservability.enabled = false\n\n"
        '[models.bench]\nrouting = ["mock"]\n\n'
        "[models.bench.providers.mock]\n"
        f'type = "openai"\nmodel_name = "bench"\napi_base = "{backend}/"\n'
        'api_key_location = "none"\n'
    )
    out = tmp / "tensorzero.url"
    assert peer.log is not None
    with open(out, "wb") as fh:
        from agentrl.core.deathsig import terminate_with_parent

        peer.proc = subprocess.Popen(
            [str(python), "-c", TENSORZERO_MAIN, str(cfg)],
            stdout=fh,
            stderr=open(peer.log, "ab"),  # noqa: SIM115 - the child keeps it
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
            preexec_fn=terminate_with_parent,
        )
    deadline = time.time() + 60
    while time.time() < deadline and not out.read_text().strip():
        if peer.proc.poll() is not None:
            raise RuntimeError(f"exited with {peer.proc.returncode}: {_tail(peer.log)}")
        time.sleep(0.1)
    base = out.read_text().strip()
    if not base:
        raise RuntimeError("gave no URL within 60 s")
    peer.url = f"{base.rstrip('/')}/chat/completions"
    peer.target = {"model": "tensorzero::model_name::bench"}
    return peer


# agentrl's own gateway under another server or event loop (the bench helper's settings, see
# `bench._serve_gateway`), measured as a peer of the same run: beside the default and the
# other peers on the same machine, so a change of server is judged by the ratios it gives.
VARIANTS: dict[str, dict[str, str]] = {
    "agentrl-asyncio": {"BENCH_GATEWAY_LOOP": "asyncio"},  # (`agentrl up` runs on uvloop)
    "agentrl-granian": {"BENCH_GATEWAY_SERVER": "granian"},
    "agentrl-granian-asyncio": {"BENCH_GATEWAY_SERVER": "granian", "BENCH_GATEWAY_LOOP": "asyncio"},
    "agentrl-h11": {"BENCH_GATEWAY_HTTP": "h11"},
    "agentrl-slice": {"BENCH_GATEWAY_SLICE": "100"},
    # `agentrl up --gateway-workers N`: N processes on the port (SO_REUSEPORT)
    "agentrl-w2": {"BENCH_GATEWAY_WORKERS": "2"},
    "agentrl-w3": {"BENCH_GATEWAY_WORKERS": "3"},
}


# agentrl's compiled front (`gateway-front/`, `agentrl.serving.front`): the same split,
# counters and completion log (to the same NATS) in Rust, with a route table of one version
# on the same backend; name -> (its tokio worker threads (1: a current-thread runtime), its
# completion log on); agentrl-rust-nolog: what the log costs it.
FRONTS: dict[str, tuple[int, bool]] = {
    "agentrl-rust": (1, True),
    "agentrl-rust-t2": (2, True),
    "agentrl-rust-nolog": (1, False),
}


def is_ours(name: str) -> bool:
    """A variant of agentrl's own gateway (compared with each real peer), not a peer."""
    return name in VARIANTS or name in FRONTS


def start_front(name: str, backend: str, nats_url: str, tmp: Path) -> Peer:
    """The compiled front on a free port; `BENCH_GATEWAY_LOG=off`: without its NATS log."""
    from agentrl.serving import front

    routes = tmp / f"{name}-routes.json"
    front.write_routes(
        routes,
        {
            "public_name": "agentrl-policy",
            "lineages": {"agentrl-policy": {"weights": {"v1": 100.0}, "order": ["v1"]}},
            "versions": {"v1": {"backend": backend, "served_name": "v1"}},
            "timeout_s": 30.0,
        },
    )
    threads, logged = FRONTS[name]
    logged = logged and os.environ.get("BENCH_GATEWAY_LOG") != "off"
    proc = front.Front(
        routes, nats_url=nats_url if logged else None, threads=threads, log=tmp / f"{name}.log"
    )
    url = proc.start()
    return Peer(
        name,
        url=f"{url}/v1/chat/completions",
        target={"model": "agentrl-policy"},
        proc=proc.proc,
        version=f"gateway-front 0.1.0, threads={threads}, log={'on' if logged else 'off'}",
        log=tmp / f"{name}.log",
    )


def start_ours(name: str, backend: str, nats_url: str, tmp: Path) -> Peer:
    if name in FRONTS:
        return start_front(name, backend, nats_url, tmp)
    return start_variant(name, backend, nats_url)


def start_variant(name: str, backend: str, nats_url: str) -> Peer:
    """agentrl's gateway helper with a variant's settings (granian: `pip install granian`)."""
    env = VARIANTS[name]
    if env.get("BENCH_GATEWAY_SERVER") == "granian":
        import importlib.util

        if importlib.util.find_spec("granian") is None:
            raise RuntimeError("granian is not installed (pip install granian)")
    port = bench._free_port()
    proc = bench._spawn("gateway", str(port), backend, nats_url, env=env)
    return Peer(
        name,
        url=f"http://127.0.0.1:{port}/v1/chat/completions",
        target={"model": "agentrl-policy"},
        proc=proc,
        version=", ".join(f"{k}={v}" for k, v in env.items()),
    )


PEERS: dict[str, Callable[[str, Path], Peer]] = {
    "litellm": start_litellm,
    "portkey": start_portkey,
    "tensorzero": start_tensorzero,
}


def _tail(log: Path | None, lines: int = 3) -> str:
    if log is None or not log.exists():
        return ""
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])[-600:]


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# ---- measuring -----------------------------------------------------------------------------
async def _ready(peer: Peer, timeout: float = 90.0) -> None:
    """The peer answers one chat completion with 200 (not merely accepts a connection)."""
    import httpx

    body = {"model": peer.target.get("model"), "messages": [{"role": "user", "content": "hi"}]}
    start, last = time.time(), "no answer"
    async with httpx.AsyncClient(timeout=10) as c:
        while time.time() - start < timeout:
            if peer.proc is not None and peer.proc.poll() is not None:
                raise RuntimeError(f"exited with {peer.proc.returncode}: {_tail(peer.log)}")
            try:
                r = await c.post(peer.url, json=body, headers=peer.target.get("headers"))
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            await asyncio.sleep(0.25)
    raise RuntimeError(f"not serving after {timeout:.0f} s: {last}; {_tail(peer.log)}")


def _sustains(run: dict[str, Any]) -> bool:
    return (
        run["gateway_p99"] < P99_LIMIT_MS
        and run["achieved_rate"] >= 0.95 * run["rate"]
        and run["unanswered"] == 0
    )


async def stream_probe(peer: Peer) -> str | None:
    """None when one streamed request comes back as server-sent events ending in [DONE],
    else what came back instead."""
    import httpx

    body = {
        "model": peer.target.get("model"),
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(peer.url, json=body, headers=peer.target.get("headers"))
    if r.status_code == 200 and "data: [DONE]" in r.text:
        return None
    return f"streaming answered {r.status_code}: {r.text[:200]}; {_tail(peer.log, 2)}"


def _step(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "rate": run["rate"],
        "p99": round(run["gateway_p99"], 2),
        "achieved": round(run["achieved_rate"]),
        "added_p50": round(run["added_p50"], 3),
        "added_p99": round(run["added_p99"], 3),
    }


async def measure(
    direct: str,
    peer: Peer,
    duration: float,
    say: Callable[[str], None],
    rates: tuple[float, ...] = RATES,
    ramp_rates: tuple[float, ...] = RAMP,
    down: tuple[float, ...] = DOWN,
) -> dict[str, Any]:
    """One peer's figures: each rate, both modes, then the ramp. A step of the ramp that
    misses is run once more before it counts (a shared machine has bad seconds). When even
    the ramp's first step misses, lower rates (`down`) are tried until one is sustained:
    `max_rps` is then that rate (0 when none is)."""
    pid = peer.proc.pid if peer.proc is not None else os.getpid()
    out: dict[str, Any] = {"stream_error": await stream_probe(peer)}
    for stream in (False, True):
        if stream and out["stream_error"]:
            say(f"{peer.name}: streaming not measured: {out['stream_error']}")
            continue
        for rate in rates:
            say(f"{peer.name}: {rate:g} req/s {'streaming' if stream else 'non-streaming'}")
            out[f"{'stream' if stream else 'plain'}{int(rate)}"] = await bench.latency_run(
                direct,
                peer.url,
                rate,
                duration,
                pids={"gateway": pid},
                target=peer.target,
                stream=stream,
                give_up_s=GIVE_UP_S,
            )
    best, ramp = 0.0, []
    steps = list(ramp_rates)
    while steps:
        rate = steps.pop(0)
        run = await sustained_run(direct, peer, rate, duration)
        ramp.append(_step(run))
        say(f"{peer.name}: ramp {rate:g} req/s -> p99 {run['gateway_p99']:.1f} ms")
        if _sustains(run):
            best = rate
            if rate < ramp_rates[0]:  # coming down: the first rate sustained is the highest
                break
            continue
        if best or rate < ramp_rates[0]:
            if not best and steps:
                continue  # still coming down
            break
        steps = [r for r in down if r < rate]  # not even the first step: come down
    out["max_rps"], out["ramp"] = best, ramp
    return out


async def sustained_run(direct: str, peer: Peer, rate: float, duration: float) -> dict[str, Any]:
    """A non-streamed run at `rate`, run once more when it misses (a bad second)."""
    args = (direct, peer.url, rate, duration)
    run = await bench.latency_run(*args, target=peer.target, give_up_s=GIVE_UP_S)
    if not _sustains(run):
        run = await bench.latency_run(*args, target=peer.target, give_up_s=GIVE_UP_S)
    return run


async def compare_at_common(
    direct: str,
    ours: Peer,
    results: dict[str, dict[str, Any]],
    name: str,
    duration: float,
    say: Callable[[str], None],
) -> None:
    """When either did not keep up with the fixed rates: agentrl and the peer at the highest
    rate both sustain (`common_rps`), or, when one sustains none, at the lowest rate the peer
    was tried at (`common_rps_sustained` False). Each run's figures go under `at`; a run
    missing there is made now, while the peer still runs, so both saw the same machine."""
    res, mine = results[name], results["agentrl"]
    kept_up = all(
        m[f"plain{int(rate)}"]["achieved_rate"] >= 0.95 * rate
        for rate in RATES
        for m in (res, mine)
    )
    if kept_up or not res["ramp"]:
        return
    common = min(res["max_rps"], mine["max_rps"])
    res["common_rps_sustained"] = bool(common)
    if not common:
        common = min(s["rate"] for s in res["ramp"])
    for who, peer, out in ((name, None, res), ("agentrl", ours, mine)):
        at = out.setdefault("at", {})
        step = next((s for s in out.get("ramp", []) if s["rate"] == common), None)
        if step is not None and common not in at:
            at[common] = step
        if common not in at:
            say(f"{who} at {common:g} req/s (agentrl and {name} side by side)")
            target = peer if peer is not None else _peer_of(results, name)
            at[common] = _step(await sustained_run(direct, target, common, duration))
    res["common_rps"] = common


def _peer_of(results: dict[str, dict[str, Any]], name: str) -> Peer:
    peer = results[name].get("peer")
    if not isinstance(peer, Peer):
        raise RuntimeError(f"{name} is not running")
    return peer


def line(results: dict[str, dict[str, Any]], failed: dict[str, str]) -> dict[str, Any]:
    """The one JSON object: agentrl's keys plain, each peer's prefixed, and the ratios."""

    def r(x: float) -> float:
        return round(x, 3)

    row: dict[str, Any] = {}
    for name, res in results.items():
        pre = "" if name == "agentrl" else f"{name}_"
        for mode in ("plain", "stream"):
            suffix = "" if mode == "plain" else "_stream"
            if mode == "stream" and res["stream_error"]:
                row[f"{pre}stream_error"] = res["stream_error"]
                continue
            for rate in (200, 1000):
                m = res[f"{mode}{rate}"]
                row[f"{pre}added_p50_ms_{rate}rps{suffix}"] = r(m["added_p50"])
                row[f"{pre}added_p99_ms_{rate}rps{suffix}"] = r(m["added_p99"])
                row[f"{pre}achieved_rps_{rate}{suffix}"] = round(m["achieved_rate"], 1)
                row[f"{pre}p99_ms_{rate}rps{suffix}"] = r(m["gateway_p99"])
        row[f"{pre}max_rps"] = res["max_rps"]
        row[f"{pre}cpu_ms_per_request"] = r(res["plain1000"].get("gateway_cpu_ms_per_req", 0.0))
        row[f"{pre}late"] = sum(
            v.get("late", 0)
            for k, v in res.items()
            if k.startswith(("plain", "stream")) and k[-1].isdigit()
        )
        row[f"{pre}errors"] = sum(
            v["unanswered"]
            for k, v in res.items()
            if k.startswith(("plain", "stream")) and k[-1].isdigit()
        )
    ours = results.get("agentrl")
    for name, res in results.items():
        if name == "agentrl" or ours is None:
            continue
        headline: tuple[float, float] | None = None  # (rate, ratio)
        for rate in (1000, 200):
            theirs, mine = res[f"plain{rate}"], ours[f"plain{rate}"]
            # a ratio only where both kept up: past saturation both paths queue and the
            # difference of two percentiles says nothing
            behind = [
                who
                for who, m in ((name, theirs), ("agentrl", mine))
                if m["achieved_rate"] < 0.95 * rate
            ]
            key = f"ratio_p99_vs_{name}_{rate}rps"
            if behind:
                row[key] = None
                row[key + "_why"] = (
                    f"{' and '.join(behind)} did not keep up with {rate} req/s (achieved "
                    + ", ".join(
                        f"{round(m['achieved_rate'])}"
                        for who, m in ((name, theirs), ("agentrl", mine))
                        if who in behind
                    )
                    + ")"
                )
            elif theirs["added_p99"] <= 0:
                row[key] = None
                row[key + "_why"] = f"{name}'s added p99 was {theirs['added_p99']:.3f} ms (<= 0)"
            else:
                row[key] = r(mine["added_p99"] / theirs["added_p99"])
                headline = headline or (float(rate), row[key])
        common = res.get("common_rps")
        if res.get("common_error"):
            row[f"common_rps_{name}_error"] = res["common_error"]
        if common:
            row[f"common_rps_{name}"] = common
            row[f"common_rps_{name}_sustained"] = res.get("common_rps_sustained", True)
            if not res.get("common_rps_sustained", True):
                row[f"ratio_p99_vs_{name}_note"] = (
                    f"{name} sustained no rate with p99 < {P99_LIMIT_MS:g} ms; both compared at "
                    f"the lowest rate tried, {common:g} req/s"
                )
            mine_c, theirs_c = ours["at"][common], res["at"][common]
            if theirs_c["added_p99"] > 0:
                row[f"ratio_p99_vs_{name}_at_common_rps"] = r(
                    mine_c["added_p99"] / theirs_c["added_p99"]
                )
                row[f"agentrl_added_p99_ms_at_{name}_common_rps"] = mine_c["added_p99"]
                row[f"{name}_added_p99_ms_at_common_rps"] = theirs_c["added_p99"]
                headline = headline or (float(common), row[f"ratio_p99_vs_{name}_at_common_rps"])
            else:
                row[f"ratio_p99_vs_{name}_at_common_rps"] = None
                row[f"ratio_p99_vs_{name}_at_common_rps_why"] = (
                    f"{name}'s added p99 at {common:g} req/s was {theirs_c['added_p99']:.3f} ms "
                    "(<= 0: within the noise of the direct path's)"
                )
        elif res["max_rps"] == 0:
            lowest = min(s["rate"] for s in res["ramp"]) if res["ramp"] else None
            row[f"ratio_p99_vs_{name}_why"] = (
                f"{name} sustained no rate down to {lowest:g} req/s with p99 < {P99_LIMIT_MS:g} ms"
                if lowest
                else f"{name} was not ramped"
            )
        if headline is None:
            row.setdefault(
                f"ratio_p99_vs_{name}_why",
                "no rate where both kept up and the peer added a positive p99",
            )
        row[f"ratio_p99_vs_{name}"] = headline[1] if headline else None
        row[f"ratio_p99_vs_{name}_rps"] = headline[0] if headline else None
    for name, res in results.items():  # a variant of agentrl's against each real peer
        if not is_ours(name):
            continue
        for peer, theirs in results.items():
            if peer == "agentrl" or is_ours(peer):
                continue
            for rate in (1000, 200):
                a, b = res[f"plain{rate}"], theirs[f"plain{rate}"]
                kept = min(a["achieved_rate"], b["achieved_rate"]) >= 0.95 * rate
                key = f"{name}_ratio_p99_vs_{peer}_{rate}rps"
                row[key] = (
                    r(a["added_p99"] / b["added_p99"]) if kept and b["added_p99"] > 0 else None
                )
                if row[key] is None:
                    row[key + "_why"] = (
                        f"one did not keep up with {rate} req/s"
                        if not kept
                        else f"{peer}'s added p99 was {b['added_p99']:.3f} ms (<= 0)"
                    )
    for name, why in failed.items():
        row[f"{name}_error"] = why
    return row


def run_peers(duration: float = 3.0, only: tuple[str, ...] = tuple(PEERS)) -> dict[str, Any]:
    """Start the backend and agentrl's gateway, then each peer in turn; print and return the
    line. The backend and agentrl's gateway are `bench`'s own helper processes."""
    from agentrl.bus.server import EmbeddedNats

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    uptime_before = _uptime()
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-peers-"))
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    versions: dict[str, str] = {}
    procs: list[subprocess.Popen[bytes]] = []
    with EmbeddedNats(data_dir=tmp) as nats:
        try:
            bp, gp = bench._free_port(), bench._free_port()
            procs.append(bench._spawn("backend", str(bp)))
            backend = f"http://127.0.0.1:{bp}/v1"
            procs.append(bench._spawn("gateway", str(gp), backend, nats.url))
            direct = f"{backend}/chat/completions"
            ours = Peer(
                "agentrl",
                url=f"http://127.0.0.1:{gp}/v1/chat/completions",
                target={"model": "agentrl-policy"},
                proc=procs[1],
            )
            from importlib.metadata import version

            versions["agentrl"] = version("agentrl")

            async def main() -> None:
                await bench._wait_http(direct)
                await _ready(ours)
                results["agentrl"] = await measure(direct, ours, duration, say)
                for name in only:
                    peer: Peer | None = None
                    try:
                        say(f"{name}: installing / starting ...")
                        if is_ours(name):
                            peer = start_ours(name, backend, nats.url, tmp)
                        else:
                            peer = await asyncio.to_thread(PEERS[name], backend, tmp)
                        if peer.version:
                            versions[name] = peer.version
                        await _ready(peer)
                        results[name] = await measure(direct, peer, duration, say)
                        results[name]["peer"] = peer
                        try:
                            await compare_at_common(direct, ours, results, name, duration, say)
                        except Exception as exc:  # the measured figures stay
                            results[name]["common_error"] = f"{type(exc).__name__}: {exc}"[:300]
                        results[name].pop("peer", None)
                    except Exception as exc:  # reported, never dropped
                        failed[name] = f"{type(exc).__name__}: {exc}"[:800]
                        say(f"{name}: not measured: {failed[name]}")
                    finally:
                        if peer is not None:
                            stop(peer.proc)

            asyncio.run(main())
        finally:
            for p in procs:
                stop(p)
    row = line(results, failed)
    row["versions"] = versions
    row["duration_s_per_rate"] = duration
    row["cores"] = os.cpu_count()
    row["uptime_before"] = uptime_before
    row["uptime_after"] = _uptime()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(row))
    return row


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_interleaved(
    duration: float = 3.0,
    only: tuple[str, ...] = ("tensorzero",),
    rounds: int = 3,
    rates: tuple[float, ...] = (1000.0,),
    stream: bool = False,
) -> dict[str, Any]:
    """agentrl's gateway and `only` (peers and agentrl variants) all started at once, then
    one short run each in turn, `rounds` times, per rate: a shared host's load drifts over
    the minutes a full `--peers` run takes, and a rotation puts every gateway through the same
    minutes. Per gateway and rate the median added p50/p99 and CPU per request with every
    round's value; per peer the median of the per-round p99 ratios (agentrl's / the peer's,
    a round where either fell behind the rate left out). The last line is one JSON object."""
    from agentrl.bus.server import EmbeddedNats

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    uptime_before = _uptime()
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-interleave-"))
    runs: dict[str, dict[float, list[dict[str, Any]]]] = {}
    failed: dict[str, str] = {}
    versions: dict[str, str] = {}
    peers: list[Peer] = []
    procs: list[subprocess.Popen[bytes]] = []
    with EmbeddedNats(data_dir=tmp) as nats:
        try:
            bp, gp = bench._free_port(), bench._free_port()
            procs.append(bench._spawn("backend", str(bp)))
            backend = f"http://127.0.0.1:{bp}/v1"
            procs.append(bench._spawn("gateway", str(gp), backend, nats.url))
            direct = f"{backend}/chat/completions"
            peers.append(
                Peer(
                    "agentrl",
                    url=f"http://127.0.0.1:{gp}/v1/chat/completions",
                    target={"model": "agentrl-policy"},
                    proc=procs[1],
                )
            )

            async def main() -> None:
                await bench._wait_http(direct)
                for name in only:
                    try:
                        if is_ours(name):
                            peer = start_ours(name, backend, nats.url, tmp)
                        else:
                            peer = await asyncio.to_thread(PEERS[name], backend, tmp)
                        peers.append(peer)
                    except Exception as exc:  # reported, never dropped
                        failed[name] = f"{type(exc).__name__}: {exc}"[:800]
                for peer in list(peers):
                    try:
                        await _ready(peer)
                        if peer.version:
                            versions[peer.name] = peer.version
                        await bench.latency_run(direct, peer.url, 200.0, 1.0, target=peer.target)
                    except Exception as exc:
                        failed[peer.name] = f"{type(exc).__name__}: {exc}"[:800]
                        peers.remove(peer)
                for k in range(rounds):
                    for rate in rates:
                        for peer in peers:
                            say(f"round {k + 1}/{rounds}: {peer.name} at {rate:g} req/s")
                            pid = peer.proc.pid if peer.proc is not None else os.getpid()
                            run = await bench.latency_run(
                                direct,
                                peer.url,
                                rate,
                                duration,
                                pids={"gateway": pid},
                                target=peer.target,
                                stream=stream,
                                give_up_s=GIVE_UP_S,
                            )
                            runs.setdefault(peer.name, {}).setdefault(rate, []).append(run)

            asyncio.run(main())
        finally:
            for peer in peers[1:]:
                stop(peer.proc)
            for p in procs:
                stop(p)
    row = interleaved_line(runs, failed)
    row["versions"] = versions
    row["rounds"] = rounds
    row["stream"] = stream
    row["duration_s_per_run"] = duration
    row["cores"] = os.cpu_count()
    row["uptime_before"] = uptime_before
    row["uptime_after"] = _uptime()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(row))
    return row


def interleaved_line(
    runs: dict[str, dict[float, list[dict[str, Any]]]], failed: dict[str, str]
) -> dict[str, Any]:
    """The rotation's figures (see `run_interleaved`): agentrl's keys plain, others prefixed."""

    def med(xs: list[float]) -> float | None:
        xs = sorted(xs)
        return round(xs[len(xs) // 2], 3) if xs else None

    row: dict[str, Any] = {}
    for name, by_rate in runs.items():
        pre = "" if name == "agentrl" else f"{name}_"
        for rate, rs in by_rate.items():
            tag = f"{int(rate)}rps"
            for key, field_ in (
                ("added_p50_ms", "added_p50"),
                ("added_p99_ms", "added_p99"),
                ("cpu_ms_per_request", "gateway_cpu_ms_per_req"),
                ("achieved_rps", "achieved_rate"),
            ):
                values = [float(r.get(field_, float("nan"))) for r in rs]
                row[f"{pre}{key}_{tag}"] = med(values)
                row[f"{pre}{key}_{tag}_runs"] = [round(v, 3) for v in values]
            row[f"{pre}errors_{tag}"] = sum(r["unanswered"] for r in rs)
    # agentrl against every other gateway; each agentrl variant against every real peer
    pairs = [("agentrl", n) for n in runs if n != "agentrl"] + [
        (v, n) for v in runs if is_ours(v) for n in runs if n != "agentrl" and not is_ours(n)
    ]
    for mine, name in pairs:
        pre = "" if mine == "agentrl" else f"{mine}_"
        for rate, rs in runs[name].items():
            ratios = [
                m["added_p99"] / t["added_p99"]
                for m, t in zip(runs[mine].get(rate, []), rs, strict=False)
                if t["added_p99"] > 0 and min(m["achieved_rate"], t["achieved_rate"]) >= 0.95 * rate
            ]
            key = f"{pre}ratio_p99_vs_{name}_{int(rate)}rps"
            row[key] = med(ratios)
            row[key + "_runs"] = [round(x, 3) for x in ratios]
            if not ratios:
                row[key + "_why"] = (
                    f"no round where both kept up with {rate:g} req/s and {name} added a "
                    "positive p99"
                )
    for name, why in failed.items():
        row[f"{name}_error"] = why
    return row
